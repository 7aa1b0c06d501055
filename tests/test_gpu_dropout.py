"""GPU: attention dropout on flash_mma and flash_wgmma (Hopper), forward and backward,
against float64 with TESTING.md's rule. The references draw the keep mask from the
host's Philox stream (cupy_attention.dropout.keep_mask), so a kernel whose draw
differs by one bit fails the comparison; the same-precision ``same`` is
helpers.plain_attention / plain_backward with the same mask. The mask tests read
the dropped elements off the kernels themselves (V, or dout, one-hot: an output
element is exactly 0 where its probability was dropped) and compare them with
keep_mask bit for bit, so every family drops the same elements for the same seed.

    python -m pytest -q tests/test_gpu_dropout.py
"""

from __future__ import annotations

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention import dropout
from cupy_attention.dispatch import FAMILIES

from helpers import (as_float, check_attention, make_qkv, np_dtype, plain_attention,
                     plain_backward, problem_for, seed_for, tolerance)

pytestmark = pytest.mark.gpu

# (B, Hq, Hkv, Sq, Sk, D, causal): head dims of every tile row (64, 96 narrowed, 128
# narrowed, 256), GQA, Sq != Sk both ways, lengths that are not multiples of 16.
CASES = [(2, 4, 2, 200, 200, 64, True), (1, 4, 4, 77, 130, 96, False),
         (2, 8, 2, 150, 150, 128, True), (1, 2, 1, 130, 61, 256, False),
         (1, 4, 1, 33, 300, 128, False)]
DTYPES = ("float16", "bfloat16")
KERNELS = ("flash_mma", "flash_wgmma")   # flash_wgmma: compute capability 9.0 only


def _id(c, dtype):
    return f"B{c[0]}-{c[1]}/{c[2]}-Sq{c[3]}-Sk{c[4]}-D{c[5]}-{'causal' if c[6] else 'full'}-{dtype}"


def _inputs(c, dtype, what):
    import cupy

    B, Hq, Hkv, Sq, Sk, D, _ = c
    q, k, v, _ = make_qkv(cupy, seed_for("dropout", what, *c, dtype), batch=B, heads_q=Hq,
                          heads_kv=Hkv, seqlen_q=Sq, seqlen_k=Sk, head_dim=D, dtype=dtype)
    return q, k, v


def _problem(c, dtype):
    B, Hq, Hkv, Sq, Sk, D, causal = c
    return problem_for(batch=B, heads_q=Hq, heads_kv=Hkv, seqlen_q=Sq, seqlen_k=Sk, head_dim=D,
                       dtype=dtype, causal=causal)


def _skip_unless_forward(kernel, c, dtype, cc):
    reason = FAMILIES[kernel].check(_problem(c, dtype), cc)
    if reason is not None:
        pytest.skip(reason)


def _skip_unless_backward(kernel, c, dtype, cc):
    import cupy

    from cupy_attention import device
    from cupy_attention.dispatch import BACKWARD_FAMILIES

    smem = device.max_shared_per_block(cupy.cuda.runtime.getDevice())
    reason = BACKWARD_FAMILIES[kernel].check(_problem(c, dtype), cc, smem)
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", CASES, ids=lambda c: _id(c, ""))
def test_forward(c, dtype, p, kernel, device_cc):
    _skip_unless_forward(kernel, c, dtype, device_cc)
    q, k, v = _inputs(c, dtype, "fwd")
    drop = (p, (7 << 32) + 123, 9)
    out, lse = ca.attention(q, k, v, causal=c[6], return_lse=True, kernel=kernel, dropout_p=p,
                            dropout_seed=drop[1], dropout_offset=drop[2])
    ref, ref_lse = plain_attention(q, k, v, causal=c[6], dropout=drop)
    same, same_lse = plain_attention(q, k, v, causal=c[6], dropout=drop, precision=dtype)
    check_attention(as_float(out), ref, same, dtype, lse=lse.astype(np.float64),
                    ref_lse=ref_lse, same_lse=same_lse)


@pytest.mark.parametrize("kernel", KERNELS)
def test_forward_repeats_bitwise_and_streams_differ(kernel, device_cc):
    import cupy

    c = CASES[0]
    _skip_unless_forward(kernel, c, "bfloat16", device_cc)
    q, k, v = _inputs(c, "bfloat16", "repeat")
    run = lambda off: ca.attention(q, k, v, causal=True, kernel=kernel,  # noqa: E731
                                   dropout_p=0.3, dropout_seed=5,
                                   dropout_offset=off).view(cupy.uint16)
    a, b, other = run(1), run(1), run(2)
    assert bool((a == b).all())
    assert not bool((a == other).all())


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", CASES, ids=lambda c: _id(c, ""))
def test_backward(c, dtype, deterministic, kernel, device_cc):
    import cupy

    _skip_unless_forward(kernel, c, dtype, device_cc)
    _skip_unless_backward(kernel, c, dtype, device_cc)
    q, k, v = _inputs(c, dtype, "bwd")
    drop = dict(dropout_p=0.2, dropout_seed=31337, dropout_offset=4)
    out, lse = ca.attention(q, k, v, causal=c[6], return_lse=True, kernel=kernel, **drop)
    dout, _, _ = _inputs(c, dtype, "dout")
    dout = cupy.ascontiguousarray(dout)
    grads = ca.attention_backward(dout, q, k, v, out, lse, causal=c[6], kernel=kernel,
                                  deterministic=deterministic, **drop)
    key = (0.2, 31337, 4)
    refs = plain_backward(dout, q, k, v, causal=c[6], dropout=key)
    sames = plain_backward(dout, q, k, v, causal=c[6], dropout=key, precision=dtype)
    for name, g, r, s in zip(("dq", "dk", "dv"), grads, refs, sames):
        tolerance(as_float(g), r, s, dtype, name, factor=3.0)


# ---------------------------------------------------------------------------
# The dropped elements, read off the kernels

# (B, Hq = Hkv, Sq, Sk, D, causal): causal Sq that are not multiples of BLOCK_M
# (flash_wgmma shifts its query blocks: by 64 at (200, 200, D = 64); by 111 at (145,
# 245, D = 128) without dropout, so by 0 with it), keys past one and two key tiles,
# D = 160 (two consumers with dropout) and 256 (the wide backward), Sq > Sk (rows
# that see nothing).
MASK_CASES = [(1, 2, 200, 200, 64, True), (1, 2, 145, 245, 128, True),
              (2, 2, 130, 300, 128, False), (1, 3, 150, 90, 256, True),
              (1, 2, 77, 130, 96, False), (1, 2, 100, 170, 160, False)]
MASK_DROP = (0.5, (3 << 40) + 77, 12)


def _mask_inputs(c, what):
    """q and k small (every probability well above 0), and the host's expected
    nonzero pattern: keep_mask within the causal band, [B, H, Sq, Sk]."""
    import cupy

    B, H, Sq, Sk, D, causal = c
    q, k, _, _ = make_qkv(cupy, seed_for("dropout-mask", what, *c), batch=B, heads_q=H,
                          heads_kv=H, seqlen_q=Sq, seqlen_k=Sk, head_dim=D, dtype="bfloat16",
                          magnitude=0.1)
    want = dropout.keep_mask(MASK_DROP[1], MASK_DROP[2], B, H, Sq, Sk, MASK_DROP[0])
    if causal:
        want &= np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + Sk - Sq
    return q, k, want


def _one_hot(rows: int, start: int, D: int, B: int, H: int):
    """[B, H, rows, D] bfloat16: 1 at (start + c, c) for c < D, 0 elsewhere."""
    import cupy

    x = cupy.zeros((B, H, rows, D), dtype=cupy.uint16)
    n = min(D, rows - start)
    x[:, :, start + cupy.arange(n), cupy.arange(n)] = 0x3F80   # bfloat16 1.0
    return x.view(np_dtype("bfloat16"))


def _c7(c):
    B, H, Sq, Sk, D, causal = c
    return (B, H, H, Sq, Sk, D, causal)


def _forward_pattern(kernel, c, q, k):
    """out != 0 of V one-hot on each window of D keys: [B, H, Sq, Sk]."""
    B, H, Sq, Sk, D, causal = c
    got = np.zeros((B, H, Sq, Sk), dtype=bool)
    p, seed, offset = MASK_DROP
    for start in range(0, Sk, D):
        v = _one_hot(Sk, start, D, B, H)
        out = ca.attention(q, k, v, causal=causal, kernel=kernel, dropout_p=p,
                           dropout_seed=seed, dropout_offset=offset)
        n = min(D, Sk - start)
        got[..., start:start + n] = (as_float(out)[..., :n] != 0).get()
    return got


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("c", MASK_CASES, ids=str)
def test_forward_drops_keep_mask_bitwise(c, kernel, device_cc):
    """V one-hot on keys start..start + D - 1: out[i, col] = P[i, start + col] * fac,
    exactly 0 where the kernel dropped (or masked) it; the pattern is keep_mask's."""
    _skip_unless_forward(kernel, _c7(c), "bfloat16", device_cc)
    q, k, want = _mask_inputs(c, "fwd")
    got = _forward_pattern(kernel, c, q, k)
    assert np.array_equal(got, want), f"{int((got != want).sum())} elements differ"


def test_families_drop_the_same_elements(device_cc):
    """flash_mma and flash_wgmma, same seed and offset: the same dropped elements."""
    c = MASK_CASES[0]
    for kernel in KERNELS:
        _skip_unless_forward(kernel, _c7(c), "bfloat16", device_cc)
    q, k, _ = _mask_inputs(c, "families")
    patterns = [_forward_pattern(kernel, c, q, k) for kernel in KERNELS]
    assert np.array_equal(patterns[0], patterns[1])


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("c", MASK_CASES, ids=str)
def test_backward_drops_keep_mask_bitwise(c, deterministic, kernel, device_cc):
    """dout one-hot on queries start..start + D - 1: dV[j, col] = P[start + col, j] *
    fac (MHA: one query head per KV head), exactly 0 where the backward dropped (or
    masked) it; the pattern is keep_mask's, transposed in the kernel (S^T)."""
    _skip_unless_forward(kernel, _c7(c), "bfloat16", device_cc)
    _skip_unless_backward(kernel, _c7(c), "bfloat16", device_cc)
    B, H, Sq, Sk, D, causal = c
    import cupy

    q, k, want = _mask_inputs(c, "bwd")
    p, seed, offset = MASK_DROP
    drop = dict(dropout_p=p, dropout_seed=seed, dropout_offset=offset)
    _, _, v, _ = make_qkv(cupy, seed_for("dropout-mask-v", *c), batch=B, heads_q=H,
                          heads_kv=H, seqlen_q=Sq, seqlen_k=Sk, head_dim=D, dtype="bfloat16")
    out, lse = ca.attention(q, k, v, causal=causal, return_lse=True, kernel=kernel, **drop)
    got = np.zeros((B, H, Sq, Sk), dtype=bool)
    for start in range(0, Sq, D):
        dout = _one_hot(Sq, start, D, B, H)
        _, _, dv = ca.attention_backward(dout, q, k, v, out, lse, causal=causal, kernel=kernel,
                                         deterministic=deterministic, **drop)
        n = min(D, Sq - start)
        got[:, :, start:start + n, :] = (as_float(dv)[..., :n] != 0).get().swapaxes(-1, -2)
    assert np.array_equal(got, want), f"{int((got != want).sum())} elements differ"


@pytest.mark.parametrize("kernel", KERNELS)
def test_unbiased_against_the_plain_kernel(kernel, device_cc):
    """Averaged over many streams, the dropped output approaches the plain one: the
    1 / (1 - p) scale and the keep fraction are right on the device."""
    import cupy

    c = (1, 2, 2, 64, 64, 64, False)
    _skip_unless_forward(kernel, c, "float16", device_cc)
    q, k, v = _inputs(c, "float16", "mean")
    plain = as_float(ca.attention(q, k, v, kernel=kernel))
    outs = cupy.stack([as_float(ca.attention(q, k, v, kernel=kernel, dropout_p=0.5,
                                             dropout_seed=1, dropout_offset=off))
                       for off in range(256)])
    sem = outs.std(axis=0) / np.sqrt(len(outs))
    assert bool((abs(outs.mean(axis=0) - plain) <= 5 * sem + 2e-3).all())


@pytest.mark.parametrize("kernel", KERNELS)
def test_packed_sequences(kernel, device_cc):
    """attention_varlen with dropout (RaggedSeqs) against the per-sequence float64
    reference, forward and backward (fp16; absolute bounds at these sizes)."""
    import cupy

    from cupy_attention.varlen import (attention_varlen_backward_reference,
                                       attention_varlen_reference)

    from helpers import normal

    _skip_unless_forward(kernel, (1, 4, 2, 130, 130, 64, True), "float16", device_cc)
    lq, lk = (70, 1, 130), (90, 17, 130)
    cu_q = cupy.asarray(np.concatenate([[0], np.cumsum(lq)]).astype(np.int32))
    cu_k = cupy.asarray(np.concatenate([[0], np.cumsum(lk)]).astype(np.int32))
    seed = seed_for("dropout-varlen")
    q, k, v, dout = (normal(cupy, seed + n, (sum(s), h, 64)).astype(cupy.float16)
                     for n, (s, h) in enumerate(((lq, 4), (lk, 2), (lk, 2), (lq, 4))))
    drop = dict(dropout_p=0.25, dropout_seed=2024, dropout_offset=6)
    out, lse = ca.attention_varlen(q, k, v, cu_q, cu_k, causal=True, return_lse=True,
                                   kernel=kernel, **drop)
    host = [x.get() for x in (q, k, v, cu_q, cu_k)]
    ref, _ = attention_varlen_reference(*host, causal=True, dropout=(0.25, 2024, 6))
    err = float(abs(out.get().astype(np.float64) - ref).max())
    assert err <= 4e-3, err
    grads = ca.attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, causal=True,
                                         kernel=kernel, **drop)
    refs = attention_varlen_backward_reference(dout.get(), *host, causal=True,
                                               dropout=(0.25, 2024, 6))
    for g, r in zip(grads, refs):
        scale = max(1.0, float(abs(r).max()))
        assert float(abs(g.get().astype(np.float64) - r).max()) <= 1e-2 * scale


def test_device_transposed_fragments_match_keep_mask(device_cc):
    """DropoutDraw::fragment_transposed on the device (each lane draws its forward
    fragment, the transposed flags come from two other lanes by shuffles) gives
    keep_mask's bits: warp w of a 16-warp block draws S^T block (query block w // 4,
    key block w % 4) of head row 3, bit nt * 4 + 2 r + e = key g + 8 r, query 8 nt + 2 t + e.
    So does transposed_values (one draw a lane, halves traded with lane ^ 4): word
    w = 2 nt + r's half e against the threshold."""
    import cupy

    from cupy_attention import device, jit

    seed, offset, p = (5 << 32) + 123, 9, 0.3
    src = ('#include "common/dropout.cuh"\n'
           'extern "C" __global__ void k(u32 k0, u32 k1, u32 offset, u32 thr, u32* out) {\n'
           '  const DropoutDraw d{k0, k1, offset, thr, 1.f};\n'
           '  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;\n'
           '  out[threadIdx.x] = d.fragment_transposed(3, w / 4, w % 4, lane / 4, lane % 4);\n'
           '  u32 v[4], bits = 0;\n'
           '  d.transposed_values(3, w / 4, w % 4, lane / 4, lane % 4, v);\n'
           '  for (int x = 0; x < 4; ++x)\n'
           '    bits |= (u32(d.kept_low(v[x])) | u32(d.kept_high(v[x])) << 1) << (2 * x);\n'
           '  out[blockDim.x + threadIdx.x] = bits;\n'
           '}\n')
    cubin, names, log = jit.compile_source(src, "transposed_probe.cu", ["k"],
                                           device.device_arch(cupy.cuda.runtime.getDevice()))
    assert cubin is not None, log
    module = cupy.cuda.function.Module()
    module.load(cubin)
    out = cupy.zeros(2 * 16 * 32, dtype=cupy.uint32)
    module.get_function(names["k"])(
        (1, 1, 1), (16 * 32, 1, 1),
        (np.uint32(seed & 0xFFFFFFFF), np.uint32(seed >> 32), np.uint32(offset),
         np.uint32(dropout.threshold(p)), out))
    got, from_values = out.get().reshape(2, -1)
    keep = dropout.keep_mask(seed, offset, 1, 4, 64, 64, p)[0, 3]   # [query, key]
    want = np.zeros_like(got)
    for x in range(16 * 32):
        w, lane = divmod(x, 32)
        g, t = divmod(lane, 4)
        for nt in range(2):
            for r in range(2):
                for e in range(2):
                    i, j = 16 * (w // 4) + 8 * nt + 2 * t + e, 16 * (w % 4) + g + 8 * r
                    want[x] |= np.uint32(int(keep[i, j])) << np.uint32(nt * 4 + 2 * r + e)
    assert np.array_equal(got, want), f"{int((got != want).sum())} of {got.size} lanes differ"
    assert np.array_equal(from_values, want), \
        f"transposed_values: {int((from_values != want).sum())} of {got.size} lanes differ"
