"""Float64 attention on the host: the `reference` kernel and the tests' oracle.

Written straight from the definition, independent of every device kernel:

    s   = q k^T * scale, then c * tanh(s / c) with softcap c, then (+ additive mask);
          -inf where the mask, causality or the sliding window says no
    p   = softmax(s) along keys (rows with no attended key give p = 0)
    out = p v,   lse = log(sum(exp(s))) (natural log, -inf for fully masked rows)

and its gradients (:func:`attention_backward_reference`), with p recomputed here:

    dv = p^T dout    dp = dout v^T    ds = p * (dp - rowsum(p * dp))
    ds *= 1 - tanh(q k^T * scale / c)^2        (softcap c only)
    dq = scale * ds k    dk = scale * ds^T q     (dk, dv summed over each KV head's
                                                  query group)

Products treat p = 0 (and ds = 0) as structural zeros: a masked-out key whose k or
v holds Inf/NaN contributes nothing, while non-finite values at attended positions
propagate. Causal and the window are aligned bottom-right (``offset = Sk - Sq``):
causal keeps keys ``j <= i + offset``; ``window = (left, right)`` keeps ``i + offset
- left <= j <= i + offset + right``, ``-1`` leaving that side unbounded.
"""

from __future__ import annotations

import math

import numpy as np


def _to_bhsd(x, layout):
    return x if layout == "bhsd" else np.swapaxes(x, 1, 2)


def _inputs(q, k, v, layout):
    """float64 [B, H, S, D] views; k and v repeated to Hq heads (GQA: head h reads
    KV head h // group)."""
    q, k, v = (_to_bhsd(np.asarray(x, dtype=np.float64), layout) for x in (q, k, v))
    group = q.shape[1] // k.shape[1] if k.shape[1] else 1
    return q, np.repeat(k, group, axis=1), np.repeat(v, group, axis=1), group


def band_keep(seqlen_q, seqlen_k, causal=False, window=None):
    """Bool [Sq, Sk]: the keys each query row sees under causal and the window."""
    i = np.arange(seqlen_q)[:, None] + (seqlen_k - seqlen_q)
    j = np.arange(seqlen_k)[None, :]
    keep = np.ones((seqlen_q, seqlen_k), dtype=bool)
    left, right = window if window is not None else (-1, -1)
    if causal:
        keep &= j <= i
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def _probabilities(q, k, causal, scale, mask, window=None, softcap=None):
    """(p, l_i, ref, t) of softmax(cap(q k^T * scale) + mask), q and k float64 [B, Hq,
    S, D]; t = tanh(q k^T * scale / softcap) (None without softcap)."""
    B, Hq, Sq, _ = q.shape
    Sk = k.shape[2]
    t = None
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.einsum("bhid,bhjd->bhij", q, k) * scale
        if softcap:
            t = np.tanh(s / softcap)
            s = softcap * t
    keep = np.ones((B, Hq, Sq, Sk), dtype=bool)
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype == np.bool_:
            keep &= np.broadcast_to(m, keep.shape)
        else:
            bias = np.broadcast_to(m.astype(np.float64), keep.shape)
            keep &= bias != -np.inf
            s = s + np.where(keep, bias, 0.0)
    keep &= band_keep(Sq, Sk, causal, window)
    s = np.where(keep, s, -np.inf)

    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m_i = s.max(axis=-1, keepdims=True) if Sk else np.full((B, Hq, Sq, 1), -np.inf)
        ref = np.where(np.isneginf(m_i), 0.0, m_i)
        e = np.exp(s - ref)
        l_i = e.sum(axis=-1, keepdims=True)
        p = np.where(l_i > 0, e / np.where(l_i > 0, l_i, 1.0), 0.0)
        p = np.where(np.isnan(l_i), np.nan, p)
    return p, l_i, ref, t


def _product(spec, a, b):
    """``einsum(spec, a, b)`` where a zero in ``a`` times Inf/NaN in ``b`` gives 0
    (structural zeros), while non-zero terms with non-finite ``b`` propagate."""
    with np.errstate(invalid="ignore", over="ignore"):
        finite_b = np.isfinite(b)
        clean = np.einsum(spec, a, np.where(finite_b, b, 0.0))
        touched = np.einsum(spec, (a != 0).astype(np.float64),
                            (~finite_b).astype(np.float64)) > 0
        if not touched.any():
            return clean
        return np.where(touched, np.einsum(spec, a, b), clean)


def attention_reference(q, k, v, *, causal=False, scale=None, mask=None, layout="bhsd",
                        window=None, softcap=None):
    """Return (out, lse) in float64; ``out`` in the given layout, ``lse`` [B, Hq, Sq].
    Rows that see no key give out 0 and lse -inf."""
    q, k, v, _ = _inputs(q, k, v, layout)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    p, l_i, ref, _ = _probabilities(q, k, causal, scale, mask, window, softcap)
    out = _product("bhij,bhjd->bhid", p, v)
    with np.errstate(invalid="ignore", divide="ignore"):
        lse = np.where(l_i > 0, np.log(np.where(l_i > 0, l_i, 1.0)) + ref, -np.inf)
        lse = np.where(np.isnan(l_i), np.nan, lse)[..., 0]
    return _to_bhsd(out, layout), lse


def attention_backward_reference(dout, q, k, v, *, causal=False, scale=None, mask=None,
                                 layout="bhsd", window=None, softcap=None):
    """Gradients (dq, dk, dv) of ``sum(dout * attention(q, k, v))`` in float64, each
    in the given layout and shaped like q, k, v. The forward is recomputed here
    (no out or lse is taken); the mask gets no gradient."""
    q, k, v, group = _inputs(q, k, v, layout)
    dout = _to_bhsd(np.asarray(dout, dtype=np.float64), layout)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    p, _, _, t = _probabilities(q, k, causal, scale, mask, window, softcap)
    dv = _product("bhij,bhid->bhjd", p, dout)
    dp = _product("bhid,bhjd->bhij", dout, v)
    with np.errstate(invalid="ignore"):
        pdp = np.where(p == 0, 0.0, p * dp)
        delta = pdp.sum(axis=-1, keepdims=True)
        ds = np.where(p == 0, 0.0, pdp - p * delta)
        if t is not None:
            ds = np.where(p == 0, 0.0, ds * (1.0 - t * t))
    dq = _product("bhij,bhjd->bhid", ds, k) * scale
    dk = _product("bhij,bhid->bhjd", ds, q) * scale

    def per_kv_head(x):
        B, Hq, S, D = x.shape
        return x.reshape(B, Hq // group, group, S, D).sum(axis=2)

    return (_to_bhsd(dq, layout), _to_bhsd(per_kv_head(dk), layout),
            _to_bhsd(per_kv_head(dv), layout))
