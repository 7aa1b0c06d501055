"""Shared test helpers: dtypes, input generators, an independent plain attention
(float64 or same-precision), the TESTING.md tolerance rule and the error log.

Everything here works on NumPy arrays (CPU tests) and on CuPy arrays (GPU tests):
functions take the array module from their inputs. 16-bit values are handled as
raw bits (uint16 views) so nothing depends on how well an array library supports
bfloat16 arithmetic.

The plain attention below is written from the definition, independently of both
``cupy_attention.reference`` and the device kernels:

    s = q k^T * scale (+ additive mask); -inf where the mask/causality says no
    p = softmax(s) (rows with no attended key: p = 0), out = p v, lse = logsumexp(s)

``precision="float64"`` gives the TESTING.md ``ref``; ``precision=<dtype>`` gives
``same``: inputs rounded to the dtype, scores and softmax in fp32, probabilities
rounded to the dtype before P@V (fp32 accumulation), output rounded to the dtype.

``nvrtc_probe`` compiles a source with NVRTC and reports whether it compiled: the
CPU tests use it for probes that static_assert host figures against the kernels'.
``load_script`` imports one of the repository's scripts (not a package) by path.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import math
import os
import sys
import zlib
from pathlib import Path

import numpy as np

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a package dependency
    BF16 = None

DTYPES = ("float32", "float16", "bfloat16")
LAYOUTS = ("bhsd", "bshd")
# Bits of a quiet NaN and the unsigned view type of each dtype.
_NAN_BITS = {"float32": 0x7FC00000, "float16": 0x7E00, "bfloat16": 0x7FC0}
_BITS = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16}


def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        if BF16 is None:
            raise RuntimeError("bfloat16 needs ml_dtypes")
        return BF16
    return np.dtype(name)


def dtype_name(x) -> str:
    """'float32' / 'float16' / 'bfloat16' / 'bool' ... of a NumPy or CuPy array."""
    return np.dtype(x.dtype).name


def xp_of(x):
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def normal(xp, seed: int, shape):
    """Standard normal float32 values from a counter-based hash (splitmix64 + Box-
    Muller) built from plain array ops: the same numbers from NumPy and CuPy, and no
    dependence on cuRAND being installed."""
    n = int(np.prod(shape))
    u64 = xp.uint64
    i = xp.arange(2 * n, dtype=u64) + u64((seed * 0x9E3779B97F4A7C15) % 2**64)
    z = (i ^ (i >> u64(30))) * u64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> u64(27))) * u64(0x94D049BB133111EB)
    z = z ^ (z >> u64(31))
    u = ((z >> u64(11)).astype(xp.float64) + 0.5) * 2.0**-53      # uniform in (0, 1)
    u1, u2 = u[:n], u[n:]
    return (xp.sqrt(-2.0 * xp.log(u1)) * xp.cos(2 * np.pi * u2)).astype(xp.float32).reshape(shape)


def seed_for(*parts) -> int:
    """A stable per-case seed: fresh inputs for every case, reproducible runs."""
    return zlib.crc32(repr(parts).encode())


# ---------------------------------------------------------------------------
# dtype conversions (host or device)

def _bf16_bits(x32, xp):
    """Round float32 to bfloat16 (nearest even), NaN kept quiet: the uint16 bits."""
    u = xp.ascontiguousarray(x32, dtype=xp.float32).view(xp.uint32)
    rounded = (u + xp.uint32(0x7FFF) + ((u >> 16) & xp.uint32(1))) >> 16
    nan = (u & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000)
    return xp.where(nan, (u >> 16) | xp.uint32(0x40), rounded).astype(xp.uint16)


def bits_of(x32, dtype: str, xp):
    """float32 values -> the bits (uint16/uint32) of their nearest ``dtype`` values."""
    x32 = xp.asarray(x32, dtype=xp.float32)
    if dtype == "float32":
        return x32.view(xp.uint32)
    if dtype == "float16":
        return x32.astype(xp.float16).view(xp.uint16)
    return _bf16_bits(x32, xp)


def as_float(x, xp=None):
    """A float64 copy of an array of any of our dtypes (bfloat16 read through its bits)."""
    xp = xp or xp_of(x)
    if dtype_name(x) == "bfloat16":
        bits = x.view(xp.uint16).astype(xp.uint32) << 16
        return bits.view(xp.float32).astype(xp.float64)
    return x.astype(xp.float64)


def round_to(x, dtype: str, xp=None):
    """Values of ``x`` rounded to ``dtype``, returned as float64."""
    xp = xp or xp_of(x)
    if dtype == "float64":
        return x.astype(xp.float64)
    if dtype == "float32":
        return x.astype(xp.float32).astype(xp.float64)
    if dtype == "float16":
        return x.astype(xp.float16).astype(xp.float64)
    bits = _bf16_bits(x.astype(xp.float32), xp).astype(xp.uint32) << 16
    return bits.view(xp.float32).astype(xp.float64)


def cast(x, dtype: str, xp=None):
    """An array of ``dtype`` holding the nearest values to ``x``."""
    xp = xp or xp_of(x)
    if dtype == "bfloat16":
        return _bf16_bits(x.astype(xp.float32), xp).view(np_dtype("bfloat16"))
    return x.astype(np_dtype(dtype))


def to_bhsd(x, layout: str):
    return x if layout == "bhsd" else x.swapaxes(1, 2)


# ---------------------------------------------------------------------------
# Inputs

@dataclasses.dataclass
class Buffer:
    """A view (``view``) into a larger NaN-filled allocation (``base``): what lies
    outside the view must stay NaN (nothing reads it into a result, nothing
    writes it)."""

    base: object
    index: tuple

    @functools.cached_property
    def view(self):
        return self.base[self.index]

    def outside_untouched(self) -> bool:
        xp = xp_of(self.base)
        inside = xp.zeros(self.base.shape, dtype=bool)
        inside[self.index] = True
        return bool(xp.isnan(as_float(self.base, xp)[~inside]).all())


def nan_array(shape, dtype: str, xp):
    bits = xp.full(shape, _NAN_BITS[dtype], dtype=_BITS[dtype])
    return bits.view(np_dtype(dtype))


def fill(view, values32, dtype: str):
    """Write float32 ``values32`` into ``view`` (an array of ``dtype``) as bits."""
    xp = xp_of(view)
    view.view(_BITS[dtype])[...] = bits_of(values32, dtype, xp)


def set_values(x, index, value: float):
    """``x[index] = value`` through the bits (any of our dtypes, NumPy or CuPy)."""
    xp = xp_of(x)
    name = dtype_name(x)
    x.view(_BITS[name])[index] = bits_of(xp.asarray([value], dtype=xp.float32), name, xp)[0]


def tensor_shape(batch, heads, seqlen, dim, layout):
    return (batch, heads, seqlen, dim) if layout == "bhsd" else (batch, seqlen, heads, dim)


def _index(heads: slice, rows: slice, dim: int, layout: str):
    cols = slice(0, dim)
    return (slice(None), heads, rows, cols) if layout == "bhsd" else (slice(None), rows, heads, cols)


def make_qkv(xp, seed, *, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype,
             layout="bhsd", view="contiguous", magnitude=1.0, values=True):
    """Fresh normal q, k, v of ``dtype`` (times ``magnitude``), laid out as asked.

    view: "contiguous"; "packed" (slices of one [B, Hq + 2 Hkv, S, D] QKV
    allocation, or [B, S, Hq + 2 Hkv, D] for bshd, unused rows NaN); "padded"
    (each tensor a view of its own allocation with one extra head, three extra
    rows and extra columns, all NaN; the column pad is odd for odd D, so rows are
    not 16-byte aligned then).
    Returns (q, k, v, buffers): ``buffers`` are the :class:`Buffer` of each.
    ``values=False`` leaves the views NaN (same pointers and strides, no work).
    """
    shapes = {
        "q": (heads_q, seqlen_q),
        "k": (heads_kv, seqlen_k),
        "v": (heads_kv, seqlen_k),
    }
    bufs = {}
    if view == "packed":
        total = heads_q + 2 * heads_kv
        smax = max(seqlen_q, seqlen_k)
        base = nan_array(tensor_shape(batch, total, smax, head_dim, layout), dtype, xp)
        starts = {"q": 0, "k": heads_q, "v": heads_q + heads_kv}
        for name, (h, s) in shapes.items():
            h0 = starts[name]
            bufs[name] = Buffer(base, _index(slice(h0, h0 + h), slice(0, s), head_dim, layout))
    else:
        for name, (h, s) in shapes.items():
            if view == "contiguous":
                base = nan_array(tensor_shape(batch, h, s, head_dim, layout), dtype, xp)
            elif view == "padded":
                pad = 8 if head_dim % 2 == 0 else 3
                base = nan_array(tensor_shape(batch, h + 1, s + 3, head_dim + pad, layout), dtype, xp)
            else:
                raise ValueError(view)
            bufs[name] = Buffer(base, _index(slice(0, h), slice(0, s), head_dim, layout))
    for name in ("q", "k", "v"):
        if not values:
            break
        v_ = bufs[name].view
        fill(v_, normal(xp, seed + {"q": 0, "k": 1, "v": 2}[name] * 7919, v_.shape)
             * xp.float32(magnitude), dtype)
    return bufs["q"].view, bufs["k"].view, bufs["v"].view, bufs


def make_out(xp, *, batch, heads_q, seqlen_q, head_dim, dtype, layout, padded=False):
    """NaN-poisoned output (and LSE) buffers; padded ones keep NaN margins to watch."""
    if padded:
        base = nan_array(tensor_shape(batch, heads_q + 1, seqlen_q + 2, head_dim + 5, layout),
                         dtype, xp)
        out = Buffer(base, _index(slice(0, heads_q), slice(0, seqlen_q), head_dim, layout))
        lse_base = xp.full((batch, heads_q + 1, seqlen_q + 3), np.nan, dtype=xp.float32)
        lse = Buffer(lse_base, (slice(None), slice(0, heads_q), slice(0, seqlen_q)))
    else:
        out = Buffer(nan_array(tensor_shape(batch, heads_q, seqlen_q, head_dim, layout), dtype, xp),
                     (Ellipsis,))
        lse = Buffer(xp.full((batch, heads_q, seqlen_q), np.nan, dtype=xp.float32), (Ellipsis,))
    return out, lse


def standin(shape, dtype: str):
    """A NumPy array with the given shape and dtype that costs no memory (broadcast
    view, unit last stride): enough for ``validate`` and ``Family.check``."""
    return np.broadcast_to(np.zeros(shape[-1:], dtype=np_dtype(dtype)), shape)


def problem_for(*, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, layout="bhsd",
                causal=False, mask=None):
    """The validated Problem of a case, without allocating it."""
    from cupy_attention.problem import validate

    q = standin(tensor_shape(batch, heads_q, seqlen_q, head_dim, layout), dtype)
    k = standin(tensor_shape(batch, heads_kv, seqlen_k, head_dim, layout), dtype)
    return validate(q, k, k, causal=causal, mask=mask, layout=layout)


# ---------------------------------------------------------------------------
# The independent plain implementation

def dropout_factor(xp, dropout, B, H, Sq, Sk):
    """keep / (1 - p) per probability from the host stream (cupy_attention.dropout), or
    1.0; ``dropout`` = (p, seed, offset) or None."""
    if not dropout:
        return 1.0
    from cupy_attention.dropout import keep_mask, keep_scale

    p, seed, offset = dropout
    return xp.asarray(keep_mask(seed, offset, B, H, Sq, Sk, p) * keep_scale(p))


def plain_attention(q, k, v, *, causal=False, scale=None, mask=None, layout="bhsd",
                    precision="float64", softcap=None, dropout=None):
    """(out, lse) as float64 arrays, out in [B, Hq, Sq, D] whatever the layout.
    ``softcap`` c: each scaled score s becomes c * tanh(s / c) before the mask.
    ``dropout`` (p, seed, offset): the normalized P times keep / (1 - p)."""
    xp = xp_of(q)
    q, k, v = (to_bhsd(as_float(t, xp), layout) for t in (q, k, v))
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    work = xp.float64 if precision == "float64" else xp.float32
    if precision != "float64":
        q, k, v = (round_to(t, precision, xp) for t in (q, k, v))
    q, k, v = (t.astype(work) for t in (q, k, v))
    group = Hq // Hkv if Hkv else 1
    k = xp.repeat(k, group, axis=1)
    v = xp.repeat(v, group, axis=1)
    if Sk == 0 or Sq == 0 or B == 0:
        return xp.zeros((B, Hq, Sq, D)), xp.full((B, Hq, Sq), -np.inf)

    s = xp.matmul(q, k.swapaxes(-1, -2)) * work(scale)
    if softcap:
        s = work(softcap) * xp.tanh(s / work(softcap))
    keep = xp.ones((B, Hq, Sq, Sk), dtype=bool)
    if mask is not None:
        if dtype_name(mask) == "bool":
            keep = keep & xp.broadcast_to(mask, keep.shape)
        else:
            bias = xp.broadcast_to(as_float(mask, xp).astype(work), keep.shape)
            keep = keep & (bias != -np.inf)
            s = s + xp.where(keep, bias, 0)
    if causal:
        i = xp.arange(Sq)[:, None]
        j = xp.arange(Sk)[None, :]
        keep = keep & (j <= i + (Sk - Sq))
    s = xp.where(keep, s, work(-np.inf))
    m = s.max(axis=-1, keepdims=True)
    m = xp.where(xp.isneginf(m), work(0), m)
    e = xp.exp(s - m)
    l = e.sum(axis=-1, keepdims=True)
    p = e / xp.where(l > 0, l, work(1))
    p = p * dropout_factor(xp, dropout, B, Hq, Sq, Sk)
    if precision != "float64":
        p = round_to(p, precision, xp).astype(work)
    out = xp.matmul(p, v)
    if precision != "float64":
        out = round_to(out, precision, xp)
    with np.errstate(divide="ignore"):
        lse = xp.where(l > 0, xp.log(xp.where(l > 0, l, work(1))) + m, -np.inf)[..., 0]
    return out.astype(xp.float64), lse.astype(xp.float64)


# ---------------------------------------------------------------------------
# An independent plain backward (float64, or the kernel's precision)

def plain_backward(dout, q, k, v, *, causal=False, scale=None, mask=None, layout="bhsd",
                   precision="float64", dropout=None):
    """(dq, dk, dv) as float64 [B, H, S, D] arrays, from the definition.

    ``precision=<dtype>`` is TESTING.md's ``same``: inputs rounded to the dtype,
    fp32 arithmetic, P recomputed in fp32, delta = rowsum(dout * out) with out
    rounded to the dtype (as the forward stores it), gradients rounded to the dtype.
    """
    xp = xp_of(q)
    q, k, v, dout = (to_bhsd(as_float(t, xp), layout) for t in (q, k, v, dout))
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    work = xp.float64 if precision == "float64" else xp.float32
    if precision != "float64":
        q, k, v, dout = (round_to(t, precision, xp) for t in (q, k, v, dout))
    q, k, v, dout = (t.astype(work) for t in (q, k, v, dout))
    kr, vr = xp.repeat(k, group, axis=1), xp.repeat(v, group, axis=1)

    s = xp.matmul(q, kr.swapaxes(-1, -2)) * work(scale)
    keep = xp.ones((B, Hq, Sq, Sk), dtype=bool)
    if mask is not None:
        if str(mask.dtype) == "bool":
            keep = keep & xp.broadcast_to(mask, keep.shape)
        else:
            bias = xp.broadcast_to(as_float(mask, xp).astype(work), keep.shape)
            keep = keep & (bias != -np.inf)
            s = s + xp.where(keep, bias, 0)
    if causal:
        keep = keep & (xp.arange(Sk)[None, :] <= xp.arange(Sq)[:, None] + (Sk - Sq))
    s = xp.where(keep, s, work(-np.inf))
    m = s.max(axis=-1, keepdims=True)
    m = xp.where(xp.isneginf(m), work(0), m)
    e = xp.exp(s - m)
    l_i = e.sum(axis=-1, keepdims=True)
    p = e / xp.where(l_i > 0, l_i, work(1))
    f = dropout_factor(xp, dropout, B, Hq, Sq, Sk)
    out = xp.matmul(p * f, vr)
    if precision != "float64":
        out = round_to(out, precision, xp).astype(work)
    delta = (dout * out).sum(axis=-1, keepdims=True)
    dp = xp.matmul(dout, vr.swapaxes(-1, -2)) * f
    ds = xp.where(p == 0, work(0), p * (dp - delta))
    dq = xp.matmul(ds, kr) * work(scale)
    dk = (xp.matmul(ds.swapaxes(-1, -2), q) * work(scale)).reshape(B, Hkv, group, Sk, D).sum(2)
    dv = xp.matmul((p * f).swapaxes(-1, -2), dout).reshape(B, Hkv, group, Sk, D).sum(2)
    grads = (dq, dk, dv)
    if precision != "float64":
        grads = tuple(round_to(g, precision, xp) for g in grads)
    return tuple(g.astype(xp.float64) for g in grads)


# ---------------------------------------------------------------------------
# The tolerance rule (TESTING.md)

def noise_floor(ref, dtype: str):
    """``2 * max|(ref + 0.3 - 0.3) - ref|`` with every step rounded to ``dtype``."""
    xp = xp_of(ref)
    finite = ref[xp.isfinite(ref)]
    if finite.size == 0:
        return 0.0
    c = float(round_to(xp.asarray([0.3]), dtype, xp)[0])
    r = round_to(finite, dtype, xp)
    t = round_to(round_to(r + c, dtype, xp) - c, dtype, xp)
    return 2.0 * float(xp.abs(t - r).max())


@dataclasses.dataclass
class Figures:
    what: str
    max_err: float
    mean_err: float
    same_err: float
    atol: float
    bound: float

    @property
    def ratio(self) -> float:
        if self.same_err > 0:
            return self.max_err / self.same_err
        return 0.0 if self.max_err == 0 else math.inf


def tolerance(out, ref, same, dtype: str, what="out", factor=2.0, extra=0.0) -> Figures:
    """Assert the TESTING.md rule for one output; returns the figures.

    ``out``, ``ref`` and ``same`` are float64 arrays of one shape. Where ``ref`` is
    not finite (-inf LSE of a fully masked row) ``out`` must equal it exactly; NaN
    in ``out`` never passes.
    """
    xp = xp_of(ref)
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    fin = xp.isfinite(ref)
    nonfinite_ref = ~fin
    if bool(nonfinite_ref.any()):
        same_there = bool((out[nonfinite_ref] == ref[nonfinite_ref]).all())
        assert same_there, (f"{what}: where the reference is -inf/inf the result differs "
                            f"({int((out[nonfinite_ref] != ref[nonfinite_ref]).sum())} elements)")
    bad = fin & ~xp.isfinite(out)
    assert not bool(bad.any()), (
        f"{what}: {int(bad.sum())} of {bad.size} elements are NaN/Inf where the reference is "
        f"finite (first at {tuple(int(i) for i in xp.argwhere(bad)[0])})")
    if not bool(fin.any()):
        return Figures(what, 0.0, 0.0, 0.0, 0.0, 0.0)
    err = xp.abs(out[fin] - ref[fin])
    max_err = float(err.max())
    mean_err = float(err.mean())
    same_err = float(xp.abs(same[fin] - ref[fin]).max())
    atol = noise_floor(ref[fin], dtype)
    bound = factor * same_err + atol + extra
    fig = Figures(what, max_err, mean_err, same_err, atol, bound)
    assert max_err <= bound, (
        f"{what}: max|out-ref| = {max_err:.3e} > {factor}*max|same-ref| + atol = "
        f"{factor}*{same_err:.3e} + {atol:.3e}{f' + {extra:.3e}' if extra else ''} = {bound:.3e} "
        f"(mean err {mean_err:.3e})")
    return fig


def check_attention(out, ref, same, dtype: str, *, lse=None, ref_lse=None, same_lse=None,
                    log: dict | None = None):
    """The whole rule for one launch: output (factor 2, plus the fp32 relative bound)
    and, when given, the LSE (float32, the same form). Logs the figures."""
    xp = xp_of(ref)
    figs = [tolerance(out, ref, same, dtype, "out")]
    if dtype == "float32":
        scale = float(xp.abs(ref[xp.isfinite(ref)]).max()) if ref.size else 0.0
        if scale > 0:
            rel = figs[0].max_err / scale
            assert rel < 1e-5, f"fp32: max|out-ref|/max|ref| = {rel:.3e} >= 1e-5"
    if lse is not None:
        # The kernels keep scores in the exp2 domain (s * scale * log2 e, rounded to
        # fp32) and use the hardware's ex2/lg2 approximations (relative error
        # 2^-22), so their LSE carries a few fp32 ulps of the row max that a
        # plain fp32 log/exp does not: allow 4 ulps of max|lse| / ln 2.
        fin = ref_lse[xp.isfinite(ref_lse)]
        lse_scale = max(1.0, float(xp.abs(fin).max())) if fin.size else 1.0
        figs.append(tolerance(lse, ref_lse, same_lse, "float32", "lse",
                              extra=4 * 2.0 ** -23 * lse_scale / math.log(2)))
    if log is not None:
        record(log, figs)
    return figs


def record(meta: dict, figs) -> None:
    """Append the figures of one case to $CUPY_ATTENTION_ERROR_LOG (JSON lines)."""
    path = os.environ.get("CUPY_ATTENTION_ERROR_LOG")
    if not path:
        return
    row = dict(meta)
    row["test"] = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    for f in figs:
        row[f"{f.what}_max_err"] = f.max_err
        row[f"{f.what}_mean_err"] = f.mean_err
        row[f"{f.what}_same_err"] = f.same_err
        row[f"{f.what}_atol"] = f.atol
        row[f"{f.what}_ratio"] = f.ratio if math.isfinite(f.ratio) else None
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


# ---------------------------------------------------------------------------
# GPU drivers

def run_and_check(kernel: str, *, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype,
                  layout="bhsd", view="contiguous", causal=False, magnitude=1.0, want_lse=True,
                  mask=None, seed=0, meta=None, xp=None):
    """One launch through the public API on NaN-poisoned outputs, checked with the
    tolerance rule against the float64 and same-precision plain implementations.
    Returns (out, lse) as the kernel gave them. ``xp`` defaults to CuPy; NumPy
    (with kernel="reference") runs the same driver on the host."""
    import cupy_attention as ca

    if xp is None:
        import cupy as xp

    q, k, v, _ = make_qkv(xp, seed, batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                          seqlen_q=seqlen_q, seqlen_k=seqlen_k, head_dim=head_dim, dtype=dtype,
                          layout=layout, view=view, magnitude=magnitude)
    out_b, lse_b = make_out(xp, batch=batch, heads_q=heads_q, seqlen_q=seqlen_q,
                            head_dim=head_dim, dtype=dtype, layout=layout,
                            padded=(view == "padded"))
    res = ca.attention(q, k, v, causal=causal, layout=layout, mask=mask, out=out_b.view,
                       lse_out=lse_b.view if want_lse else None, return_lse=want_lse,
                       kernel=kernel)
    out, lse = res if want_lse else (res, None)
    assert out is out_b.view, "out= must be returned as given (written in place)"
    assert lse is None or lse is lse_b.view
    ref, ref_lse = plain_attention(q, k, v, causal=causal, mask=mask, layout=layout)
    same, same_lse = plain_attention(q, k, v, causal=causal, mask=mask, layout=layout,
                                     precision=dtype)
    row = dict(kernel=kernel, dtype=dtype, B=batch, Hq=heads_q, Hkv=heads_kv, Sq=seqlen_q,
               Sk=seqlen_k, D=head_dim, causal=bool(causal), layout=layout, view=view,
               magnitude=magnitude, mask=None if mask is None else dtype_name(mask))
    row.update(meta or {})
    check_attention(to_bhsd(as_float(out), layout), ref, same, dtype,
                    lse=None if lse is None else lse.astype(xp.float64),
                    ref_lse=ref_lse, same_lse=same_lse, log=row)
    assert out_b.outside_untouched(), "the kernel wrote outside the out view"
    assert lse is None or lse_b.outside_untouched(), "the kernel wrote outside the lse view"
    return out, lse


def _compile_into_cache(job):
    spec, arch = job
    from cupy_attention import jit

    try:
        jit.load_or_compile(spec, arch)
    except Exception:  # the test that launches it reports the error properly
        pass


def _compile_recorded(run, workers=None) -> int:
    """Run ``run()`` with the JIT's ``get_function`` replaced by a recorder (nothing
    is launched on the device), then compile every recorded (spec, arch) in a process
    pool into the disk cache. Hot-call entries made meanwhile (of every hot cache),
    which would hold the recorder's fake kernels, are dropped.
    Returns how many compiled."""
    import concurrent.futures as cf
    import multiprocessing

    import cupy

    from cupy_attention import api, backward, decode, jit, varlen

    if not jit.cache_enabled():
        return 0
    wanted: dict = {}

    class _NoLaunch:
        max_dynamic_smem = 0

        def launch(self, *args, **kwargs):
            pass

        def launch_packed(self, *args, **kwargs):
            pass

    def record(spec, arch, device_id):
        wanted[(spec, arch)] = None
        return _NoLaunch()

    caches = (api._HOT, varlen.HOT, varlen.HOT_BACKWARD, decode._HOT, backward._HOT)
    before = [set(cache.entries) for cache in caches]
    real = jit.get_function, jit.LoadedKernel.launch, jit.LoadedKernel.launch_packed
    jit.get_function = record
    # in case a family bypasses get_function
    jit.LoadedKernel.launch = jit.LoadedKernel.launch_packed = lambda self, *a, **k: None
    try:
        run()
    finally:
        jit.get_function, jit.LoadedKernel.launch, jit.LoadedKernel.launch_packed = real
        for cache, keys in zip(caches, before):
            for key in set(cache.entries) - keys:
                cache.entries.pop(key, None)
    cupy.cuda.runtime.deviceSynchronize()
    jobs = list(wanted)
    if not jobs:
        return 0
    workers = workers or max(1, min(len(jobs), os.cpu_count() or 1))
    with cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile_into_cache, jobs))
    return len(jobs)


def prewarm(cases, workers=None) -> int:
    """Compile, in parallel processes and into the disk cache, every instantiation
    that ``cases`` will launch: (kernel name, run_and_check keyword dict) pairs.

    Best effort and purely a speed-up: each family's ``launch`` runs once per case
    under :func:`_compile_recorded`'s recorder (nothing is launched). Returns how
    many compiled.
    """
    import cupy

    from cupy_attention import device
    from cupy_attention.dispatch import FAMILIES
    from cupy_attention.families.base import Tensors
    from cupy_attention.problem import validate

    dev = cupy.cuda.runtime.getDevice()
    arch = device.device_arch(dev)

    def run():
        for name, c in cases:
            family = FAMILIES.get(name)
            if family is None:
                continue
            shape = {key: c[key] for key in ("batch", "heads_q", "heads_kv", "seqlen_q",
                                             "seqlen_k", "head_dim", "dtype")}
            q, k, v, _ = make_qkv(cupy, 0, layout=c.get("layout", "bhsd"),
                                  view=c.get("view", "contiguous"), values=False, **shape)
            out_b, lse_b = make_out(cupy, batch=c["batch"], heads_q=c["heads_q"],
                                    seqlen_q=c["seqlen_q"], head_dim=c["head_dim"],
                                    dtype=c["dtype"], layout=c.get("layout", "bhsd"),
                                    padded=c.get("view") == "padded")
            try:
                p = validate(q, k, v, causal=c.get("causal", False), layout=c.get("layout", "bhsd"),
                             out=out_b.view, lse_out=lse_b.view)
                if p.empty or family.check(p, device.compute_capability(dev)) is not None:
                    continue
                family.launch(p, Tensors(q, k, v, out_b.view, lse_b.view, None),
                              cupy.cuda.get_current_stream(), dev, arch)
            except Exception:
                continue

    return _compile_recorded(run, workers)


def prewarm_calls(calls) -> int:
    """Compile, in parallel processes and into the disk cache, every instantiation
    that ``calls()`` launches: it runs once under :func:`_compile_recorded`'s
    recorder, so nothing executes on the device (``calls`` may make any
    ``attention`` / ``attention_backward`` / ``attention_decode`` /
    ``attention_varlen`` calls, on NaN inputs of the right shapes; exceptions inside
    it are its own business). Best effort, purely a speed-up; returns how many
    compiled."""
    return _compile_recorded(calls)


def static_asserts(include: str, checks) -> str:
    """Source for nvrtc_probe: ``#include include``, then one static_assert per
    (condition, message) of ``checks``."""
    lines = [f'#include "{include}"'] + [f'static_assert({c}, "{m}");' for c, m in checks]
    return "\n".join(lines) + "\n"


def nvrtc_probe(src: str, options) -> tuple[bool, str]:
    """Compile ``src`` with NVRTC (no GPU needed): (compiled, the compiler's log)."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(src, "probe.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(options))
            ok = True
        except nvrtc.NVRTCError:
            ok = False
        return ok, nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


ROOT = Path(__file__).resolve().parents[1]


def load_script(relpath: str, name: str | None = None):
    """The module at ``relpath`` under the repository root (``scripts/x.py``), imported
    by path and registered in sys.modules under ``name`` (default: its stem plus
    ``_script``), which dataclasses defined while it loads look it up by."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(name or f"{path.stem}_script", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
