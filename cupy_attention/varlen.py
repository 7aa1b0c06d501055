"""Packed sequences of different lengths: :func:`attention_varlen` and its backward.

FlashAttention's ``flash_attn_varlen_func`` conventions. B sequences are packed
along one row axis, with no padding:

    q, out  [total_q, Hq, D]     k, v  [total_k, Hkv, D]     lse  [Hq, total_q] float32
    cu_seqlens_q, cu_seqlens_k   int32 [B + 1]: prefix sums of the lengths, starting at 0

Sequence b owns query rows ``cu_seqlens_q[b] : cu_seqlens_q[b + 1]`` and key rows
``cu_seqlens_k[b] : cu_seqlens_k[b + 1]``; causal masks and windows are aligned
bottom-right per sequence (its own Sk - Sq). Lengths may be 0. The kernels
(flash_wgmma on Hopper, flash_mma on sm_80+) schedule the real query blocks of each
sequence only: the work does not depend on the longest sequence
(``kernels/common/seqs.cuh``).
"""

from __future__ import annotations

import numbers

import numpy as np

from . import device as _device
from . import dispatch, interop
from .arrays import host64, like, slopes_view
from .backward import HotBackward, check_options
from .calls import HotCache, allocator, array_signature, backward_family, hot_io
from .errors import DeviceMismatchError, DTypeError, ShapeError, translate_oom
from .families import flash_bwd
from .families.base import Tensors
from .problem import (DTYPES, Problem, check_alibi, check_alibi_length, check_dropout,
                      check_heads, check_like, check_scale, check_softcap, check_window,
                      describe, unit_last_stride)
from .reference import attention_backward_reference, attention_reference


def _check_cu(x, name: str, qi, batch_plus_1: int | None):
    info = describe(x, name)
    if len(info.shape) != 1 or info.shape[0] < 1:
        raise ShapeError(f"{name} must be a 1-D int32 array [B + 1] of prefix sums starting "
                         f"at 0, got shape {info.shape}")
    if info.dtype != "int32":
        raise DTypeError(f"{name} must have dtype int32, got {info.dtype}")
    if batch_plus_1 is not None and info.shape[0] != batch_plus_1:
        raise ShapeError(f"cu_seqlens_q and cu_seqlens_k must have the same length B + 1, "
                         f"got {batch_plus_1} and {info.shape[0]}")
    if info.device != qi.device and not (info.device == "cpu" and qi.device != "cpu"):
        raise DeviceMismatchError(f"{name} is on device {info.device} but q is on {qi.device}")
    return info


def _check_max(x, name: str) -> int:
    if x is None:
        return 0
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 0:
        raise DTypeError(f"{name} must be a non-negative int or None, got {x!r}")
    return int(x)


def validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                    *, causal=False, scale=None, window=None, softcap=None,
                    alibi_slopes=None, dropout_p=0.0, dropout_seed=None, dropout_offset=None,
                    need_seed=False) -> Problem:
    """Shapes, dtypes and devices of a packed problem (the lengths' values are checked
    by :func:`check_seqlens`)."""
    if not isinstance(causal, (bool, int)) or isinstance(causal, float):
        raise DTypeError(f"causal must be a bool, got {type(causal).__name__}")
    qi, ki, vi = describe(q, "q"), describe(k, "k"), describe(v, "v")
    for name, info, heads in (("q", qi, "Hq"), ("k", ki, "Hkv"), ("v", vi, "Hkv")):
        if len(info.shape) != 3:
            raise ShapeError(f"{name} must have rank 3 ([total, {heads}, D]: sequences packed "
                             f"along the first axis), got shape {info.shape}")
    if not (qi.dtype == ki.dtype == vi.dtype):
        raise DTypeError(f"q, k and v must share one dtype, got {qi.dtype}, {ki.dtype}, {vi.dtype}")
    if qi.dtype not in DTYPES:
        raise DTypeError(f"q has dtype {qi.dtype}; supported dtypes are {', '.join(DTYPES)}")
    if not (qi.device == ki.device == vi.device):
        raise DeviceMismatchError(f"q, k and v are on different devices ({qi.device}, "
                                  f"{ki.device}, {vi.device}); move them to one device")
    total_q, Hq, D = qi.shape
    total_k, Hkv, Dk = ki.shape
    if vi.shape != ki.shape:
        raise ShapeError(f"k and v must have the same shape, got {ki.shape} and {vi.shape}")
    if Dk != D:
        raise ShapeError(f"head dims differ: q has D={D}, k and v have D={Dk}")
    check_heads(Hq, Hkv, D)
    for name, info in (("q", qi), ("k", ki), ("v", vi)):
        if not unit_last_stride(info):
            raise ShapeError(f"{name} must have unit stride in its last (head-dim) axis, got "
                             f"strides {info.strides}")
    ci = _check_cu(cu_seqlens_q, "cu_seqlens_q", qi, None)
    _check_cu(cu_seqlens_k, "cu_seqlens_k", qi, ci.shape[0])
    mq, mk = _check_max(max_seqlen_q, "max_seqlen_q"), _check_max(max_seqlen_k, "max_seqlen_k")
    window = check_window(window, bool(causal), total_q, total_k)
    softcap = check_softcap(softcap)
    scale = check_scale(scale, D)
    B = ci.shape[0] - 1
    alibi = check_alibi(alibi_slopes, qi, B, Hq)
    check_alibi_length(alibi, mq, mk)   # the longest sequences, where given
    drop = check_dropout(dropout_p, dropout_seed, dropout_offset, need_seed)
    return Problem(B, Hq, Hkv, total_q, total_k, D, qi.dtype, "thd", bool(causal),
                   "none", scale, qi.device, window, softcap, True, mq, mk, alibi, **drop)


def _host_ints(x):
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return np.asarray(x)


def check_seqlens(p: Problem, cu_q, cu_k) -> tuple[int, int]:
    """The lengths' values on the host: prefix sums from 0, never decreasing, ending at
    the totals. Returns the longest query and key sequence."""
    out = []
    for name, cu, total in (("cu_seqlens_q", cu_q, p.seqlen_q), ("cu_seqlens_k", cu_k, p.seqlen_k)):
        h = _host_ints(cu).astype(np.int64)
        if h[0] != 0:
            raise ShapeError(f"{name} must start at 0, got {int(h[0])}")
        steps = np.diff(h)
        if (steps < 0).any():
            b = int(np.argmax(steps < 0))
            raise ShapeError(f"{name} must not decrease: entry {b + 1} is {int(h[b + 1])} after "
                             f"{int(h[b])}")
        if h[-1] != total:
            raise ShapeError(f"{name} ends at {int(h[-1])}, but the packed tensor has {total} "
                             f"rows; the last entry must be the total")
        out.append(int(steps.max()) if steps.size else 0)
    return out[0], out[1]


def _device_ints(x, name, ctx):
    cupy = _device.require_cupy()
    if isinstance(x, np.ndarray):
        with cupy.cuda.Device(ctx.device_id), ctx.stream:
            return cupy.asarray(x)
    if type(x).__module__.startswith("torch"):
        x = x.detach()
    return interop.to_cupy(x, name, ctx)


def _capturing(ctx) -> bool:
    try:
        return bool(ctx.stream.is_capturing())
    except Exception:
        return False


# ---------------------------------------------------------------------------
# Hot path (as api.attention's): a call whose arrays match an earlier call's shapes,
# strides, dtypes and devices, cu_seqlens included (not their values), repeats that
# call's launch with new pointers: no validation, dispatch or packing. Device arrays
# only (CuPy, or torch CUDA tensors with cu_seqlens on q's device), no ALiBi.
# ``check=True`` still reads the lengths on the host for every call (a device-to-host
# copy that waits for the stream): ``check=False`` is the fast path.

HOT = HotCache(1024)


def signature(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window, softcap, return_lse,
              kernel):
    """What a varlen launch depends on, hashable; None where there is no fast path
    (NumPy or other producers, host cu_seqlens, unhashable arguments: validation then
    names what is wrong)."""
    return _key((q, k, v, cu_q, cu_k), max_q, max_k, causal, scale, window, softcap,
                bool(return_lse), kernel)


def _key(arrays, max_q, max_k, causal, scale, window, softcap, *rest):
    """The hot-path key of both directions: the arrays' signature, the arguments both
    take, then ``rest``; None as :func:`signature` says."""
    try:
        desc = array_signature(arrays)
        if desc is None:
            return None
        key = (desc, type(max_q), max_q, type(max_k), max_k, bool(causal), type(scale), scale,
               None if window is None else tuple((type(x), x) for x in window),
               type(softcap), softcap) + rest
        hash(key)
        return key
    except (AttributeError, TypeError):
        return None


class VarlenHotCall:
    """One signature's launch, repeated with new pointers (``launcher``: a HotLaunch)."""

    def __init__(self, kind: str, device_id: int, p: Problem, launcher):
        self.kind, self.device_id, self.p, self.launcher = kind, device_id, p, launcher

    def __call__(self, q, k, v, cu_q, cu_k, return_lse, check):
        p = self.p
        io = hot_io(self.kind, self.device_id, q, tuple(q.shape), (p.heads_q, p.seqlen_q),
                    return_lse)
        if io is None:
            return None
        stream, out, lse, ptr = io
        if check and not stream.is_capturing():
            check_seqlens(p, cu_q, cu_k)
        self.launcher.run(ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse), stream,
                          (ptr(cu_q), ptr(cu_k)))
        return (out, lse) if return_lse else out


# The backward's hot path, the same way: gradients, delta and dq_accum fresh each call,
# the launches of the first call with new pointers, cu_seqlens included. No ALiBi or
# dropout.
HOT_BACKWARD = HotCache(1024)


def backward_signature(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale,
                       window, softcap, deterministic, kernel):
    """What a varlen backward's launches depend on, hashable; None where there is no
    fast path (as :func:`signature`)."""
    return _key((dout, q, k, v, out, lse, cu_q, cu_k), max_q, max_k, causal, scale, window,
                softcap, type(deterministic), deterministic, kernel)


class VarlenHotBackward:
    """One signature's backward (``hot``: a backward.HotBackward), with the lengths
    checked on the host where the caller asks."""

    def __init__(self, p: Problem, hot: HotBackward):
        self.p, self.hot = p, hot

    def __call__(self, dout, q, k, v, out, lse, cu_q, cu_k, check):
        return self.hot(dout, q, k, v, out, lse, cu=(cu_q, cu_k),
                        check=(lambda: check_seqlens(self.p, cu_q, cu_k)) if check else None)


@translate_oom
def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                     *, causal=False, scale=None, window=None, softcap=None, alibi_slopes=None,
                     return_lse=False, kernel="auto", check=True, dropout_p=0.0,
                     dropout_seed=None, dropout_offset=None):
    """Attention over packed sequences of different lengths (no padding).

    Parameters
    ----------
    q : array [total_q, Hq, D]; k, v : arrays [total_k, Hkv, D] (Hq a multiple of Hkv).
        CuPy arrays, torch CUDA tensors (results as torch tensors on torch's current
        stream) or NumPy arrays, float16 / bfloat16 (the tensor-core kernels).
    cu_seqlens_q, cu_seqlens_k : int32 [B + 1], prefix sums of the query and key
        lengths: ``[0, len_0, len_0 + len_1, ...]``. Lengths may be 0.
    max_seqlen_q, max_seqlen_k : int, optional. Accepted for FlashAttention's signature;
        the kernels do not need them.
    causal, scale, window, softcap : as :func:`cupy_attention.attention`, applied to each
        sequence with its own bottom-right alignment.
    alibi_slopes : float32 ``[Hq]`` or ``[B, Hq]`` (B sequences), optional: ALiBi, the
        distance measured within each sequence (docs/variants.md).
    dropout_p, dropout_seed, dropout_offset : attention dropout as in
        :func:`cupy_attention.attention`, the mask addressed by (sequence, head, row and
        key within the sequence).
    return_lse : also return the log-sum-exp, float32 [Hq, total_q].
    kernel : ``"auto"``, ``"flash_wgmma"``, ``"flash_mma"`` or ``"reference"``.
    check : bool
        Read the lengths on the host and raise ShapeError unless they start at 0, never
        decrease and end at the totals (one small device-to-host copy, which waits for
        the stream). ``False`` skips it (for CUDA-graph capture or a hot loop: wrong
        lengths then give wrong results, or reads out of bounds). Skipped while the
        stream is capturing a graph. A call with the signature of an earlier one
        (shapes, strides, dtypes and devices of the arrays, cu_seqlens included, and
        the other arguments; no ALiBi) skips validation and planning, but ``check=True``
        still reads the lengths every call: ``check=False`` is the fast path.

    Returns
    -------
    out [total_q, Hq, D] (contiguous), or ``(out, lse)``.
    """
    hot_key = None
    if alibi_slopes is None and not dropout_p:   # dropout: a stream per call, no hot path
        hot_key = signature(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            causal, scale, window, softcap, return_lse, kernel)
        hot = HOT.get(hot_key)
        if hot is not None:
            result = hot(q, k, v, cu_seqlens_q, cu_seqlens_k, return_lse, check)
            if result is not None:
                return result
    p = validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        causal=causal, scale=scale, window=window, softcap=softcap,
                        alibi_slopes=alibi_slopes, dropout_p=dropout_p,
                        dropout_seed=dropout_seed, dropout_offset=dropout_offset)
    if kernel == "reference":
        return _reference(p, q, k, v, cu_seqlens_q, cu_seqlens_k, return_lse, alibi_slopes)
    dispatch.check_kernel_name(kernel)
    _device.require_device()
    ctx = interop.context_for(q)
    if check and not _capturing(ctx):
        check_alibi_length(p.alibi, *check_seqlens(p, cu_seqlens_q, cu_seqlens_k))
    family = dispatch.choose(p, kernel, _device.compute_capability(ctx.device_id))
    cupy = _device.require_cupy()
    with cupy.cuda.Device(ctx.device_id), ctx.stream:
        alloc = allocator(ctx, q)
        qc, kc, vc = (interop.to_cupy(x, n, ctx) for x, n in ((q, "q"), (k, "k"), (v, "v")))
        oc = alloc(qc.shape, qc.dtype, p.seqlen_k == 0)
        lc = alloc((p.heads_q, p.seqlen_q), cupy.float32, False) if return_lse else None
        if p.seqlen_q and p.heads_q and p.batch:
            if p.seqlen_k == 0 and lc is not None:
                lc.fill(-np.inf)
            elif p.seqlen_k:
                t = Tensors(qc, kc, vc, oc, lc, None,
                            _device_ints(cu_seqlens_q, "cu_seqlens_q", ctx),
                            _device_ints(cu_seqlens_k, "cu_seqlens_k", ctx),
                            slopes_view(alibi_slopes, ctx))
                arch = _device.device_arch(ctx.device_id)
                family.launch(p, t, ctx.stream, ctx.device_id, arch)
                if hot_key is not None and ctx.kind in ("cupy", "torch") and not HOT.full:
                    launcher = family.prepare(p, t, ctx.device_id, arch)
                    if launcher is not None:
                        HOT.put(hot_key, VarlenHotCall(ctx.kind, ctx.device_id, p, launcher))
        o = interop.from_cupy(oc, ctx)
        return (o, interop.from_cupy(lc, ctx)) if return_lse else o


@translate_oom
def attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q=None, max_seqlen_k=None, *, causal=False, scale=None,
                              window=None, softcap=None, alibi_slopes=None, deterministic=False,
                              kernel="auto", check=True, dropout_p=0.0, dropout_seed=None,
                              dropout_offset=None):
    """Gradients (dq, dk, dv) of :func:`attention_varlen`, shaped like q, k, v.

    ``out`` and ``lse`` ([Hq, total_q]) are the forward's; the other arguments are as
    the forward took them (dropout's seed and offset required with ``dropout_p``).
    ``deterministic`` as :func:`cupy_attention.attention_backward`.
    ``kernel``: ``"auto"``, ``"flash_wgmma"``, ``"flash_mma"`` or ``"reference"``.
    ``check``: as :func:`attention_varlen`'s; a call with the signature of an earlier
    one (no ALiBi, no dropout) skips validation and planning.
    """
    hot_key = None
    if alibi_slopes is None and not dropout_p and kernel != "reference":
        hot_key = backward_signature(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                     max_seqlen_q, max_seqlen_k, causal, scale, window, softcap,
                                     deterministic, kernel)
        hot = HOT_BACKWARD.get(hot_key)
        if hot is not None:
            grads = hot(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, check)
            if grads is not None:
                return grads
    p = validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        causal=causal, scale=scale, window=window, softcap=softcap,
                        alibi_slopes=alibi_slopes, dropout_p=dropout_p,
                        dropout_seed=dropout_seed, dropout_offset=dropout_offset,
                        need_seed=True)
    qi = describe(q, "q")
    for name, x, shape, dtype in (("out", out, qi.shape, p.dtype), ("dout", dout, qi.shape, p.dtype),
                                  ("lse", lse, (p.heads_q, p.seqlen_q), "float32")):
        if x is None:
            raise ShapeError(f"{name} is required")
        check_like(x, name, qi, shape, dtype)
    check_options(deterministic, kernel)
    if kernel == "reference":
        return _reference_backward(p, dout, q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    _device.require_device()
    ctx = interop.context_for(q)
    if check and not _capturing(ctx):
        check_alibi_length(p.alibi, *check_seqlens(p, cu_seqlens_q, cu_seqlens_k))
    family = backward_family(p, kernel, ctx.device_id)
    cupy = _device.require_cupy()
    with cupy.cuda.Device(ctx.device_id), ctx.stream:
        qc, kc, vc, oc, dc = (interop.to_cupy(x, n, ctx) for x, n in
                              ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (dout, "dout")))
        empty = p.empty or p.seqlen_k == 0 or p.batch == 0
        alloc = allocator(ctx, q)
        dq = alloc(qc.shape, qc.dtype, empty)
        # keys no query sees keep dK = dV = 0: the kernels write every key row of a
        # sequence, but a key row outside every sequence (cu_seqlens_k[-1] < total_k
        # cannot happen once checked) would otherwise be left unset
        dk = alloc(kc.shape, qc.dtype, empty)
        dv = alloc(kc.shape, qc.dtype, empty)
        if not empty:
            lc = interop.to_cupy(lse, "lse", ctx)
            lse_as_given = lc.strides[-1] == 4   # (a hot call passes lse's own pointer)
            if not lse_as_given:
                lc = cupy.ascontiguousarray(lc)
            delta_shape = (p.heads_q, p.seqlen_q)
            accum_shape = None if deterministic else (p.heads_q, p.seqlen_q, p.head_dim)
            t = flash_bwd.BwdTensors(
                fwd=Tensors(qc, kc, vc, oc, lc, None,
                            _device_ints(cu_seqlens_q, "cu_seqlens_q", ctx),
                            _device_ints(cu_seqlens_k, "cu_seqlens_k", ctx),
                            slopes_view(alibi_slopes, ctx)),
                dout=dc, dq=dq, dk=dk, dv=dv,
                delta=alloc(delta_shape, cupy.float32, False),
                dq_accum=None if accum_shape is None else alloc(accum_shape, cupy.float32, False))
            arch = _device.device_arch(ctx.device_id)
            family.launch(p, t, ctx.stream, ctx.device_id, arch, deterministic)
            if hot_key is not None and ctx.kind in ("cupy", "torch") and lse_as_given \
                    and not HOT_BACKWARD.full:
                launcher = family.prepare(p, t, ctx.device_id, arch, deterministic)
                if launcher is not None:
                    HOT_BACKWARD.put(hot_key, VarlenHotBackward(p, HotBackward(
                        ctx.kind, ctx.device_id, p, launcher, q, k, accum_shape, delta_shape)))
        return tuple(interop.from_cupy(x, ctx) for x in (dq, dk, dv))


# ---------------------------------------------------------------------------
# Reference: each sequence through the dense float64 reference.

def _sequences(cu_q, cu_k, total_q: int, total_k: int):
    hq, hk = _host_ints(cu_q), _host_ints(cu_k)
    stub = Problem(len(hq) - 1, 1, 1, total_q, total_k, 1, "float32", "thd", False, "none", 1.0,
                   "cpu", varlen=True)
    check_seqlens(stub, hq, hk)
    return [(int(hq[b]), int(hq[b + 1]), int(hk[b]), int(hk[b + 1])) for b in range(len(hq) - 1)]


def _slopes_of(alibi_slopes, b: int):
    """Sequence b's slopes [Hq] from [Hq] or [B, Hq] (float64 on the host), or None."""
    if alibi_slopes is None:
        return None
    s = np.asarray(host64(alibi_slopes))
    return s if s.ndim == 1 else s[b]


def attention_varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None,
                               window=None, softcap=None, alibi_slopes=None, dropout=None):
    """(out [total_q, Hq, D], lse [Hq, total_q]) in float64, sequence by sequence through
    :func:`cupy_attention.attention_reference` (``dropout`` = (p, seed, offset): sequence
    b draws as batch entry b)."""
    q, k, v = (np.asarray(host64(x)) for x in (q, k, v))
    out = np.zeros(q.shape)
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    for b, (q0, q1, k0, k1) in enumerate(_sequences(cu_seqlens_q, cu_seqlens_k, q.shape[0],
                                                    k.shape[0])):
        if q1 == q0 or k1 == k0:
            continue
        o, l = attention_reference(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=causal,
                                   scale=scale, layout="bshd", window=window, softcap=softcap,
                                   alibi_slopes=_slopes_of(alibi_slopes, b),
                                   dropout=_sequence_dropout(dropout, b))
        out[q0:q1], lse[:, q0:q1] = o[0], l[0]
    return out, lse


def _sequence_dropout(dropout, b: int):
    """The references' dropout argument for packed sequence b (its batch entry)."""
    return None if not dropout or not dropout[0] else tuple(dropout[:3]) + (b,)


def attention_varlen_backward_reference(dout, q, k, v, cu_seqlens_q, cu_seqlens_k, *,
                                        causal=False, scale=None, window=None, softcap=None,
                                        alibi_slopes=None, dropout=None):
    """(dq, dk, dv) in float64, sequence by sequence."""
    dout, q, k, v = (np.asarray(host64(x)) for x in (dout, q, k, v))
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b, (q0, q1, k0, k1) in enumerate(_sequences(cu_seqlens_q, cu_seqlens_k, q.shape[0],
                                                    k.shape[0])):
        if q1 == q0 or k1 == k0:
            continue
        g = attention_backward_reference(dout[None, q0:q1], q[None, q0:q1], k[None, k0:k1],
                                         v[None, k0:k1], causal=causal, scale=scale,
                                         layout="bshd", window=window, softcap=softcap,
                                         alibi_slopes=_slopes_of(alibi_slopes, b),
                                         dropout=_sequence_dropout(dropout, b))
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = g[0][0], g[1][0], g[2][0]
    return dq, dk, dv


def _dropout_of(p: Problem):
    return (p.dropout_p, p.dropout_seed, p.dropout_offset) if p.dropout_p else None


def _reference(p, q, k, v, cu_q, cu_k, return_lse, alibi_slopes=None):
    o, l = attention_varlen_reference(q, k, v, cu_q, cu_k, causal=p.causal, scale=p.scale,
                                      window=p.window, softcap=p.softcap,
                                      alibi_slopes=alibi_slopes, dropout=_dropout_of(p))
    kind = interop.array_kind(q) if not isinstance(q, np.ndarray) else "numpy"
    o = like(o, q, kind)
    return (o, like(l, q, kind, float32=True)) if return_lse else o


def _reference_backward(p, dout, q, k, v, cu_q, cu_k, alibi_slopes=None):
    grads = attention_varlen_backward_reference(dout, q, k, v, cu_q, cu_k, causal=p.causal,
                                                scale=p.scale, window=p.window, softcap=p.softcap,
                                                alibi_slopes=alibi_slopes, dropout=_dropout_of(p))
    kind = interop.array_kind(q) if not isinstance(q, np.ndarray) else "numpy"
    return tuple(like(g, q, kind) for g in grads)
