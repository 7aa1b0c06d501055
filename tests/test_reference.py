"""The float64 host reference (cupy_attention.reference) against a textbook
per-row softmax written with Python floats, on small shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cupy_attention.reference import attention_reference

from helpers import plain_attention


def textbook(q, k, v, *, causal=False, scale=None, mask=None):
    """Row by row: softmax over the attended keys, Python floats, layout bhsd."""
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    m = None if mask is None else np.broadcast_to(mask, (B, Hq, Sq, Sk))
    out = np.zeros((B, Hq, Sq, D))
    lse = np.full((B, Hq, Sq), -math.inf)
    for b in range(B):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            for i in range(Sq):
                scores = []
                for j in range(Sk):
                    if causal and j > i + Sk - Sq:
                        continue
                    s = sum(float(q[b, h, i, d]) * float(k[b, hk, j, d]) for d in range(D)) * scale
                    if m is not None:
                        if m.dtype == np.bool_:
                            if not m[b, h, i, j]:
                                continue
                        else:
                            if m[b, h, i, j] == -math.inf:
                                continue
                            s += float(m[b, h, i, j])
                    scores.append((j, s))
                if not scores:
                    continue
                top = max(s for _, s in scores)
                weights = [(j, math.exp(s - top)) for j, s in scores]
                total = sum(w for _, w in weights)
                lse[b, h, i] = top + math.log(total)
                for d in range(D):
                    out[b, h, i, d] = sum(w * float(v[b, hk, j, d]) for j, w in weights) / total
    return out, lse


def qkv(seed, B, Hq, Hkv, Sq, Sk, D, scale=1.0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, Sq, D)) * scale
    k = rng.standard_normal((B, Hkv, Sk, D)) * scale
    v = rng.standard_normal((B, Hkv, Sk, D))
    return q, k, v


def assert_matches(got, want, tol=1e-12):
    out, lse = got
    w_out, w_lse = want
    np.testing.assert_allclose(out, w_out, rtol=tol, atol=tol)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(w_lse))
    fin = np.isfinite(w_lse)
    np.testing.assert_allclose(lse[fin], w_lse[fin], rtol=tol, atol=tol)


CASES = [
    dict(B=1, Hq=1, Hkv=1, Sq=1, Sk=1, D=1),
    dict(B=2, Hq=2, Hkv=2, Sq=4, Sk=6, D=3),
    dict(B=1, Hq=4, Hkv=2, Sq=5, Sk=3, D=4),      # GQA
    dict(B=1, Hq=3, Hkv=1, Sq=3, Sk=7, D=2),      # MQA
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{B}H{Hq}x{Hkv}S{Sq}x{Sk}D{D}".format(**c))
@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_textbook(case, causal):
    q, k, v = qkv(1, case["B"], case["Hq"], case["Hkv"], case["Sq"], case["Sk"], case["D"])
    assert_matches(attention_reference(q, k, v, causal=causal), textbook(q, k, v, causal=causal))


@pytest.mark.parametrize("Sq,Sk", [(3, 7), (7, 3), (5, 5), (1, 4), (4, 1)])
def test_causal_is_bottom_right(Sq, Sk):
    """Query i sees keys j <= i + Sk - Sq; with Sq > Sk the first Sq - Sk rows see nothing."""
    q, k, v = qkv(2, 1, 2, 2, Sq, Sk, 4)
    out, lse = attention_reference(q, k, v, causal=True)
    for i in range(Sq):
        last = i + Sk - Sq                       # last visible key
        if last < 0:
            assert (out[:, :, i] == 0).all() and np.isneginf(lse[:, :, i]).all()
            continue
        o_i, l_i = attention_reference(q[:, :, i:i + 1], k[:, :, :last + 1], v[:, :, :last + 1])
        np.testing.assert_allclose(out[:, :, i:i + 1], o_i, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse[:, :, i:i + 1], l_i, rtol=1e-12, atol=1e-12)
    assert_matches((out, lse), textbook(q, k, v, causal=True))


def test_gqa_reads_kv_head_h_over_group():
    q, k, v = qkv(3, 2, 6, 2, 4, 5, 3)
    out, lse = attention_reference(q, k, v)
    for h in range(6):
        o_h, l_h = attention_reference(q[:, h:h + 1], k[:, h // 3:h // 3 + 1], v[:, h // 3:h // 3 + 1])
        np.testing.assert_allclose(out[:, h:h + 1], o_h, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse[:, h:h + 1], l_h, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mask_shape", [(2, 2, 4, 6), (1, 1, 4, 6), (6,), (4, 1), (2, 1, 1, 6)])
def test_bool_mask(mask_shape):
    q, k, v = qkv(4, 2, 2, 1, 4, 6, 3)
    mask = np.random.default_rng(5).random(mask_shape) > 0.4
    assert_matches(attention_reference(q, k, v, mask=mask), textbook(q, k, v, mask=mask))


def test_additive_mask_with_minus_inf():
    q, k, v = qkv(6, 1, 2, 2, 5, 4, 3)
    rng = np.random.default_rng(7)
    bias = rng.standard_normal((1, 2, 5, 4)) * 3
    bias[rng.random(bias.shape) < 0.3] = -np.inf
    bias[0, 1, 2] = -np.inf                     # one fully masked row
    got = attention_reference(q, k, v, mask=bias, causal=True)
    assert_matches(got, textbook(q, k, v, mask=bias, causal=True))
    assert (got[0][0, 1, 2] == 0).all() and np.isneginf(got[1][0, 1, 2])


def test_fully_masked_rows_give_zero_and_minus_inf():
    q, k, v = qkv(8, 1, 2, 2, 6, 4, 5)
    mask = np.ones((6, 4), dtype=bool)
    mask[3] = False
    for kwargs in (dict(causal=True), dict(mask=mask)):
        out, lse = attention_reference(q, k, v, **kwargs)
        dead = [0, 1] if kwargs.get("causal") else [3]    # causal Sq=6 > Sk=4: rows 0, 1
        for i in dead:
            assert (out[:, :, i] == 0).all() and np.isneginf(lse[:, :, i]).all()
        assert not np.isnan(out).any() and not np.isnan(lse).any()
        alive = [i for i in range(6) if i not in dead]
        assert np.isfinite(lse[:, :, alive]).all() and (np.abs(out[:, :, alive]) > 0).any()


def test_nan_in_masked_kv_does_not_leak():
    q, k, v = qkv(9, 1, 2, 2, 5, 5, 4)
    k_bad, v_bad = k.copy(), v.copy()
    k_bad[:, :, 4] = np.nan          # key 4 is seen only by query 4 under causal
    v_bad[:, :, 3] = np.inf          # value 3 is seen by queries 3 and 4
    out, lse = attention_reference(q, k_bad, v_bad, causal=True)
    clean, clean_lse = attention_reference(q, k, v, causal=True)
    np.testing.assert_allclose(out[:, :, :3], clean[:, :, :3], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse[:, :, :4], clean_lse[:, :, :4], rtol=1e-12, atol=1e-12)
    # Attended non-finite values propagate.
    assert np.isnan(out[:, :, 4]).all() and np.isnan(lse[:, :, 4]).all()
    assert not np.isfinite(out[:, :, 3]).any()
    # The same through a boolean mask: NaN in keys nobody attends stays out.
    mask = np.ones(5, dtype=bool)
    mask[[3, 4]] = False
    out_m, _ = attention_reference(q, k_bad, v_bad, mask=mask)
    want, _ = attention_reference(q, k[:, :, :3], v[:, :, :3])
    np.testing.assert_allclose(out_m, want, rtol=1e-12, atol=1e-12)


def test_nan_in_attended_query_propagates_to_its_row_only():
    q, k, v = qkv(10, 1, 1, 1, 3, 4, 2)
    q[0, 0, 1, 0] = np.nan
    out, lse = attention_reference(q, k, v)
    assert np.isnan(out[0, 0, 1]).all() and np.isnan(lse[0, 0, 1])
    assert np.isfinite(out[0, 0, [0, 2]]).all() and np.isfinite(lse[0, 0, [0, 2]]).all()


def test_very_negative_logits_are_not_zero_collapsed():
    """Scores near -1e5 (finite): softmax is shift invariant, so the result equals
    the one with the shift removed."""
    rng = np.random.default_rng(11)
    B, H, Sq, Sk, D = 1, 2, 4, 6, 3
    q, k, v = qkv(11, B, H, H, Sq, Sk, D)
    shift = -1e5 + rng.standard_normal((B, H, Sq, 1))
    out, lse = attention_reference(q, k, v, mask=np.broadcast_to(shift, (B, H, Sq, Sk)).copy())
    base, base_lse = attention_reference(q, k, v)
    np.testing.assert_allclose(out, base, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(lse, base_lse + shift[..., 0], rtol=1e-12)
    assert np.abs(out).max() > 0.1


def test_bshd_layout_is_a_transpose():
    q, k, v = qkv(12, 2, 4, 2, 3, 5, 4)
    tr = lambda x: np.ascontiguousarray(x.swapaxes(1, 2))  # noqa: E731
    out, lse = attention_reference(tr(q), tr(k), tr(v), layout="bshd", causal=True)
    want, want_lse = attention_reference(q, k, v, causal=True)
    np.testing.assert_allclose(out, tr(want), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_test_suites_plain_implementation_agrees(causal):
    """The GPU tests' float64 plain implementation (tests/helpers.py) is a third
    independent implementation; it must agree with the textbook too."""
    q, k, v = qkv(13, 2, 4, 2, 5, 7, 3)
    mask = np.random.default_rng(14).random((2, 1, 5, 7)) > 0.3
    got = plain_attention(q, k, v, causal=causal, mask=mask)
    assert_matches(got, textbook(q, k, v, causal=causal, mask=mask))
