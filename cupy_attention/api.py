"""The NumPy-like entry point: :func:`attention`."""

from __future__ import annotations

import numpy as np

from . import device as _device
from . import dispatch, interop
from .arrays import device_mask, host64, like, slopes_view
from .calls import HotCache, array_signature, hot_io
from .errors import translate_oom
from .families.base import Tensors
from .problem import Problem, out_shape, validate


@translate_oom
def attention(q, k, v, *, causal=False, scale=None, mask=None, layout="bhsd",
              return_lse=False, out=None, lse_out=None, kernel="auto", window=None,
              softcap=None, alibi_slopes=None, dropout_p=0.0, dropout_seed=None,
              dropout_offset=None):
    """Scaled dot-product attention, ``softmax(q k^T * scale + mask) v``.

    Parameters
    ----------
    q : array [B, Hq, Sq, D] (``layout="bhsd"``) or [B, Sq, Hq, D] (``"bshd"``)
    k, v : arrays [B, Hkv, Sk, D] (or [B, Sk, Hkv, D]); Hq must be a multiple of
        Hkv (grouped-query / multi-query attention: query head h reads KV head
        h // (Hq // Hkv)). Sq and Sk may differ (cross attention).
        Arrays may be CuPy arrays, torch CUDA tensors (zero-copy through DLPack,
        run on torch's current stream, results returned as torch tensors), JAX
        arrays on a GPU (zero-copy through DLPack both ways, ordered with JAX's
        streams, results returned as JAX arrays; docs/jax.md), NumPy
        arrays (copied to the current device, results returned as NumPy) or any
        DLPack producer. Any strides with unit stride in the last axis, e.g.
        slices of a packed QKV tensor, are read in place.
        dtypes: float32, float16, bfloat16 (all three alike; fp32 accumulation).
    causal : bool
        Causal masking aligned to the bottom-right corner, as in FlashAttention:
        query i attends key j iff ``j <= i + Sk - Sq``. With Sq > Sk the first
        ``Sq - Sk`` queries attend nothing (output 0, LSE -inf).
    scale : float, optional
        Multiplies ``q k^T``; defaults to ``1 / sqrt(D)``.
    mask : array, optional
        Broadcastable to [B, Hq, Sq, Sk] (always in that axis order, whatever the
        layout). Boolean: True = attend. Floating: added to the scaled scores
        (-inf = do not attend).
    layout : "bhsd" or "bshd"
    return_lse : bool
        Also return the log-sum-exp of each row, float32 [B, Hq, Sq], natural log
        (``-inf`` for rows that attend nothing).
    out, lse_out : arrays, optional
        Preallocated outputs (same kind, shape and dtype as the results).
    kernel : str
        ``"auto"`` (fastest kernel that runs the problem), a family name
        (:func:`cupy_attention.kernels`), or ``"reference"`` (float64 NumPy on the
        host; slow, for checking).
    window : (int, int), optional
        Sliding window ``(left, right)``, FlashAttention's ``window_size``: query i
        attends key j iff ``i + Sk - Sq - left <= j <= i + Sk - Sq + right`` (aligned
        bottom-right like ``causal``); ``-1`` leaves a side unbounded, so ``(-1, -1)``
        is no window. With ``causal=True`` the right side is 0 whatever is given.
        Combines with ``mask`` and GQA. See docs/variants.md.
    softcap : float, optional
        Logit softcapping ``c > 0`` (Gemma 2): each scaled score ``s`` becomes
        ``c * tanh(s / c)`` before the mask is added. None: off.
    alibi_slopes : array, optional
        ALiBi (BLOOM, MPT): float32 ``[Hq]`` or ``[B, Hq]``, the array kind and device
        of q. Query i, key j of head h gains ``-slope[h] * |i + Sk - Sq - j|`` after
        the scale and softcap (FlashAttention's definition; with causal the LSE
        therefore differs from FlashAttention-2's, which adds ``slope * j``: the
        output is the same). Not with ``mask``. See docs/variants.md.
    dropout_p, dropout_seed, dropout_offset : optional
        Attention dropout (training): each normalized probability is kept with
        probability 1 - p (p quantized to 1/65536) and scaled by 1 / (1 - p), drawn
        from a Philox stream addressed by (seed, offset, batch, head, row, key)
        (``cupy_attention.dropout``), so the backward redraws the same mask from the
        same seed and offset. ``dropout_seed`` (int, 64 bits) and ``dropout_offset``
        (int, 32 bits) default to the library's generator; pass them when the
        backward is wanted. The LSE is that of the undropped softmax. Runs on
        ``flash_wgmma`` and ``flash_mma``, which drop the same elements (``"auto"``
        picks as without dropout).

    Returns
    -------
    out, or ``(out, lse)`` when ``return_lse`` is true. Rows that attend no key
    (causal or a window with Sq > Sk, a fully masked row) give 0 and LSE -inf.
    """
    hot_key = None
    if mask is None and out is None and lse_out is None and alibi_slopes is None and \
            not dropout_p:
        hot_key = _signature(q, k, v, causal, scale, layout, kernel, return_lse, window, softcap)
        hot = _HOT.get(hot_key)
        if hot is not None:
            result = hot(q, k, v, return_lse)
            if result is not None:
                return result
    p = validate(q, k, v, causal=causal, scale=scale, mask=mask, layout=layout, out=out,
                 lse_out=lse_out, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                 dropout_p=dropout_p, dropout_seed=dropout_seed, dropout_offset=dropout_offset)
    interop.check_jax_call(q, None if kernel == "reference" else p.device, out=out,
                           lse_out=lse_out)
    if kernel == "reference":
        return _reference(p, q, k, v, mask, out, lse_out, return_lse, alibi_slopes)
    dispatch.check_kernel_name(kernel)
    _device.require_device()
    ctx = interop.context_for(q)
    cc = _device.compute_capability(ctx.device_id)
    family = dispatch.choose(p, kernel, cc)
    return _run(family, p, ctx, q, k, v, mask, out, lse_out, return_lse, hot_key, alibi_slopes)


# ---------------------------------------------------------------------------
# Hot path: a call whose arrays match an earlier call's shapes, strides, dtypes
# and device repeats that call's launch with new pointers (no validation, no
# dispatch, no packing). Only device arrays, no mask or preallocated outputs.

_HOT_LIMIT = 1024
_HOT = HotCache(_HOT_LIMIT)


def _signature(q, k, v, causal, scale, layout, kernel, return_lse, window, softcap):
    """What the launch depends on, hashable; None for arrays without a fast path (or
    arguments that are not hashable: validation names what is wrong with them)."""
    try:
        arrays = array_signature((q, k, v))
        if arrays is None:
            return None
        key = (bool(causal), scale, layout, kernel, bool(return_lse),
               None if window is None else tuple((type(x), x) for x in window),
               type(softcap), softcap, arrays)
        hash(key)
        return key
    except (AttributeError, TypeError):  # NumPy and other producers
        return None


class _HotCall:
    def __init__(self, kind: str, device_id: int, p: Problem, launcher):
        self.kind, self.device_id, self.launcher = kind, device_id, launcher
        self.out_shape = out_shape(p.batch, p.heads_q, p.seqlen_q, p.head_dim, p.layout)
        self.lse_shape = (p.batch, p.heads_q, p.seqlen_q)

    def __call__(self, q, k, v, return_lse):
        io = hot_io(self.kind, self.device_id, q, self.out_shape, self.lse_shape, return_lse)
        if io is None:
            return None
        stream, out, lse, ptr = io
        self.launcher.run(ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse), stream)
        return (out, lse) if return_lse else out


def _run(family, p: Problem, ctx, q, k, v, mask, out, lse_out, return_lse, hot_key=None,
         alibi_slopes=None):
    cupy = _device.require_cupy()
    want_lse = return_lse or lse_out is not None
    with cupy.cuda.Device(ctx.device_id), ctx.stream:
        operands = _torch_operands if ctx.kind == "torch" else _cupy_operands
        tensors, results = operands(p, ctx, q, k, v, mask, out, lse_out, want_lse)
        tensors.alibi_slopes = slopes_view(alibi_slopes, ctx)
        if not p.empty:
            if p.seqlen_k == 0:  # every row attends nothing
                _fill(results[0], 0.0)
                if results[1] is not None:
                    _fill(results[1], -np.inf)
            else:
                arch = _device.device_arch(ctx.device_id)
                family.launch(p, tensors, ctx.stream, ctx.device_id, arch)
                if hot_key is not None and ctx.kind in ("torch", "cupy") and not _HOT.full:
                    launcher = family.prepare(p, tensors, ctx.device_id, arch)
                    if launcher is not None:
                        _HOT.put(hot_key, _HotCall(ctx.kind, ctx.device_id, p, launcher))
        o = _give_back(results[0], out, ctx)
        if not return_lse:
            return o
        return o, _give_back(results[1], lse_out, ctx)


def _torch_operands(p: Problem, ctx, q, k, v, mask, out, lse_out, want_lse):
    """Views of torch tensors read in place; results allocated by torch."""
    import torch

    if out is None:
        out = torch.empty(out_shape(p.batch, p.heads_q, p.seqlen_q, p.head_dim, p.layout),
                          dtype=q.dtype, device=q.device)
    if lse_out is None and want_lse:
        lse_out = torch.empty((p.batch, p.heads_q, p.seqlen_q), dtype=torch.float32,
                              device=q.device)
    m = None
    if mask is not None and not p.empty and p.seqlen_k:
        if interop.array_kind(mask) == "torch":
            m = mask.view(torch.uint8) if p.mask_kind == "bool" else mask.float()
            m = interop.torch_view(m.expand(p.batch, p.heads_q, p.seqlen_q, p.seqlen_k),
                                   "mask", ctx)
        else:
            m = device_mask(interop.to_cupy(mask, "mask", ctx), p)
    view = interop.torch_view
    tensors = Tensors(view(q, "q", ctx), view(k, "k", ctx), view(v, "v", ctx),
                      view(out, "out", ctx),
                      None if lse_out is None else view(lse_out, "lse_out", ctx), m)
    return tensors, (out, lse_out)


def _cupy_operands(p: Problem, ctx, q, k, v, mask, out, lse_out, want_lse):
    """CuPy arrays as they are (NumPy and other producers converted once)."""
    cupy = _device.require_cupy()
    qc, kc, vc = (interop.to_cupy(x, n, ctx) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    oc = interop.to_cupy(out, "out", ctx)
    if oc is None:
        oc = cupy.empty(out_shape(p.batch, p.heads_q, p.seqlen_q, p.head_dim, p.layout),
                        dtype=qc.dtype)
    lc = interop.to_cupy(lse_out, "lse_out", ctx)
    if lc is None and want_lse:
        lc = cupy.empty((p.batch, p.heads_q, p.seqlen_q), dtype=cupy.float32)
    mc = None
    if mask is not None and not p.empty and p.seqlen_k:
        mc = device_mask(interop.to_cupy(mask, "mask", ctx), p)
    return Tensors(qc, kc, vc, oc, lc, mc), (oc, lc)


def _fill(arr, value: float) -> None:
    if hasattr(arr, "fill_"):
        arr.fill_(value)
    else:
        arr.fill(value)


def _give_back(arr, user_array, ctx):
    """Return the caller's own preallocated array if there was one."""
    if ctx.kind == "torch":
        return arr
    if user_array is None:
        return interop.from_cupy(arr, ctx)
    if ctx.kind == "numpy":
        user_array[...] = interop.from_cupy(arr, ctx)
    return user_array


def _dropout(p: Problem):
    """The references' ``dropout`` argument: (p, seed, offset), or None."""
    return (p.dropout_p, p.dropout_seed, p.dropout_offset) if p.dropout_p else None


def _reference(p: Problem, q, k, v, mask, out, lse_out, return_lse, alibi_slopes=None):
    from .reference import attention_reference

    ref_out, ref_lse = attention_reference(host64(q), host64(k), host64(v), causal=p.causal,
                                           scale=p.scale, mask=host64(mask), layout=p.layout,
                                           window=p.window, softcap=p.softcap,
                                           alibi_slopes=host64(alibi_slopes),
                                           dropout=_dropout(p))
    kind = interop.array_kind(q) if not isinstance(q, np.ndarray) else "numpy"
    o = like(ref_out, q, kind)
    lse = like(ref_lse, q, kind, float32=True)
    if out is not None:
        out[...] = o
        o = out
    if lse_out is not None:
        lse_out[...] = lse
        lse = lse_out
    return (o, lse) if return_lse else o
