"""Packed sequences on the CPU: validation (typed errors naming the argument), the
float64 reference against the dense one, and the Variant's ragged policy."""

from __future__ import annotations

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention.reference import attention_backward_reference, attention_reference
from cupy_attention.variant import Variant
from cupy_attention.varlen import (attention_varlen_backward_reference,
                                   attention_varlen_reference, validate_varlen)


def _qkv(total_q=10, total_k=12, hq=4, hkv=2, d=16, dtype=np.float16, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((total_q, hq, d)).astype(dtype),
            rng.standard_normal((total_k, hkv, d)).astype(dtype),
            rng.standard_normal((total_k, hkv, d)).astype(dtype))


CU_Q = np.array([0, 3, 3, 10], np.int32)
CU_K = np.array([0, 5, 8, 12], np.int32)


@pytest.mark.parametrize("kw, err, match", [
    (dict(q=np.zeros((10, 4), np.float16)), ca.ShapeError, "q must have rank 3"),
    (dict(cu_seqlens_q=CU_Q.astype(np.int64)), ca.DTypeError, "cu_seqlens_q must have dtype int32"),
    (dict(cu_seqlens_q=CU_Q[None]), ca.ShapeError, "cu_seqlens_q must be a 1-D"),
    (dict(cu_seqlens_k=CU_K[:3]), ca.ShapeError, "same length B \\+ 1"),
    (dict(cu_seqlens_q=np.array([0, 3, 2, 10], np.int32)), ca.ShapeError, "must not decrease"),
    (dict(cu_seqlens_k=np.array([1, 5, 8, 12], np.int32)), ca.ShapeError, "must start at 0"),
    (dict(cu_seqlens_q=np.array([0, 3, 3, 9], np.int32)), ca.ShapeError, "last entry"),
    (dict(max_seqlen_q=-1), ca.DTypeError, "max_seqlen_q"),
    (dict(window=(-3, 0)), ca.ShapeError, "window left"),
    (dict(softcap=0.0), ca.ShapeError, "softcap"),
])
def test_typed_errors(kw, err, match):
    q, k, v = _qkv()
    args = dict(q=q, k=k, v=v, cu_seqlens_q=CU_Q, cu_seqlens_k=CU_K)
    extra = {n: kw.pop(n) for n in list(kw) if n in ("max_seqlen_q", "window", "softcap")}
    args.update(kw)
    with pytest.raises(err, match=match):
        ca.attention_varlen(args["q"], args["k"], args["v"], args["cu_seqlens_q"],
                            args["cu_seqlens_k"], kernel="reference", **extra)


@pytest.mark.parametrize("causal, window, softcap", [(False, None, None), (True, None, 20.0),
                                                     (False, (2, 1), None)])
def test_reference_matches_dense_per_sequence(causal, window, softcap):
    q, k, v = _qkv(seed=1)
    out, lse = attention_varlen_reference(q, k, v, CU_Q, CU_K, causal=causal, window=window,
                                          softcap=softcap)
    dout = np.random.default_rng(2).standard_normal(q.shape)
    grads = attention_varlen_backward_reference(dout, q, k, v, CU_Q, CU_K, causal=causal,
                                                window=window, softcap=softcap)
    for b in range(3):
        q0, q1, k0, k1 = CU_Q[b], CU_Q[b + 1], CU_K[b], CU_K[b + 1]
        if q1 == q0:
            continue
        o, l = attention_reference(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=causal,
                                   layout="bshd", window=window, softcap=softcap)
        np.testing.assert_allclose(out[q0:q1], o[0])
        np.testing.assert_array_equal(lse[:, q0:q1], l[0])
        g = attention_backward_reference(dout[None, q0:q1], q[None, q0:q1], k[None, k0:k1],
                                         v[None, k0:k1], causal=causal, layout="bshd",
                                         window=window, softcap=softcap)
        np.testing.assert_allclose(grads[0][q0:q1], g[0][0])
        np.testing.assert_allclose(grads[1][k0:k1], g[1][0])
    # a sequence with no query rows leaves its keys' gradients zero; causal with
    # Sq > Sk (sequence 2: 7 queries, 4 keys) leaves its first rows attending nothing
    if causal:
        assert np.isneginf(lse[:, 3:6]).all() and (out[3:6] == 0).all()


def test_problem_and_variant():
    q, k, v = _qkv()
    p = validate_varlen(q, k, v, CU_Q, CU_K, causal=True, window=(4, 0))
    assert (p.batch, p.seqlen_q, p.seqlen_k, p.layout, p.varlen) == (3, 10, 12, "thd", True)
    vt = p.variant
    assert vt.cpp() == "Variant<Band<true, true>, PlainLogits, NoDense, RaggedSeqs>"
    assert vt.suffix() == ",causal,window,varlen"
    # each sequence adds its own Sk - Sq: the params hold the band without it
    assert vt.band(10, 12) == (-4, 0)
    assert Variant(True).band(10, 12) == (0, 2)  # no lower bound: band_lo unread
    assert Variant(True).cpp() == "Variant<Band<false, true>, PlainLogits, NoDense>"


def test_families_that_decline():
    from cupy_attention.dispatch import FAMILIES, choose

    q, k, v = _qkv(d=64)
    p = validate_varlen(q, k, v, CU_Q, CU_K)
    takes = {n for n, f in FAMILIES.items() if f.check(p, 90) is None}
    assert takes == {"flash_mma", "flash_wgmma"}
    with pytest.raises(ca.UnsupportedError, match="no packed sequences"):
        choose(p, "flash", 90)


def test_packed_arrays_take_the_vector_path():
    """Rank-3 packed arrays: only the row and head strides decide 16-byte alignment
    (the head dim's unit stride does not), so they run the cp.async / TMA kernels."""
    from cupy_attention.families.flash_mma import strides_aligned

    q = np.zeros((100, 4, 128), np.float16)
    assert strides_aligned(128, [q, q[:, :2]])
    assert not strides_aligned(128, [np.zeros((100, 4, 132), np.float16)[..., :128]])
    assert strides_aligned(64, [np.zeros((2, 4, 100, 64), np.float16)])
