"""GPU: attention dropout on flash_mma, forward and backward, against float64 with
TESTING.md's rule. The references draw the keep mask from the host's Philox stream
(cupy_attention.dropout.keep_mask), so a kernel whose draw differs by one bit fails
the comparison; the same-precision ``same`` is helpers.plain_attention / plain_backward
with the same mask.

    python -m pytest -q tests/test_gpu_dropout.py
"""

from __future__ import annotations

import numpy as np
import pytest

import cupy_attention as ca

from helpers import (as_float, check_attention, make_qkv, plain_attention, plain_backward,
                     seed_for, tolerance)

pytestmark = pytest.mark.gpu

# (B, Hq, Hkv, Sq, Sk, D, causal): head dims of every tile row (64, 96 narrowed, 128
# narrowed, 256), GQA, Sq != Sk both ways, lengths that are not multiples of 16.
CASES = [(2, 4, 2, 200, 200, 64, True), (1, 4, 4, 77, 130, 96, False),
         (2, 8, 2, 150, 150, 128, True), (1, 2, 1, 130, 61, 256, False),
         (1, 4, 1, 33, 300, 128, False)]
DTYPES = ("float16", "bfloat16")


def _id(c, dtype):
    return f"B{c[0]}-{c[1]}/{c[2]}-Sq{c[3]}-Sk{c[4]}-D{c[5]}-{'causal' if c[6] else 'full'}-{dtype}"


def _inputs(c, dtype, what):
    import cupy

    B, Hq, Hkv, Sq, Sk, D, _ = c
    q, k, v, _ = make_qkv(cupy, seed_for("dropout", what, *c, dtype), batch=B, heads_q=Hq,
                          heads_kv=Hkv, seqlen_q=Sq, seqlen_k=Sk, head_dim=D, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", CASES, ids=lambda c: _id(c, ""))
def test_forward(c, dtype, p):
    q, k, v = _inputs(c, dtype, "fwd")
    drop = (p, (7 << 32) + 123, 9)
    out, lse = ca.attention(q, k, v, causal=c[6], return_lse=True, dropout_p=p,
                            dropout_seed=drop[1], dropout_offset=drop[2])
    ref, ref_lse = plain_attention(q, k, v, causal=c[6], dropout=drop)
    same, same_lse = plain_attention(q, k, v, causal=c[6], dropout=drop, precision=dtype)
    check_attention(as_float(out), ref, same, dtype, lse=lse.astype(np.float64),
                    ref_lse=ref_lse, same_lse=same_lse)


def test_forward_repeats_bitwise_and_streams_differ():
    import cupy

    c = CASES[0]
    q, k, v = _inputs(c, "bfloat16", "repeat")
    run = lambda off: ca.attention(q, k, v, causal=True, dropout_p=0.3,  # noqa: E731
                                   dropout_seed=5, dropout_offset=off).view(cupy.uint16)
    a, b, other = run(1), run(1), run(2)
    assert bool((a == b).all())
    assert not bool((a == other).all())


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", CASES, ids=lambda c: _id(c, ""))
def test_backward(c, dtype, deterministic):
    import cupy

    q, k, v = _inputs(c, dtype, "bwd")
    drop = dict(dropout_p=0.2, dropout_seed=31337, dropout_offset=4)
    out, lse = ca.attention(q, k, v, causal=c[6], return_lse=True, **drop)
    dout, _, _ = _inputs(c, dtype, "dout")
    dout = cupy.ascontiguousarray(dout)
    grads = ca.attention_backward(dout, q, k, v, out, lse, causal=c[6],
                                  deterministic=deterministic, **drop)
    key = (0.2, 31337, 4)
    refs = plain_backward(dout, q, k, v, causal=c[6], dropout=key)
    sames = plain_backward(dout, q, k, v, causal=c[6], dropout=key, precision=dtype)
    for name, g, r, s in zip(("dq", "dk", "dv"), grads, refs, sames):
        tolerance(as_float(g), r, s, dtype, name, factor=3.0)


def test_unbiased_against_the_plain_kernel():
    """Averaged over many streams, the dropped output approaches the plain one: the
    1 / (1 - p) scale and the keep fraction are right on the device."""
    import cupy

    c = (1, 2, 2, 64, 64, 64, False)
    q, k, v = _inputs(c, "float16", "mean")
    plain = as_float(ca.attention(q, k, v))
    outs = cupy.stack([as_float(ca.attention(q, k, v, dropout_p=0.5, dropout_seed=1,
                                             dropout_offset=off)) for off in range(256)])
    sem = outs.std(axis=0) / np.sqrt(len(outs))
    assert bool((abs(outs.mean(axis=0) - plain) <= 5 * sem + 2e-3).all())


def test_packed_sequences():
    """attention_varlen with dropout (flash_mma's RaggedSeqs) against the per-sequence
    float64 reference, forward and backward (fp16; absolute bounds at these sizes)."""
    import cupy

    from cupy_attention.varlen import (attention_varlen_backward_reference,
                                       attention_varlen_reference)

    from helpers import normal

    lq, lk = (70, 1, 130), (90, 17, 130)
    cu_q = cupy.asarray(np.concatenate([[0], np.cumsum(lq)]).astype(np.int32))
    cu_k = cupy.asarray(np.concatenate([[0], np.cumsum(lk)]).astype(np.int32))
    seed = seed_for("dropout-varlen")
    q, k, v, dout = (normal(cupy, seed + n, (sum(s), h, 64)).astype(cupy.float16)
                     for n, (s, h) in enumerate(((lq, 4), (lk, 2), (lk, 2), (lq, 4))))
    drop = dict(dropout_p=0.25, dropout_seed=2024, dropout_offset=6)
    out, lse = ca.attention_varlen(q, k, v, cu_q, cu_k, causal=True, return_lse=True, **drop)
    host = [x.get() for x in (q, k, v, cu_q, cu_k)]
    ref, _ = attention_varlen_reference(*host, causal=True, dropout=(0.25, 2024, 6))
    err = float(abs(out.get().astype(np.float64) - ref).max())
    assert err <= 4e-3, err
    grads = ca.attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, causal=True, **drop)
    refs = attention_varlen_backward_reference(dout.get(), *host, causal=True,
                                               dropout=(0.25, 2024, 6))
    for g, r in zip(grads, refs):
        scale = max(1.0, float(abs(r).max()))
        assert float(abs(g.get().astype(np.float64) - r).max()) <= 1e-2 * scale
