"""Float64 attention on the host: the `reference` kernel and the tests' oracle.

Written straight from the definition, independent of every device kernel:

    s   = q k^T * scale, then c * tanh(s / c) with softcap c, then (+ additive mask)
          (- ALiBi's slope[h] * |i + Sk - Sq - j|);
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


def alibi_bias(slopes, batch, heads_q, seqlen_q, seqlen_k):
    """Float64 [B, Hq, Sq, Sk]: -slope * |i + Sk - Sq - j|, slopes [Hq] or [B, Hq]."""
    slopes = np.broadcast_to(np.asarray(slopes, dtype=np.float64), (batch, heads_q))
    i = np.arange(seqlen_q)[:, None] + (seqlen_k - seqlen_q)
    j = np.arange(seqlen_k)[None, :]
    return -slopes[:, :, None, None] * np.abs(i - j).astype(np.float64)


def _probabilities(q, k, causal, scale, mask, window=None, softcap=None, alibi_slopes=None):
    """(p, l_i, ref, t) of softmax(cap(q k^T * scale) + mask + alibi), q and k float64
    [B, Hq, S, D]; t = tanh(q k^T * scale / softcap) (None without softcap)."""
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
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes, B, Hq, Sq, Sk)
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


def _dropout_factor(shape, dropout):
    """The factor dropout multiplies each probability by, [B, Hq, Sq, Sk] float64:
    keep / (1 - p) from the kernels' Philox stream (cupy_attention.dropout.keep_mask);
    1 without dropout. ``dropout``: (p, seed, offset) or None, or (p, seed, offset,
    first batch entry) for one packed sequence of many."""
    if dropout is None or not dropout[0]:
        return 1.0
    from .dropout import keep_mask, keep_scale

    p, seed, offset = dropout[:3]
    first = dropout[3] if len(dropout) > 3 else 0
    return keep_mask(seed, offset, *shape, p, first_batch=first) * keep_scale(p)


def attention_reference(q, k, v, *, causal=False, scale=None, mask=None, layout="bhsd",
                        window=None, softcap=None, alibi_slopes=None, dropout=None):
    """Return (out, lse) in float64; ``out`` in the given layout, ``lse`` [B, Hq, Sq].
    Rows that see no key give out 0 and lse -inf. ``dropout = (p, seed, offset)``
    drops probabilities as the kernels do (the LSE is that of the kept softmax's
    scores, unchanged)."""
    q, k, v, _ = _inputs(q, k, v, layout)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    p, l_i, ref, _ = _probabilities(q, k, causal, scale, mask, window, softcap, alibi_slopes)
    out = _product("bhij,bhjd->bhid", p * _dropout_factor(p.shape, dropout), v)
    with np.errstate(invalid="ignore", divide="ignore"):
        lse = np.where(l_i > 0, np.log(np.where(l_i > 0, l_i, 1.0)) + ref, -np.inf)
        lse = np.where(np.isnan(l_i), np.nan, lse)[..., 0]
    return _to_bhsd(out, layout), lse


def attention_backward_reference(dout, q, k, v, *, causal=False, scale=None, mask=None,
                                 layout="bhsd", window=None, softcap=None, alibi_slopes=None,
                                 dropout=None):
    """Gradients (dq, dk, dv) of ``sum(dout * attention(q, k, v))`` in float64, each
    in the given layout and shaped like q, k, v. The forward is recomputed here
    (no out or lse is taken); the mask gets no gradient. With ``dropout`` (as in
    :func:`attention_reference`) out = (P f) V for the dropout factor f, so dV =
    (P f)^T dout and the gradient of P is f (dout V^T)."""
    q, k, v, group = _inputs(q, k, v, layout)
    dout = _to_bhsd(np.asarray(dout, dtype=np.float64), layout)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    p, _, _, t = _probabilities(q, k, causal, scale, mask, window, softcap, alibi_slopes)
    f = _dropout_factor(p.shape, dropout)
    dv = _product("bhij,bhid->bhjd", p * f, dout)
    dp = _product("bhid,bhjd->bhij", dout, v) * f
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


def gather_kv_cache(cache, cache_seqlens=None, block_table=None):
    """The keys (or values) of each sequence of a KV cache, in order: a list of
    float64 arrays [len_b, Hkv, D]. ``cache`` is [B, Sk, Hkv, D] (contiguous) or
    [num_pages, page_size, Hkv, D] with ``block_table`` [B, max_pages]."""
    cache = np.asarray(cache, dtype=np.float64)
    if block_table is None:
        B = cache.shape[0]
        lengths = (np.full(B, cache.shape[1]) if cache_seqlens is None
                   else np.asarray(cache_seqlens))
        return [cache[b, :int(lengths[b])] for b in range(B)]
    table = np.asarray(block_table)
    page_size = cache.shape[1]
    out = []
    for b, n in enumerate(np.asarray(cache_seqlens)):
        pages = table[b, :-(-int(n) // page_size)]
        rows = cache[pages].reshape(-1, *cache.shape[2:]) if len(pages) else cache[:0, 0]
        out.append(rows[:int(n)])
    return out


def attention_decode_reference(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None,
                               causal=True, scale=None, window=None, softcap=0.0):
    """Float64 (out [B, Sq, Hq, D], lse [B, Hq, Sq]) of ``attention_decode``: per
    sequence b, the Sq queries are its last Sq tokens (query i is token
    len_b - Sq + i); causal keeps j <= i + len_b - Sq, a window (left, right) keeps
    i + len_b - Sq - left <= j <= i + len_b - Sq + right (-1 = unbounded), softcap
    c > 0 maps each scaled score s to c tanh(s / c)."""
    q = np.asarray(q, dtype=np.float64)
    B, Sq, Hq, D = q.shape
    ks = gather_kv_cache(k_cache, cache_seqlens, block_table)
    vs = gather_kv_cache(v_cache, cache_seqlens, block_table)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    out = np.zeros((B, Sq, Hq, D))
    lse = np.full((B, Hq, Sq), -np.inf)
    for b in range(B):
        k, v = ks[b], vs[b]
        n, Hkv = k.shape[0], k.shape[1]
        if n == 0:
            continue
        group = Hq // Hkv
        k = np.repeat(k, group, axis=1)            # [n, Hq, D]
        v = np.repeat(v, group, axis=1)
        s = np.einsum("ihd,jhd->hij", q[b], k) * scale
        if softcap:
            s = softcap * np.tanh(s / softcap)
        i = np.arange(Sq)[:, None] + (n - Sq)
        j = np.arange(n)[None, :]
        keep = np.ones((Sq, n), dtype=bool)
        left, right = window if window is not None else (-1, -1)
        if causal:
            right = 0 if right < 0 else min(right, 0)
        if left >= 0:
            keep &= j >= i - left
        if right >= 0:
            keep &= j <= i + right
        s = np.where(keep, s, -np.inf)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            m = s.max(axis=-1, keepdims=True)
            ref = np.where(np.isneginf(m), 0.0, m)
            e = np.exp(s - ref)
            l_i = e.sum(axis=-1, keepdims=True)
            p = np.where(l_i > 0, e / np.where(l_i > 0, l_i, 1.0), 0.0)
            out[b] = _product("hij,jhd->ihd", p, v)
            lse[b] = np.where(l_i > 0, np.log(np.where(l_i > 0, l_i, 1.0)) + ref, -np.inf)[..., 0]
    return out, lse


def merge_attention_states_reference(outs, lses):
    """Float64 merge of attention states over disjoint key sets: ``outs`` a list of
    [..., D] arrays, ``lses`` the matching [...] natural-log LSEs. A state with LSE
    -inf contributes nothing; all -inf gives (0, -inf)."""
    lses = [np.asarray(x, dtype=np.float64) for x in lses]
    outs = [np.asarray(x, dtype=np.float64) for x in outs]
    m = np.max(lses, axis=0)
    ref = np.where(np.isneginf(m), 0.0, m)
    w = [np.exp(x - ref) for x in lses]
    total = np.sum(w, axis=0)
    o = sum(np.where(wi[..., None] > 0, wi[..., None] * oi, 0.0) for wi, oi in zip(w, outs))
    with np.errstate(divide="ignore", invalid="ignore"):
        o = np.where(total[..., None] > 0, o / np.where(total > 0, total, 1.0)[..., None], 0.0)
        lse = np.where(total > 0, np.log(np.where(total > 0, total, 1.0)) + ref, -np.inf)
    return o, lse
