"""Sliding window, softcap and ALiBi on the device: every forward family (O and LSE) and
every backward family (dQ, dK, dV) against the float64 reference, with TESTING.md's
tolerance rule (``same``: a plain implementation in the kernel's precision, written
here independently of the kernels and of cupy_attention.reference).

The grid is sampled, not a product: each family runs every window of WINDOWS with
and without softcap; ALiBi (per-head slopes) is on for one of the two, alternating
from window to window, so it meets every window, softcap on and off, and causal;
head dim, (Sq, Sk), dtype, layout and KV heads rotate with the case index so every
value of each axis meets every family. (Sq, Sk) pairs with
Sq > Sk leave the first rows of the right-bounded windows no key at all (output 0,
LSE -inf, zero gradients), checked exactly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention.dispatch import FAMILIES
from cupy_attention.reference import attention_backward_reference, attention_reference

from helpers import (as_float, make_out, make_qkv, noise_floor, prewarm_calls, problem_for,
                     round_to, seed_for, to_bhsd, tolerance)

pytestmark = pytest.mark.gpu

# (causal, window): FlashAttention's window_size, -1 = unbounded
WINDOWS = [(True, (-1, -1)), (False, (128, 0)), (False, (64, 64)), (False, (0, 0)),
           (False, (300, -1))]
SOFTCAPS = [None, 30.0]
SHAPES = [(333, 517), (517, 333), (384, 384), (400, 150)]   # (Sq, Sk)
DTYPES = ("float16", "bfloat16")
LAYOUTS = ("bhsd", "bshd")
HKV = (4, 2, 1)                                              # Hq = 4: MHA, GQA, MQA
FWD_FAMILIES = ("naive", "tiled", "flash", "flash_mma", "flash_wgmma")
BWD_FAMILIES = ("flash", "flash_mma", "flash_wgmma")
HEAD_DIMS = {"flash_wgmma": (64, 128, 80, 256)}
OTHER_HEAD_DIMS = (64, 128, 72)
HEADS_Q = 4
ALIBI_SLOPES = np.float32(2.0) ** -np.arange(2, 2 + 2 * HEADS_Q, 2, dtype=np.float32)  # 1/4 .. 1/256


def _slopes(c):
    """The case's ALiBi slopes on the device ([Hq], or [B, Hq] when it says so), or None."""
    if not c.get("alibi"):
        return None
    import cupy

    s = ALIBI_SLOPES if c.get("batch", 1) == 1 else np.stack(
        [ALIBI_SLOPES * (b + 1) for b in range(c["batch"])])
    return cupy.asarray(s)


def _cases(families):
    out = []
    for fam in families:
        dims = HEAD_DIMS.get(fam, OTHER_HEAD_DIMS)
        for idx, ((causal, window), softcap) in enumerate(
                (w, c) for w in WINDOWS for c in SOFTCAPS):
            alibi = (idx // 2 + idx % 2) % 2 == 1
            out.append(pytest.param(dict(
                family=fam, causal=causal, window=window, softcap=softcap, alibi=alibi,
                head_dim=dims[idx % len(dims)], shape=SHAPES[(idx // 2 + idx) % len(SHAPES)],
                dtype=DTYPES[idx % 2], layout=LAYOUTS[(idx // 3) % 2], heads_kv=HKV[idx % 3],
                deterministic=idx % 4 == 3),
                id=f"{fam}-{'causal-' if causal else ''}w{window[0]}_{window[1]}"
                   f"-cap{softcap or 0:g}{'-alibi' if alibi else ''}-i{idx}"))
    return out


def _alibi_cases(families):
    """ALiBi with per-(batch, head) slopes [B, Hq] at B = 2, beside the sampled grid;
    cases 2-3 are long enough that whole key tiles lie on either side of the diagonal
    (where the kernels take the bias as a line in the key: AlibiBias::line)."""
    out = []
    cases = ((True, (333, 517)), (False, (517, 333)), (False, (1031, 777)), (True, (777, 1031)))
    for fam in families:
        dims = HEAD_DIMS.get(fam, OTHER_HEAD_DIMS)
        for idx, (causal, shape) in enumerate(cases):
            out.append(pytest.param(dict(
                family=fam, causal=causal, window=(-1, -1), softcap=None, alibi=True, batch=2,
                head_dim=dims[idx % len(dims)], shape=shape,
                dtype=DTYPES[idx % 2], layout=LAYOUTS[idx % 2], heads_kv=HKV[(idx + 1) % 3],
                deterministic=idx % 2 == 1), id=f"{fam}-alibi-batch-slopes-{idx}"))
    return out


def _own_keys_cases():
    """flash_wgmma's consumers each compute only the key tiles their own 64 rows see
    (Consumer::own_keys): bands whose edges fall inside a work tile at head dims of
    each tile shape (64: three consumers, BLOCK_N = 128; 80: 112; 160: 64; 256: two
    consumers, 64), long enough that a lower edge leaves whole key tiles below some
    consumers' rows and a causal diagonal whole tiles past others', Sq < Sk and
    Sq > Sk (rows before the diagonal see nothing)."""
    bands = ((True, (127, 0)), (False, (200, 0)), (True, (1023, 0)), (False, (70, 190)))
    shapes = ((1400, 1400), (700, 1100), (1100, 700))
    out = []
    for idx, d in enumerate((64, 80, 160, 256)):
        for jdx, (causal, window) in enumerate(bands):
            k = idx + jdx
            out.append(pytest.param(dict(
                family="flash_wgmma", causal=causal, window=window, softcap=30.0 if k % 4 == 3
                else None, alibi=False, head_dim=d, shape=shapes[k % 3], dtype=DTYPES[k % 2],
                layout=LAYOUTS[jdx % 2], heads_kv=HKV[k % 3], deterministic=False),
                id=f"flash_wgmma-own-keys-d{d}-{'causal-' if causal else ''}"
                   f"w{window[0]}_{window[1]}"))
    return out


# Softcap 30 on the backward at head dims and paths the sampled grid does not reach:
# (family, D, causal, ALiBi, deterministic). flash_mma with ALiBi at the head dims whose
# tiles the two transforms narrow (flash_mma_bwd.config's ``two_transforms``: D = 40
# and 64 leave the 128-query tiles, D = 112 and 120 take 32-query ones); flash_wgmma's
# P^T and gradient factor in one pass (p_grad_from_s) up to D = 112, at D = 120-128
# over fixed lengths in the atomic mode and in the wide kernel past D = 128, the
# ordered mode at D = 120 keeping the factor from log2 P (p_times_grad).
SOFTCAP_BWD_CASES = (
    ("flash_mma", 40, True, True, False), ("flash_mma", 64, False, True, True),
    ("flash_mma", 112, True, True, False), ("flash_mma", 120, False, True, True),
    ("flash_wgmma", 64, False, False, False), ("flash_wgmma", 96, True, True, True),
    ("flash_wgmma", 112, False, False, False), ("flash_wgmma", 120, True, True, True),
    ("flash_wgmma", 128, False, True, False), ("flash_wgmma", 160, True, True, False),
    ("flash_wgmma", 192, False, False, True))


def _softcap_bwd_cases():
    """SOFTCAP_BWD_CASES, shape, dtype, layout and KV heads rotating within a family."""
    out, seen = [], {}
    for fam, d, causal, alibi, det in SOFTCAP_BWD_CASES:
        seen[fam] = idx = seen.get(fam, -1) + 1
        out.append((fam, d, causal, alibi, det, idx))
    return [pytest.param(dict(
        family=fam, causal=causal, window=(-1, -1), softcap=30.0, alibi=alibi, head_dim=d,
        shape=SHAPES[idx % len(SHAPES)], dtype=DTYPES[idx % 2], layout=LAYOUTS[idx % 2],
        heads_kv=HKV[idx % 3], deterministic=det),
        id=f"{fam}-cap30{'-alibi' if alibi else ''}-d{d}{'-det' if det else ''}")
        for fam, d, causal, alibi, det, idx in out]


def _shape(c):
    sq, sk = c["shape"]
    return dict(batch=c.get("batch", 1), heads_q=HEADS_Q, heads_kv=c["heads_kv"], seqlen_q=sq,
                seqlen_k=sk,
                head_dim=c["head_dim"], dtype=c["dtype"], layout=c["layout"])


def _inputs(c, what):
    import cupy

    magnitude = 2.0 if c["softcap"] else 1.0   # scores up to ~10: the cap bends them
    q, k, v, _ = make_qkv(cupy, seed_for(what, c["family"], c["window"], c["softcap"],
                                         c["head_dim"]), magnitude=magnitude, **_shape(c))
    return q, k, v


def _band(sq, sk, causal, window):
    """keep[i, j]: written out from the convention, bottom-right aligned."""
    i = np.arange(sq)[:, None] + (sk - sq)
    j = np.arange(sk)[None, :]
    left, right = window
    keep = np.ones((sq, sk), dtype=bool)
    if causal:
        keep &= j <= i
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def _same(q, k, v, c, dout=None, out=None):
    """TESTING.md's ``same`` on the host: inputs rounded to the dtype, fp32 scores,
    softcap and softmax, P rounded to the dtype before P @ V, results rounded. With
    ``dout`` (and the forward's ``out``): the gradients instead, fp32 throughout."""
    dtype, layout = c["dtype"], c["layout"]
    f32 = np.float32
    q, k, v = (round_to(to_bhsd(as_float(x).get(), layout), dtype, np).astype(f32)
               for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kr, vr = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = f32(1.0 / math.sqrt(q.shape[-1]))
    raw = np.matmul(q, kr.swapaxes(-1, -2)) * scale
    s, t = raw, None
    if c["softcap"]:
        cap = f32(c["softcap"])
        t = np.tanh(raw / cap)
        s = cap * t
    sq, sk = q.shape[2], k.shape[2]
    slopes = _slopes(c)
    if slopes is not None:
        dist = np.abs(np.arange(sq)[:, None] + (sk - sq) - np.arange(sk)[None, :]).astype(f32)
        sl = np.broadcast_to(slopes.get(), (q.shape[0], q.shape[1]))
        s = s - sl[:, :, None, None] * dist
    keep = np.broadcast_to(_band(sq, sk, c["causal"], c["window"]), s.shape)
    s = np.where(keep, s, f32(-np.inf))
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), f32(0), m)
    e = np.exp(s - m)
    l_ = e.sum(axis=-1, keepdims=True)
    p = e / np.where(l_ > 0, l_, f32(1))
    if dout is None:
        o = round_to(np.matmul(round_to(p, dtype, np).astype(f32), vr), dtype, np)
        with np.errstate(divide="ignore"):
            lse = np.where(l_ > 0, np.log(np.where(l_ > 0, l_, f32(1))) + m, -np.inf)[..., 0]
        return o.astype(np.float64), lse.astype(np.float64)
    do, o = (round_to(to_bhsd(as_float(x).get(), layout), dtype, np).astype(f32)
             for x in (dout, out))
    dv = np.matmul(p.swapaxes(-1, -2), do)
    dp = np.matmul(do, vr.swapaxes(-1, -2))
    ds = p * (dp - (do * o).sum(axis=-1, keepdims=True))
    if t is not None:
        ds = ds * (f32(1) - t * t)
    dq = np.matmul(ds, kr) * scale
    dk = np.matmul(ds.swapaxes(-1, -2), q) * scale

    def per_kv(x):
        b, h, s_, d = x.shape
        return x.reshape(b, h // group, group, s_, d).sum(axis=2)

    return tuple(round_to(g, dtype, np).astype(np.float64) for g in (dq, per_kv(dk), per_kv(dv)))


def _skip_unless_forward(c, cc):
    p = problem_for(causal=c["causal"], **_shape(c))
    reason = FAMILIES[c["family"]].check(p, cc)
    if reason is not None:
        pytest.skip(reason)


def _skip_unless_backward(c, cc):
    from cupy_attention.families import flash_bwd, flash_mma_bwd, flash_wgmma_bwd

    import cupy

    from cupy_attention import device

    p = problem_for(causal=c["causal"], **_shape(c))
    smem = device.max_shared_per_block(cupy.cuda.runtime.getDevice())
    fam = c["family"]
    reason = (flash_bwd.check(p, cc) if fam == "flash" else
              flash_mma_bwd.check(p, cc, smem) if fam == "flash_mma" else
              flash_wgmma_bwd.check(p, cc, smem))
    if reason is not None:
        pytest.skip(reason)


def _empty_rows(c):
    sq, sk = c["shape"]
    return ~_band(sq, sk, c["causal"], c["window"]).any(axis=1)


@pytest.fixture(scope="module", autouse=True)
def _compile_in_parallel():
    """Compile every instantiation this module launches in a process pool first
    (helpers.prewarm_calls: the calls run with a recording get_function)."""
    import cupy

    def calls():
        for param in (_cases(FWD_FAMILIES) + _cases(BWD_FAMILIES) + _alibi_cases(FWD_FAMILIES)
                      + _alibi_cases(BWD_FAMILIES) + _own_keys_cases()):
            c = param.values[0]
            q, k, v, _ = make_qkv(cupy, 0, values=False, **_shape(c))
            out_b, lse_b = make_out(cupy, batch=c.get("batch", 1), heads_q=HEADS_Q,
                                    seqlen_q=c["shape"][0], head_dim=c["head_dim"],
                                    dtype=c["dtype"], layout=c["layout"])
            opts = dict(causal=c["causal"], window=c["window"], softcap=c["softcap"],
                        layout=c["layout"], alibi_slopes=_slopes(c))
            try:
                ca.attention(q, k, v, out=out_b.view, lse_out=lse_b.view, kernel=c["family"],
                             **opts)
                if c["family"] in BWD_FAMILIES:
                    ca.attention_backward(out_b.view, q, k, v, out_b.view, lse_b.view,
                                          kernel=c["family"], deterministic=c["deterministic"],
                                          **opts)
            except Exception:   # unsupported here: the test says so
                continue

    prewarm_calls(calls)


@pytest.mark.parametrize("c", _cases(FWD_FAMILIES) + _alibi_cases(FWD_FAMILIES)
                         + _own_keys_cases())
def test_forward(c, device_cc):
    import cupy

    _skip_unless_forward(c, device_cc)
    q, k, v = _inputs(c, "fwd")
    out_b, lse_b = make_out(cupy, batch=c.get("batch", 1), heads_q=HEADS_Q,
                            seqlen_q=c["shape"][0], head_dim=c["head_dim"], dtype=c["dtype"],
                            layout=c["layout"])
    slopes = _slopes(c)
    out, lse = ca.attention(q, k, v, causal=c["causal"], window=c["window"],
                            softcap=c["softcap"], layout=c["layout"], out=out_b.view,
                            lse_out=lse_b.view, return_lse=True, kernel=c["family"],
                            alibi_slopes=slopes)
    host = [as_float(x).get() for x in (q, k, v)]
    ref, ref_lse = attention_reference(*host, causal=c["causal"], window=c["window"],
                                       softcap=c["softcap"], layout=c["layout"],
                                       alibi_slopes=None if slopes is None else slopes.get())
    same, same_lse = _same(q, k, v, c)
    got = to_bhsd(as_float(out).get(), c["layout"])
    got_lse = lse.get().astype(np.float64)
    tolerance(got, to_bhsd(ref, c["layout"]), same, c["dtype"], "out")
    fin = np.isfinite(ref_lse)
    lse_extra = 4 * 2.0 ** -23 * max(1.0, float(np.abs(ref_lse[fin]).max())) / math.log(2)
    tolerance(got_lse, ref_lse, same_lse, "float32", "lse", extra=lse_extra)
    empty = _empty_rows(c)
    assert (got[:, :, empty] == 0).all(), "rows that see no key must give exactly 0"
    assert np.isneginf(got_lse[:, :, empty]).all(), "rows that see no key must give LSE -inf"
    assert out_b.outside_untouched() and lse_b.outside_untouched()


def _mid_alibi_cases():
    """ALiBi (per-head and per-(batch, head) slopes) on flash_wgmma_bwd_dkdv_mid's head
    dims, with a window and causal, both dQ modes."""
    out = []
    for idx, (d, causal, window, batch) in enumerate(((136, True, (-1, -1), 2),
                                                     (160, False, (128, 0), 1),
                                                     (192, False, (-1, -1), 2),
                                                     (176, True, (-1, -1), 1))):
        out.append(pytest.param(dict(
            family="flash_wgmma", causal=causal, window=window, softcap=None, alibi=True,
            batch=batch, head_dim=d, shape=((384, 517), (517, 384), (640, 640))[idx % 3],
            dtype=DTYPES[idx % 2], layout=LAYOUTS[idx % 2], heads_kv=HKV[idx % 3],
            deterministic=idx % 2 == 1), id=f"flash_wgmma-mid-alibi-d{d}"))
    return out


@pytest.mark.parametrize("c", _cases(BWD_FAMILIES) + _alibi_cases(BWD_FAMILIES)
                         + _softcap_bwd_cases() + _mid_alibi_cases())
def test_backward(c, device_cc):
    import cupy

    _skip_unless_backward(c, device_cc)
    q, k, v = _inputs(c, "bwd")
    slopes = _slopes(c)
    opts = dict(causal=c["causal"], window=c["window"], softcap=c["softcap"], layout=c["layout"],
                alibi_slopes=slopes)
    out, lse = ca.attention(q, k, v, return_lse=True, kernel="auto", **opts)
    dout, _, _, _ = make_qkv(cupy, seed_for("dout", c["family"], c["window"]), **_shape(c))
    dout = cupy.ascontiguousarray(dout)
    grads = ca.attention_backward(dout, q, k, v, out, lse, kernel=c["family"],
                                  deterministic=c["deterministic"], **opts)
    host = [as_float(x).get() for x in (dout, q, k, v)]
    refs = attention_backward_reference(*host, causal=c["causal"], window=c["window"],
                                        softcap=c["softcap"], layout=c["layout"],
                                        alibi_slopes=None if slopes is None else slopes.get())
    sames = _same(q, k, v, c, dout=dout, out=out)
    empty = _empty_rows(c)
    for name, g, r, s in zip(("dq", "dk", "dv"), grads, refs, sames):
        got = to_bhsd(as_float(g).get(), c["layout"])
        r = to_bhsd(r, c["layout"])
        # window (0, 0) with Sq == Sk: one key per row, so dq = dk = 0 exactly in float64
        # and the rule's noise floor is 0; allow the dtype's noise at the kernel's scale.
        extra = noise_floor(s, c["dtype"]) if not np.abs(r).max() else 0.0
        tolerance(got, r, s, c["dtype"], name, factor=3.0, extra=extra)
        if name == "dq":
            assert (got[:, :, empty] == 0).all(), "rows that see no key get zero dq"


def test_hot_path_keeps_windows_apart():
    """Repeated calls with the same arrays (the hot path) and different windows or
    softcaps each give their own result."""
    import cupy

    c = dict(family="auto", causal=False, window=(16, 0), softcap=None, head_dim=64,
             shape=(200, 200), dtype="float16", layout="bhsd", heads_kv=2)
    q, k, v = _inputs(c, "hot")
    host = [as_float(x).get() for x in (q, k, v)]
    for window, softcap in [((16, 0), None), ((-1, 5), None), ((16, 0), 2.0), ((16, 0), None),
                            (None, None)] * 2:
        out = ca.attention(q, k, v, window=window, softcap=softcap)
        cupy.cuda.get_current_stream().synchronize()
        ref, _ = attention_reference(*host, window=window, softcap=softcap)
        err = float(np.abs(as_float(out).get() - ref).max())
        assert err < 1e-2, f"window={window} softcap={softcap}: max err {err}"


def test_torch_autograd_passes_window_and_softcap():
    torch = pytest.importorskip("torch")
    import cupy_attention.torch as cat

    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(1, 4, 300, 64, device="cuda", generator=gen, dtype=torch.bfloat16)
               for _ in range(3))
    k, v = k[:, :2].contiguous(), v[:, :2].contiguous()
    for x in (q, k, v):
        x.requires_grad_(True)
    out = cat.attention(q, k, v, causal=True, window=(40, -1), softcap=5.0)
    dout = torch.randn(out.shape, device="cuda", generator=gen, dtype=torch.bfloat16)
    out.backward(dout)
    host = [x.detach().double().cpu().numpy() for x in (q, k, v)]
    ref, _ = attention_reference(*host, causal=True, window=(40, -1), softcap=5.0)
    grads = attention_backward_reference(dout.double().cpu().numpy(), *host, causal=True,
                                         window=(40, -1), softcap=5.0)
    assert float(np.abs(out.detach().double().cpu().numpy() - ref).max()) < 3e-2
    for x, g in zip((q, k, v), grads):
        scale = max(1.0, float(np.abs(g).max()))
        assert float(np.abs(x.grad.double().cpu().numpy() - g).max()) < 5e-2 * scale


def test_window_with_dense_mask(device_cc):
    """A window and a boolean mask together (the families that take dense masks):
    the keys kept are the intersection."""
    import cupy

    c = dict(family="flash", causal=False, window=(32, 8), softcap=None, head_dim=64,
             shape=(150, 170), dtype="float16", layout="bhsd", heads_kv=4)
    q, k, v = _inputs(c, "mask")
    rng = np.random.default_rng(11)
    mask = rng.random((1, 1, 150, 170)) < 0.7
    host = [as_float(x).get() for x in (q, k, v)]
    ref, ref_lse = attention_reference(*host, window=(32, 8), mask=mask)
    p = problem_for(batch=1, heads_q=4, heads_kv=4, seqlen_q=150, seqlen_k=170, head_dim=64,
                    dtype="float16", mask=mask)
    for fam in ("naive", "tiled", "flash", "flash_mma"):
        if FAMILIES[fam].check(p, device_cc) is not None:
            continue
        out, lse = ca.attention(q, k, v, window=(32, 8), mask=cupy.asarray(mask),
                                return_lse=True, kernel=fam)
        got = as_float(out).get()
        assert float(np.abs(got - ref).max()) < 1e-2, fam
        same_inf = np.isneginf(lse.get()) == np.isneginf(ref_lse)
        assert same_inf.all(), fam
