"""Sliding window and softcap on the host: argument checking, the Problem and its
variant, spec names, and the float64 reference against a direct formula."""

from __future__ import annotations

import math

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention.errors import DTypeError, ShapeError
from cupy_attention.families import flash, flash_bwd, flash_mma, naive, tiled
from cupy_attention.problem import check_window, validate
from cupy_attention.reference import attention_backward_reference, attention_reference, band_keep
from cupy_attention.variant import Variant


def qkv(seed, B=1, Hq=2, Hkv=1, Sq=7, Sk=9, D=5, magnitude=1.0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, Sq, D)) * magnitude
    k = rng.standard_normal((B, Hkv, Sk, D)) * magnitude
    v = rng.standard_normal((B, Hkv, Sk, D))
    return q, k, v


def direct(q, k, v, *, causal=False, window=None, softcap=None, scale=None, alibi_slopes=None):
    """Row by row with Python floats: the keys row i sees, softcap, ALiBi's
    -slope * |i + Sk - Sq - j| (slopes [Hq] or [B, Hq]), softmax."""
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    left, right = window if window is not None else (-1, -1)
    slopes = np.broadcast_to(0.0 if alibi_slopes is None else alibi_slopes, (B, Hq))
    out = np.zeros((B, Hq, Sq, D))
    lse = np.full((B, Hq, Sq), -math.inf)
    for b in range(B):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            for i in range(Sq):
                c = i + Sk - Sq
                js = [j for j in range(Sk)
                      if (not causal or j <= c) and (left < 0 or j >= c - left)
                      and (right < 0 or j <= c + right)]
                if not js:
                    continue
                s = [float(q[b, h, i] @ k[b, hk, j]) * scale for j in js]
                if softcap:
                    s = [softcap * math.tanh(x / softcap) for x in s]
                s = [x - float(slopes[b, h]) * abs(c - j) for x, j in zip(s, js)]
                top = max(s)
                w = [math.exp(x - top) for x in s]
                lse[b, h, i] = top + math.log(sum(w))
                out[b, h, i] = sum(wj * v[b, hk, j] for wj, j in zip(w, js)) / sum(w)
    return out, lse


# ---------------------------------------------------------------------------
# The reference


@pytest.mark.parametrize("Sq,Sk", [(7, 9), (9, 7), (8, 8), (1, 6)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window,softcap", [((2, 1), None), ((0, 0), None), ((-1, 3), 2.0),
                                            ((3, -1), None), ((1, 1), 0.5), (None, 1.5)])
def test_reference_against_direct_formula(Sq, Sk, causal, window, softcap):
    q, k, v = qkv(Sq * 31 + Sk, Sq=Sq, Sk=Sk, magnitude=2.0)
    out, lse = attention_reference(q, k, v, causal=causal, window=window, softcap=softcap)
    want_out, want_lse = direct(q, k, v, causal=causal, window=window, softcap=softcap)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    fin = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[fin], want_lse[fin], rtol=1e-12)


def test_reference_unbounded_window_is_no_window():
    q, k, v = qkv(1)
    for causal in (False, True):
        a = attention_reference(q, k, v, causal=causal, window=(-1, -1))
        b = attention_reference(q, k, v, causal=causal)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_reference_diagonal_window():
    """window (0, 0) with Sq == Sk: each row attends its own key only, so out = v and
    lse = its score."""
    q, k, v = qkv(2, Hq=1, Sq=6, Sk=6)
    out, lse = attention_reference(q, k, v, window=(0, 0))
    np.testing.assert_allclose(out, v, rtol=1e-13)
    np.testing.assert_allclose(lse, np.einsum("bhid,bhid->bhi", q, k) / math.sqrt(5), rtol=1e-13)


def test_reference_large_softcap_is_plain():
    q, k, v = qkv(3)
    a = attention_reference(q, k, v, softcap=1e7)
    b = attention_reference(q, k, v)
    np.testing.assert_allclose(a[0], b[0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(a[1], b[1], rtol=1e-9)


def test_reference_fully_masked_rows():
    """Sq > Sk with a window that leaves the first rows no key: out 0, lse -inf, zero
    gradients there."""
    q, k, v = qkv(4, Sq=9, Sk=4)
    out, lse = attention_reference(q, k, v, window=(1, 0))
    keep = band_keep(9, 4, window=(1, 0))
    empty = ~keep.any(axis=1)
    assert empty.sum() == 5
    assert (out[:, :, empty] == 0).all() and np.isneginf(lse[:, :, empty]).all()
    assert np.isfinite(lse[:, :, ~empty]).all()
    dout = np.ones_like(out)
    dq, dk, dv = attention_backward_reference(dout, q, k, v, window=(1, 0))
    assert (dq[:, :, empty] == 0).all()
    assert all(np.isfinite(g).all() for g in (dq, dk, dv))


def test_band_keep_convention():
    keep = band_keep(3, 5, causal=True, window=(1, 7))
    # offset 2: row 0 sees keys 1..2, row 1 keys 2..3, row 2 keys 3..4
    assert keep.tolist() == [[False, True, True, False, False],
                             [False, False, True, True, False],
                             [False, False, False, True, True]]


@pytest.mark.parametrize("causal,window,softcap", [(False, (2, 1), 1.5), (True, (3, -1), None),
                                                   (False, None, 0.7), (True, (1, 0), 2.0)])
def test_reference_backward_matches_finite_differences(causal, window, softcap):
    q, k, v = qkv(5, Hq=2, Hkv=1, Sq=5, Sk=6, D=3, magnitude=1.5)
    dout = np.random.default_rng(6).standard_normal(q.shape)
    grads = attention_backward_reference(dout, q, k, v, causal=causal, window=window,
                                         softcap=softcap)

    def loss(q_, k_, v_):
        return float((attention_reference(q_, k_, v_, causal=causal, window=window,
                                          softcap=softcap)[0] * dout).sum())

    eps = 1e-6
    for which, g in enumerate(grads):
        args = [q, k, v]
        x = args[which]
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus, minus = x.copy(), x.copy()
            plus[idx] += eps
            minus[idx] -= eps
            a, b = list(args), list(args)
            a[which], b[which] = plus, minus
            num[idx] = (loss(*a) - loss(*b)) / (2 * eps)
        np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------
# The API (kernel="reference" runs on the host) and validation


def test_api_reference_kernel_takes_window_and_softcap():
    q, k, v = (x.astype(np.float32) for x in qkv(7, Sq=6, Sk=8))
    out, lse = ca.attention(q, k, v, window=(2, 1), softcap=3.0, return_lse=True,
                            kernel="reference")
    want, want_lse = direct(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                            window=(2, 1), softcap=3.0)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5)
    dq, dk, dv = ca.attention_backward(np.ones_like(out), q, k, v, out, lse, window=(2, 1),
                                       softcap=3.0, kernel="reference")
    ref = attention_backward_reference(np.ones_like(out), q, k, v, window=(2, 1), softcap=3.0)
    for got, r in zip((dq, dk, dv), ref):
        np.testing.assert_allclose(got, r, rtol=1e-4, atol=1e-5)


def _problem(**kw):
    q, k, v = (np.zeros(s, np.float16) for s in ((1, 2, 16, 8), (1, 1, 32, 8), (1, 1, 32, 8)))
    return validate(q, k, v, **kw)


@pytest.mark.parametrize("window,exc,match", [
    ((1,), DTypeError, "pair"), (5, DTypeError, "pair"), ("ab", DTypeError, "pair"),
    ((1.0, 2), DTypeError, "window left must be an int"),
    ((True, 2), DTypeError, "window left must be an int"),
    ((3, "x"), DTypeError, "window right must be an int"),
    ((-2, 0), ShapeError, "window left must be -1"),
    ((0, -5), ShapeError, "window right must be -1")])
def test_window_errors(window, exc, match):
    with pytest.raises(exc, match=match):
        _problem(window=window)


@pytest.mark.parametrize("softcap,exc", [(0.0, ShapeError), (-1.0, ShapeError),
                                         (float("nan"), ShapeError), (float("inf"), ShapeError),
                                         ("3", DTypeError), (True, DTypeError)])
def test_softcap_errors(softcap, exc):
    with pytest.raises(exc, match="softcap"):
        _problem(softcap=softcap)


def test_window_normalization():
    # Sq = 16, Sk = 32 (offset 16)
    assert _problem(window=(-1, -1)).window is None
    assert _problem(window=(4, 2)).window == (4, 2)
    assert _problem(window=(np.int64(4), 2)).window == (4, 2)
    assert _problem(window=[4, 2]).window == (4, 2)
    assert _problem(window=(31, 15)).window is None          # bounds no row
    assert _problem(window=(30, 14)).window == (30, 14)
    assert _problem(causal=True, window=(4, 9)).window == (4, 0)
    assert _problem(causal=True, window=(-1, 9)).window is None
    assert check_window((0, 0), False, 0, 0) is None


def test_problem_variant_and_describe():
    p = _problem(causal=True, window=(4, 3), softcap=30)
    assert p.softcap == 30.0 and isinstance(p.softcap, float)
    assert p.variant == Variant(True, (4, 0), 30.0, "none")
    assert p.variant.cpp() == "Variant<Band<true, true>, Softcap, NoDense>"
    assert "causal,window,softcap" in p.describe() and "softcap=30" in p.describe()
    assert _problem().describe() == validate(*(np.zeros(s, np.float16) for s in (
        (1, 2, 16, 8), (1, 1, 32, 8), (1, 1, 32, 8)))).describe()


def test_band_params_follow_the_convention():
    p = _problem(window=(4, 2))   # offset 16: row i sees i + 12 .. i + 18
    assert p.variant.band(p.seqlen_q, p.seqlen_k) == (12, 18)
    p = _problem(causal=True, window=(4, -1))
    assert p.variant.band(p.seqlen_q, p.seqlen_k) == (12, 16)


# ---------------------------------------------------------------------------
# Spec names: the variant suffix, the same instantiation as before without one


def test_spec_names_carry_the_variant():
    vt = Variant(False, (4, 2), 30.0, "none")
    s = flash.spec(flash.config(64), "float16", vt)
    assert s.name.startswith("flash[D=64,") and s.name.endswith(",f16,window,softcap]")
    assert "Band<true, true>, Softcap" in s.expr
    s = flash_mma.spec(64, "bfloat16", vt, True)   # an upper bound: the grid in sections
    assert s.name.endswith(",window,softcap,sections]") and "Softcap" in s.expr
    scores, _, pv = naive.specs("float16", vt)
    assert scores.name == "naive_scores[f16,window,softcap]"
    assert pv.name == "naive_pv[f16,window]" and "PlainLogits" in pv.expr
    _, softmax, _ = tiled.specs("float16", Variant(True, (3, 0)))
    assert softmax.name == "tiled_softmax[causal,window]"
    _, softmax, _ = tiled.specs("float16", Variant())
    assert softmax.name == "tiled_softmax[full]"
    names = [x.name for x in flash_bwd.specs(flash_bwd.config(64), "float16", vt, True)]
    assert any(n.startswith("flash_bwd_dkdv[") and ",window,softcap]" in n for n in names)


def test_hot_signature_separates_windows():
    from cupy_attention.api import _signature

    class Arr:
        __module__ = "cupy"
        shape, strides, dtype = (1, 1, 4, 8), (64, 64, 16, 2), "float16"

        class device:
            id = 0

    a = Arr()
    keys = {_signature(a, a, a, False, None, "bhsd", "auto", False, w, c)
            for w, c in ((None, None), ((1, 0), None), ((True, 0), None), ((1, 0), 2.0),
                         ((1, 0), 2))}
    assert len(keys) == 5


# ---------------------------------------------------------------------------
# The backward registry (dispatch.choose_backward), device properties given


def test_choose_backward_order_and_errors():
    from cupy_attention.dispatch import BACKWARD_FAMILIES, choose_backward
    from cupy_attention.errors import UnsupportedError

    from helpers import problem_for, standin

    hopper_smem = 227 * 1024
    shape = dict(batch=1, heads_q=2, heads_kv=1, seqlen_q=64, seqlen_k=64, head_dim=128)
    assert list(BACKWARD_FAMILIES) == ["flash_wgmma", "flash_mma", "flash"]
    p16 = problem_for(dtype="float16", **shape)
    assert choose_backward(p16, "auto", 90, hopper_smem).name == "flash_wgmma"
    assert choose_backward(p16, "auto", 80, 163 * 1024).name == "flash_mma"
    p32 = problem_for(dtype="float32", **shape)
    assert choose_backward(p32, "auto", 90, hopper_smem).name == "flash"
    with pytest.raises(UnsupportedError, match="kernel='flash' or kernel='reference' runs it"):
        choose_backward(p32, "flash_mma", 90, hopper_smem)
    masked = problem_for(dtype="float16", mask=standin((1, 1, 64, 64), "bool"), **shape)
    assert choose_backward(masked, "auto", 90, hopper_smem).name == "flash"
    with pytest.raises(UnsupportedError, match="dense mask"):
        choose_backward(masked, "flash_wgmma", 90, hopper_smem)
