"""The backward pass: ``attention_backward``, the float64 reference backward, the
``flash_bwd`` (CUDA cores), ``flash_mma_bwd`` (tensor cores, mma.sync) and
``flash_wgmma_bwd`` (Hopper tensor cores, wgmma) kernels and the torch integration.

CPU: the reference backward against central finite differences and against
torch.autograd in float64; this file's plain backward against the reference;
validation errors; every CI instantiation of kernels/flash_bwd.cu and
kernels/flash_mma_bwd.cu compiles for sm_80 and sm_90a, of
kernels/flash_wgmma_bwd.cu for sm_90a, without spills; torch plumbing through
``kernel="reference"``.

GPU (marker ``gpu``), for each kernel (``flash``, ``flash_mma``, ``flash_wgmma``
on compute capability 9.0): each backward mode (atomic dQ, deterministic) against
the float64 plain backward with TESTING.md's rule for gradients (factor 3) over a
sampled grid; fully masked rows and non-finite masked-out values; 50
bitwise-equal deterministic reruns; no S^2 allocation; through the real forward;
``flash_wgmma``'s fallback for unaligned arrays; torch autograd against SDPA;
``kernel="auto"``'s choice; a toy transformer block trained 200 steps beside the
same block on torch SDPA (fp32: ``flash``).
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import multiprocessing
import os
import re

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention import jit
from cupy_attention.errors import (DTypeError, LayoutError, NoDeviceError, ShapeError,
                                   UnsupportedError)
from cupy_attention.families import flash_bwd, flash_mma_bwd, flash_wgmma_bwd
from cupy_attention.variant import Variant
from cupy_attention.reference import attention_backward_reference, attention_reference

from helpers import (as_float, cast, make_qkv, normal, nvrtc_probe, plain_attention,
                     plain_backward, problem_for, record, seed_for, set_values, static_asserts,
                     to_bhsd, tolerance, xp_of)

ARCHS = ("sm_80", "sm_90a")


# plain_backward (the independent plain backward, float64 or the kernel's precision)
# lives in helpers.py, shared with the GPU non-finite tests.


def make_mask(xp, kind, seed, *, batch, heads_q, seqlen_q, seqlen_k):
    """None, a bool mask [B, 1, Sq, Sk] (~75% attended) or an additive float32 mask
    [1, Hq, Sq, Sk] (normal values, ~10% -inf)."""
    if kind is None:
        return None
    if kind == "bool":
        return normal(xp, seed + 11, (batch, 1, seqlen_q, seqlen_k)) > -0.67
    bias = normal(xp, seed + 13, (1, heads_q, seqlen_q, seqlen_k))
    drop = normal(xp, seed + 17, bias.shape) > 1.28
    return xp.where(drop, xp.float32(-np.inf), bias).astype(xp.float32)


# ---------------------------------------------------------------------------
# CPU: the float64 reference backward

def _finite_differences(dout, q, k, v, eps=1e-6, **kw):
    """Central differences of sum(dout * attention_reference(q, k, v)) per element."""
    def loss():
        out, _ = attention_reference(q, k, v, **kw)
        return float((dout * out).sum())

    grads = []
    for x in (q, k, v):
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            keep = x[idx]
            x[idx] = keep + eps
            hi = loss()
            x[idx] = keep - eps
            lo = loss()
            x[idx] = keep
            g[idx] = (hi - lo) / (2 * eps)
        grads.append(g)
    return grads


def _tiny(seed, B=1, Hq=2, Hkv=1, Sq=3, Sk=4, D=3, layout="bhsd"):
    rng = np.random.default_rng(seed)
    shape = lambda h, s: (B, h, s, D) if layout == "bhsd" else (B, s, h, D)  # noqa: E731
    return (rng.standard_normal(shape(Hq, Sq)), rng.standard_normal(shape(Hq, Sq)),
            rng.standard_normal(shape(Hkv, Sk)), rng.standard_normal(shape(Hkv, Sk)))


FD_CASES = [
    dict(Hkv=2),
    dict(Hkv=1, causal=True),
    dict(Hkv=1, Sq=4, Sk=3, causal=True),            # bottom-right: query 0 attends nothing
    dict(Hkv=2, Sq=3, Sk=5, causal=True, scale=0.7),
    dict(Hkv=1, mask="bool"),
    dict(Hkv=2, mask="add"),
    dict(Hkv=1, Sq=2, Sk=6, causal=True, mask="add", layout="bshd"),
]


@pytest.mark.parametrize("case", FD_CASES, ids=[str(i) for i in range(len(FD_CASES))])
def test_reference_backward_matches_finite_differences(case):
    case = dict(case)
    mask_kind, layout = case.pop("mask", None), case.pop("layout", "bhsd")
    causal, scale = case.pop("causal", False), case.pop("scale", None)
    dout, q, k, v = _tiny(seed_for("fd", sorted(case.items()), mask_kind), layout=layout, **case)
    Sq, Sk = case.get("Sq", 3), case.get("Sk", 4)
    mask = None
    if mask_kind == "bool":
        mask = np.random.default_rng(1).random((1, 1, Sq, Sk)) < 0.7
        mask[..., 1, :] = False                         # a fully masked row
        mask[..., 0, 0] = True
    elif mask_kind == "add":
        mask = np.random.default_rng(2).standard_normal((1, 2, Sq, Sk))
        mask[..., 0, 1] = -np.inf
    kw = dict(causal=causal, scale=scale, mask=mask, layout=layout)
    got = attention_backward_reference(dout, q, k, v, **kw)
    want = _finite_differences(dout, q, k, v, **kw)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.shape == w.shape
        assert np.isfinite(g).all(), name
        np.testing.assert_allclose(g, w, atol=1e-7, rtol=1e-6, err_msg=name)


def test_reference_backward_fully_masked_rows_are_zero():
    dout, q, k, v = _tiny(3, Hkv=1, Sq=6, Sk=2)
    dq, dk, dv = attention_backward_reference(dout, q, k, v, causal=True)
    assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    assert (dq[:, :, :4] == 0).all()                    # queries 0..3 see no key


def test_reference_backward_ignores_nonfinite_masked_keys():
    dout, q, k, v = _tiny(4, Hkv=1, Sq=3, Sk=5)
    mask = np.ones((1, 1, 3, 5), dtype=bool)
    mask[..., 2] = False
    clean = attention_backward_reference(dout, q, k, v, mask=mask)
    k[:, :, 2], v[:, :, 2] = np.nan, np.inf
    poisoned = attention_backward_reference(dout, q, k, v, mask=mask)
    for c, p in zip(clean, poisoned):
        np.testing.assert_array_equal(c, p)


def test_reference_backward_layouts_agree():
    dout, q, k, v = _tiny(5, Hkv=1, Sq=5, Sk=7, D=4)
    bhsd = attention_backward_reference(dout, q, k, v, causal=True)
    sw = lambda x: np.swapaxes(x, 1, 2)  # noqa: E731
    bshd = attention_backward_reference(sw(dout), sw(q), sw(k), sw(v), causal=True, layout="bshd")
    for a, b in zip(bhsd, bshd):
        np.testing.assert_allclose(a, sw(b), rtol=0, atol=1e-14)


@pytest.mark.parametrize("causal,mask_kind,hkv", [(False, None, 2), (True, None, 1),
                                                  (True, "add", 2), (False, "bool", 1)])
def test_plain_backward_matches_reference(causal, mask_kind, hkv):
    """The GPU tests' oracle agrees with cupy_attention.reference (two independent
    float64 implementations)."""
    dout, q, k, v = _tiny(6, B=2, Hq=4, Hkv=hkv, Sq=9, Sk=13, D=5)
    mask = make_mask(np, mask_kind, 7, batch=2, heads_q=4, seqlen_q=9, seqlen_k=13)
    if mask is not None and mask.dtype == np.bool_:
        mask[..., 0] = True                             # no fully masked row: same p either way
    got = plain_backward(dout, q, k, v, causal=causal, mask=mask)
    want = attention_backward_reference(dout, q, k, v, causal=causal, mask=mask)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def _torch_attention(q, k, v, *, causal, scale, mask):
    import torch

    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask
    if causal:
        Sq, Sk = s.shape[-2:]
        keep = torch.arange(Sk)[None, :] <= torch.arange(Sq)[:, None] + (Sk - Sq)
        s = s.masked_fill(~keep, -math.inf)
    return torch.softmax(s, dim=-1) @ v


@pytest.mark.parametrize("causal,mask_kind,hkv", [(False, None, 4), (True, None, 2),
                                                  (False, "add", 1), (True, "bool", 2)])
def test_reference_backward_matches_torch_autograd(causal, mask_kind, hkv):
    torch = pytest.importorskip("torch")
    dout, q, k, v = _tiny(8, B=2, Hq=4, Hkv=hkv, Sq=11, Sk=17, D=6)
    mask = make_mask(np, mask_kind, 9, batch=2, heads_q=4, seqlen_q=11, seqlen_k=17)
    if mask is not None and mask.dtype == np.bool_:
        mask[..., -1] = True        # torch's softmax of an all -inf row is NaN: avoid those
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    tmask = None if mask is None else torch.tensor(
        mask if mask.dtype == np.bool_ else mask.astype(np.float64))
    out = _torch_attention(tq, tk, tv, causal=causal, scale=0.4, mask=tmask)
    (out * torch.tensor(dout)).sum().backward()
    got = attention_backward_reference(dout, q, k, v, causal=causal, scale=0.4, mask=mask)
    for g, t in zip(got, (tq, tk, tv)):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------
# CPU: the public API without a device

def _np_case(B=1, Hq=4, Hkv=2, Sq=5, Sk=7, D=8, dtype=np.float32):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, Hq, Sq, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Sk, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Sk, D)).astype(dtype)
    out, lse = ca.attention(q, k, v, kernel="reference", return_lse=True)
    dout = rng.standard_normal(out.shape).astype(dtype)
    return dout, q, k, v, out, lse


def test_reference_kernel_through_the_api():
    dout, q, k, v, out, lse = _np_case()
    dq, dk, dv = ca.attention_backward(dout, q, k, v, out, lse, kernel="reference")
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert dq.dtype == dk.dtype == dv.dtype == np.float32
    want = attention_backward_reference(dout, q, k, v)
    for g, w in zip((dq, dk, dv), want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mutate,error,word", [
    (lambda a: a.update(dout=a["dout"][:, :, :-1]), ShapeError, "dout"),
    (lambda a: a.update(dout=a["dout"].astype(np.float16)), DTypeError, "dout"),
    (lambda a: a.update(dout=np.asfortranarray(a["dout"])), LayoutError, "dout"),
    (lambda a: a.update(lse=a["lse"][:, :, :-1]), ShapeError, "lse"),
    (lambda a: a.update(lse=a["lse"].astype(np.float64)), DTypeError, "lse"),
    (lambda a: a.update(out=a["out"][:, :1]), ShapeError, "out"),
    (lambda a: a.update(out=None), ShapeError, "out"),
    (lambda a: a.update(k=a["k"][:, :, :, :4]), ShapeError, "head dim"),
    (lambda a: a.update(q=a["q"][:, :3]), ShapeError, "multiple"),
    (lambda a: a.update(kernel="naive"), UnsupportedError, "naive"),
    (lambda a: a.update(deterministic="yes"), DTypeError, "deterministic"),
    (lambda a: a.update(mask=np.ones((3, 5), dtype=bool)), ShapeError, "mask"),
], ids=["dout-shape", "dout-dtype", "dout-stride", "lse-shape", "lse-dtype", "out-shape",
        "out-missing", "head-dim", "gqa", "kernel", "deterministic", "mask"])
def test_validation_errors(mutate, error, word):
    dout, q, k, v, out, lse = _np_case()
    args = dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse, kernel="reference")
    mutate(args)
    with pytest.raises(error, match=word):
        ca.attention_backward(args.pop("dout"), args.pop("q"), args.pop("k"), args.pop("v"),
                              args.pop("out"), args.pop("lse"), **args)


def test_no_device_is_one_clear_error():
    from conftest import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("a CUDA device is present")
    dout, q, k, v, out, lse = _np_case()
    with pytest.raises(NoDeviceError, match="no CUDA device"):
        ca.attention_backward(dout, q, k, v, out, lse)


def test_torch_plumbing_through_the_reference_kernel():
    """AttentionFunction and CUDAAttention on CPU tensors (kernel="reference"):
    forward and gradients equal the same module written with torch ops."""
    torch = pytest.importorskip("torch")
    from cupy_attention.torch import CUDAAttention

    torch.manual_seed(0)
    ours = CUDAAttention(24, 4, num_kv_heads=2, causal=True, kernel="reference")
    x = torch.randn(2, 9, 24)
    y = ours(x)
    y.square().sum().backward()
    got = {n: p.grad.clone() for n, p in ours.named_parameters()}

    ours.zero_grad()
    B, S, _ = x.shape
    qkv = ours.qkv(x).view(B, S, 8, 6)
    q, k, v = (t.transpose(1, 2).double() for t in qkv.split([4, 2, 2], dim=2))
    o = _torch_attention(q, k, v, causal=True, scale=6 ** -0.5, mask=None).float()
    y_ref = ours.proj(o.transpose(1, 2).reshape(B, S, 24))
    y_ref.square().sum().backward()
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    for n, p in ours.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-5, msg=n)


# ---------------------------------------------------------------------------
# CPU: every CI instantiation compiles without spills

def _compile_one(job):
    spec, arch = job
    from cupy_attention import jit as _jit
    from cupy_attention.errors import CompileError

    try:
        c = _jit.compile_spec(spec, arch)
        return spec, arch, c.resources, c.log
    except CompileError as exc:
        return spec, arch, None, exc.log


# wgmma exists on sm_90a alone.
CI_FAMILIES = [(flash_bwd, ARCHS), (flash_mma_bwd, ARCHS), (flash_wgmma_bwd, ("sm_90a",))]


@pytest.mark.parametrize("family,archs", CI_FAMILIES, ids=["flash", "flash_mma", "flash_wgmma"])
def test_ci_specs_compile_without_spills(family, archs):
    specs = family.ci_specs()
    assert len({s.name for s in specs}) == len(specs), "readable names must be unique"
    jobs = [(s, a) for s in specs for a in archs]
    workers = max(2, min(os.cpu_count() or 2, 8))
    with cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        rows = list(pool.map(_compile_one, jobs))
    failed = [f"{s.name} ({a}):\n{log}" for s, a, res, log in rows if res is None]
    assert not failed, "\n".join(failed[:3])
    spills = [f"{s.name} ({a}): {r.spills} B spilled, {r.registers} registers"
              for s, a, r, _ in rows if r.spills or r.stack_frame]
    assert not spills, "\n".join(spills)
    assert all(0 < r.registers <= 255 for _, _, r, _ in rows)
    serialized = sorted({s.name for s, a, _, log in rows if a == "sm_90a"
                         and SERIALIZED_WGMMA.search(log)})
    assert not serialized, "ptxas serializes the wgmma of:\n" + "\n".join(serialized)


# ptxas' advisory that it serializes a kernel's wgmma ("Potential Performance Loss:
# wgmma.mma_async instructions are serialized due to ...": C7512, C7514, C7515, C7520):
# it then waits after every wgmma, which runs correctly at a fraction of the speed. Two
# backward builds with one ran at 0.77x and 0.85-0.89x of their serialization-free form
# (H200, 2026-11-29: ALiBi's 80-query tiles at D = 128, benchmarks/results/notes-alibi.md;
# an S^T issued a tile early, notes-bwd-loops.md section 29; the 128-query tiles at
# D = 72-80, which added dQ from registers under a per-row test, C7520, ran 0.94-0.96x
# the 64-query tiles that replaced them).
SERIALIZED_WGMMA = re.compile(r"Potential Performance Loss: wgmma\.mma_async instructions are "
                              r"serialized")


def mma_bwd_smem_probe(lie: bool = False, arch: str = "sm_80") -> str:
    """static_asserts that flash_mma_bwd's kernels address the shared memory their
    launches ask for (Config.smem, dq_smem) at every head dim, both tile columns and
    the A100's budget: equal with padded rows, at most with swizzled ones, which take
    less (MmaBwdTraits::SWIZZLE: 16-byte builds at D_PAD = 64,
    128 and 192, and D_PAD = 256 in sm_90a builds)."""
    configs = {flash_mma_bwd.config(d, limit, narrow, two) for d in range(1, 257)
               for limit in (227 * 1024, 163 * 1024) for narrow in (False, True)
               for two in (False, True)}
    checks = []
    for c in sorted((c for c in configs if c is not None), key=lambda c: (c.head_dim, c.block_m)):
        d_pad = -(-c.head_dim // 16) * 16
        swizzled = (d_pad == 256 and arch == "sm_90a") or (c.head_dim % 8 == 0
                                                          and d_pad in (64, 128, 192))
        op = "<=" if swizzled else "=="
        vec = str(c.head_dim % 8 == 0).lower()
        traits = f"MmaBwdTraits<{c.head_dim}, {c.block_m}, {c.block_n}, {c.warps}, bf16, {vec}>"
        dq = f"MmaBwdDqTraits<{c.head_dim}, {c.dq_block_n}, {c.dq_warps}, bf16, {vec}>"
        checks += [(f"{traits}::SMEM_BYTES {op} {c.smem + (16 if lie else 0)}",
                    f"SMEM_BYTES D={c.head_dim} {c.block_m}x{c.block_n}"),
                   (f"{dq}::SMEM_BYTES == {c.dq_smem}", f"DQ SMEM_BYTES D={c.head_dim}")]
        if lie:
            break
    return static_asserts("flash_mma_bwd.cu", checks)


def test_mma_bwd_host_shared_memory_matches_the_kernels():
    for arch in ("sm_80", "sm_90a"):
        ok, log = nvrtc_probe(mma_bwd_smem_probe(arch=arch), jit.options_for(arch))
        assert ok, f"flash_mma_bwd.py's smem and the {arch} kernels' SMEM_BYTES disagree:\n{log}"
    ok, log = nvrtc_probe(mma_bwd_smem_probe(lie=True), jit.options_for("sm_80"))
    assert not ok and "SMEM_BYTES D=" in log, log


def test_heuristics_fit_their_devices():
    for d in range(1, 257):
        assert flash_bwd.config(d) is not None                      # sm_80: 163 KB
        assert flash_bwd.config(d, 99 * 1024) is not None           # sm_86 / sm_89 / sm_120
        assert flash_bwd.config(d).smem <= 163 * 1024
        mma = flash_mma_bwd.config(d)                               # sm_90: 227 KB
        assert mma is not None and max(mma.smem, mma.dq_smem) <= 227 * 1024
        mma = flash_mma_bwd.config(d, 163 * 1024)                   # sm_80
        assert mma is not None and max(mma.smem, mma.dq_smem) <= 163 * 1024
        wg = flash_wgmma_bwd.config(d)                              # sm_90a
        assert (wg is not None) == (d % 8 == 0 and 64 <= d <= 256)
        assert wg is None or wg.smem <= 227 * 1024



def test_row_kernel_grids_cover_every_row():
    """The host's rows per block of the row kernels (delta, dq_convert,
    dkdv_convert) is the kernels' ROW_BLOCK: fewer would leave rows unconverted."""
    import re
    src = (jit.kernels_dir() / "common" / "bwd_tiles.cuh").read_text()   # (flash_bwd.cu's)
    lanes = int(re.search(r"constexpr int ROW_LANES = (\d+);", src).group(1))
    assert "constexpr int ROW_BLOCK = 256 / ROW_LANES;" in src
    assert flash_bwd.THREADS == 256 and flash_bwd.ROWS_PER_BLOCK == 256 // lanes

@pytest.mark.parametrize("change,cc,word", [
    (dict(), 90, None),
    (dict(causal=True, heads_q=4, heads_kv=1), 90, None),
    (dict(), 80, "compute capability 9.0"),
    (dict(head_dim=256), 90, None),
    (dict(head_dim=56), 90, "multiples of 8 from 64 to 256"),
    (dict(head_dim=100), 90, "multiples of 8 from 64 to 256"),
    (dict(dtype="float32"), 90, "float32"),
    (dict(mask=np.ones((1, 1, 100, 100), dtype=bool)), 90, "dense mask"),
], ids=["plain", "causal-gqa", "sm80", "wide", "head-dim", "odd-head-dim", "dtype", "mask"])
def test_wgmma_backward_check(change, cc, word):
    """What flash_wgmma's backward accepts, and the reasons it gives otherwise."""
    shape = dict(batch=2, heads_q=2, heads_kv=2, seqlen_q=100, seqlen_k=100, head_dim=64,
                 dtype="bfloat16")
    shape.update(change)
    reason = flash_wgmma_bwd.check(problem_for(**shape), cc)
    if word is None:
        assert reason is None
    else:
        assert reason is not None and word in reason and "flash_wgmma" in reason, reason


# ---------------------------------------------------------------------------
# GPU

# The sampled grid: every head dim of the brief's list, each dtype, causal with
# both orders of Sq != Sk, MHA / GQA / MQA, both layouts, packed and padded views,
# both mask kinds, both dQ modes, one large-magnitude case.
GRID = [
    dict(dtype="float32", D=1, Sq=17, Sk=33, Hq=2, Hkv=2),
    dict(dtype="float16", D=32, Sq=113, Sk=203, causal=True, Hq=6, Hkv=2, layout="bshd",
         view="packed"),
    dict(dtype="bfloat16", D=59, Sq=128, Sk=217, Hq=6, Hkv=1, view="padded"),
    dict(dtype="float32", D=64, Sq=239, Sk=1, causal=True, Hq=2, Hkv=1),
    dict(dtype="float16", D=64, Sq=3, Sk=799, causal=True, mask="bool", B=2),
    dict(dtype="bfloat16", D=96, Sq=127, Sk=513, causal=True, mask="add", layout="bshd"),
    dict(dtype="float16", D=128, Sq=256, Sk=512, Hq=6, Hkv=2, B=2, magnitude=3.0),
    dict(dtype="float32", D=128, Sq=512, Sk=256, causal=True, deterministic=True),
    dict(dtype="bfloat16", D=160, Sq=108, Sk=256, layout="bshd", view="packed",
         deterministic=True),
    dict(dtype="float16", D=256, Sq=1, Sk=147, Hq=6, Hkv=6),
    dict(dtype="float32", D=256, Sq=799, Sk=3, causal=True),
    dict(dtype="bfloat16", D=64, Sq=1023, Sk=1024, causal=True),
    dict(dtype="float16", D=128, Sq=1024, Sk=1023, causal=True, mask="bool", Hq=4, Hkv=2,
         deterministic=True),
    dict(dtype="float32", D=59, Sq=113, Sk=203, mask="add", deterministic=True, layout="bshd"),
    dict(dtype="bfloat16", D=1, Sq=127, Sk=512, causal=True, view="padded"),
    dict(dtype="float16", D=32, Sq=1, Sk=1, deterministic=True),
    dict(dtype="bfloat16", D=256, Sq=200, Sk=300, causal=True, mask="add", Hq=4, Hkv=1,
         deterministic=True),
]


# The tensor-core kernel's grid (fp16/bf16, no dense mask): every head dim of the
# list, causal with both orders of Sq != Sk, MHA / GQA / MQA, both layouts, packed
# and padded views (the unaligned copy path), both dQ modes at D = 64, 128, 256,
# one large-magnitude case.
MMA_GRID = [
    dict(dtype="bfloat16", D=1, Sq=17, Sk=33, Hq=2, Hkv=2),
    dict(dtype="float16", D=8, Sq=1, Sk=147, Hq=6, Hkv=2, deterministic=True),
    dict(dtype="float16", D=32, Sq=113, Sk=203, causal=True, Hq=6, Hkv=2, layout="bshd",
         view="packed"),
    dict(dtype="bfloat16", D=40, Sq=239, Sk=1, causal=True, Hq=2, Hkv=1),
    dict(dtype="bfloat16", D=59, Sq=128, Sk=217, Hq=6, Hkv=1, view="padded"),
    dict(dtype="float16", D=64, Sq=3, Sk=799, causal=True, B=2, deterministic=True),
    dict(dtype="bfloat16", D=64, Sq=1023, Sk=1024, causal=True, Hq=4, Hkv=2),
    # swizzled shared rows at D_PAD = 64, 128 and 192 (16-byte builds), non-causal
    dict(dtype="bfloat16", D=64, Sq=300, Sk=517, Hq=4, Hkv=2),
    dict(dtype="float16", D=56, Sq=200, Sk=130, Hq=2, Hkv=1, layout="bshd"),
    dict(dtype="bfloat16", D=120, Sq=513, Sk=300, Hq=4, Hkv=1),
    dict(dtype="float16", D=184, Sq=300, Sk=200, causal=True, Hq=2, Hkv=2),
    dict(dtype="float16", D=72, Sq=127, Sk=513, causal=True, layout="bshd"),
    dict(dtype="bfloat16", D=80, Sq=799, Sk=3, causal=True, deterministic=True),
    dict(dtype="float16", D=96, Sq=108, Sk=256, layout="bshd", view="packed",
         deterministic=True),
    dict(dtype="bfloat16", D=104, Sq=300, Sk=517, causal=True, Hq=4, Hkv=2),
    dict(dtype="bfloat16", D=111, Sq=127, Sk=512, causal=True, view="padded"),
    dict(dtype="float16", D=128, Sq=256, Sk=512, Hq=6, Hkv=2, B=2, magnitude=3.0),
    dict(dtype="bfloat16", D=128, Sq=512, Sk=256, causal=True, deterministic=True),
    dict(dtype="float16", D=128, Sq=1024, Sk=1023, causal=True, Hq=4, Hkv=2,
         deterministic=True),
    dict(dtype="bfloat16", D=160, Sq=108, Sk=256, layout="bshd", view="packed",
         deterministic=True),
    dict(dtype="float16", D=192, Sq=2048, Sk=2048, causal=True, Hq=2, Hkv=1),
    dict(dtype="bfloat16", D=224, Sq=1, Sk=1, deterministic=True),
    dict(dtype="float16", D=256, Sq=200, Sk=300, causal=True, Hq=4, Hkv=1, deterministic=True),
    dict(dtype="bfloat16", D=256, Sq=1023, Sk=1024, Hq=2, Hkv=2, layout="bshd"),
    # dq_accum's rows in groups of 8 (Sq % 8 == 0, atomic dQ, 16-byte rows): D not a
    # multiple of 16, GQA, the two-round dQ jobs of D_PAD > 128
    dict(dtype="bfloat16", D=40, Sq=248, Sk=129, causal=True, Hq=4, Hkv=2, B=2),
    dict(dtype="float16", D=64, Sq=1024, Sk=1000, causal=True, Hq=4, Hkv=1),
    dict(dtype="bfloat16", D=256, Sq=136, Sk=300, Hq=2, Hkv=2, layout="bshd"),
]

# The wgmma kernels' grid (fp16/bf16, D = 64-256 in steps of 8, 16-byte aligned
# arrays): causal with both orders of Sq != Sk, lengths off every tile, MHA / GQA /
# MQA, both layouts, packed views, both dQ modes, large-magnitude cases; every head
# dim between 64 and 128 (72, 88, 104, 120 with K Q^T's k16 steps padded), and past
# 128 (the wide kernel) 136 and 200 (padded k16 steps), 152, 168 and 184 (from 136
# to 192 each warpgroup's dQ wgmma spans D - 64 columns, the two ranges overlap and
# split at D / 2 rounded down to 8), 160, 192, 248 and 256.
WGMMA_GRID = [
    dict(dtype="bfloat16", D=64, Sq=17, Sk=33, Hq=2, Hkv=2),
    dict(dtype="float16", D=64, Sq=1, Sk=147, Hq=6, Hkv=2, deterministic=True),
    dict(dtype="float16", D=64, Sq=113, Sk=203, causal=True, Hq=6, Hkv=2, layout="bshd",
         view="packed"),
    dict(dtype="bfloat16", D=64, Sq=239, Sk=1, causal=True, Hq=2, Hkv=1),
    dict(dtype="float16", D=64, Sq=3, Sk=799, causal=True, B=2, deterministic=True),
    dict(dtype="bfloat16", D=64, Sq=1023, Sk=1024, causal=True, Hq=4, Hkv=2),
    dict(dtype="float16", D=64, Sq=2048, Sk=2048, Hq=2, Hkv=1, magnitude=3.0),
    dict(dtype="bfloat16", D=128, Sq=799, Sk=3, causal=True, deterministic=True),
    dict(dtype="float16", D=128, Sq=108, Sk=256, layout="bshd", view="packed",
         deterministic=True),
    dict(dtype="bfloat16", D=128, Sq=127, Sk=513, causal=True, Hq=6, Hkv=1),
    dict(dtype="float16", D=128, Sq=256, Sk=512, Hq=6, Hkv=2, B=2, magnitude=3.0),
    dict(dtype="bfloat16", D=128, Sq=512, Sk=256, causal=True, deterministic=True),
    dict(dtype="float16", D=128, Sq=1024, Sk=1023, causal=True, Hq=4, Hkv=2),
    dict(dtype="bfloat16", D=128, Sq=2048, Sk=2048, causal=True, Hq=2, Hkv=2, layout="bshd"),
    dict(dtype="float16", D=72, Sq=239, Sk=300, causal=True, Hq=6, Hkv=2),
    dict(dtype="bfloat16", D=72, Sq=1024, Sk=1023, Hq=2, Hkv=1, layout="bshd", view="packed",
         deterministic=True),
    dict(dtype="bfloat16", D=80, Sq=127, Sk=513, causal=True, Hq=4, Hkv=1),
    dict(dtype="float16", D=80, Sq=1023, Sk=1024, Hq=2, Hkv=2, magnitude=3.0),
    dict(dtype="bfloat16", D=88, Sq=799, Sk=3, causal=True, deterministic=True),
    dict(dtype="float16", D=96, Sq=108, Sk=256, layout="bshd", view="packed"),
    dict(dtype="bfloat16", D=96, Sq=2048, Sk=2048, causal=True, Hq=4, Hkv=2),
    dict(dtype="float16", D=104, Sq=1, Sk=147, Hq=6, Hkv=2, deterministic=True),
    dict(dtype="bfloat16", D=112, Sq=300, Sk=517, causal=True, Hq=6, Hkv=1, layout="bshd"),
    dict(dtype="float16", D=120, Sq=512, Sk=256, causal=True, Hq=2, Hkv=1, magnitude=3.0),
    dict(dtype="bfloat16", D=136, Sq=239, Sk=300, causal=True, Hq=6, Hkv=2),
    dict(dtype="float16", D=152, Sq=300, Sk=517, causal=True, Hq=6, Hkv=2),
    dict(dtype="float16", D=160, Sq=108, Sk=256, layout="bshd", view="packed"),
    dict(dtype="bfloat16", D=168, Sq=512, Sk=256, causal=True, Hq=4, Hkv=1, magnitude=3.0),
    dict(dtype="float16", D=184, Sq=1023, Sk=1024, Hq=2, Hkv=2, layout="bshd"),
    dict(dtype="bfloat16", D=160, Sq=799, Sk=3, causal=True, deterministic=True),
    dict(dtype="float16", D=192, Sq=1024, Sk=1023, causal=True, Hq=4, Hkv=2),
    dict(dtype="bfloat16", D=192, Sq=1, Sk=147, Hq=6, Hkv=2),
    dict(dtype="float16", D=200, Sq=127, Sk=513, causal=True, Hq=4, Hkv=1, magnitude=3.0),
    dict(dtype="bfloat16", D=248, Sq=300, Sk=517, Hq=2, Hkv=1, layout="bshd",
         deterministic=True),
    dict(dtype="bfloat16", D=256, Sq=2048, Sk=2048, causal=True, Hq=2, Hkv=2),
    dict(dtype="float16", D=256, Sq=17, Sk=33, Hq=2, Hkv=2, magnitude=3.0),
    dict(dtype="float16", D=256, Sq=512, Sk=256, causal=True, Hq=2, Hkv=1, deterministic=True),
    # flash_wgmma_bwd_dkdv_mid (D = 136-192, both dQ modes): MQA, whole query tiles
    # (test_gpu_variants' mid cases take a partial one), keys off its 96-key blocks
    dict(dtype="bfloat16", D=144, Sq=640, Sk=640, causal=True, Hq=4, Hkv=1),
    dict(dtype="float16", D=176, Sq=256, Sk=1000, Hq=3, Hkv=1, B=2),
    dict(dtype="float16", D=176, Sq=512, Sk=700, causal=True, Hq=4, Hkv=2, deterministic=True),
    dict(dtype="bfloat16", D=152, Sq=640, Sk=640, Hq=2, Hkv=1, deterministic=True),
    dict(dtype="bfloat16", D=192, Sq=384, Sk=200, causal=True, Hq=2, Hkv=2, layout="bshd"),
    # D = 72-80 without a band: 64-query tiles on the producer warpgroup
    dict(dtype="bfloat16", D=80, Sq=1024, Sk=777, Hq=4, Hkv=2, B=2),
    dict(dtype="float16", D=72, Sq=520, Sk=256, Hq=4, Hkv=1, layout="bshd"),
]

KERNELS = ("flash", "flash_mma", "flash_wgmma")


def _case_id(c):
    return "-".join(f"{k}={v}" for k, v in c.items())


GRID_CASES = ([(c, "flash") for c in GRID] + [(c, "flash_mma") for c in MMA_GRID]
              + [(c, "flash_wgmma") for c in WGMMA_GRID])


def _skip_unless_device_runs(kernel):
    """flash_wgmma runs on compute capability 9.0 only."""
    import cupy

    from cupy_attention import device

    cc = device.compute_capability(cupy.cuda.runtime.getDevice())
    if kernel == "flash_wgmma" and cc != 90:
        pytest.skip(f"flash_wgmma's backward needs compute capability 9.0, device has {cc / 10:.1f}")


def _shape(c):
    return dict(batch=c.get("B", 1), heads_q=c.get("Hq", 2), heads_kv=c.get("Hkv", 1),
                seqlen_q=c["Sq"], seqlen_k=c["Sk"], head_dim=c["D"], dtype=c["dtype"],
                layout=c.get("layout", "bhsd"))


@pytest.fixture(scope="module")
def warm_kernels():
    """Compile every instantiation the GPU tests launch, in parallel, into the disk
    cache (a speed-up only: each test compiles what is missing)."""
    import cupy

    from cupy_attention import device

    if not jit.cache_enabled():
        return
    dev = cupy.cuda.runtime.getDevice()
    arch, limit = device.device_arch(dev), device.max_shared_per_block(dev)
    # (case, dQ modes, kernel) for the grid and for the other GPU tests of this file.
    extra = [(dict(dtype="float16", D=64, causal=True), (False, True), "flash"),
             (dict(dtype="float16", D=64, causal=True, mask="bool"), (False, True), "flash"),
             (dict(dtype="float32", D=64), (False,), "flash"),
             (dict(dtype="float32", D=64, causal=True), (False,), "flash"),
             (dict(dtype="float32", D=16, causal=True), (False,), "flash"),
             (dict(dtype="bfloat16", D=64, causal=True, mask="bool"), (False,), "flash"),
             (dict(dtype="float16", D=64, causal=True), (False, True), "flash_mma"),
             (dict(dtype="bfloat16", D=64, causal=True), (False,), "flash_mma"),
             (dict(dtype="bfloat16", D=64), (False,), "flash_mma"),
             (dict(dtype="float16", D=64, causal=True), (False, True), "flash_wgmma"),
             (dict(dtype="bfloat16", D=64, causal=True), (False,), "flash_wgmma"),
             (dict(dtype="bfloat16", D=64), (False,), "flash_wgmma"),
             (dict(dtype="float16", D=64, causal=True, view="unaligned"), (False, True),
              "flash_mma")]
    wanted = {}
    for c, modes, kernel in [(c, (c.get("deterministic", False),), k)
                             for c, k in GRID_CASES] + extra:
        vt = Variant(c.get("causal", False), dense=c.get("mask") or "none")
        if kernel == "flash_wgmma" and device.compute_capability(dev) != 90:
            continue
        for det in modes:
            if kernel == "flash":
                specs = flash_bwd.specs(flash_bwd.config(c["D"], limit), c["dtype"], vt, det)
            elif kernel == "flash_wgmma":
                specs = flash_wgmma_bwd.specs(flash_wgmma_bwd.config(c["D"], vt), c["dtype"], vt,
                                              det)
            else:
                vec = c["D"] % 8 == 0 and c.get("view") not in ("padded", "unaligned")
                specs = flash_mma_bwd.specs(flash_mma_bwd.config(c["D"], limit), c["dtype"],
                                            vt, vec, det)
            for s in specs:
                wanted[(s, arch)] = None
    workers = max(1, min(len(wanted), os.cpu_count() or 1))
    with cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_warm_one, wanted))


def _warm_one(job):
    from cupy_attention import jit as _jit

    try:
        _jit.load_or_compile(*job)
    except Exception:  # the test that launches it reports the error properly
        pass


def _inputs(c, seed, xp):
    """q, k, v (views as the case asks), mask, and the forward's out / lse / dout in
    the case's layout: out and lse from the same-precision plain forward."""
    shape = _shape(c)
    dtype, layout = c["dtype"], shape["layout"]
    q, k, v, _ = make_qkv(xp, seed, view=c.get("view", "contiguous"),
                          magnitude=c.get("magnitude", 1.0), **shape)
    mask = make_mask(xp, c.get("mask"), seed, batch=shape["batch"], heads_q=shape["heads_q"],
                     seqlen_q=c["Sq"], seqlen_k=c["Sk"])
    causal = c.get("causal", False)
    out, lse = plain_attention(q, k, v, causal=causal, mask=mask, layout=layout, precision=dtype)
    out = xp.ascontiguousarray(cast(to_bhsd(out, layout), dtype, xp))
    dout = cast(normal(xp, seed + 101, out.shape), dtype, xp)
    return q, k, v, mask, out, lse.astype(xp.float32), dout


def _check_grads(c, grads, inputs, meta):
    q, k, v, mask, _, _, dout = inputs
    dtype, layout = c["dtype"], c.get("layout", "bhsd")
    kw = dict(causal=c.get("causal", False), mask=mask, layout=layout)
    ref = plain_backward(dout, q, k, v, **kw)
    same = plain_backward(dout, q, k, v, precision=dtype, **kw)
    # dS = P * (dP - delta) cancels two fp32 sums of D terms of size |dout||v|; where
    # the exact result is 0 (a single key: dP == delta) only that rounding is left.
    # dq = scale * dS k, so the floor is that rounding times scale * max|k|.
    xp = xp_of(q)
    d = q.shape[-1]
    dp_size = d * float(xp.abs(as_float(dout)).max()) * float(xp.abs(as_float(v)).max())
    cancel = 4 * 2.0 ** -23 * dp_size * float(xp.abs(as_float(k)).max()) / math.sqrt(d)
    figs = []
    for name, g, r, s in zip(("dq", "dk", "dv"), grads, ref, same):
        g = to_bhsd(as_float(g), layout)
        figs.append(tolerance(g, r, s, dtype, what=name, factor=3.0, extra=cancel))
        if dtype == "float32" and float(abs(r).max()) > 0:
            rel = figs[-1].max_err / float(abs(r).max())
            assert rel < 1e-5, f"{name}: fp32 max|g-ref|/max|ref| = {rel:.3e} >= 1e-5"
    record(meta, figs)
    return figs


@pytest.mark.gpu
@pytest.mark.parametrize("c,kernel", GRID_CASES,
                         ids=[f"{k}-{_case_id(c)}" for c, k in GRID_CASES])
def test_backward_grid(c, kernel, warm_kernels):
    import cupy

    _skip_unless_device_runs(kernel)
    inputs = _inputs(c, seed_for("bwd", _case_id(c)), cupy)
    q, k, v, mask, out, lse, dout = inputs
    grads = ca.attention_backward(dout, q, k, v, out, lse, causal=c.get("causal", False),
                                  mask=mask, layout=c.get("layout", "bhsd"),
                                  deterministic=c.get("deterministic", False), kernel=kernel)
    for g, x in zip(grads, (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype
    _check_grads(c, grads, inputs, dict(kernel=f"{kernel}_bwd", **c))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("deterministic", [False, True])
def test_fully_masked_rows_and_nonfinite_masked_values(deterministic, kernel, warm_kernels):
    """Causal with Sq > Sk: queries 0..39 attend nothing; NaN in their q and dout
    rows must not leak, and their gradients are exactly zero. Masked-out keys:
    ``flash`` gets a bool mask whose key column 7 is all False and NaN in key 7's
    k and v (dk, dv of key 7 exactly zero); ``flash_mma`` and ``flash_wgmma`` take
    no dense mask, so NaN goes into v of the last key, which only the last query
    attends: every other query's dq, and dk of every other key, stay exact."""
    import cupy

    _skip_unless_device_runs(kernel)

    c = dict(dtype="float16", D=64, Sq=70, Sk=30, causal=True, Hq=2, Hkv=1)
    q, k, v, _ = make_qkv(cupy, 21, **_shape(c))
    mask = None
    if kernel == "flash":
        mask = cupy.ones((1, 1, 70, 30), dtype=bool)
        mask[..., 7] = False
    out, lse = plain_attention(q, k, v, causal=True, mask=mask, precision="float16")
    assert bool(cupy.isneginf(lse[:, :, :40]).all())
    lse = lse.astype(cupy.float32)
    out = cast(out, "float16", cupy)
    dout = cast(normal(cupy, 22, out.shape), "float16", cupy)
    ref = plain_backward(dout, q, k, v, causal=True, mask=mask)
    same = plain_backward(dout, q, k, v, causal=True, mask=mask, precision="float16")
    for x in (q, dout):
        set_values(x, (slice(None), slice(None), slice(0, 6)), np.nan)
    if kernel == "flash":
        for x in (k, v):
            set_values(x, (slice(None), slice(None), 7), np.nan)
        q_rows, k_rows = slice(None), slice(None)
    else:
        set_values(v, (slice(None), slice(None), 29), np.nan)
        q_rows, k_rows = slice(0, 69), slice(0, 29)
    grads = ca.attention_backward(dout, q, k, v, out, lse, causal=True, mask=mask,
                                  deterministic=deterministic, kernel=kernel)
    dq, dk, dv = (as_float(g) for g in grads)
    assert bool((dq[:, :, :40] == 0).all()), "queries that attend nothing get dq = 0"
    if kernel == "flash":
        assert bool((dk[:, :, 7] == 0).all()) and bool((dv[:, :, 7] == 0).all())
    rows = (slice(None), slice(None))
    for name, g, r, s, sel in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, same,
                                  (q_rows, k_rows, slice(None))):
        tolerance(g[rows + (sel,)], r[rows + (sel,)], s[rows + (sel,)], "float16", what=name,
                  factor=3.0)


@pytest.mark.gpu
def test_empty_problems_launch_nothing():
    import cupy

    for B, Sq, Sk in ((0, 5, 7), (2, 0, 7), (2, 5, 0)):
        q = cupy.ones((B, 2, Sq, 8), dtype=cupy.float16)
        k = cupy.ones((B, 1, Sk, 8), dtype=cupy.float16)
        lse = cupy.zeros((B, 2, Sq), dtype=cupy.float32)
        dq, dk, dv = ca.attention_backward(q, q, k, k, q, lse)
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == k.shape
        for g in (dq, dk, dv):
            assert not bool(g.astype(cupy.float32).any())


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
def test_deterministic_reruns_are_bitwise_equal(kernel, warm_kernels):
    import cupy

    _skip_unless_device_runs(kernel)

    c = dict(dtype="float16", D=64, Sq=300, Sk=300, causal=True, Hq=4, Hkv=2)
    q, k, v, mask, out, lse, dout = _inputs(c, 31, cupy)
    kw = dict(causal=True, kernel=kernel)
    first = [g.view(cupy.uint16).copy() for g in
             ca.attention_backward(dout, q, k, v, out, lse, deterministic=True, **kw)]
    for _ in range(49):
        again = ca.attention_backward(dout, q, k, v, out, lse, deterministic=True, **kw)
        for a, b in zip(first, again):
            assert bool((a == b.view(cupy.uint16)).all())
    atomic = ca.attention_backward(dout, q, k, v, out, lse, **kw)
    _check_grads(c, atomic, (q, k, v, mask, out, lse, dout), dict(kernel=f"{kernel}_bwd-atomic"))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,dtype", [("flash", "float32"), ("flash_mma", "bfloat16"),
                                          ("flash_wgmma", "bfloat16")])
def test_backward_allocates_no_s_squared_memory(kernel, dtype, warm_kernels):
    import cupy

    _skip_unless_device_runs(kernel)

    S, D = 4096, 64
    c = dict(dtype=dtype, D=D, Sq=S, Sk=S, Hq=1, Hkv=1)
    q, k, v, _ = make_qkv(cupy, 41, **_shape(c))
    dout = cast(normal(cupy, 42, q.shape), dtype, cupy)
    out, lse = ca.attention(q, k, v, return_lse=True)
    pool = cupy.get_default_memory_pool()
    cupy.cuda.Device().synchronize()
    pool.free_all_blocks()
    before = pool.total_bytes()
    grads = ca.attention_backward(dout, q, k, v, out, lse, kernel=kernel)
    cupy.cuda.Device().synchronize()
    grown = pool.total_bytes() - before
    # dq, dk, dv (3 S D floats), the dQ accumulator (S D) and delta (S): ~4.1 MB.
    o_s = 4 * (4 * S * D + S)
    assert grown <= 2 * o_s, f"backward took {grown} bytes, O(S) bound {2 * o_s}"
    assert grown < 4 * S * S / 8
    del grads


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
def test_through_the_real_forward(kernel, warm_kernels):
    """out and lse from cupy_attention.attention itself (kernel auto) feed the backward."""
    import cupy

    _skip_unless_device_runs(kernel)

    c = dict(dtype="float16", D=64, Sq=200, Sk=333, causal=True, Hq=4, Hkv=2, layout="bshd")
    q, k, v, _ = make_qkv(cupy, 51, **_shape(c))
    out, lse = ca.attention(q, k, v, causal=True, layout="bshd", return_lse=True)
    dout = cast(normal(cupy, 52, out.shape), "float16", cupy)
    grads = ca.attention_backward(dout, q, k, v, out, lse, causal=True, layout="bshd",
                                  kernel=kernel)
    _check_grads(c, grads, (q, k, v, None, out, lse, dout),
                 dict(kernel=f"{kernel}_bwd+fwd-auto"))


@pytest.mark.gpu
def test_wgmma_unaligned_arrays_run_flash_mma(warm_kernels):
    """flash_wgmma needs 16-byte aligned q, k, v and dout: views that start one element
    into their allocation run flash_mma's unaligned kernels instead, in both dQ
    modes, with correct gradients."""
    import cupy

    from cupy_attention.bench import recording_specs

    _skip_unless_device_runs("flash_wgmma")
    c = dict(dtype="float16", D=64, Sq=100, Sk=150, causal=True, Hq=4, Hkv=2)
    q, k, v, _, out, lse, dout = _inputs(c, 71, cupy)

    def shifted(x):  # the same values, 2 bytes past a 16-byte boundary
        y = cupy.empty(x.size + 1, dtype=x.dtype)[1:].reshape(x.shape)
        y[...] = x
        return y

    qs, ks, vs, ds = (shifted(x) for x in (q, k, v, dout))
    for deterministic in (False, True):
        with recording_specs() as names:
            grads = ca.attention_backward(ds, qs, ks, vs, out, lse, causal=True,
                                          deterministic=deterministic, kernel="flash_wgmma")
        assert any(n.startswith("flash_mma_bwd_dkdv[") and ",unaligned" in n for n in names), names
        _check_grads(c, grads, (q, k, v, None, out, lse, dout),
                     dict(kernel="flash_wgmma_bwd-unaligned", deterministic=deterministic))


@pytest.mark.gpu
def test_auto_picks_the_tensor_core_backward(warm_kernels):
    """kernel="auto": flash_wgmma on compute capability 9.0 for fp16/bf16 at D = 64,
    72, ..., 256 without a dense mask, else flash_mma for fp16/bf16 without a dense
    mask, flash for fp32 and dense masks; kernel="flash_mma" or "flash_wgmma" with a
    dense mask, and "flash_wgmma" at another head dim, are clear errors."""
    import cupy

    from cupy_attention import device
    from cupy_attention.bench import recording_specs

    hopper = device.compute_capability(cupy.cuda.runtime.getDevice()) == 90
    tensor_core = "flash_wgmma_bwd_dkdv" if hopper else "flash_mma_bwd_dkdv"
    for dtype, d, mask_kind, want in (("bfloat16", 64, None, tensor_core),
                                      ("float16", 128, None, tensor_core),
                                      ("bfloat16", 80, None, tensor_core),
                                      ("bfloat16", 160, None, tensor_core + "_mid"
                                       if hopper else tensor_core),
                                      ("bfloat16", 200, None, tensor_core + "_wide"
                                       if hopper else tensor_core),
                                      ("bfloat16", 100, None, "flash_mma_bwd_dkdv"),
                                      ("bfloat16", 64, "bool", "flash_bwd_dkdv"),
                                      ("float32", 64, None, "flash_bwd_dkdv")):
        c = dict(dtype=dtype, D=d, Sq=100, Sk=100, causal=True, mask=mask_kind)
        q, k, v, mask, out, lse, dout = _inputs(c, 61, cupy)
        with recording_specs() as names:
            ca.attention_backward(dout, q, k, v, out, lse, causal=True, mask=mask)
        assert any(n.startswith(want + "[") for n in names), (dtype, d, mask_kind, names)
        if mask is not None:
            for kernel in ("flash_mma", "flash_wgmma"):
                with pytest.raises(UnsupportedError, match="dense mask" if hopper else kernel):
                    ca.attention_backward(dout, q, k, v, out, lse, causal=True, mask=mask,
                                          kernel=kernel)
        if d == 100:
            with pytest.raises(UnsupportedError, match="kernel='flash_mma'"):
                ca.attention_backward(dout, q, k, v, out, lse, causal=True, kernel="flash_wgmma")


def _sdpa(q, k, v, causal):
    import torch.nn.functional as F

    group = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1),
                                          v.repeat_interleave(group, 1), is_causal=causal)


@pytest.mark.gpu
def test_torch_autograd_matches_sdpa(warm_kernels):
    torch = pytest.importorskip("torch")
    from cupy_attention.torch import attention

    torch.manual_seed(0)
    q = torch.randn(2, 4, 100, 64, device="cuda", requires_grad=True)
    k = torch.randn(2, 2, 100, 64, device="cuda", requires_grad=True)
    v = torch.randn(2, 2, 100, 64, device="cuda", requires_grad=True)
    dout = torch.randn(2, 4, 100, 64, device="cuda")
    attention(q, k, v, causal=True).backward(dout)
    ours = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    _sdpa(q, k, v, True).backward(dout)
    for a, t in zip(ours, (q, k, v)):
        torch.testing.assert_close(a, t.grad, rtol=1e-4, atol=1e-4)

    qh, kh, vh = (t.detach().to(torch.bfloat16).requires_grad_() for t in (q, k, v))
    attention(qh, kh, vh, causal=True).float().sum().backward()
    for t in (qh, kh, vh):
        assert t.grad.dtype == torch.bfloat16 and bool(torch.isfinite(t.grad).all())


@pytest.mark.gpu
def test_torch_autograd_bf16_matches_sdpa(warm_kernels):
    """bf16 through the torch wrapper (backward kernel auto: flash_wgmma on Hopper,
    else flash_mma): gradients
    against fp32 SDPA within 3x the error of torch's own bf16 SDPA backward, plus
    the bf16 rounding floor."""
    torch = pytest.importorskip("torch")
    from cupy_attention.torch import attention

    torch.manual_seed(1)
    shapes = ((2, 4, 300, 64), (2, 2, 300, 64), (2, 2, 300, 64))
    leaves32 = [torch.randn(s, device="cuda", requires_grad=True) for s in shapes]
    dout = torch.randn(shapes[0], device="cuda")
    _sdpa(*leaves32, True).backward(dout)
    ref = [t.grad for t in leaves32]
    grads = []
    for fn in (lambda q, k, v: attention(q, k, v, causal=True), lambda q, k, v: _sdpa(q, k, v, True)):
        leaves = [t.detach().to(torch.bfloat16).requires_grad_() for t in leaves32]
        fn(*leaves).backward(dout.to(torch.bfloat16))
        grads.append([t.grad.float() for t in leaves])
    ours, theirs = grads
    for name, a, b, r in zip(("dq", "dk", "dv"), ours, theirs, ref):
        err, err_sdpa = (a - r).abs().max().item(), (b - r).abs().max().item()
        floor = 2.0 ** -7 * r.abs().max().item()
        assert err <= 3 * err_sdpa + floor, f"{name}: {err:.3e} vs SDPA bf16 {err_sdpa:.3e}"


@pytest.mark.gpu
def test_toy_transformer_trains_like_sdpa(warm_kernels):
    """A pre-norm block (attention + MLP), CUDAAttention vs the same weights on
    torch SDPA: 200 Adam steps in fp32, learning the causal running mean of the
    input sequence (uniform causal attention solves it)."""
    torch = pytest.importorskip("torch")
    from cupy_attention.torch import CUDAAttention

    class SdpaAttention(torch.nn.Module):
        def __init__(self, like):
            super().__init__()
            self.like = like

        def forward(self, x):
            a = self.like
            B, S, _ = x.shape
            qkv = a.qkv(x).view(B, S, a.num_heads + 2 * a.num_kv_heads, a.head_dim)
            q, k, v = (t.transpose(1, 2) for t in
                       qkv.split([a.num_heads, a.num_kv_heads, a.num_kv_heads], dim=2))
            return a.proj(_sdpa(q, k, v, a.causal).transpose(1, 2).reshape(B, S, a.embed_dim))

    class Block(torch.nn.Module):
        def __init__(self, attn):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(64), torch.nn.LayerNorm(64)
            self.attn = attn
            self.mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                           torch.nn.Linear(128, 64))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    ours = Block(CUDAAttention(64, 4, num_kv_heads=2, causal=True)).cuda()
    theirs = Block(SdpaAttention(CUDAAttention(64, 4, num_kv_heads=2, causal=True))).cuda()
    theirs.load_state_dict({k.replace("attn.", "attn.like."): t
                            for k, t in ours.state_dict().items()})
    gen = torch.Generator(device="cuda").manual_seed(1)
    data = torch.randn(16, 8, 48, 64, device="cuda", generator=gen)
    counts = torch.arange(1, 49, device="cuda", dtype=torch.float32)[None, :, None]
    curves = []
    for model in (ours, theirs):
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses = []
        for step in range(200):
            x = data[step % 16]
            loss = torch.nn.functional.mse_loss(model(x), x.cumsum(dim=1) / counts)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(np.array(losses))
    a, b = curves
    assert a[-10:].mean() < 0.5 * a[:10].mean(), "the block did not learn"
    rel = np.abs(a - b) / b
    assert rel.max() < 2e-2, f"loss curves differ by up to {rel.max():.2e} (step {rel.argmax()})"


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 2, 3, 8])
@pytest.mark.parametrize("c", [
    dict(D=64, Sq=300, Sk=333, Hq=4, Hkv=1, causal=True, dtype="bfloat16"),
    dict(D=128, Sq=257, Sk=200, Hq=4, Hkv=2, causal=False, dtype="float16", layout="bshd"),
    dict(D=128, Sq=130, Sk=390, Hq=2, Hkv=2, B=2, causal=True, dtype="bfloat16"),
    dict(D=200, Sq=190, Sk=190, Hq=3, Hkv=1, causal=True, dtype="bfloat16"),
    dict(D=72, Sq=333, Sk=300, Hq=4, Hkv=2, causal=False, dtype="float16"),
], ids=["d64-gqa-causal", "d128-bshd", "d128-sk-longer", "d200-wide", "d72"])
def test_split_backward_matches_the_reference(c, splits, monkeypatch, warm_kernels):
    """flash_wgmma_bwd with a block of keys' query tiles shared by `splits` blocks (dK
    and dV summed with atomics, then converted): the reference's gradients, as with
    one block per block of keys; more splits than tiles leaves blocks idle."""
    import cupy

    _skip_unless_device_runs("flash_wgmma")
    from cupy_attention import backward

    monkeypatch.setattr(flash_wgmma_bwd, "kv_splits", lambda p, sms, det: splits)
    monkeypatch.setattr(backward, "_HOT", backward.HotCache(0))   # no entry keeps a split
    inputs = _inputs(c, seed_for("bwd-split", _case_id(c)), cupy)
    q, k, v, mask, out, lse, dout = inputs
    grads = ca.attention_backward(dout, q, k, v, out, lse, causal=c["causal"],
                                  layout=c.get("layout", "bhsd"), kernel="flash_wgmma")
    _check_grads(c, grads, inputs, dict(kernel="flash_wgmma_bwd", splits=splits, **c))


def test_kv_splits_fill_the_gpu_only_where_the_grid_is_small():
    from cupy_attention.problem import Problem

    def prob(b, hq, hkv, s, d=128, causal=True, **kw):
        return Problem(b, hq, hkv, s, s, d, "bfloat16", "bhsd", causal, "none", d ** -0.5, 0,
                       **kw)

    small = prob(2, 16, 4, 2048)              # 16 key blocks x 4 x 2 = 128 blocks
    assert flash_wgmma_bwd.kv_splits(small, 132, False) == 3
    assert flash_wgmma_bwd.kv_splits(small, 132, True) == 1, "deterministic: no atomics"
    assert flash_wgmma_bwd.kv_splits(prob(8, 16, 16, 2048), 132, False) == 1, "2048 blocks"
    tiny = prob(1, 4, 1, 256)                 # 2 key blocks, 4 heads x 4 query tiles each
    assert flash_wgmma_bwd.kv_splits(tiny, 132, False) == 4
    assert flash_wgmma_bwd.kv_splits(prob(1, 1, 1, 256), 132, False) == 1, "too few tiles"
    assert flash_wgmma_bwd.kv_splits(prob(1, 64, 8, 8192), 132, False) == 1
    wide = prob(1, 8, 8, 1024, d=256)         # 64-key blocks: 16 x 8 = 128 blocks
    assert flash_wgmma_bwd.kv_splits(wide, 132, False) == 3
    balanced = prob(2, 16, 4, 2048, causal=False)   # 128 blocks of equal work: one wave
    assert flash_wgmma_bwd.kv_splits(balanced, 132, False) == 1
    assert flash_wgmma_bwd.kv_splits(prob(1, 16, 2, 1024, causal=False), 132, False) == 8
    assert flash_wgmma_bwd.kv_splits(prob(2, 16, 4, 2048, window=(256, 0)), 132, False) == 1
    for causal in (False, True):   # D = 72-80: 64-query tiles, split as D = 88-128's
        assert flash_wgmma_bwd.kv_splits(prob(1, 16, 2, 1024, d=72, causal=causal), 132, False) > 1
        assert flash_wgmma_bwd.kv_splits(prob(1, 16, 2, 1024, d=80, causal=causal), 132, False) > 1
    assert all(flash_wgmma_bwd.kv_splits(prob(1, 32, 1, 64 * n), 132, False)
               <= flash_wgmma_bwd.MAX_SPLITS for n in range(1, 40))



def test_sections_only_under_an_upper_bound():
    """base.section: sections of (head, batch) pairs for the causal grids, the largest
    divisor of the pairs up to the bound and up to 16k keys over a section's pairs; one
    pair after another elsewhere (and in the ordered dQ modes, whose turns rely on the
    grid's order)."""
    from cupy_attention.families import base
    from cupy_attention.problem import Problem

    def prob(b, hkv, causal=True, s=2048, **kw):
        return Problem(b, 2 * hkv, hkv, s, s, 128, "bfloat16", "bhsd", causal, "none",
                       0.1, 0, **kw)

    section = flash_wgmma_bwd.bwd_section
    assert section(prob(8, 16), "atomic", 16) == 8
    assert section(prob(8, 16), "separate", 32) == 8
    assert flash_wgmma_bwd.dq_section(prob(8, 16)) == 8
    assert flash_wgmma_bwd.dq_section(prob(8, 16, dropout_p=0.1)) == 1, "the dQ pass's registers"
    assert section(prob(2, 3), "atomic", 3) == 6
    assert section(prob(1, 11), "atomic", 11) == 1, "no divisor of 11 up to 8 but 1"
    assert section(prob(8, 16, causal=False), "atomic", 16) == 1
    assert section(prob(8, 16, causal=False, window=(256, 0)), "atomic", 16) == 8
    assert section(prob(8, 16), "ordered", 16) == 1, "the ordered dQ keeps the grid's order"
    assert section(prob(8, 16), "staggered", 16) == 1
    assert section(prob(8, 16, varlen=True), "atomic", 16) == 1
    assert section(prob(2, 16, s=4096), "atomic", 16) == 4, "16k keys a section"
    assert section(prob(2, 16, s=8192), "atomic", 16) == 2
    assert section(prob(2, 16, s=3000), "atomic", 16) == 4, "divisors of 32 up to 5"
    assert section(prob(2, 16, s=16384), "atomic", 16) == 1, "long keys: the L2"
    assert base.section_grid(16, 16, 8, 8) == (128, 16, 1)
    assert base.section_grid(16, 16, 8, 1) == (16, 16, 8)
    # flash_mma's kernels: the 16-byte builds of the causal fixed-length variants
    from cupy_attention.families import flash_mma
    for d in (64, 96, 256):   # not D_PAD = 112, 128: acc and S past 160 registers a thread
        cfg = flash_mma.tiles_for(d)
        assert flash_mma.sections(d, Variant(True), True, cfg), d
        assert not flash_mma.sections(d, Variant(True), False, cfg), d
        assert ",sections]" in flash_mma.spec(d, "bfloat16", Variant(True), True).name
        assert "sections" not in flash_mma.spec(d, "bfloat16", Variant(False), True).name
    assert not any(flash_mma.sections(d, Variant(True), True, flash_mma.tiles_for(d)) for d in (104, 128))
    mma = flash_mma_bwd
    assert mma.sections(Variant(True), True) and not mma.sections(Variant(True), False)
    assert not mma.sections(Variant(False), True)
    assert not mma.sections(Variant(True, ragged=True), True)
    assert mma.dq_section(prob(8, 16)) == 8 and mma.dq_section(prob(8, 16), vec=False) == 1
    for vec in (True, False):
        names = [s.name for s in mma.specs(mma.config(128), "bfloat16", Variant(True), vec, True)]
        assert [",sections" in n for n in names] == [False, vec, vec], names


def test_mma_dq_rows8_only_where_the_rows_group():
    """flash_mma_bwd.rows8 and flash_wgmma_bwd.rows8: dq_accum's rows in groups of 8 for
    the atomic dQ from registers of fixed lengths with Sq % 8 == 0 (flash_mma's 16-byte
    builds), and the dK/dV kernel and the conversion of one launch agree on it;
    flash_wgmma's narrow kernel stages dQ instead."""
    from cupy_attention.problem import Problem

    def prob(sq, **kw):
        return Problem(2, 4, 2, sq, 300, 128, "bfloat16", "bhsd", True, "none", 0.1, 0, **kw)

    mma = flash_mma_bwd
    assert mma.rows8(prob(512), True, False)
    assert not mma.rows8(prob(300), True, False), "Sq % 8 != 0: groups would cross heads"
    assert not mma.rows8(prob(512), False, False), "unaligned builds"
    assert not mma.rows8(prob(512), True, True), "deterministic: no dq_accum"
    assert not mma.rows8(prob(512, varlen=True), True, False), "packed sequences"
    for rows8 in (False, True):
        names = [s.name for s in mma.specs(mma.config(128), "bfloat16", Variant(True), True,
                                           False, rows8)]
        assert [",rows8" in n for n in names] == [False, rows8, rows8], names
    det = [s.name for s in mma.specs(mma.config(128), "bfloat16", Variant(True), True, True, True)]
    assert not any("rows8" in n for n in det), det
    # flash_wgmma's narrow kernel stages dQ at every tile shape: dq_accum's rows in order
    w = flash_wgmma_bwd
    for d in (64, 72, 80, 96, 128):
        for causal in (False, True):
            vt = Variant(causal)
            c = w.config(d, vt)
            assert c.stage_dq, (d, causal)
            names = [s.name for s in w._plan(d, "bfloat16", vt, False)[2]]
            assert not any("rows8" in n for n in names), names


@pytest.mark.gpu
@pytest.mark.parametrize("c,kernel", [
    (dict(D=128, Sq=300, Sk=300, Hq=8, Hkv=4, B=2, causal=True, dtype="bfloat16"), "flash_wgmma"),
    (dict(D=64, Sq=200, Sk=333, Hq=6, Hkv=3, B=2, causal=True, dtype="float16"), "flash_wgmma"),
    (dict(D=256, Sq=390, Sk=300, Hq=4, Hkv=2, B=3, causal=True, dtype="bfloat16"), "flash_wgmma"),
    (dict(D=128, Sq=300, Sk=300, Hq=8, Hkv=4, B=2, causal=True, dtype="bfloat16"), "flash_mma"),
    (dict(D=96, Sq=257, Sk=190, Hq=4, Hkv=4, B=3, causal=True, dtype="float16"), "flash_mma"),
], ids=["wgmma-d128", "wgmma-d64-sk-longer", "wgmma-d256-dq-pass", "mma-d128",
        "mma-d96-sq-longer"])
def test_sections_change_only_the_order(c, kernel, monkeypatch, warm_kernels):
    """The causal backward grids in sections of (head, batch) pairs (base.section) give
    the reference's gradients, and the dK, dV of one pair after another bitwise (each
    block owns its keys; only dQ's atomic order may change), the deterministic mode's
    dQ bitwise too."""
    import cupy

    _skip_unless_device_runs(kernel)
    from cupy_attention import backward

    monkeypatch.setattr(flash_wgmma_bwd, "kv_splits", lambda p, sms, det: 1)
    inputs = _inputs(c, seed_for("bwd-section", _case_id(c)), cupy)
    q, k, v, mask, out, lse, dout = inputs
    runs = []
    for bound in (1, 8):
        monkeypatch.setenv("CUPY_ATTENTION_SECTION", str(bound))
        monkeypatch.setattr(backward, "_HOT", backward.HotCache(0))
        grads = ca.attention_backward(dout, q, k, v, out, lse, causal=True, kernel=kernel)
        det = ca.attention_backward(dout, q, k, v, out, lse, causal=True, kernel=kernel,
                                    deterministic=True)
        runs.append((grads, det))
    (g1, d1), (g8, d8) = runs
    for name, a, b in [("dk", g1[1], g8[1]), ("dv", g1[2], g8[2])] + [
            (f"deterministic {n}", x, y) for n, x, y in zip(("dq", "dk", "dv"), d1, d8)]:
        assert bool((a == b).all()), f"{name} differs between section bounds 1 and 8"
    _check_grads(c, g8, inputs, dict(kernel=f"{kernel}_bwd", sections=8, **c))

_FLAT_DQ = flash_wgmma_bwd.flat_dq   # the rule itself, whatever a test patched in


def _flat_runs(monkeypatch, flat_on, run):
    """(``run()``, what flat_dq chose in it) with flat_dq as the rule says
    (``flat_on``) or never, on cold hot-path caches (attention_backward's and
    attention_varlen_backward's)."""
    from cupy_attention import backward, varlen

    chosen = []

    def spy(p, cfg, mode, dq):
        chosen.append(_FLAT_DQ(p, cfg, mode, dq))
        return chosen[-1]

    monkeypatch.setattr(flash_wgmma_bwd, "flat_dq",
                        spy if flat_on else (lambda p, cfg, mode, dq: False))
    monkeypatch.setattr(backward, "_HOT", backward.HotCache(0))
    monkeypatch.setattr(varlen, "HOT_BACKWARD", varlen.HotCache(0))
    return run(), chosen


@pytest.mark.gpu
@pytest.mark.parametrize("c", [
    dict(D=128, Sq=256, Sk=300, Hq=8, Hkv=4, B=2, causal=True, dtype="bfloat16"),
    dict(D=64, Sq=384, Sk=384, Hq=6, Hkv=3, B=2, causal=False, dtype="float16"),
    dict(D=64, Sq=256, Sk=200, Hq=4, Hkv=1, B=2, causal=True, dtype="bfloat16"),
    dict(D=96, Sq=192, Sk=250, Hq=4, Hkv=2, B=1, causal=True, dtype="float16"),
    dict(D=72, Sq=192, Sk=192, Hq=2, Hkv=1, B=2, causal=True, dtype="bfloat16"),
    dict(D=80, Sq=256, Sk=130, Hq=4, Hkv=4, B=1, causal=False, dtype="float16"),
    dict(D=88, Sq=128, Sk=320, Hq=4, Hkv=2, B=2, causal=True, dtype="bfloat16"),
    dict(D=104, Sq=256, Sk=256, Hq=2, Hkv=2, B=1, causal=True, dtype="float16"),
    dict(D=112, Sq=192, Sk=200, Hq=8, Hkv=1, B=1, causal=True, dtype="bfloat16"),
], ids=["d128-causal-gqa2", "d64", "d64-causal-sk-shorter", "d96-causal", "d72-causal",
        "d80", "d88-causal-sk-longer", "d104-causal", "d112-causal-mqa"])
def test_flat_dq_changes_only_the_layout(c, monkeypatch, warm_kernels):
    """dQ staged and added in its own order (flat_dq: the tiles of dQ, whole query
    tiles) gives the reference's gradients in both modes, and in the deterministic mode
    the same dQ, dK and dV bitwise as dq_accum's rows in order (the same additions in
    the same order, only their place in dq_accum differs)."""
    import cupy

    _skip_unless_device_runs("flash_wgmma")
    monkeypatch.setattr(flash_wgmma_bwd, "kv_splits", lambda p, sms, det: 1)
    inputs = _inputs(c, seed_for("bwd-flat-dq", _case_id(c)), cupy)
    q, k, v, mask, out, lse, dout = inputs
    kw = dict(causal=c["causal"], kernel="flash_wgmma")
    runs = {}
    for on in (False, True):
        runs[on], chosen = _flat_runs(monkeypatch, on, lambda: [
            ca.attention_backward(dout, q, k, v, out, lse, deterministic=det, **kw)
            for det in (False, True)])
    assert chosen == [True, True], chosen
    for name, a, b in zip(("dq", "dk", "dv"), runs[False][1], runs[True][1]):
        assert bool((a == b).all()), f"deterministic {name} differs with dQ in its own order"
    for grads in runs[True]:
        _check_grads(c, grads, inputs, dict(kernel="flash_wgmma_bwd", flat_dq=True, **c))


@pytest.mark.gpu
@pytest.mark.parametrize("c", [
    dict(D=128, Sq=256, Sk=256, Hq=4, Hkv=2, B=2, causal=True, dtype="bfloat16", splits=2),
    dict(D=64, Sq=512, Sk=384, Hq=2, Hkv=1, B=1, causal=False, dtype="float16", splits=3),
    dict(D=96, Sq=256, Sk=320, Hq=4, Hkv=4, B=1, causal=False, dtype="bfloat16", splits=2),
    dict(D=120, Sq=384, Sk=384, Hq=2, Hkv=1, B=1, causal=True, dtype="float16", splits=3),
], ids=["d128-causal-2", "d64-3", "d96-2", "d120-causal-3"])
def test_flat_dq_with_a_split(c, monkeypatch, warm_kernels):
    """The split kernel (kv_splits blocks a block of keys, each over its share of the
    query tiles) with dQ in its own order: the reference's gradients, and the split
    taken with the FLAT build."""
    import cupy

    _skip_unless_device_runs("flash_wgmma")
    splits = c["splits"]
    monkeypatch.setattr(flash_wgmma_bwd, "kv_splits", lambda p, sms, det: 1 if det else splits)
    inputs = _inputs(c, seed_for("bwd-flat-split", _case_id(c)), cupy)
    q, k, v, mask, out, lse, dout = inputs
    names = []
    real_plan = flash_wgmma_bwd._plan

    def plan(*a):
        planned = real_plan(*a)
        names.append(planned[2][1].name)
        return planned

    monkeypatch.setattr(flash_wgmma_bwd, "_plan", plan)
    grads, chosen = _flat_runs(monkeypatch, True, lambda: ca.attention_backward(
        dout, q, k, v, out, lse, causal=c["causal"], kernel="flash_wgmma"))
    assert chosen == [True], chosen
    assert len(names) == 1 and names[0].endswith(",split,flat]"), names
    _check_grads(c, grads, inputs, dict(kernel="flash_wgmma_bwd", flat_dq=True, **c))


@pytest.mark.gpu
@pytest.mark.parametrize("c", [
    dict(D=88, Sq=256, Sk=256, Hq=4, Hkv=2, B=1, causal=True, dtype="bfloat16", softcap=30.0),
    dict(D=64, Sq=192, Sk=250, Hq=2, Hkv=1, B=2, causal=False, dtype="float16", softcap=5.0),
    dict(D=64, Sq=256, Sk=256, Hq=2, Hkv=2, B=1, causal=True, dtype="bfloat16", dropout_p=0.2),
    dict(D=96, Sq=192, Sk=300, Hq=4, Hkv=1, B=1, causal=False, dtype="float16", dropout_p=0.1),
], ids=["d88-causal-softcap", "d64-softcap", "d64-causal-dropout", "d96-dropout"])
def test_flat_dq_under_a_transform(c, monkeypatch, warm_kernels):
    """Softcap and dropout with dQ in its own order: the deterministic mode's dQ, dK
    and dV bitwise those of dq_accum's rows in order, and the default mode's within
    the dtype's rounding of them (a misplaced fragment moves whole values)."""
    import cupy

    _skip_unless_device_runs("flash_wgmma")
    monkeypatch.setattr(flash_wgmma_bwd, "kv_splits", lambda p, sms, det: 1)
    q, k, v, _, _, _, dout = _inputs(c, seed_for("bwd-flat-transform", _case_id(c)), cupy)
    kw = dict(causal=c["causal"], kernel="flash_wgmma", softcap=c.get("softcap"))
    if c.get("dropout_p"):
        kw.update(dropout_p=c["dropout_p"], dropout_seed=4242, dropout_offset=8)
    out, lse = ca.attention(q, k, v, return_lse=True, **kw)
    runs = {}
    for on in (False, True):
        runs[on], chosen = _flat_runs(monkeypatch, on, lambda: [
            ca.attention_backward(dout, q, k, v, out, lse, deterministic=det, **kw)
            for det in (False, True)])
        assert not on or chosen == [True, True], chosen
    eps = 2.0 ** -7 if c["dtype"] == "bfloat16" else 2.0 ** -10
    for name, a, b in zip(("dq", "dk", "dv"), runs[True][1], runs[False][1]):
        assert bool((a == b).all()), f"deterministic {name} differs with dQ in its own order"
    for name, a, ref in zip(("dq", "dk", "dv"), runs[True][0], runs[False][1]):
        a, ref = as_float(a), as_float(ref)
        err, top = float(abs(a - ref).max()), float(abs(ref).max())
        assert top > 0 and err <= 2 * eps * top, f"{name}: {err} against {top}"


def test_flat_dq_rule():
    """flat_dq: the narrow kernel's tiles of dQ (64 and 128 queries, not the 80-query
    tiles' dQ^T), dQ in the dK/dV kernel, fixed lengths of whole query tiles, dq's rows
    16-byte aligned (packed sequences: any lengths, the atomic mode); not under dropout
    in the atomic mode at D = 128."""
    from cupy_attention.problem import Problem
    from cupy_attention.variant import Variant

    w = flash_wgmma_bwd

    class Dq:   # what flat_dq reads of a device array: strides and the base pointer
        def __init__(self, ptr, row=128):
            self.shape, self.itemsize = (2, 8, 512, 128), 2
            self.strides = (8 * 512 * row * 2, 512 * row * 2, row * 2, 2)
            self.data = type("Ptr", (), {"ptr": ptr})()

    dq = Dq(1 << 20)

    def rule(d, sq=512, causal=True, det=False, dq=dq, **kw):
        p = Problem(2, 8, 2, sq, sq, d, "bfloat16", "bhsd", causal, "none", d ** -0.5, 0, **kw)
        c = w.config(d, p.variant, det)
        return w.flat_dq(p, c, w._dq_mode(c, p.variant, det), dq)

    assert rule(128) and rule(128, det=True) and rule(64, causal=False)
    assert rule(64, det=True) is w.config(64, Variant(True), True).flat_fits
    assert not rule(128, causal=False)          # 80-query tiles: dQ^T
    assert rule(96) and rule(72, causal=False)  # 64 x 32 and 64 x 8 fragments beside 64 x 64
    assert rule(96, det=True) and rule(120, det=True)
    assert not rule(96, causal=False) and not rule(256)   # dQ^T; the wide kernel
    assert not rule(128, sq=500)                # a partial query tile
    assert not rule(128, dropout_p=0.1)         # (its build spilled 40 bytes)
    assert rule(128, dropout_p=0.1, det=True) and rule(96, dropout_p=0.1)
    assert rule(128, window=(64, 0), softcap=30.0) and rule(128, window=(64, 0))
    # packed sequences: any lengths (a sequence's partial last tile keeps its rows in
    # order), the atomic mode only
    assert rule(96, sq=500, varlen=True) and not rule(96, sq=500, varlen=True, det=True)
    assert not rule(128, dq=Dq((1 << 20) + 2))  # rows not 16-byte aligned
    assert not rule(128, dq=Dq(1 << 20, row=132))
    names = [s.name for s in w.specs(w.config(128, Variant(True)), "bfloat16", Variant(True),
                                     False, flat=True)]
    assert names[1].endswith(",flat]") and "flash_wgmma_bwd_dq_convert" in names[2], names


def test_deterministic_dq_is_ordered_where_the_narrow_kernel_stages_it():
    """Deterministic mode: the dK/dV kernel adds dQ in a fixed order of key blocks
    (one kernel and no recomputation) wherever it stages dQ over fixed lengths; the
    wide kernel is followed by a dQ pass of its own in both modes (flash_wgmma_bwd_dq),
    packed sequences too; packed sequences up to D = 128 keep flash_mma's. Without dropout it
    takes 64-query tiles and the producer warpgroup where the default mode takes 128
    (D = 64 with ALiBi).
    The family asks for a dq_accum with a turn counter per query tile."""
    from cupy_attention.dispatch import backward_families
    from cupy_attention.problem import Problem
    from cupy_attention.variant import Variant

    def prob(d, causal=True, **kw):
        return Problem(2, 8, 2, 1000, 1200, d, "bfloat16", "bhsd", causal, "none", d ** -0.5, 0,
                       **kw)

    def names(d, vt, det):
        return [s.name for s in flash_wgmma_bwd.specs(flash_wgmma_bwd.config(d, vt, det),
                                                      "bfloat16", vt, det)]

    for d, causal in ((64, False), (64, True), (72, False), (80, False), (96, True),
                      (128, False), (128, True), (72, True)):
        vt = Variant(causal)
        assert flash_wgmma_bwd.ordered_dq(prob(d, causal)), d
        got = names(d, vt, True)
        rows = (",BM=128," if d == 64   # 128-query tiles with P^T in sP (KV_SS_FITS)
                else ",BM=80," if d >= 88 and not causal else ",BM=64,")  # _rows80
        assert rows in got[1] and ",ordered-dq" in got[1], got
        assert got[2].startswith("flash_wgmma_bwd_dq_convert"), got   # counted per tile
        assert flash_wgmma_bwd.config(d, vt, True).threads("ordered", vt) == 384
        default = names(d, vt, False)[1]
        assert ",atomic-dq" in default
        assert (",BM=128," in default) == (d == 64), default
    vt = Variant(True, dense="alibi")   # D = 64 with ALiBi: 64-query tiles (KV_SS spilled)
    assert ",BM=64," in names(64, vt, True)[1] and ",ordered-dq" in names(64, vt, True)[1]
    assert flash_wgmma_bwd.config(64, vt, True).threads("ordered", vt) == 384
    vt = Variant(False, dropout=True)   # dropout: 64-query tiles, the producer warpgroup
    assert ",BM=64," in names(64, vt, True)[1] and ",ordered-dq" in names(64, vt, True)[1]
    assert flash_wgmma_bwd.config(64, vt, True).threads("ordered", vt) == 256  # atomic only
    assert flash_wgmma_bwd.config(64, vt, False).threads("atomic", vt) == 384
    # D = 136-192 (flash_wgmma_bwd_dkdv_mid): dQ in the kernel in both modes, ordered in
    # the deterministic one over whole query tiles (else the wide kernel and its pass)
    for det, mode in ((False, ",atomic-dq]"), (True, ",ordered-dq]")):
        got = names(136, Variant(True), det)
        assert got[1].startswith("flash_wgmma_bwd_dkdv_mid[") and got[1].endswith(mode), got
        assert got[2].startswith("flash_wgmma_bwd_dq_convert[") and ",flat" in got[2], got
    assert flash_wgmma_bwd.ordered_dq(Problem(2, 8, 2, 1024, 1200, 136, "bfloat16", "bhsd", True,
                                              "none", 136 ** -0.5, 0))
    assert not flash_wgmma_bwd.ordered_dq(prob(136, True))   # Sq = 1000: not whole tiles
    families = backward_families()["flash_wgmma"]
    assert families.dq_accum_shape(prob(136, True), False) is not None
    d, causal = 256, False
    assert not flash_wgmma_bwd.ordered_dq(prob(d, causal)), d
    for det in (False, True):
        got = names(d, Variant(causal), det)
        assert "-dq" not in got[1] and got[2].startswith("flash_wgmma_bwd_dq"), got
    assert families.dq_accum_shape(prob(d, causal), False) is None
    assert families.dq_accum_shape(prob(d, causal), True) is None
    vt = Variant(True, ragged=True)   # packed sequences too
    for det in (False, True):
        got = names(256, vt, det)
        assert "-dq" not in got[1] and got[2].startswith("flash_wgmma_bwd_dq"), got
    assert not flash_wgmma_bwd.ordered_dq(prob(128, varlen=True))

    vt = Variant(True)
    assert "staggered-dq" in flash_wgmma_bwd.specs(flash_wgmma_bwd.config(128, vt), "bfloat16", vt,
                                                   True, staggered=True)[1].name
    vt = Variant(False)   # no upper bound: lockstep whatever the grid
    assert "ordered-dq" in flash_wgmma_bwd.specs(flash_wgmma_bwd.config(128, vt), "bfloat16", vt,
                                                 True, staggered=True)[1].name
    many = Problem(4, 16, 16, 4096, 4096, 128, "bfloat16", "bhsd", True, "none", 0.1, 0)
    assert flash_wgmma_bwd.staggered_turns(many, 132)          # 2048 blocks
    assert not flash_wgmma_bwd.staggered_turns(prob(128), 132)  # 40
    family = backward_families()["flash_wgmma"]
    p = prob(128)                              # 64-query tiles: 16 per (batch, head)
    assert family.dq_accum_shape(p, False) == (2, 8, 1000, 128)
    assert family.dq_accum_shape(p, True) == (2 * 8 * 1000 * 128 + 2 * 8 * 16,)
    assert flash_wgmma_bwd.dq_turns(prob(64)) == 2 * 8 * 8    # 128-query tiles (KV_SS_FITS)
    assert family.dq_accum_shape(prob(256), True) is None
    assert backward_families()["flash_mma"].dq_accum_shape(p, True) is None


def _ordered_case(c, seed):
    """q, k, v, dout, the flash_wgmma forward's out and lse, and the attention
    keywords of an ordered-dQ test case ``c``."""
    import cupy

    rng = cupy.random.default_rng(seed)
    shapes = [(c["B"], h, s, c["D"]) for h, s in ((c["Hq"], c["Sq"]), (c["Hkv"], c["Sk"]),
                                                   (c["Hkv"], c["Sk"]), (c["Hq"], c["Sq"]))]
    q, k, v, dout = (cast(rng.standard_normal(s, dtype=cupy.float32), c["dtype"], cupy)
                     for s in shapes)
    kw = dict(causal=c["causal"], window=c.get("window"), kernel="flash_wgmma")
    out, lse = ca.attention(q, k, v, return_lse=True, **kw)
    return q, k, v, dout, out, lse, kw


@pytest.mark.gpu
@pytest.mark.parametrize("c", [
    # 4 x 2 x 32 key blocks: more blocks than SMs, each query tile's 32 in one order
    dict(dtype="bfloat16", D=128, Sq=4096, Sk=4096, B=4, Hq=8, Hkv=2, causal=False),
    # causal with Sk > Sq (bottom-right): the first key blocks reach every tile
    dict(dtype="float16", D=64, Sq=1500, Sk=3000, B=2, Hq=4, Hkv=4, causal=True),
    # a window: the blocks that reach a tile start past the first (lowest_block)
    dict(dtype="bfloat16", D=96, Sq=2000, Sk=2000, B=1, Hq=4, Hkv=1, causal=True,
         window=(300, 0)),
    # the producer warpgroup's edges: key blocks that one, two or no query tiles
    # reach (a short window, Sk > Sq), GQA 3
    dict(dtype="float16", D=112, Sq=200, Sk=700, B=2, Hq=6, Hkv=2, causal=True,
         window=(64, 0)),
    # flash_wgmma_bwd_dkdv_mid (96-key blocks, its reducer warp takes the turns)
    dict(dtype="bfloat16", D=160, Sq=1024, Sk=1000, B=2, Hq=4, Hkv=2, causal=True),
    dict(dtype="float16", D=192, Sq=2048, Sk=2048, B=1, Hq=2, Hkv=1, causal=False),
    # a head's 20 key blocks split across waves (132 SMs): lockstep, not rotated
    dict(dtype="bfloat16", D=168, Sq=1280, Sk=1900, B=2, Hq=8, Hkv=4, causal=False),
], ids=["d128-full", "d64-causal-sk-longer", "d96-window", "d112-few-tiles", "d160-mid",
        "d192-mid", "d168-mid-split-head"])
@pytest.mark.parametrize("staggered", [False, True], ids=["lockstep", "staggered"])
def test_ordered_dq_is_bitwise_reproducible(c, staggered, monkeypatch, warm_kernels):
    """The deterministic mode's ordered dQ (flash_wgmma_bwd_dkdv, kDqOrdered, and under
    a causal band kDqStaggered): 50 reruns bitwise equal, and the atomic mode's
    gradients up to the order of fp32 sums."""
    import cupy

    from cupy_attention import backward
    from cupy_attention.bench import recording_specs

    _skip_unless_device_runs("flash_wgmma")
    if staggered and not c["causal"]:
        pytest.skip("staggered turns need an upper bound (causal)")
    monkeypatch.setattr(backward, "_HOT", backward.HotCache(0))   # every call dispatches
    monkeypatch.setattr(flash_wgmma_bwd, "STAGGERED_MIN_BLOCKS_PER_SM",
                        0 if staggered else 10 ** 9)
    q, k, v, dout, out, lse, kw = _ordered_case(c, 61)
    with recording_specs() as names:
        first = ca.attention_backward(dout, q, k, v, out, lse, deterministic=True, **kw)
    assert any((",staggered-dq" if staggered else ",ordered-dq") in n for n in names), names
    bits = [g.view(cupy.uint16).copy() for g in first]
    for _ in range(49):
        again = ca.attention_backward(dout, q, k, v, out, lse, deterministic=True, **kw)
        for a, b in zip(bits, again):
            assert bool((a == b.view(cupy.uint16)).all())
    atomic = ca.attention_backward(dout, q, k, v, out, lse, **kw)
    for name, a, b in zip(("dq", "dk", "dv"), first, atomic):
        a64, b64 = as_float(a, cupy), as_float(b, cupy)
        err = float(cupy.abs(a64 - b64).max())
        assert err <= 2 ** -6 * float(cupy.abs(b64).max()), (name, err)


@pytest.mark.gpu
@pytest.mark.parametrize("c", [
    dict(dtype="bfloat16", D=128, Sq=1000, Sk=1000, B=2, Hq=8, Hkv=2, causal=True),
    dict(dtype="float16", D=96, Sq=700, Sk=900, B=1, Hq=4, Hkv=4, causal=False),   # 80 rows
    # the first Sq - Sk rows attend nothing: tiles no key block reaches convert at once
    dict(dtype="bfloat16", D=104, Sq=900, Sk=500, B=1, Hq=4, Hkv=1, causal=True),
    dict(dtype="bfloat16", D=72, Sq=800, Sk=800, B=1, Hq=2, Hkv=2, causal=True,
         window=(100, 0)),
], ids=["d128-causal-gqa", "d96-bm80", "d104-sq-longer", "d72-window"])
@pytest.mark.parametrize("rows16", [True, False], ids=["per-tile", "dq-unaligned"])
def test_counted_dq_conversion(c, rows16, monkeypatch, warm_kernels):
    """The deterministic mode's ordered dQ: flash_wgmma_bwd_dq_convert runs as the
    dK/dV kernel's programmatic dependent and converts each query tile once its turns
    are complete (tiles no key block reaches at once); where dq's rows are not 16-byte
    aligned (forced here) flash_bwd_dq_convert runs after the grid. The gradients
    match flash_mma's."""
    import cupy

    from cupy_attention import backward
    from cupy_attention.bench import recording_specs

    _skip_unless_device_runs("flash_wgmma")
    monkeypatch.setattr(backward, "_HOT", backward.HotCache(0))   # every call dispatches
    if not rows16:
        monkeypatch.setattr(flash_wgmma_bwd, "_rows16", lambda p, dq: False)
    q, k, v, dout, out, lse, kw = _ordered_case(c, 63)
    with recording_specs() as names:
        got = ca.attention_backward(dout, q, k, v, out, lse, deterministic=True, **kw)
    after = any(n.startswith("flash_bwd_dq_convert") for n in names)   # loaded for the fallback
    assert after != rows16 and any(",ordered-dq" in n or ",staggered-dq" in n
                                   for n in names), names
    want = ca.attention_backward(dout, q, k, v, out, lse,
                                 **dict(kw, kernel="flash_mma"))
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        a64, b64 = as_float(a, cupy), as_float(b, cupy)
        assert bool(cupy.isfinite(a64).all()), name
        err = float(cupy.abs(a64 - b64).max())
        assert err <= 2 ** -6 * max(float(cupy.abs(b64).max()), 1e-3), (name, err)


def test_ordered_dq_stores_first_only_where_every_tile_has_a_key_block():
    """The ordered dQ's first key block of a query tile stores its dQ (dq_store_first)
    and flash_bwd_delta skips zeroing dq_accum's floats, where every query tile has a
    key block: not under a window, nor causal with Sq > Sk."""
    import numpy as np

    from cupy_attention.families import flash_bwd
    from cupy_attention.problem import Problem

    def prob(causal, sq, sk, window=None):
        return Problem(2, 8, 2, sq, sk, 128, "bfloat16", "bhsd", causal, "none", 0.1, 0,
                       window=window)

    assert flash_wgmma_bwd.store_first(prob(False, 1000, 500))
    assert flash_wgmma_bwd.store_first(prob(True, 1000, 1200))
    assert flash_wgmma_bwd.store_first(prob(True, 1000, 1000))
    assert not flash_wgmma_bwd.store_first(prob(True, 1200, 1000))
    assert not flash_wgmma_bwd.store_first(prob(True, 1000, 1000, window=(100, 0)))

    def tensors(problem):
        n = problem.batch * problem.heads_q * problem.seqlen_q
        return flash_bwd.BwdTensors(
            fwd=None, dout=None, dq=None, dk=None, dv=None, delta=np.zeros(n, np.float32),
            dq_accum=np.zeros(n * 128 + flash_wgmma_bwd.dq_turns(problem), np.float32))

    for problem, det, want in ((prob(True, 1000, 1000), True, 1),
                               (prob(True, 1000, 1000), False, 0),
                               (prob(True, 1200, 1000), True, 0)):
        got = flash_wgmma_bwd._with_turns(problem, tensors(problem), det, 132)
        assert got.dq_store_first == want, (problem, det)
        assert (got.dq_turn_rows > 0) == det
        assert got.dq_rotate == 0, "causal: staggered or lockstep turns"
    got = flash_wgmma_bwd._with_turns(prob(False, 1000, 1000), tensors(prob(False, 1000, 1000)),
                                      True, 132)
    assert got.dq_rotate == 1 and got.dq_store_first == 1


def test_rotated_turns_only_without_a_band_and_within_one_wave():
    """The ordered dQ's rotated walk (TileScheduler::rotated_turn): no band, no more key
    blocks than query tiles, and a head's key blocks all on the GPU at once; the turns
    it gives each query tile are 0 .. N - 1 in the order the blocks reach the tile."""
    from cupy_attention.problem import Problem

    def prob(sq, sk, d=128, causal=False, window=None, **kw):
        return Problem(2, 8, 2, sq, sk, d, "bfloat16", "bhsd", causal, "none", 0.1, 0,
                       window=window, **kw)

    rot = flash_wgmma_bwd.rotated_turns
    assert rot(prob(2048, 2048), 132) and rot(prob(2048, 2048, d=64), 132)
    assert rot(prob(2048, 1024), 132), "fewer key blocks than query tiles"
    assert not rot(prob(1024, 2048, d=64), 132), "more key blocks than query tiles"
    assert not rot(prob(32768, 32768), 132), "256 key blocks a head: not one wave"
    assert not rot(prob(2048, 2048, causal=True), 132)
    assert not rot(prob(2048, 2048, window=(256, 256)), 132)
    assert not rot(prob(2048, 2048, varlen=True, max_seqlen_q=2048, max_seqlen_k=2048), 132)
    # the mid kernel (96 keys a block): not where a wave holds part of a head's blocks
    assert rot(prob(2048, 2048, d=160), 132), "22 blocks a head: 6 heads a wave"
    assert not rot(prob(8192, 8192, d=160), 132), "86 blocks a head: 46 SMs on a split one"
    assert rot(prob(1280, 1900, d=168), 10 ** 4), "one wave"

    def turn(n, j, big_n, t):   # the kernel's rotated_turn, mirrored
        return min(j, big_n - 1 - n) if n + j < t else big_n - 1 - n + min(n + j - t + 1, big_n)

    for t in range(1, 24):
        for big_n in range(1, t + 1):
            for q in range(t):   # block n reaches tile q at iteration j = (t - 1 - q - n) mod t
                order = sorted(range(big_n), key=lambda n: (t - 1 - q - n) % t)
                assert [turn(n, (t - 1 - q - n) % t, big_n, t) for n in order] == list(range(big_n))


@pytest.mark.gpu
@pytest.mark.parametrize("c", [
    dict(dtype="bfloat16", D=128, Sq=1000, Sk=1000, B=2, Hq=4, Hkv=2, causal=False),
    dict(dtype="float16", D=64, Sq=700, Sk=1300, B=2, Hq=4, Hkv=4, causal=True),
    dict(dtype="bfloat16", D=96, Sq=900, Sk=900, B=1, Hq=6, Hkv=2, causal=True),
    # no stored first addition: the rows that attend nothing keep dQ 0 from the zeroing
    dict(dtype="bfloat16", D=128, Sq=900, Sk=600, B=1, Hq=4, Hkv=1, causal=True),
    dict(dtype="bfloat16", D=80, Sq=800, Sk=800, B=1, Hq=2, Hkv=2, causal=True,
         window=(100, 0)),
], ids=["d128", "d64-causal-sk-longer", "d96-causal", "d128-causal-sq-longer", "d80-window"])
def test_ordered_dq_ignores_what_dq_accum_held(c, monkeypatch, warm_kernels):
    """The deterministic mode's dQ does not depend on what its dq_accum scratch held
    before the call (NaN here): each query tile's first key block stores, or the delta
    kernel zeroes it; it matches the default mode up to the order of fp32 sums."""
    import cupy

    from cupy_attention import backward, calls

    _skip_unless_device_runs("flash_wgmma")
    monkeypatch.setattr(backward, "_HOT", backward.HotCache(0))   # every call dispatches
    plain = calls.allocator

    def poisoned(ctx, q):
        alloc = plain(ctx, q)

        def fill(shape, dtype, zero):
            x = alloc(shape, dtype, zero)
            if not zero and cupy.dtype(dtype) == cupy.float32:
                x.fill(cupy.nan)
            return x
        return fill
    q, k, v, dout, out, lse, kw = _ordered_case(c, 62)
    atomic = ca.attention_backward(dout, q, k, v, out, lse, **kw)
    monkeypatch.setattr(backward, "allocator", poisoned)
    det = ca.attention_backward(dout, q, k, v, out, lse, deterministic=True, **kw)
    for name, a, b in zip(("dq", "dk", "dv"), det, atomic):
        a64, b64 = as_float(a, cupy), as_float(b, cupy)
        assert bool(cupy.isfinite(a64).all()), name
        err = float(cupy.abs(a64 - b64).max())
        assert err <= 2 ** -6 * float(cupy.abs(b64).max()), (name, err)
