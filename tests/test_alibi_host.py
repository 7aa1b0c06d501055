"""ALiBi on the host: argument checking, the Problem and its variant, the tile
configs of variants that transform the score, and the float64 reference against a
direct formula (forward, and the backward against finite differences)."""

from __future__ import annotations


import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention.errors import DTypeError, ShapeError, UnsupportedError
from cupy_attention.families import flash_mma_bwd, flash_wgmma
from cupy_attention.problem import (ALIBI_MAX_SEQLEN, check_alibi, check_alibi_length, describe,
                                    validate)
from cupy_attention.reference import (alibi_bias, attention_backward_reference,
                                      attention_reference)
from cupy_attention.variant import Variant

from test_variants_host import direct as variants_direct

SLOPES = np.array([0.5, 0.125], dtype=np.float32)


def qkv(seed, B=1, Hq=2, Hkv=1, Sq=7, Sk=9, D=5):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, Hq, Sq, D)), rng.standard_normal((B, Hkv, Sk, D)),
            rng.standard_normal((B, Hkv, Sk, D)))


def direct(q, k, v, slopes, *, causal=False, softcap=None):
    """test_variants_host's row-by-row formula with these slopes."""
    return variants_direct(q, k, v, causal=causal, softcap=softcap, alibi_slopes=slopes)


@pytest.mark.parametrize("Sq,Sk", [(7, 9), (9, 7), (8, 8)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_reference_matches_direct(Sq, Sk, causal, softcap):
    q, k, v = qkv(1, B=2, Sq=Sq, Sk=Sk)
    slopes = np.stack([SLOPES, SLOPES * 3])            # [B, Hq]
    out, lse = attention_reference(q, k, v, causal=causal, softcap=softcap, alibi_slopes=slopes)
    want, want_lse = direct(q, k, v, slopes, causal=causal, softcap=softcap)
    np.testing.assert_allclose(out, want, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, atol=1e-12)


def test_bias_is_bottom_right_aligned():
    bias = alibi_bias(np.array([1.0]), 1, 1, 2, 4)[0, 0]
    # row i sits at key i + Sk - Sq = i + 2: its own key has bias 0
    np.testing.assert_array_equal(bias, [[-2, -1, 0, -1], [-3, -2, -1, 0]])


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_backward_reference_matches_finite_differences(softcap):
    q, k, v = qkv(2, Sq=4, Sk=6, D=3)
    dout = np.random.default_rng(3).standard_normal(q.shape)
    kw = dict(causal=True, softcap=softcap, alibi_slopes=SLOPES)
    grads = attention_backward_reference(dout, q, k, v, **kw)
    eps = 1e-6
    for x, g in zip((q, k, v), grads):
        idx = (0, 0, 1, 2)
        plus, minus = x.copy(), x.copy()
        plus[idx] += eps
        minus[idx] -= eps
        args = {id(q): 0, id(k): 1, id(v): 2}[id(x)]
        fp = [q, k, v]
        fp[args] = plus
        fm = [q, k, v]
        fm[args] = minus
        num = ((attention_reference(*fp, **kw)[0] - attention_reference(*fm, **kw)[0]) * dout
               ).sum() / (2 * eps)
        assert abs(num - g[idx]) < 1e-6 * max(1.0, abs(num))


# ---------------------------------------------------------------------------
# Arguments


def _validate(slopes, **kw):
    q, k, v = qkv(0, B=2)
    return validate(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                    alibi_slopes=slopes, **kw)


def test_problem_and_variant():
    p = _validate(SLOPES, causal=True)
    assert p.alibi and p.variant.dense == "alibi" and p.variant.transforms
    assert "AlibiBias" in p.variant.cpp() and p.variant.suffix() == ",causal,alibi"
    assert not p.variant.reads_mask
    assert not _validate(None).alibi
    assert _validate(np.stack([SLOPES, SLOPES])).alibi


@pytest.mark.parametrize("slopes,error,words", [
    (np.ones(2, dtype=np.float64), DTypeError, "float32"),
    (np.ones(3, dtype=np.float32), ShapeError, "[Hq]"),
    (np.ones((3, 2), dtype=np.float32), ShapeError, "[B, Hq]"),
    (np.ones((2, 2, 1), dtype=np.float32), ShapeError, "alibi_slopes"),
    (np.ones((2, 4), dtype=np.float32)[:, ::2], Exception, "unit stride"),
])
def test_bad_slopes(slopes, error, words):
    with pytest.raises(error, match=None) as exc:
        _validate(slopes)
    assert words in str(exc.value)


def test_slopes_with_mask_refused():
    with pytest.raises(UnsupportedError, match="mask"):
        _validate(SLOPES, mask=np.ones((1, 1, 7, 9), dtype=bool))


def test_sequences_past_the_exact_range_refused():
    qi = describe(np.zeros((1, 2, 1, 4), dtype=np.float32), "q")
    assert check_alibi(SLOPES, qi, 1, 2)
    check_alibi_length(True, 1, ALIBI_MAX_SEQLEN - 1)
    check_alibi_length(False, 1, ALIBI_MAX_SEQLEN)
    with pytest.raises(ShapeError, match="shorter than"):
        check_alibi_length(True, 1, ALIBI_MAX_SEQLEN)


def test_reference_kernel_takes_slopes():
    q, k, v = (x.astype(np.float32) for x in qkv(4))
    out = ca.attention(q, k, v, causal=True, alibi_slopes=SLOPES, kernel="reference")
    want, _ = direct(*qkv(4), SLOPES, causal=True)
    np.testing.assert_allclose(out, want, atol=1e-5)


def test_decode_refuses_alibi():
    from cupy_attention.dispatch import FAMILIES

    q, k, v = (x.astype(np.float16) for x in qkv(0, Sq=1, Sk=64, D=64, Hq=2, Hkv=1))
    p = validate(q, k, v, alibi_slopes=SLOPES)
    assert "ALiBi" in FAMILIES["decode"].check(p, 90)


# ---------------------------------------------------------------------------
# Tile configs: variants that transform the score fit TRANSFORM_PAYLOAD_REGS


@pytest.mark.parametrize("head_dim", range(64, 257, 8))
@pytest.mark.parametrize("causal", [False, True])
def test_transform_configs_fit(head_dim, causal):
    cfg = flash_wgmma.tiles_for(head_dim, causal, transforms=True)
    consumers, block_n, _, _ = cfg
    assert flash_wgmma.smem_bytes(head_dim, cfg) <= flash_wgmma.SMEM_LIMIT
    assert (flash_wgmma.payload(head_dim, consumers, block_n)
            <= flash_wgmma.TRANSFORM_PAYLOAD_REGS[consumers] or block_n == 64)
    plain = flash_wgmma.tiles_for(head_dim, causal)
    assert block_n <= plain[1] or consumers < plain[0]
    vt = Variant(causal, dense="alibi")
    assert f"BN={block_n}" in flash_wgmma.spec(head_dim, "bfloat16", vt).name
    # what `cupy-attention tune` times for such a variant stays within the same rule
    cands = flash_wgmma.candidates(head_dim, causal, transforms=True)
    assert cands[0] == cfg
    assert all(flash_wgmma.config_fits(head_dim, c, transforms=True) for c in cands[1:])


def test_flash_mma_backward_narrows_softcap_with_alibi():
    """Softcap with ALiBi takes flash_mma_bwd's narrower tiles (their table rows
    spilled): never 128 queries, 32 from D_PAD = 112; the dQ kernel's 32-key tiles from
    D = 96; the table's rows elsewhere."""
    assert flash_mma_bwd.two_transforms(Variant(True, softcap=30.0, dense="alibi"))
    assert not flash_mma_bwd.two_transforms(Variant(True, softcap=30.0))
    assert not flash_mma_bwd.two_transforms(Variant(True, dense="alibi"))
    for d in range(1, 257):
        for limit in (227 * 1024, 163 * 1024):
            plain = flash_mma_bwd.config(d, limit)
            both = flash_mma_bwd.config(d, limit, two_transforms=True)
            assert both is not None and max(both.smem, both.dq_smem) <= limit
            d_pad = -(-d // 16) * 16
            assert (both.dq_block_n == 32) == (d >= 96)
            if d_pad in (112, 128):
                assert both.block_m == 32
            elif plain.block_m == 128:
                assert both.block_m == 64 and both.block_n == plain.block_n
            else:
                assert (both.block_m, both.block_n) == (plain.block_m, plain.block_n)


# ---------------------------------------------------------------------------
# Packed sequences


def test_varlen_reference_measures_within_each_sequence():
    from cupy_attention.varlen import attention_varlen_reference, validate_varlen

    rng = np.random.default_rng(5)
    lens = [5, 0, 7]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    q, k, v = (rng.standard_normal((sum(lens), 2, 4)) for _ in range(3))
    slopes = np.stack([SLOPES, SLOPES * 2, SLOPES * 4]).astype(np.float32)   # [B, Hq]
    out, lse = attention_varlen_reference(q, k, v, cu, cu, causal=True, alibi_slopes=slopes)
    for b, (a, e) in enumerate(zip(cu[:-1], cu[1:])):
        if a == e:
            continue
        want, want_lse = direct(q[None, a:e].transpose(0, 2, 1, 3), k[None, a:e].transpose(0, 2, 1, 3),
                                v[None, a:e].transpose(0, 2, 1, 3), slopes[b], causal=True)
        np.testing.assert_allclose(out[a:e], want[0].transpose(1, 0, 2), atol=1e-12)
        np.testing.assert_allclose(lse[:, a:e], want_lse[0], atol=1e-12)
    p = validate_varlen(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), cu, cu,
                        alibi_slopes=slopes)
    assert p.alibi and p.variant.cpp().endswith("AlibiBias, RaggedSeqs>")
    with pytest.raises(ShapeError, match=r"\[B, Hq\]"):
        validate_varlen(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), cu, cu,
                        alibi_slopes=np.ones((2, 2), dtype=np.float32))
