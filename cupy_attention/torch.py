"""PyTorch integration: differentiable attention and a drop-in attention module.

    import cupy_attention.torch as cat
    out = cat.attention(q, k, v, causal=True)      # CUDA tensors, requires_grad ok
    out.sum().backward()                           # our backward kernels
    block_attn = cat.CUDAAttention(512, 8, num_kv_heads=2, causal=True).cuda()

Tensors cross to the kernels zero-copy (DLPack) and run on torch's current stream;
the forward saves q, k, v, out and the row log-sum-exp (O(S), never the S x S
probabilities) for the backward.

torch.compile: not supported yet. :class:`AttentionFunction` is a plain
``torch.autograd.Function``, not a ``torch.library`` custom op, so dynamo cannot
trace into it: compiled models graph-break around the attention call (the rest
still compiles) and ``fullgraph=True`` fails.
"""

from __future__ import annotations

import torch

from .api import attention as _attention
from .backward import attention_backward as _attention_backward


class AttentionFunction(torch.autograd.Function):
    """``out = attention(q, k, v, ...)`` with gradients for q, k and v.

    ``kernel`` picks the forward kernel (any :func:`cupy_attention.kernels` name);
    the backward runs the fused backward kernels, or the float64 host reference
    when ``kernel="reference"`` (which also works on CPU tensors, for checking).
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale, layout, deterministic, kernel, window=None,
                softcap=None):
        out, lse = _attention(q, k, v, causal=causal, scale=scale, mask=mask, layout=layout,
                              return_lse=True, kernel=kernel, window=window, softcap=softcap)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.options = dict(causal=causal, scale=scale, layout=layout, window=window,
                           softcap=softcap,
                           deterministic=deterministic,
                           kernel="reference" if kernel == "reference" else "auto")
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, mask = ctx.saved_tensors
        # Autograd may hand over broadcast (stride 0) or transposed gradients.
        if dout.stride(-1) != 1 or 0 in dout.stride():
            dout = dout.contiguous()
        dq, dk, dv = _attention_backward(dout, q, k, v, out, lse, mask=mask, **ctx.options)
        return dq, dk, dv, None, None, None, None, None, None, None, None


def attention(q, k, v, *, causal=False, scale=None, mask=None, layout="bhsd",
              deterministic=False, kernel="auto", window=None, softcap=None):
    """Differentiable :func:`cupy_attention.attention` (same arguments, ``window`` and
    ``softcap`` included; the mask gets no gradient). ``deterministic=True`` makes the
    backward bitwise reproducible."""
    return AttentionFunction.apply(q, k, v, mask, causal, scale, layout, deterministic, kernel,
                                   window, softcap)


class CUDAAttention(torch.nn.Module):
    """Multi-head self-attention for transformer blocks: one fused q/k/v projection,
    :func:`attention`, an output projection.

    Input and output are [batch, seq, embed_dim] (batch first). ``num_kv_heads``
    smaller than ``num_heads`` gives grouped-query attention (1: multi-query). The
    q/k/v heads are read in place from the projection's output as [B, S, H, D]
    views (layout "bshd"): no transposes, no copies.

    ``window`` and ``softcap`` are :func:`attention`'s (a sliding window ``(left,
    right)``, logit softcapping).

    Weights: ``qkv`` (embed_dim -> (num_heads + 2 num_kv_heads) head_dim, q heads
    first, then k, then v) and ``proj`` (embed_dim -> embed_dim), both ``nn.Linear``.
    """

    def __init__(self, embed_dim: int, num_heads: int, num_kv_heads: int | None = None,
                 causal: bool = False, bias: bool = True, *, deterministic: bool = False,
                 kernel: str = "auto", window=None, softcap=None, device=None, dtype=None):
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
                      window=self.window, softcap=self.softcap)
        return self.proj(o.reshape(B, S, self.embed_dim))

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, causal={self.causal}"
                + (f", window={self.window}" if self.window is not None else "")
                + (f", softcap={self.softcap}" if self.softcap is not None else ""))
