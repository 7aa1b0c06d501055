"""The backward pass: :func:`attention_backward`."""

from __future__ import annotations

from . import device as _device
from . import interop
from .arrays import device_mask, host64, like, slopes_view
from .calls import allocator, backward_family
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
        the last bits, vary from run to run). ``True`` computes dQ in a second pass
        without atomics: bitwise identical results run to run. dK and dV are
        deterministic either way.
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
    return _run(p, ctx, dout, q, k, v, out, lse, mask, deterministic, family, alibi_slopes)


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


def _run(p: Problem, ctx, dout, q, k, v, out, lse, mask, deterministic, family,
         alibi_slopes=None):
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
            scratch = (alloc((p.batch, p.heads_q, p.seqlen_q), cupy.float32, False),
                       None if deterministic else alloc(
                           (p.batch, p.heads_q, p.seqlen_q, p.head_dim), cupy.float32, False))
            launch_into(p, ctx, family, dc, qc, kc, vc, oc, lc,
                        device_mask(interop.to_cupy(mask, "mask", ctx), p), (dq, dk, dv),
                        scratch, deterministic, slopes_view(alibi_slopes, ctx))
        return tuple(interop.from_cupy(x, ctx) for x in (dq, dk, dv))


def launch_into(p: Problem, ctx, family, dout, q, k, v, out, lse, mask, grads, scratch,
                deterministic, alibi_slopes=None) -> None:
    """The backward kernels of a non-empty problem (``Sk > 0``) on device arrays, into
    ``grads`` = (dq, dk, dv) with ``scratch`` = (delta float32 [B, Hq, Sq], dq_accum
    float32 [B, Hq, Sq, D] or None when deterministic): nothing is allocated here
    (cupy_attention.jax hands in buffers XLA allocated). Runs on ``ctx.stream``."""
    cupy = _device.require_cupy()
    if lse.strides[-1] != 4:
        lse = cupy.ascontiguousarray(lse)   # the kernels read LSE rows with unit stride
    dq, dk, dv = grads
    delta, dq_accum = scratch
    fwd = Tensors(q, k, v, out, lse, mask, alibi_slopes=alibi_slopes)
    t = flash_bwd.BwdTensors(fwd=fwd, dout=dout, dq=dq, dk=dk,
                             dv=dv, delta=delta, dq_accum=None if deterministic else dq_accum)
    family.launch(p, t, ctx.stream, ctx.device_id, _device.device_arch(ctx.device_id),
                  deterministic)


def _reference(p: Problem, dout, q, k, v, mask, alibi_slopes=None):
    grads = attention_backward_reference(host64(dout), host64(q), host64(k), host64(v),
                                         causal=p.causal, scale=p.scale, mask=host64(mask),
                                         layout=p.layout, window=p.window, softcap=p.softcap,
                                         alibi_slopes=host64(alibi_slopes),
                                         dropout=((p.dropout_p, p.dropout_seed, p.dropout_offset)
                                                  if p.dropout_p else None))
    kind = interop.array_kind(q)
    return tuple(like(g, q, kind) for g in grads)
