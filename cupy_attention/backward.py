"""The backward pass: :func:`attention_backward`."""

from __future__ import annotations

from . import device as _device
from . import interop
from .arrays import device_mask, host64, like, slopes_view
from .calls import (HotCache, allocator, array_signature, backward_family, cupy_ptr,
                    on_device, torch_ptr)
from .dispatch import BACKWARD_FAMILIES
from .errors import DTypeError, ShapeError, UnsupportedError, translate_oom
from .families import flash_bwd
from .families.base import Tensors
from .problem import Problem, check_like, describe, out_shape, validate
from .reference import attention_backward_reference

BACKWARD_KERNELS = ("auto", *BACKWARD_FAMILIES, "reference")


@translate_oom
def attention_backward(dout, q, k, v, out, lse, *, causal=False, scale=None, mask=None,
                       layout="bhsd", deterministic=False, kernel="auto", window=None,
                       softcap=None, alibi_slopes=None, dropout_p=0.0, dropout_seed=None,
                       dropout_offset=None):
    """Gradients of :func:`cupy_attention.attention` with respect to q, k and v.

    Parameters
    ----------
    dout : array like ``out``: the gradient of the loss with respect to the output.
    q, k, v, causal, scale, mask, layout, window, softcap, alibi_slopes : exactly as
        passed to the forward (the slopes get no gradient).
    dropout_p, dropout_seed, dropout_offset : the forward's, all three (the seed is
        required with p > 0: the backward redraws the forward's keep mask). Runs on
        the ``flash_wgmma`` and ``flash_mma`` backwards.
    out, lse : the forward's output and its log-sum-exp (``return_lse=True``),
        float32 [B, Hq, Sq]. P is recomputed from them, so nothing of size S^2 is
        stored between the passes or allocated here.
    deterministic : bool
        ``False`` sums dQ with fp32 atomics (fastest; the summation order, hence
        the last bits, vary from run to run). ``True`` gives bitwise identical
        results run to run: ``flash_wgmma`` at head dims 64-128 over fixed lengths
        adds dQ's parts in a fixed order of key blocks, the other cases compute dQ
        in a second pass without atomics. On Hopper, when
        (key blocks x KV heads x batch) would leave SMs idle, the default mode also
        splits each block of keys' query tiles over several blocks and sums dK and
        dV with atomics (``flash_wgmma_bwd.kv_splits``); ``True`` never does.
    kernel : ``"auto"``, ``"flash_wgmma"``, ``"flash_mma"``, ``"flash"`` or ``"reference"``.
        ``"flash_wgmma"`` is the Hopper backward on wgmma (float16/bfloat16,
        compute capability 9.0, head dims 64, 72, ..., 256, causal or not, no dense
        ``mask``; arrays that are not 16-byte aligned run ``"flash_mma"``'s kernels);
        ``"flash_mma"`` the tensor-core backward on mma.sync (float16/bfloat16,
        compute capability 8.0+, head dims 1..256, causal or not, no dense
        ``mask``); ``"flash"`` the fused CUDA-core backward (all dtypes, head dims
        1..256, dense masks too); ``"auto"`` takes the first of ``"flash_wgmma"``,
        ``"flash_mma"``, ``"flash"`` that runs the problem. ``"reference"`` runs
        float64 NumPy on the host (it ignores ``out`` and ``lse`` and recomputes
        the forward).

    Returns
    -------
    (dq, dk, dv): arrays of the inputs' kind (torch in -> torch out, on torch's
    current stream), shaped like q, k, v in ``layout`` (contiguous), in the input
    dtype; accumulation is fp32. GQA/MQA: dk, dv sum over each KV head's query
    group. Rows that attend no key get zero gradients; the mask gets none.
    """
    hot_key = None
    if mask is None and alibi_slopes is None and not dropout_p and kernel != "reference":
        hot_key = _signature(dout, q, k, v, out, lse, causal, scale, layout, window, softcap,
                             deterministic, kernel)
        hot = _HOT.get(hot_key)
        if hot is not None:
            grads = hot(dout, q, k, v, out, lse)
            if grads is not None:
                return grads
    if out is None or lse is None:
        raise ShapeError("out and lse (the forward's output and its log-sum-exp, from "
                         "attention(..., return_lse=True)) are required")
    p = validate(q, k, v, causal=causal, scale=scale, mask=mask, layout=layout, out=out,
                 window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                 dropout_p=dropout_p, dropout_seed=dropout_seed,
                 dropout_offset=dropout_offset, need_seed=True)
    _check_grad_inputs(p, dout, lse, q)
    check_options(deterministic, kernel)
    if kernel == "reference":
        return _reference(p, dout, q, k, v, mask, alibi_slopes)
    interop.check_jax_call(q, p.device)
    _device.require_device()
    ctx = interop.context_for(q)
    family = backward_family(p, kernel, ctx.device_id)
    return _run(p, ctx, dout, q, k, v, out, lse, mask, deterministic, family, alibi_slopes,
                hot_key)


def check_options(deterministic, kernel) -> None:
    """The backward's own arguments, as every backward entry point takes them."""
    if not isinstance(deterministic, bool):
        raise DTypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    if kernel not in BACKWARD_KERNELS:
        raise UnsupportedError(f"unknown backward kernel {kernel!r}; choose one of "
                               f"{', '.join(BACKWARD_KERNELS)}")


def _check_grad_inputs(p: Problem, dout, lse, q) -> None:
    qi = describe(q, "q")
    check_like(dout, "dout", qi, out_shape(p.batch, p.heads_q, p.seqlen_q, p.head_dim, p.layout),
               p.dtype, shape_note=" (like the forward's out)",
               dtype_rule=f"have dtype {p.dtype} (like q)", layout_hint="; pass dout.contiguous()")
    check_like(lse, "lse", qi, (p.batch, p.heads_q, p.seqlen_q), "float32",
               shape_note=" [B, Hq, Sq]",
               dtype_rule="be float32 (as attention(..., return_lse=True) gives it)")


# ---------------------------------------------------------------------------
# Hot path, as the forward's (api.py): a call whose arrays match an earlier call's
# shapes, strides, dtypes and device repeats its launches with new pointers and
# fresh outputs (no validation, no dispatch, no packing). Device arrays only, no
# mask, slopes or dropout.

_HOT = HotCache()


def _signature(dout, q, k, v, out, lse, causal, scale, layout, window, softcap, deterministic,
               kernel):
    """What the launches depend on, hashable; None where there is no fast path."""
    try:
        arrays = array_signature((dout, q, k, v, out, lse))
        if arrays is None:
            return None
        key = (bool(causal), scale, layout, kernel, deterministic,
               None if window is None else tuple((type(x), x) for x in window),
               type(softcap), softcap, arrays)
        hash(key)
        return key
    except (AttributeError, TypeError):
        return None


class HotBackward:
    """One signature's backward launches, repeated with new pointers and fresh
    gradients, delta and dq_accum (``delta_shape``: [B, Hq, Sq] unless given;
    attention_varlen_backward's is [Hq, total_q])."""

    def __init__(self, kind: str, device_id: int, p: Problem, launcher, q, k,
                 accum_shape: tuple | None, delta_shape: tuple | None = None):
        self.kind, self.device_id, self.launcher = kind, device_id, launcher
        self.q_shape, self.kv_shape = tuple(q.shape), tuple(k.shape)
        self.delta_shape = delta_shape or (p.batch, p.heads_q, p.seqlen_q)
        self.accum_shape = accum_shape
        self.kv_accum_shape = ((p.batch, p.heads_kv, p.seqlen_k, p.head_dim)
                               if launcher.kv_splits > 1 else None)

    def __call__(self, dout, q, k, v, out, lse, cu=None, check=None):
        """(dq, dk, dv), or None where the general path must run. ``cu``: the
        (cu_seqlens_q, cu_seqlens_k) arrays of packed sequences; ``check``: called
        before the launch unless the stream is capturing a graph."""
        cupy = _device.require_cupy()
        if not on_device(cupy, self.device_id):
            return None
        if self.kind == "torch":
            import torch

            empty, ptr = q.new_empty, torch_ptr
            stream = interop.torch_stream(self.device_id)
            f32 = torch.float32

            def zeros(shape):
                return q.new_zeros(shape, dtype=f32)
        else:
            def empty(shape, dtype=q.dtype):
                return cupy.empty(shape, dtype=dtype)

            def zeros(shape):
                return cupy.zeros(shape, dtype=cupy.float32)
            ptr, stream, f32 = cupy_ptr, cupy.cuda.get_current_stream(), cupy.float32
        if check is not None and not stream.is_capturing():
            check()
        dq, dk, dv = empty(self.q_shape), empty(self.kv_shape), empty(self.kv_shape)
        delta = empty(self.delta_shape, dtype=f32)
        accum = None if self.accum_shape is None else empty(self.accum_shape, dtype=f32)
        kv = (None, None) if self.kv_accum_shape is None else (zeros(self.kv_accum_shape),
                                                               zeros(self.kv_accum_shape))
        if not self.launcher.run(ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse), ptr(dout),
                                 ptr(dq), ptr(dk), ptr(dv), ptr(accum), ptr(delta), stream.ptr,
                                 ptr(kv[0]), ptr(kv[1]),
                                 None if cu is None else (ptr(cu[0]), ptr(cu[1]))):
            return None
        return dq, dk, dv


def _run(p: Problem, ctx, dout, q, k, v, out, lse, mask, deterministic, family,
         alibi_slopes=None, hot_key=None):
    cupy = _device.require_cupy()
    with cupy.cuda.Device(ctx.device_id), ctx.stream:
        qc, kc, vc, oc, dc = (interop.to_cupy(x, n, ctx) for x, n in
                              ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (dout, "dout")))
        kv_shape = out_shape(p.batch, p.heads_kv, p.seqlen_k, p.head_dim, p.layout)
        empty = p.empty or p.seqlen_k == 0
        alloc = allocator(ctx, q)
        dq = alloc(qc.shape, qc.dtype, empty)
        dk = alloc(kv_shape, qc.dtype, empty)
        dv = alloc(kv_shape, qc.dtype, empty)
        if not empty:
            lc = interop.to_cupy(lse, "lse", ctx)
            accum_shape = family.dq_accum_shape(p, deterministic)
            scratch = (alloc((p.batch, p.heads_q, p.seqlen_q), cupy.float32, False),
                       None if accum_shape is None else alloc(accum_shape, cupy.float32, False))
            splits = family.kv_splits(p, ctx.device_id, deterministic)
            kv = None
            if splits > 1:
                shape = (p.batch, p.heads_kv, p.seqlen_k, p.head_dim)
                kv = (splits, alloc(shape, cupy.float32, True), alloc(shape, cupy.float32, True))
            t = launch_into(p, ctx, family, dc, qc, kc, vc, oc, lc,
                            device_mask(interop.to_cupy(mask, "mask", ctx), p), (dq, dk, dv),
                            scratch, deterministic, slopes_view(alibi_slopes, ctx), kv)
            if hot_key is not None and ctx.kind in ("torch", "cupy") and \
                    t.fwd.lse is lc and not _HOT.full:
                arch = _device.device_arch(ctx.device_id)
                launcher = family.prepare(p, t, ctx.device_id, arch, deterministic)
                if launcher is not None:
                    _HOT.put(hot_key, HotBackward(ctx.kind, ctx.device_id, p, launcher, q, k,
                                                  accum_shape))
        return tuple(interop.from_cupy(x, ctx) for x in (dq, dk, dv))


def launch_into(p: Problem, ctx, family, dout, q, k, v, out, lse, mask, grads, scratch,
                deterministic, alibi_slopes=None, kv=None) -> flash_bwd.BwdTensors:
    """The backward kernels of a non-empty problem (``Sk > 0``) on device arrays, into
    ``grads`` = (dq, dk, dv) with ``scratch`` = (delta float32 [B, Hq, Sq], dq_accum:
    float32 of at least ``family.dq_accum_shape``'s size, or None where that is None;
    a larger one is ignored where the family takes none), and ``kv`` = (splits,
    dk_accum, dv_accum: zeroed float32 [B, Hkv, Sk, D]) where the family splits
    (``family.kv_splits``); nothing is allocated here (cupy_attention.jax hands in
    buffers XLA allocated). Runs on ``ctx.stream``; returns the tensors it launched
    with."""
    cupy = _device.require_cupy()
    if lse.strides[-1] != 4:
        lse = cupy.ascontiguousarray(lse)   # the kernels read LSE rows with unit stride
    dq, dk, dv = grads
    delta, dq_accum = scratch
    fwd = Tensors(q, k, v, out, lse, mask, alibi_slopes=alibi_slopes)
    splits, dk_accum, dv_accum = kv or (1, None, None)
    if family.dq_accum_shape(p, deterministic) is None:
        dq_accum = None
    t = flash_bwd.BwdTensors(fwd=fwd, dout=dout, dq=dq, dk=dk,
                             dv=dv, delta=delta, dq_accum=dq_accum,
                             kv_splits=splits, dk_accum=dk_accum, dv_accum=dv_accum)
    family.launch(p, t, ctx.stream, ctx.device_id, _device.device_arch(ctx.device_id),
                  deterministic)
    return t


def _reference(p: Problem, dout, q, k, v, mask, alibi_slopes=None):
    grads = attention_backward_reference(host64(dout), host64(q), host64(k), host64(v),
                                         causal=p.causal, scale=p.scale, mask=host64(mask),
                                         layout=p.layout, window=p.window, softcap=p.softcap,
                                         alibi_slopes=host64(alibi_slopes),
                                         dropout=((p.dropout_p, p.dropout_seed, p.dropout_offset)
                                                  if p.dropout_p else None))
    kind = interop.array_kind(q)
    return tuple(like(g, q, kind) for g in grads)
