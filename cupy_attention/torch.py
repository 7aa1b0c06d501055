"""PyTorch integration: differentiable attention and a drop-in attention module.

    import cupy_attention.torch as cat
    out = cat.attention(q, k, v, causal=True)      # CUDA tensors, requires_grad ok
    out.sum().backward()                           # our backward kernels
    block_attn = cat.CUDAAttention(512, 8, num_kv_heads=2, causal=True).cuda()

Tensors cross to the kernels zero-copy (DLPack) and run on torch's current stream;
the forward saves q, k, v, out and the row log-sum-exp (O(S), never the S x S
probabilities) for the backward.

torch.compile: the forward and the backward are ``torch.library`` custom operators
(``cupy_attention::attention_fwd``, ``cupy_attention::attention_bwd``) with fake
implementations (shapes and dtypes only) and a registered autograd formula, so
``torch.compile(model, fullgraph=True)`` traces through :func:`attention` and
:class:`CUDAAttention` without a graph break, and the compiled backward calls our
backward kernel. Outputs are fresh contiguous tensors (never views of an input).
Eager calls on plain tensors run the same operator bodies and autograd formula under
a plain ``torch.autograd.Function`` instead: the custom operators' Python autograd
costs about 0.3 ms of host time per forward and backward, which a training step of
small layers waits for.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .api import attention as _attention
from .backward import attention_backward as _attention_backward
from .dropout import check_args
from .errors import ShapeError
from .problem import check_softcap, check_window


def _window(window_left: int, window_right: int):
    """The op's two ints back to :func:`cupy_attention.attention`'s ``window``
    (``NO_WINDOW`` in the left slot: none)."""
    return None if window_left == NO_WINDOW else (window_left, window_right)


NO_WINDOW = -2  # -1 already means "unbounded" inside a window


def _stream(dropout_p: float, dropout_seed: int, dropout_offset: int) -> torch.Tensor:
    """The dropout stream (seed, offset) a forward uses, as an int64 CPU tensor the
    backward receives: the caller's (``dropout_seed >= 0``, seeds of 63 bits), else
    drawn from cupy_attention.dropout's generator when the operator runs (at run time,
    so a compiled graph draws a new stream per call)."""
    from .dropout import default_generator

    if dropout_p and dropout_seed < 0:
        seed, offset = default_generator.next()
        seed &= (1 << 63) - 1
    else:
        seed, offset = max(dropout_seed, 0), dropout_offset
    return torch.tensor([seed, offset], dtype=torch.int64)


def _check_dropout(dropout_p, dropout_seed, dropout_offset) -> None:
    check_args(dropout_p, dropout_seed, dropout_offset)
    if dropout_seed is not None and dropout_seed >= 1 << 63:
        raise ShapeError(f"dropout_seed must be below 2^63 through torch's operators, got "
                         f"{dropout_seed}")


def _dropout_args(dropout_p: float, stream: torch.Tensor) -> dict:
    if not dropout_p:
        return {}
    seed, offset = (int(x) for x in stream.tolist())
    return dict(dropout_p=dropout_p, dropout_seed=seed, dropout_offset=offset)


def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                  alibi_slopes: Optional[torch.Tensor], causal: bool, scale: Optional[float],
                  layout: str, window_left: int, window_right: int, softcap: Optional[float],
                  kernel: str, deterministic: bool, dropout_p: float, dropout_seed: int,
                  dropout_offset: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, lse, stream)`` of :func:`cupy_attention.attention` as a torch operator
    (``deterministic`` is the backward's: kept for the registered autograd formula;
    ``stream`` the dropout stream the backward redraws, ``dropout_seed`` -1: drawn)."""
    return _attention_body(_stream(dropout_p, dropout_seed, dropout_offset), q, k, v, mask,
                           alibi_slopes, causal, scale, layout, window_left, window_right,
                           softcap, kernel, deterministic, dropout_p)


def _attention_body(stream, q, k, v, mask, alibi_slopes, causal, scale, layout, window_left,
                    window_right, softcap, kernel, deterministic, dropout_p, *_):
    """The operator's work for a given dropout ``stream`` (the operator's inputs after
    it; the seed and offset, already in the stream, are not read)."""
    out, lse = _attention(q, k, v, causal=causal, scale=scale, mask=mask, layout=layout,
                          return_lse=True, kernel=kernel,
                          window=_window(window_left, window_right), softcap=softcap,
                          alibi_slopes=alibi_slopes, **_dropout_args(dropout_p, stream))
    return out, lse, stream


attention_fwd = torch.library.custom_op("cupy_attention::attention_fwd",
                                        mutates_args=())(_attention_fwd)


@attention_fwd.register_fake
def _(q, k, v, mask, alibi_slopes, causal, scale, layout, window_left, window_right, softcap,
      kernel, deterministic, dropout_p, dropout_seed, dropout_offset):
    batch, heads, rows = ((q.shape[0], q.shape[2], q.shape[1]) if layout == "bshd"
                          else tuple(q.shape[:3]))
    return (q.new_empty(q.shape), q.new_empty((batch, heads, rows), dtype=torch.float32),
            torch.empty(2, dtype=torch.int64))


def _attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  out: torch.Tensor, lse: torch.Tensor, mask: Optional[torch.Tensor],
                  alibi_slopes: Optional[torch.Tensor], causal: bool, scale: Optional[float],
                  layout: str, window_left: int, window_right: int, softcap: Optional[float],
                  deterministic: bool, kernel: str, dropout_p: float,
                  stream: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of :func:`cupy_attention.attention_backward` as a torch operator
    (``stream``: the forward's dropout stream)."""
    # Autograd may hand over broadcast (stride 0) or transposed gradients.
    if dout.stride(-1) != 1 or 0 in dout.stride():
        dout = dout.contiguous()
    dq, dk, dv = _attention_backward(dout, q, k, v, out, lse, causal=causal, scale=scale,
                                     mask=mask, layout=layout,
                                     window=_window(window_left, window_right),
                                     softcap=softcap, alibi_slopes=alibi_slopes,
                                     deterministic=deterministic, kernel=kernel,
                                     **_dropout_args(dropout_p, stream))
    # the operator's contract: fresh contiguous tensors, as its fake says
    return tuple(g if g.is_contiguous() else g.contiguous() for g in (dq, dk, dv))


attention_bwd = torch.library.custom_op("cupy_attention::attention_bwd",
                                        mutates_args=())(_attention_bwd)


@attention_bwd.register_fake
def _(dout, q, k, v, out, lse, mask, alibi_slopes, causal, scale, layout, window_left,
      window_right, softcap, deterministic, kernel, dropout_p, stream):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    (q, k, v, mask, alibi_slopes, causal, scale, layout, window_left, window_right, softcap,
     kernel, deterministic, dropout_p, _, _) = inputs
    out, lse, stream = output
    ctx.save_for_backward(q, k, v, out, lse, mask, alibi_slopes, stream)
    ctx.options = (causal, scale, layout, window_left, window_right, softcap, deterministic,
                   "reference" if kernel == "reference" else "auto", dropout_p)


def _backward(ctx, dout, dlse, dstream, bwd=attention_bwd):
    # the LSE and the stream are outputs of the operator, not of attention(): nothing
    # flows into them
    q, k, v, out, lse, mask, alibi_slopes, stream = ctx.saved_tensors
    dq, dk, dv = bwd(dout, q, k, v, out, lse, mask, alibi_slopes, *ctx.options, stream)
    return (dq, dk, dv) + (None,) * 13


torch.library.register_autograd("cupy_attention::attention_fwd", _backward,
                                setup_context=_setup_context)


def _eager(*tensors) -> bool:
    """Whether a call runs the operators' bodies under :class:`_Eager` rather than the
    custom operators: plain tensors outside torch.compile. Tracing (dynamo, and tensor
    subclasses such as fake or functional tensors) needs the operators; in eager mode
    their Python autograd costs about 0.3 ms of host time per forward and backward,
    which a training step of small layers waits for (torch's own attention is C++)."""
    return not torch.compiler.is_compiling() and all(
        type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors if t is not None)


_NO_STREAM = torch.zeros(2, dtype=torch.int64)  # the eager path's stream without dropout


class _Eager(torch.autograd.Function):
    """The operators' autograd formula as a plain autograd.Function, for eager calls:
    ``body`` is the forward operator's body (its inputs after the dropout stream),
    ``bwd`` the backward operator's, ``setup``/``backward`` their registered context
    and backward functions (one formula for both paths). The operator's inputs come as
    the tensors and one tuple of the rest (``options``), and only ``out`` is returned:
    fewer arguments and outputs for autograd to walk; the LSE and the stream are saved
    for the backward as intermediates (the formula takes no double backward). Without
    dropout the stream is one constant tensor instead of a new one per call."""

    @staticmethod
    def forward(ctx, body, bwd, setup, backward, options, *tensors):
        inputs = tensors + options
        dropout_p, seed, offset = options[-3:]
        output = body(_stream(dropout_p, seed, offset) if dropout_p else _NO_STREAM, *inputs)
        setup(ctx, inputs, output)
        ctx.bwd_impl, ctx.backward_impl, ctx.count = bwd, backward, len(tensors)
        return output[0]

    @staticmethod
    def backward(ctx, dout):
        grads = ctx.backward_impl(ctx, dout, None, None, bwd=ctx.bwd_impl)
        return (None,) * 5 + tuple(grads[:ctx.count])


def attention(q, k, v, *, causal=False, scale=None, mask=None, layout="bhsd",
              deterministic=False, kernel="auto", window=None, softcap=None, alibi_slopes=None,
              dropout_p=0.0, dropout_seed=None, dropout_offset=None):
    """Differentiable :func:`cupy_attention.attention` (same arguments, ``window``,
    ``softcap``, ``alibi_slopes`` and dropout included; the mask and the slopes get no
    gradient). ``deterministic=True`` makes the backward bitwise reproducible. With
    ``dropout_p > 0`` and no ``dropout_seed``, each call draws a new stream from
    ``cupy_attention.dropout``'s generator (``cupy_attention.dropout.manual_seed``
    makes a run repeatable); the backward redraws the forward's mask. Traceable by
    ``torch.compile`` (custom operators)."""
    window = check_window(window, bool(causal), 1 << 62, 1 << 62)  # typed errors, no clipping
    window_left, window_right = (NO_WINDOW, 0) if window is None else window
    softcap = check_softcap(softcap) or None
    _check_dropout(dropout_p, dropout_seed, dropout_offset)
    options = (bool(causal), None if scale is None else float(scale), layout, window_left,
               window_right, softcap, kernel, bool(deterministic), float(dropout_p),
               -1 if dropout_seed is None else int(dropout_seed), int(dropout_offset or 0))
    tensors = (q, k, v, mask, alibi_slopes)
    if _eager(*tensors):
        return _Eager.apply(_attention_body, _attention_bwd, _setup_context, _backward, options,
                            *tensors)
    return attention_fwd(*tensors, *options)[0]


def _attention_varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                         alibi_slopes: Optional[torch.Tensor], causal: bool,
                         scale: Optional[float], window_left: int, window_right: int,
                         softcap: Optional[float], kernel: str, deterministic: bool,
                         check: bool, dropout_p: float, dropout_seed: int,
                         dropout_offset: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, lse, stream)`` of :func:`cupy_attention.attention_varlen` as a torch
    operator (``stream``: the dropout stream, as :func:`attention`'s)."""
    return _varlen_body(_stream(dropout_p, dropout_seed, dropout_offset), q, k, v, cu_seqlens_q,
                        cu_seqlens_k, alibi_slopes, causal, scale, window_left, window_right,
                        softcap, kernel, deterministic, check, dropout_p)


def _varlen_body(stream, q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, causal, scale,
                 window_left, window_right, softcap, kernel, deterministic, check, dropout_p, *_):
    """As :func:`_attention_body`, for packed sequences."""
    from .varlen import attention_varlen as _varlen

    out, lse = _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, scale=scale,
                       window=_window(window_left, window_right), softcap=softcap,
                       alibi_slopes=alibi_slopes, return_lse=True, kernel=kernel, check=check,
                       **_dropout_args(dropout_p, stream))
    return out, lse, stream


attention_varlen_fwd = torch.library.custom_op("cupy_attention::attention_varlen_fwd",
                                               mutates_args=())(_attention_varlen_fwd)


@attention_varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, causal, scale, window_left,
      window_right, softcap, kernel, deterministic, check, dropout_p, dropout_seed,
      dropout_offset):
    return (q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32),
            torch.empty(2, dtype=torch.int64))


def _attention_varlen_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, alibi_slopes: Optional[torch.Tensor],
                         causal: bool, scale: Optional[float],
                         window_left: int, window_right: int, softcap: Optional[float],
                         deterministic: bool, kernel: str, check: bool, dropout_p: float,
                         stream: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of :func:`cupy_attention.attention_varlen_backward` (``stream``:
    the forward's dropout stream)."""
    from .varlen import attention_varlen_backward as _varlen_backward

    if dout.stride(-1) != 1 or 0 in dout.stride():
        dout = dout.contiguous()
    grads = _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, causal=causal,
                             scale=scale, window=_window(window_left, window_right),
                             softcap=softcap, alibi_slopes=alibi_slopes,
                             deterministic=deterministic, kernel=kernel, check=check,
                             **_dropout_args(dropout_p, stream))
    return tuple(g if g.is_contiguous() else g.contiguous() for g in grads)


attention_varlen_bwd = torch.library.custom_op("cupy_attention::attention_varlen_bwd",
                                               mutates_args=())(_attention_varlen_bwd)


@attention_varlen_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, causal, scale,
      window_left, window_right, softcap, deterministic, kernel, check, dropout_p, stream):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _varlen_setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, alibi_slopes, causal, scale, window_left, window_right, softcap, kernel,
     deterministic, check, dropout_p, _, _) = inputs
    out, lse, stream = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi_slopes, stream)
    ctx.options = (causal, scale, window_left, window_right, softcap, deterministic,
                   "reference" if kernel == "reference" else "auto", False, dropout_p)


def _varlen_backward(ctx, dout, dlse, dstream, bwd=attention_varlen_bwd):
    q, k, v, out, lse, cu_q, cu_k, alibi_slopes, stream = ctx.saved_tensors
    dq, dk, dv = bwd(dout, q, k, v, out, lse, cu_q, cu_k, alibi_slopes, *ctx.options, stream)
    return (dq, dk, dv) + (None,) * 14


torch.library.register_autograd("cupy_attention::attention_varlen_fwd", _varlen_backward,
                                setup_context=_varlen_setup_context)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                     *, causal=False, scale=None, deterministic=False, kernel="auto", window=None,
                     softcap=None, alibi_slopes=None, check=True, dropout_p=0.0,
                     dropout_seed=None, dropout_offset=None):
    """Differentiable :func:`cupy_attention.attention_varlen`: packed sequences q
    [total_q, Hq, D], k, v [total_k, Hkv, D], int32 ``cu_seqlens_q/k`` [B + 1] on the
    same device. ``check`` reads the lengths on the host once in the forward (the
    backward trusts them). Dropout as in :func:`attention` (packed sequence b draws
    batch entry b's mask). Traceable by ``torch.compile`` (custom operators)."""
    window = check_window(window, bool(causal), 1 << 62, 1 << 62)
    window_left, window_right = (NO_WINDOW, 0) if window is None else window
    softcap = check_softcap(softcap) or None
    _check_dropout(dropout_p, dropout_seed, dropout_offset)
    options = (bool(causal), None if scale is None else float(scale), window_left, window_right,
               softcap, kernel, bool(deterministic), bool(check), float(dropout_p),
               -1 if dropout_seed is None else int(dropout_seed), int(dropout_offset or 0))
    tensors = (q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    if _eager(*tensors):
        return _Eager.apply(_varlen_body, _attention_varlen_bwd, _varlen_setup_context,
                            _varlen_backward, options, *tensors)
    return attention_varlen_fwd(*tensors, *options)[0]


class CUDAAttention(torch.nn.Module):
    """Multi-head self-attention for transformer blocks: one fused q/k/v projection,
    :func:`attention`, an output projection.

    Input and output are [batch, seq, embed_dim] (batch first). ``num_kv_heads``
    smaller than ``num_heads`` gives grouped-query attention (1: multi-query). The
    q/k/v heads are read in place from the projection's output as [B, S, H, D]
    views (layout "bshd"): no transposes, no copies.

    ``window`` and ``softcap`` are :func:`attention`'s (a sliding window ``(left,
    right)``, logit softcapping); ``dropout`` is attention dropout's p, applied in
    training mode only (``module.train()``), a new stream per call.

    Weights: ``qkv`` (embed_dim -> (num_heads + 2 num_kv_heads) head_dim, q heads
    first, then k, then v) and ``proj`` (embed_dim -> embed_dim), both ``nn.Linear``.
    """

    def __init__(self, embed_dim: int, num_heads: int, num_kv_heads: int | None = None,
                 causal: bool = False, bias: bool = True, *, deterministic: bool = False,
                 kernel: str = "auto", window=None, softcap=None, dropout: float = 0.0,
                 device=None, dtype=None):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be a multiple of num_heads "
                             f"({num_heads})")
        if num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads "
                             f"({num_kv_heads})")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim = embed_dim // num_heads
        self.causal, self.deterministic, self.kernel = causal, deterministic, kernel
        self.window = None if window is None else tuple(window)
        self.softcap = softcap
        self.dropout = float(dropout)
        factory = dict(device=device, dtype=dtype)
        self.qkv = torch.nn.Linear(embed_dim, (num_heads + 2 * num_kv_heads) * self.head_dim,
                                   bias=bias, **factory)
        self.proj = torch.nn.Linear(embed_dim, embed_dim, bias=bias, **factory)

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        """x [B, S, embed_dim]; mask (optional) broadcastable to [B, Hq, S, S]."""
        B, S, _ = x.shape
        qkv = self.qkv(x).view(B, S, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=2)
        o = attention(q, k, v, causal=self.causal, mask=mask, layout="bshd",
                      deterministic=self.deterministic, kernel=self.kernel,
                      window=self.window, softcap=self.softcap,
                      dropout_p=self.dropout if self.training else 0.0)
        return self.proj(o.reshape(B, S, self.embed_dim))

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, causal={self.causal}"
                + (f", window={self.window}" if self.window is not None else "")
                + (f", softcap={self.softcap}" if self.softcap is not None else "")
                + (f", dropout={self.dropout}" if self.dropout else ""))
