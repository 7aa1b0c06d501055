"""Float64 attention on the host: the `reference` kernel and the tests' oracle.

Written straight from the definition, independent of every device kernel:

    s   = q k^T * scale (+ additive mask), -inf where the mask or causality says no
    p   = softmax(s) along keys (rows with no attended key give p = 0)
    out = p v,   lse = log(sum(exp(s))) (natural log, -inf for fully masked rows)

Causal is aligned bottom-right: query i sees keys j <= i + Sk - Sq.
"""

from __future__ import annotations

import math

import numpy as np


def _to_bhsd(x, layout):
    return x if layout == "bhsd" else np.swapaxes(x, 1, 2)


def attention_reference(q, k, v, *, causal=False, scale=None, mask=None, layout="bhsd"):
    """Return (out, lse) in float64; ``out`` in the given layout, ``lse`` [B, Hq, Sq]."""
    q = _to_bhsd(np.asarray(q, dtype=np.float64), layout)
    k = _to_bhsd(np.asarray(k, dtype=np.float64), layout)
    v = _to_bhsd(np.asarray(v, dtype=np.float64), layout)
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    group = Hq // Hkv if Hkv else 1
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)

    with np.errstate(invalid="ignore", over="ignore"):
        s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    keep = np.ones((B, Hq, Sq, Sk), dtype=bool)
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype == np.bool_:
            keep &= np.broadcast_to(m, keep.shape)
        else:
            bias = np.broadcast_to(m.astype(np.float64), keep.shape)
            keep &= bias != -np.inf
            s = s + np.where(keep, bias, 0.0)
    if causal:
        i = np.arange(Sq)[:, None]
        j = np.arange(Sk)[None, :]
        keep &= j <= i + (Sk - Sq)
    s = np.where(keep, s, -np.inf)

    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m_i = s.max(axis=-1, keepdims=True) if Sk else np.full((B, Hq, Sq, 1), -np.inf)
        ref = np.where(np.isneginf(m_i), 0.0, m_i)
        e = np.exp(s - ref)
        l_i = e.sum(axis=-1, keepdims=True)
        p = np.where(l_i > 0, e / np.where(l_i > 0, l_i, 1.0), 0.0)
        p = np.where(np.isnan(l_i), np.nan, p)
        # p = 0 times a NaN/Inf value must give 0 (masked keys do not leak), while
        # non-finite values at attended keys must propagate.
        finite_v = np.isfinite(v)
        clean = np.einsum("bhij,bhjd->bhid", p, np.where(finite_v, v, 0.0))
        touched = np.einsum("bhij,bhjd->bhid", (p != 0).astype(np.float64),
                            (~finite_v).astype(np.float64)) > 0
        raw = np.einsum("bhij,bhjd->bhid", p, v) if touched.any() else clean
        out = np.where(touched, raw, clean)
        lse = np.where(l_i > 0, np.log(np.where(l_i > 0, l_i, 1.0)) + ref, -np.inf)
        lse = np.where(np.isnan(l_i), np.nan, lse)[..., 0]
    return _to_bhsd(out, layout), lse
