"""GPU: attention_decode (contiguous and paged caches, GQA packing, Sq > 1, split-KV)
and merge_attention_states against float64, with TESTING.md's tolerance rule.

The reference of each sequence is the plain attention (tests/helpers.py) over the
keys its cache holds, gathered through the page table: written independently of the
kernel, of its page walk and of cupy_attention.reference. Cache rows no sequence
holds (spare pages, the tail of each last page, rows past a contiguous length) are
NaN, so a read of one shows up as NaN in the output.

    python -m pytest -q tests/test_gpu_decode.py
"""

from __future__ import annotations

import itertools
import os
from types import SimpleNamespace

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention.families import decode as fam
from cupy_attention.families import flash_wgmma
from cupy_attention.variant import Variant

from helpers import (as_float, bits_of, check_attention, fill, nan_array, noise_floor, normal,
                     plain_attention, seed_for)

pytestmark = pytest.mark.gpu

HEADS = ((8, 8), (32, 8), (16, 2))
DIMS = (64, 128, 256)
PAGES = (None, 1, 16, 64)          # None: a contiguous cache
DTYPES = ("float16", "bfloat16")
# Lengths per batch size: 1, a length not a multiple of any page size, very
# different lengths in one batch (0: output 0 and LSE -inf).
LENGTHS = {1: (1000,), 3: (1, 37, 300), 8: (0, 1, 15, 16, 17, 100, 513, 2000)}


@pytest.fixture(scope="module", autouse=True)
def _compile_in_parallel():
    """Compile the aligned instantiations the grid below launches, in a process pool."""
    import concurrent.futures as cf
    import multiprocessing

    import cupy

    from cupy_attention import device, jit
    from helpers import _compile_into_cache

    if not jit.cache_enabled():
        return
    dev = cupy.cuda.runtime.getDevice()
    arch, sms = device.device_arch(dev), device.multiprocessor_count(dev)
    limit = device.max_shared_per_block(dev)
    jobs = {}
    for page, (hq, hkv), d, sq, dtype, causal in itertools.product(
            PAGES, HEADS, DIMS, (1, 4), DTYPES, (False, True)):
        for b in LENGTHS:
            s = fam.DecodeShape(b, hq, hkv, sq, 2048, d, dtype, Variant(causal),
                                page is not None)
            for splits in (None, 1, 5):
                p = fam.plan(s, True, sms, splits, limit,
                             copy_engine=device.arch_cc(arch) >= 90)
                jobs[(p.spec, arch)] = None
                jobs[(fam.split_merge_spec(dtype, d), arch)] = None
    with cf.ProcessPoolExecutor(min(len(jobs), os.cpu_count() or 1),
                                mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile_into_cache, list(jobs)))


# ---------------------------------------------------------------------------
# Building a cache

def make_cache(seed, *, B, Hq, Hkv, D, Sq, lengths, page, dtype, spare=3):
    """(q, k_cache, v_cache, block_table or None, cache_seqlens, per-sequence K, V).

    Paged: every sequence's pages are drawn from a shuffled pool (so no sequence's
    pages are in order or adjacent), plus ``spare`` pages nobody holds; table
    entries past a sequence's last page are -1. Everything not held is NaN."""
    import cupy

    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, dtype=np.int32)
    q = nan_array((B, Sq, Hq, D), dtype, cupy)
    fill(q, normal(cupy, seed, (B, Sq, Hq, D)), dtype)
    if page is None:
        cap = int(lengths.max(initial=0)) + 5
        shape = (B, cap, Hkv, D)
        table = None
    else:
        per = [-(-int(n) // page) for n in lengths]
        n_pages = sum(per) + spare
        pool = rng.permutation(n_pages)
        table_h = np.full((B, max(per, default=0) + 1), -1, dtype=np.int32)
        at = 0
        for b, n in enumerate(per):
            table_h[b, :n] = pool[at:at + n]
            at += n
        shape = (n_pages, page, Hkv, D)
        table = cupy.asarray(table_h)
    k = nan_array(shape, dtype, cupy)
    v = nan_array(shape, dtype, cupy)
    ks, vs = [], []
    for b, n in enumerate(lengths):
        n = int(n)
        j = np.arange(n)
        # where key j of sequence b lives: (batch or page, row)
        at = ((np.full(n, b), j) if page is None
              else (table_h[b, j // page].astype(np.int64), j % page))
        at = tuple(cupy.asarray(x) for x in at)
        for dst, out, w in ((k, ks, "k"), (v, vs, "v")):
            if n:
                dst.view(cupy.uint16)[at] = bits_of(normal(cupy, seed_for(seed, b, w),
                                                           (n, Hkv, D)), dtype, cupy)
            # the sequence's keys as the kernel should see them, gathered independently
            out.append(dst.view(cupy.uint16)[at].view(dst.dtype) if n else dst[:0, 0])
    return q, k, v, table, cupy.asarray(lengths), ks, vs


def reference(q, ks, vs, *, causal, dtype, window=None, scale=None, softcap=None):
    """(ref, same, ref_lse, same_lse) in [B, Hq, Sq, D] / [B, Hq, Sq], float64, per
    sequence through the plain attention."""
    import cupy

    B, Sq, Hq, D = q.shape
    outs = {"float64": ([], []), dtype: ([], [])}
    for b in range(B):
        n = ks[b].shape[0]
        mask = None
        if window is not None:
            i = cupy.arange(Sq)[:, None] + (n - Sq)
            j = cupy.arange(n)[None, :]
            left, right = window
            keep = cupy.ones((Sq, n), dtype=bool)
            if left >= 0:
                keep &= j >= i - left
            if right >= 0:
                keep &= j <= i + right
            mask = keep[None, None]
        for prec in outs:
            o, lse = plain_attention(q[b:b + 1], ks[b][None], vs[b][None], causal=causal,
                                     mask=mask, layout="bshd", precision=prec, scale=scale,
                                     softcap=softcap)
            outs[prec][0].append(o)
            outs[prec][1].append(lse)
    ref, ref_lse = (cupy.concatenate(x) for x in outs["float64"])
    same, same_lse = (cupy.concatenate(x) for x in outs[dtype])
    return ref, same, ref_lse, same_lse


def run_case(seed, *, B, Hq, Hkv, D, Sq, page, dtype, causal=True, splits=None, lengths=None,
             window=None, max_seqlen=None, scale=None, softcap=None):
    q, k, v, table, lens, ks, vs = make_cache(seed, B=B, Hq=Hq, Hkv=Hkv, D=D, Sq=Sq,
                                              lengths=lengths or LENGTHS[B], page=page,
                                              dtype=dtype)
    out, lse = ca.attention_decode(q, k, v, cache_seqlens=lens, block_table=table,
                                   causal=causal, return_lse=True, num_splits=splits,
                                   window=window, max_seqlen=max_seqlen, scale=scale,
                                   softcap=softcap or 0.0)
    assert out.shape == q.shape and lse.shape == (B, Hq, Sq)
    ref, same, ref_lse, same_lse = reference(q, ks, vs, causal=causal, dtype=dtype,
                                             window=window, scale=scale, softcap=softcap)
    check_attention(as_float(out).swapaxes(1, 2), ref, same, dtype, lse=lse.astype(np.float64),
                    ref_lse=ref_lse, same_lse=same_lse)
    return out, lse


# ---------------------------------------------------------------------------
# The grid: every page size x heads x head dim x Sq x dtype; batch sizes, split
# counts and causality cycle through the cases so each value meets each page size.

GRID = [
    dict(page=page, Hq=hq, Hkv=hkv, D=d, Sq=sq, dtype=dt)
    for page, (hq, hkv), d, sq, dt in itertools.product(PAGES, HEADS, DIMS, (1, 4), DTYPES)
]
for n, case in enumerate(GRID):
    case["B"] = (1, 3, 8)[n % 3]
    case["splits"] = (None, 1, 5)[(n // 3) % 3]
    case["causal"] = (n // 9) % 2 == 0


def _id(c):
    return (f"{'contig' if c['page'] is None else 'page' + str(c['page'])}-B{c['B']}-"
            f"{c['Hq']}/{c['Hkv']}-D{c['D']}-Sq{c['Sq']}-{c['dtype']}-split{c['splits']}-"
            f"{'causal' if c['causal'] else 'full'}")


@pytest.mark.parametrize("case", GRID, ids=[_id(c) for c in GRID])
def test_decode_grid(case):
    run_case(seed_for("grid", _id(case)), **case)


@pytest.mark.parametrize("page", [None, 16, 48, 256])
def test_results_do_not_depend_on_the_split_count(page):
    kw = dict(B=3, Hq=16, Hkv=2, D=128, Sq=2, page=page, dtype="bfloat16",
              lengths=(4000, 1, 2500))
    seed = seed_for("splits", page)
    outs = [run_case(seed, splits=s, **kw) for s in (1, 2, 7, 16, None)]
    import cupy

    base_o, base_l = (as_float(x) for x in outs[0])
    fin = cupy.isfinite(base_l)        # -inf: query 0 of the 1-key sequence sees nothing
    for o, l in outs[1:]:
        floor = noise_floor(base_o, "bfloat16")
        assert float(abs(as_float(o) - base_o).max()) <= 2 * floor
        l = as_float(l)
        assert bool((l[~fin] == base_l[~fin]).all())
        assert float(abs(l[fin] - base_l[fin]).max()) <= \
            1e-5 * max(1.0, float(abs(base_l[fin]).max()))


@pytest.mark.parametrize("D,splits", [(128, 24), (128, 40), (256, 64), (72, 33), (30, 20)])
def test_split_merge_batches(D, splits):
    """merge_splits (the plan takes 24, 36, 57, 29 and 18 of these counts) past one
    batch of 8 partials and past 32 (the LSEs' second lane chunk), two float4s a lane
    at D = 256, and D = 30 (not a multiple of 4: merge_states instead): each against
    float64, with a sequence of no keys among them."""
    run_case(seed_for("split-merge", D, splits), B=3, Hq=8, Hkv=2, D=D, Sq=1, page=16,
             dtype="bfloat16", splits=splits, lengths=(9000, 0, 4100))


@pytest.mark.parametrize("splits", [1, 16])
def test_dependent_launches_wait_for_the_kernel_before(splits, monkeypatch):
    """sm_90+: the decode is launched as the programmatic dependent of the kernel before
    it and the merge as the decode's (kernels/common/pdl.cuh). Each call here follows
    an in-place rewrite of q and of the lengths by an ordinary kernel, and writes the
    same output buffer, so a decode that read before that kernel finished, or a merge
    that read the partials before the decode wrote them, would differ from the same
    calls launched in order: they must agree bit for bit."""
    import cupy

    from cupy_attention import device, jit

    if device.arch_cc(device.device_arch(cupy.cuda.runtime.getDevice())) < 90:
        pytest.skip("programmatic dependent launch is sm_90+")
    q, k, v, table, lens, _, _ = make_cache(seed_for("pdl", splits), B=4, Hq=32, Hkv=8, D=128,
                                            Sq=1, lengths=(3000, 1, 4096, 700), page=16,
                                            dtype="bfloat16")
    qs = [normal(cupy, seed_for("pdl-q", i), q.shape).astype(q.dtype) for i in range(12)]
    # each at most the sequence's length in make_cache (rows past it are NaN)
    lengths = [cupy.asarray(np.array([3000 - 97 * i, i % 2, 4096 - 300 * i, 700 - 5 * i],
                                     dtype=np.int32)) for i in range(12)]

    def run():
        out = cupy.empty(q.shape, dtype=q.dtype)   # [B, Sq, Hq, D], reused
        got = []
        for qi, li in zip(qs, lengths):
            q[...] = qi
            lens[...] = li
            out[...] = ca.attention_decode(q, k, v, cache_seqlens=lens, block_table=table,
                                           num_splits=splits)
            got.append(out.copy())
        cupy.cuda.get_current_stream().synchronize()
        return got

    dependent = run()
    assert jit._launch_kernel_ex() is not None, "this driver has cuLaunchKernelEx"
    monkeypatch.setattr(jit, "_launch_ex_fn", [None])   # ordinary launches
    ordered = run()
    for a, b in zip(dependent, ordered):
        assert bool(cupy.array_equal(a.view(cupy.uint16), b.view(cupy.uint16)))
    assert not bool(cupy.array_equal(ordered[0], ordered[1]))   # the inputs did change


@pytest.mark.parametrize("max_seqlen", [0, 100])
def test_a_short_max_seqlen_costs_speed_not_correctness(max_seqlen):
    """The split plan made for 0 or 100 keys; the last split runs to each end."""
    run_case(seed_for("maxlen", max_seqlen), B=1, Hq=32, Hkv=8, D=128, Sq=1, page=16,
             dtype="bfloat16", lengths=(5000,), max_seqlen=max_seqlen)
    run_case(seed_for("maxlen-split", max_seqlen), B=1, Hq=32, Hkv=8, D=128, Sq=1, page=16,
             dtype="bfloat16", lengths=(5000,), max_seqlen=max_seqlen, splits=4)


@pytest.mark.parametrize("D", [72, 96, 160])
def test_head_dims_not_a_power_of_two(D):
    run_case(seed_for("dims", D), B=3, Hq=8, Hkv=2, D=D, Sq=2, page=16, dtype="float16")


def test_long_sequence_beside_empty_ones():
    run_case(seed_for("long"), B=3, Hq=32, Hkv=8, D=128, Sq=1, page=64, dtype="bfloat16",
             lengths=(65536, 0, 3))


# (Hq, Hkv, Sq): packed rows group x Sq = 64 (four row warps), 32 and 21 (two), 128
# (two blocks of 64), 16 (MHA, one row per head).
@pytest.mark.parametrize("Hq,Hkv,Sq", [(32, 8, 16), (16, 2, 4), (24, 8, 7), (64, 8, 16),
                                       (8, 8, 16)])
@pytest.mark.parametrize("page", [None, 16])
def test_many_packed_rows(Hq, Hkv, Sq, page):
    run_case(seed_for("rows", Hq, Hkv, Sq, page), B=3, Hq=Hq, Hkv=Hkv, D=128, Sq=Sq, page=page,
             dtype="bfloat16", lengths=(Sq, 700, 3000), splits=(None, 3)[Sq % 2])


@pytest.mark.parametrize("Sq", [2, 8, 16])
def test_speculative_rows_mqa(Sq):
    run_case(seed_for("mqa", Sq), B=3, Hq=8, Hkv=1, D=64, Sq=Sq, page=16, dtype="bfloat16",
             lengths=(Sq - 1, 100, 1000))   # the first sequence is shorter than Sq


def test_sliding_window():
    run_case(seed_for("window"), B=3, Hq=16, Hkv=2, D=128, Sq=4, page=16, dtype="bfloat16",
             window=(50, -1), splits=3)


@pytest.mark.parametrize("scale", [-0.7, 0.0])
@pytest.mark.parametrize("page", [None, 16])
def test_scale_of_any_sign(scale, page):
    """A negative scale makes the max of the raw dots the min of the scores, so the
    interior key tiles, where a non-negative scale joins the exp2's FMA, take the
    variant's scores first; 0 makes every attended key equal."""
    run_case(seed_for("scale", scale, page), B=3, Hq=16, Hkv=2, D=128, Sq=2, page=page,
             dtype="bfloat16", lengths=(3000, 1, 700), scale=scale)


@pytest.mark.parametrize("scale", [2.0, 50.0])
@pytest.mark.parametrize("page", [None, 16])
def test_scores_that_rise_past_the_reference(scale, page):
    """Large scales spread the scores so that later key tiles rise above a warp's
    reference m_i: by 8 to 128 (exp2 domain) the max-free softmax settles on the
    tile's largest p, past 128 it recomputes the tile's scores under the exact max
    (at 2.0 the first mostly, at 50 the second)."""
    run_case(seed_for("rise", scale, page), B=3, Hq=16, Hkv=2, D=128, Sq=2, page=page,
             dtype="bfloat16", lengths=(3000, 1, 700), scale=scale, splits=2)


# The warpgroup tile (use_wgmma: sm_90a, caches through tensor maps, more than 32
# packed rows, D <= 128): contiguous caches and pages of a multiple of 16 rows, head
# dims not a power of two, rows padded to 64 (48) and two row blocks (128), windows,
# forced splits, sequences shorter than Sq and empty ones.
WGMMA_CASES = [
    dict(page=None, Hq=32, Hkv=8, Sq=16, D=128, dtype="bfloat16", lengths=(16, 700, 3000)),
    dict(page=16, Hq=32, Hkv=8, Sq=16, D=128, dtype="float16", lengths=(0, 700, 3000), splits=3),
    # (the paged producer tile with barriers per consumer warpgroup, plan()'s halves:
    # grids of at most half the SMs; the case above has 72 blocks)
    dict(page=16, Hq=32, Hkv=8, Sq=16, D=128, dtype="bfloat16", lengths=(33, 1000, 4000)),
    dict(page=64, Hq=32, Hkv=8, Sq=16, D=128, dtype="float16", lengths=(65, 2000, 97)),
    dict(page=48, Hq=16, Hkv=2, Sq=8, D=64, dtype="bfloat16", lengths=(7, 100, 2000),
         causal=False),
    dict(page=64, Hq=64, Hkv=8, Sq=16, D=96, dtype="bfloat16", lengths=(15, 1000, 129)),
    dict(page=256, Hq=32, Hkv=8, Sq=12, D=72, dtype="float16", lengths=(12, 300, 2500),
         window=(100, 0)),
    dict(page=None, Hq=8, Hkv=1, Sq=16, D=64, dtype="float16", lengths=(1, 5000, 64), splits=5),
    dict(page=None, Hq=32, Hkv=4, Sq=8, D=80, dtype="bfloat16", lengths=(8, 1500, 333),
         window=(300, 20), causal=False),
    # past D = 128 (Q in 64 registers a thread at D = 256)
    dict(page=None, Hq=32, Hkv=8, Sq=16, D=256, dtype="bfloat16", lengths=(16, 700, 3000),
         splits=2),
    dict(page=16, Hq=16, Hkv=2, Sq=16, D=160, dtype="float16", lengths=(0, 900, 2100)),
    dict(page=64, Hq=32, Hkv=8, Sq=16, D=256, dtype="bfloat16", lengths=(15, 1000, 129),
         window=(300, 0), softcap=30.0),
    # 160 blocks of 64 rows: more than an SM each, so paged caches keep the two-block tile
    dict(page=16, Hq=16, Hkv=4, Sq=16, D=128, dtype="bfloat16", B=40,
         lengths=tuple(range(5, 40 * 41, 41))),
]


def _on_sm90a() -> bool:
    import cupy

    from cupy_attention import device

    return device.device_arch(cupy.cuda.runtime.getDevice()) == "sm_90a"


def _loaded_on_sm90a(pred):
    """On sm_90a: whether a loaded kernel's name satisfies ``pred`` (None elsewhere)."""
    from cupy_attention import jit

    if not _on_sm90a():
        return None
    return any(pred(spec.name) for spec, _, _ in jit._loaded)


def _wgmma_ran(D):
    """On sm_90a: whether a warpgroup-tile decode of head dim D was loaded (None elsewhere)."""
    return _loaded_on_sm90a(lambda name: ",wgmma" in name and f"[D={D}," in name)


@pytest.mark.parametrize("case", WGMMA_CASES,
                         ids=[f"{c['page']}-B{c.get('B', 3)}-{c['Hq']}/{c['Hkv']}-Sq{c['Sq']}-"
                              f"D{c['D']}" for c in WGMMA_CASES])
def test_warpgroup_tile(case):
    run_case(seed_for("wgmma", tuple(sorted(case.items()))), **{"B": 3, **case})
    assert _wgmma_ran(case["D"]) in (None, True)


# Caches without tensor maps (pages of 1, 8 and 40 rows) under the warpgroup tile: its
# swizzled ring gathered by cp.async (GATHER traits).
GATHER_CASES = [
    dict(page=1, Hq=32, Hkv=8, Sq=16, D=64, dtype="float16", lengths=(0, 700, 3000), splits=3),
    dict(page=1, Hq=32, Hkv=8, Sq=16, D=128, dtype="bfloat16", lengths=(16, 1500, 77)),
    dict(page=8, Hq=16, Hkv=2, Sq=8, D=96, dtype="bfloat16", lengths=(7, 100, 2000),
         causal=False),
    dict(page=40, Hq=32, Hkv=8, Sq=12, D=72, dtype="float16", lengths=(12, 300, 2500),
         window=(100, 0), softcap=30.0),
    dict(page=1, Hq=32, Hkv=8, Sq=16, D=256, dtype="bfloat16", lengths=(16, 1500, 77)),
]


def _gather_ran(D):
    """On sm_90a: whether a gathered warpgroup-tile decode of head dim D was loaded."""
    return _loaded_on_sm90a(lambda name: ",gather,wgmma]" in name and f"[D={D}," in name)


@pytest.mark.parametrize("case", GATHER_CASES,
                         ids=[f"page{c['page']}-{c['Hq']}/{c['Hkv']}-Sq{c['Sq']}-D{c['D']}"
                              for c in GATHER_CASES])
def test_warpgroup_tile_gathered(case):
    run_case(seed_for("gather", tuple(sorted(case.items()))), **{"B": 3, **case})
    assert _gather_ran(case["D"]) in (None, True)


def test_warpgroup_tile_gathered_from_a_contiguous_cache(monkeypatch):
    """A contiguous cache denied its tensor maps takes the gathered tile too."""
    monkeypatch.setattr(fam, "use_tma", lambda *args: False)
    run_case(seed_for("gather-contig"), B=2, Hq=32, Hkv=8, Sq=16, D=128, page=None,
             dtype="bfloat16", lengths=(900, 4000), splits=2)
    assert _gather_ran(128) in (None, True)


@pytest.mark.parametrize("Sq,page,four", [(1, 16, True), (16, 16, True), (16, None, True),
                                          (1, None, False)])
def test_four_block_tiles(Sq, page, four, monkeypatch):
    """More 64-row blocks than two an SM holds, at D = 64 (320 of them): on sm_90a the
    warpgroup tile and paged tensor-map tiles take BLOCK_SMEM_NARROW's rings (four blocks
    an SM), contiguous mma.sync tiles (Sq = 1) keep two; lengths of every residue."""
    plans = []
    launch = fam.launch_decode

    def recorded(s, scale, p, *args, **kw):
        plans.append(p)
        return launch(s, scale, p, *args, **kw)

    monkeypatch.setattr(fam, "launch_decode", recorded)
    lengths = tuple((37 * b) % 1100 for b in range(80))
    run_case(seed_for("four-block", Sq, page), B=80, Hq=16, Hkv=4, D=64, Sq=Sq, page=page,
             dtype="bfloat16", lengths=lengths, causal=Sq > 1)
    assert len(plans) == 1
    if _on_sm90a():
        assert (plans[0].smem <= fam.BLOCK_SMEM_NARROW) == four, plans[0].spec.name


@pytest.mark.parametrize("scale", [2.0, 50.0])
@pytest.mark.parametrize("page", [None, 16])
def test_warpgroup_tile_scores_that_rise(scale, page):
    """As test_scores_that_rise_past_the_reference, on 64 packed rows: a warp whose
    sums fail the bound recomputes its scores alone (mma.sync) beside the warpgroup's
    wgmma."""
    run_case(seed_for("wgmma-rise", scale, page), B=3, Hq=16, Hkv=2, D=128, Sq=8, page=page,
             dtype="bfloat16", lengths=(3000, 8, 700), scale=scale, splits=2)
    assert _wgmma_ran(128) in (None, True)


# Chunked prefill: many query rows of each sequence against its cache. On sm_90a, with
# work tiles for every SM, flash_wgmma's cache kernels run it (families/flash_wgmma.py,
# takes_cache): boxes through tensor maps (contiguous caches, pages of 64 rows and
# more), or rows gathered with cp.async (pages whose boxes would hold 32 rows or
# fewer, and page sizes that are not a multiple of 16). Lengths cover every residue
# mod 16 (V's last 16-row box is loaded from exact 8/4/2/1-row boxes, a gathered
# tile zero-fills its rows past the sequence: the rows past a sequence are NaN here),
# lengths below Sq (rows that see no key: 0 and -inf) and 0.
PREFILL_LENGTHS = {
    "a": (0, 129, 258, 387, 516, 645, 774, 903),        # residues 0, 1, 2, 3, 4, 5, 6, 7
    "b": (1032, 1161, 1290, 1419, 1548, 1677, 1806, 1935),  # 8 .. 15
    "c": (77, 2000, 4097),
}
PREFILL_CASES = [
    dict(page=32, B=8, Hq=32, Hkv=8, D=128, Sq=128, dtype="bfloat16", lengths="a"),
    dict(page=16, B=8, Hq=32, Hkv=8, D=256, Sq=128, dtype="float16", lengths="b",
         causal=False),
    dict(page=16, B=8, Hq=32, Hkv=8, D=128, Sq=128, dtype="bfloat16", lengths="b"),
    dict(page=48, B=3, Hq=32, Hkv=8, D=64, Sq=256, dtype="float16", lengths="c"),
    dict(page=64, B=8, Hq=16, Hkv=2, D=256, Sq=160, dtype="bfloat16", lengths="b"),
    dict(page=256, B=3, Hq=32, Hkv=4, D=128, Sq=300, dtype="bfloat16", lengths="c",
         causal=False),
    dict(page=None, B=8, Hq=32, Hkv=8, D=128, Sq=128, dtype="bfloat16", lengths="a"),
    dict(page=None, B=3, Hq=32, Hkv=8, D=80, Sq=256, dtype="float16", lengths="c"),
    # 64 query rows: the decode kernel (below CACHE_MIN_SEQLEN_Q)
    dict(page=16, B=8, Hq=32, Hkv=32, D=96, Sq=64, dtype="bfloat16", lengths="b"),
    dict(page=32, B=3, Hq=32, Hkv=1, D=128, Sq=256, dtype="bfloat16", lengths="c"),
    dict(page=64, B=3, Hq=32, Hkv=8, D=128, Sq=256, dtype="bfloat16", lengths="c",
         window=(300, -1)),
    dict(page=128, B=3, Hq=32, Hkv=8, D=128, Sq=256, dtype="bfloat16", lengths="c",
         softcap=30.0),
    dict(page=None, B=3, Hq=32, Hkv=8, D=192, Sq=256, dtype="float16", lengths="c",
         window=(100, 50), causal=False),
    # page sizes that are not a multiple of 16: gathered rows only
    dict(page=1, B=8, Hq=32, Hkv=8, D=128, Sq=128, dtype="bfloat16", lengths="b"),
    dict(page=8, B=8, Hq=32, Hkv=8, D=80, Sq=128, dtype="float16", lengths="b"),
    dict(page=24, B=8, Hq=32, Hkv=4, D=64, Sq=160, dtype="bfloat16", lengths="a"),
    dict(page=40, B=3, Hq=32, Hkv=8, D=192, Sq=256, dtype="bfloat16", lengths="c",
         window=(300, -1)),
    dict(page=100, B=3, Hq=32, Hkv=8, D=96, Sq=256, dtype="float16", lengths="c",
         softcap=30.0, causal=False),
    # gathered rows whose chunks fill a power of two of lanes only in part: spare lanes
    # zero-fill (D = 88, 104, 232) or copy nothing (D = 136); one offset a load (D = 64
    # under softcap: 112-key tiles)
    dict(page=1, B=8, Hq=32, Hkv=4, D=88, Sq=160, dtype="float16", lengths="a"),
    dict(page=8, B=3, Hq=32, Hkv=8, D=104, Sq=256, dtype="bfloat16", lengths="c"),
    dict(page=1, B=3, Hq=32, Hkv=4, D=136, Sq=256, dtype="float16", lengths="c",
         causal=False),
    dict(page=24, B=8, Hq=32, Hkv=8, D=232, Sq=128, dtype="bfloat16", lengths="b"),
    dict(page=8, B=8, Hq=32, Hkv=8, D=64, Sq=128, dtype="bfloat16", lengths="a",
         softcap=30.0),
    # gathered tiles of their own at D = 136-160 causal (GATHER_CAUSAL_WIDE)
    dict(page=8, B=3, Hq=32, Hkv=8, D=160, Sq=256, dtype="bfloat16", lengths="c"),
]


def _gathers(page, D, causal=True, softcap=None):
    """Whether flash_wgmma gathers the rows of a paged cache of ``page`` rows."""
    if page is None:
        return False
    s = SimpleNamespace(head_dim=D, variant=SimpleNamespace(causal=causal,
                                                            transforms=softcap is not None))
    return flash_wgmma.cache_gathers(s, page, tma_ok=page % 16 == 0)


@pytest.fixture
def cache_runs(monkeypatch):
    """Calls of flash_wgmma's cache kernel during the test (CacheLaunch.run), and whether
    the device routes there at all (sm_90a)."""
    import cupy

    from cupy_attention import device

    from cupy_attention import decode

    runs = []
    real = flash_wgmma.CacheLaunch.run
    # no hot launch of an earlier test with the same shapes (it would skip the route)
    monkeypatch.setattr(decode._HOT, "entries", {})

    def run(self, *args, **kwargs):
        runs.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(flash_wgmma.CacheLaunch, "run", run)
    return runs, device.device_arch(cupy.cuda.runtime.getDevice()) == "sm_90a"


def _prefill_id(c):
    return (f"{'contig' if c['page'] is None else 'page' + str(c['page'])}-B{c['B']}-"
            f"{c['Hq']}/{c['Hkv']}-D{c['D']}-Sq{c['Sq']}-{c['dtype']}-{c['lengths']}"
            + ("-full" if c.get("causal") is False else "")
            + (f"-window{c['window']}" if c.get("window") else "")
            + ("-softcap" if c.get("softcap") else ""))


@pytest.mark.parametrize("case", PREFILL_CASES, ids=[_prefill_id(c) for c in PREFILL_CASES])
def test_chunked_prefill(case, cache_runs):
    name = _prefill_id(case)
    case = dict(case)
    case["lengths"] = PREFILL_LENGTHS[case["lengths"]]
    run_case(seed_for("prefill", name), **case)
    runs, hopper = cache_runs
    expected = hopper and case["Sq"] >= flash_wgmma.CACHE_MIN_SEQLEN_Q
    assert len(runs) == int(expected)
    if expected:
        assert runs[0].vt.cache == ("contiguous" if case["page"] is None else "paged")
        assert runs[0].gather == _gathers(case["page"], case["D"], case.get("causal", True),
                                          case.get("softcap"))


@pytest.mark.parametrize("page,D,lengths", [(16, 128, "a"), (16, 128, "b"), (48, 64, "c"),
                                             (80, 96, "c")])
@pytest.mark.parametrize("gather", [False, True], ids=["boxes", "gather"])
def test_chunked_prefill_small_boxes(page, D, lengths, gather, cache_runs, monkeypatch):
    """Pages whose boxes hold 16 rows (gcd with the key tile), both ways: 4 to 8 boxes
    a K or V tile, issued by the producer warp's lanes, exact V tails at every residue
    mod 16 (GATHER_MAX_BOX 0: the way a cache that cannot be gathered goes), and the
    rows gathered by the producer warpgroup."""
    monkeypatch.setattr(flash_wgmma, "GATHER_MAX_BOX", 16 if gather else 0)
    run_case(seed_for("prefill-small", page, D, lengths), B=len(PREFILL_LENGTHS[lengths]),
             Hq=32, Hkv=8, D=D, Sq=128 if lengths != "c" else 256, page=page,
             dtype="bfloat16", lengths=PREFILL_LENGTHS[lengths])
    runs, hopper = cache_runs
    assert len(runs) == int(hopper)
    assert all(r.gather == gather for r in runs)


@pytest.mark.parametrize("page", [None, 16, 64])
def test_chunked_prefill_scores_that_rise(page, cache_runs):
    """A large scale lifts later key tiles 128 (exp2 domain) above a row's running max:
    the warp recomputes that tile's scores from K in global memory, located through the
    block table (CachedKV::k_row)."""
    run_case(seed_for("prefill-rise", page), B=3, Hq=32, Hkv=8, D=128, Sq=256, page=page,
             dtype="bfloat16", lengths=(3000, 300, 1700), scale=50.0)
    runs, hopper = cache_runs
    assert len(runs) == int(hopper)


@pytest.mark.parametrize("page", [16, 32])
def test_chunked_prefill_hot_path_and_appends(page, cache_runs):
    """The second call with the same shapes takes the hot path (device lengths and
    table), and k_new / v_new appended before the prefill land where it reads them
    (gathered rows at page 16, boxes at page 32)."""
    import cupy

    B, Hq, Hkv, D, Sq = 3, 32, 8, 128, 256
    lengths = (700, 300, 1000)
    q, k, v, table, lens, ks, vs = make_cache(seed_for("prefill-hot"), B=B, Hq=Hq, Hkv=Hkv,
                                              D=D, Sq=Sq, lengths=[n + Sq for n in lengths],
                                              page=page, dtype="bfloat16")
    k_new = cupy.stack([x[-Sq:] for x in ks])
    v_new = cupy.stack([x[-Sq:] for x in vs])
    before = cupy.asarray(np.asarray(lengths, dtype=np.int32))
    # clear the appended rows in the cache, so only the append can put them back
    for b, n in enumerate(lengths):
        j = np.arange(n, n + Sq)
        at = (cupy.asarray(table.get()[b, j // page].astype(np.int64)), cupy.asarray(j % page))
        k[at] = 0
        v[at] = 0
    out, lse = ca.attention_decode(q, k, v, cache_seqlens=before, block_table=table,
                                   return_lse=True, k_new=k_new, v_new=v_new)
    ref, same, ref_lse, same_lse = reference(q, ks, vs, causal=True, dtype="bfloat16")
    check_attention(as_float(out).swapaxes(1, 2), ref, same, "bfloat16",
                    lse=lse.astype(np.float64), ref_lse=ref_lse, same_lse=same_lse)
    for _ in range(2):   # the hot path: the same shapes, the lengths after the append
        again, lse2 = ca.attention_decode(q, k, v, cache_seqlens=lens, block_table=table,
                                          return_lse=True)
        assert cupy.array_equal(again, out) and cupy.array_equal(lse2, lse)
    runs, hopper = cache_runs
    assert len(runs) == 3 * int(hopper)
    assert all(r.gather == _gathers(page, D) for r in runs)


def test_unaligned_views_take_the_element_path():
    """q a slice of a wider tensor (row stride not a multiple of 8 elements)."""
    import cupy

    q, k, v, table, lens, ks, vs = make_cache(seed_for("unaligned"), B=3, Hq=8, Hkv=2, D=64,
                                              Sq=1, lengths=LENGTHS[3], page=16,
                                              dtype="float16")
    wide = cupy.zeros((3, 1, 8, 68), dtype=q.dtype)
    wide[..., :64] = q
    qv = wide[..., :64]
    out, lse = ca.attention_decode(qv, k, v, cache_seqlens=lens, block_table=table,
                                   return_lse=True)
    ref, same, ref_lse, same_lse = reference(q, ks, vs, causal=True, dtype="float16")
    check_attention(as_float(out).swapaxes(1, 2), ref, same, "float16",
                    lse=lse.astype(np.float64), ref_lse=ref_lse, same_lse=same_lse)


def test_pages_past_2_31_elements():
    """Page offsets beyond 2^31 elements (TESTING.md 8): a wrapped 32-bit offset would
    read the NaN that fills every page but the sequence's own."""
    import cupy

    page, hkv, d = 16, 2, 128
    n_pages = 2**31 // (page * hkv * d) + 64
    need = 2 * n_pages * page * hkv * d * 2 + 2**28
    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB free, device has {free / 2**30:.1f}")
    k = nan_array((n_pages, page, hkv, d), "bfloat16", cupy)
    v = nan_array((n_pages, page, hkv, d), "bfloat16", cupy)
    n = 100
    pages = np.random.default_rng(7).permutation(np.arange(n_pages - 40, n_pages))[:7]
    table = cupy.asarray(pages[None].astype(np.int32))
    at = (cupy.asarray(pages[np.arange(n) // page]), cupy.asarray(np.arange(n) % page))
    for x, w in ((k, "k"), (v, "v")):
        x.view(cupy.uint16)[at] = bits_of(normal(cupy, seed_for("big", w), (n, hkv, d)),
                                          "bfloat16", cupy)
    q = nan_array((1, 1, 8, d), "bfloat16", cupy)
    fill(q, normal(cupy, seed_for("big", "q"), q.shape), "bfloat16")
    ks, vs = [k.view(cupy.uint16)[at].view(k.dtype)], [v.view(cupy.uint16)[at].view(v.dtype)]
    for splits in (1, 3):
        out, lse = ca.attention_decode(q, k, v, cache_seqlens=cupy.asarray([n], cupy.int32),
                                       block_table=table, return_lse=True, num_splits=splits)
        ref, same, ref_lse, same_lse = reference(q, ks, vs, causal=True, dtype="bfloat16")
        check_attention(as_float(out).swapaxes(1, 2), ref, same, "bfloat16",
                        lse=lse.astype(np.float64), ref_lse=ref_lse, same_lse=same_lse)


def test_host_table_and_lengths():
    import cupy

    q, k, v, table, lens, ks, vs = make_cache(seed_for("host"), B=3, Hq=8, Hkv=2, D=64, Sq=1,
                                              lengths=LENGTHS[3], page=16, dtype="bfloat16")
    a = ca.attention_decode(q, k, v, cache_seqlens=lens, block_table=table, num_splits=1)
    b = ca.attention_decode(q, k, v, cache_seqlens=cupy.asnumpy(lens),
                            block_table=cupy.asnumpy(table), num_splits=1)
    assert bool((a.view(cupy.uint16) == b.view(cupy.uint16)).all())


def test_attention_auto_takes_decode_for_few_rows():
    from helpers import run_and_check

    for layout, view in (("bhsd", "contiguous"), ("bshd", "padded")):
        run_and_check("auto", batch=2, heads_q=8, heads_kv=2, seqlen_q=3, seqlen_k=799,
                      head_dim=128, dtype="bfloat16", causal=True, layout=layout, view=view,
                      seed=seed_for("auto", layout))
        run_and_check("decode", batch=3, heads_q=4, heads_kv=4, seqlen_q=1, seqlen_k=147,
                      head_dim=59, dtype="float16", layout=layout, view=view,
                      seed=seed_for("d59", layout))


@pytest.mark.parametrize("Sk", [300, 20000])   # one split, several
def test_attention_hot_path_repeats_the_launch(Sk):
    """ca.attention's second call with the same shapes reuses the first's launch
    (new pointers only): same results as a fresh launch, bit for bit."""
    import cupy

    from helpers import make_qkv

    outs = []
    for seed in (1, 2, 1):
        q, k, v, _ = make_qkv(cupy, seed_for("hot", Sk, seed), batch=1, heads_q=16, heads_kv=2,
                              seqlen_q=2, seqlen_k=Sk, head_dim=128, dtype="bfloat16")
        outs.append(ca.attention(q, k, v, causal=True, return_lse=True))
    (o1, l1), (o2, l2), (o3, l3) = outs
    ref, ref_lse = plain_attention(q, k, v, causal=True)
    same, same_lse = plain_attention(q, k, v, causal=True, precision="bfloat16")
    check_attention(as_float(o3), ref, same, "bfloat16", lse=l3.astype(np.float64),
                    ref_lse=ref_lse, same_lse=same_lse)
    assert bool((o1.view(cupy.uint16) == o3.view(cupy.uint16)).all())
    assert bool((l1 == l3).all())
    assert not bool((o1.view(cupy.uint16) == o2.view(cupy.uint16)).all())


def test_torch_in_torch_out_on_the_callers_stream():
    torch = pytest.importorskip("torch")
    import cupy

    q, k, v, table, lens, ks, vs = make_cache(seed_for("torch"), B=3, Hq=16, Hkv=2, D=128,
                                              Sq=1, lengths=LENGTHS[3], page=16,
                                              dtype="bfloat16")
    want = ca.attention_decode(q, k, v, cache_seqlens=lens, block_table=table)
    cupy.cuda.Device().synchronize()   # inputs and want ready before torch's side stream
    tq, tk, tv = (torch.from_dlpack(x.view(cupy.int16)).view(torch.bfloat16) for x in (q, k, v))
    tt, tl = torch.from_dlpack(table), torch.from_dlpack(lens)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out, lse = ca.attention_decode(tq, tk, tv, cache_seqlens=tl, block_table=tt,
                                       return_lse=True, num_splits=4)
    stream.synchronize()
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (3, 16, 1)
    got = cupy.from_dlpack(out.view(torch.int16)).view(want.dtype)
    diff = abs(as_float(got) - as_float(want))
    assert float(diff.max()) <= 2 * noise_floor(as_float(want), "bfloat16")


@pytest.mark.parametrize("torch_arrays", [False, True])
def test_decode_hot_path_follows_new_tables_and_lengths(torch_arrays):
    """A repeat call with the same shapes takes the hot path (no validation), and must
    still read the new call's q, caches, block table and lengths: two caches of one
    shape with different page orders and lengths, called alternately, each against its
    own reference."""
    import cupy

    from cupy_attention import decode as dec

    torch = pytest.importorskip("torch") if torch_arrays else None
    cases = []
    for n, lengths in enumerate(((700, 1, 2000), (1999, 64, 3))):
        c = make_cache(seed_for("hot-decode", n, torch_arrays), B=3, Hq=16, Hkv=2, D=128, Sq=2,
                       lengths=lengths, page=16, dtype="bfloat16", spare=4 - n)
        cases.append(c)
    # one shape for both: pad the smaller pool and table
    pages = max(c[1].shape[0] for c in cases)
    width = max(c[3].shape[1] for c in cases)
    runs = []
    for q, k, v, table, lens, ks, vs in cases:
        if k.shape[0] < pages:
            pad = nan_array((pages - k.shape[0],) + k.shape[1:], "bfloat16", cupy)
            k, v = (cupy.concatenate([x.view(cupy.uint16), pad.view(cupy.uint16)]).view(x.dtype)
                    for x in (k, v))
        table = cupy.pad(table, ((0, 0), (0, width - table.shape[1])), constant_values=-1)
        runs.append((q, k, v, table, lens, ks, vs))
    if torch_arrays:
        conv = lambda x: (torch.from_dlpack(x.view(cupy.int16)).view(torch.bfloat16)  # noqa: E731
                          if x.dtype.itemsize == 2 else torch.from_dlpack(x))
    else:
        conv = lambda x: x  # noqa: E731
    keys = set()
    for rep in range(2):
        for q, k, v, table, lens, ks, vs in runs:
            args = (conv(q), conv(k), conv(v))
            kw = dict(cache_seqlens=conv(lens), block_table=conv(table), return_lse=True)
            keys.add(dec._signature(*args, kw["cache_seqlens"], kw["block_table"], True, None,
                                    None, 0.0, True, None, None))
            out, lse = ca.attention_decode(*args, **kw)
            if torch_arrays:
                torch.cuda.synchronize()
                out = cupy.from_dlpack(out.view(torch.int16)).view(q.dtype)
                lse = cupy.from_dlpack(lse)
            ref, same, ref_lse, same_lse = reference(q, ks, vs, causal=True, dtype="bfloat16")
            check_attention(as_float(out).swapaxes(1, 2), ref, same, "bfloat16",
                            lse=lse.astype(np.float64), ref_lse=ref_lse, same_lse=same_lse)
    assert len(keys) == 1 and dec._HOT.get(keys.pop()) is not None   # one signature: hot


# ---------------------------------------------------------------------------
# Merging attention states

def _halves(seed, dtype, *, Sq=3, n=700, cut=300, H=4, D=128):
    """q, k, v and the float64 states of keys [0, cut) and [cut, n), [S, H, D] / [S, H]."""
    import cupy

    q = normal(cupy, seed, (1, Sq, H, D))
    k = normal(cupy, seed + 1, (1, n, H, D))
    v = normal(cupy, seed + 2, (1, n, H, D))
    full = plain_attention(q, k, v, layout="bshd")
    a = plain_attention(q, k[:, :cut], v[:, :cut], layout="bshd")
    b = plain_attention(q, k[:, cut:], v[:, cut:], layout="bshd")
    # [1, H, S, D] / [1, H, S] -> [S, H, D] / [S, H]
    to = lambda o, l: (o[0].swapaxes(0, 1), l[0].swapaxes(0, 1))  # noqa: E731
    return to(*full), to(*a), to(*b)


def test_merge_of_two_halves_is_the_one_shot_result_fp32():
    import cupy

    (fo, fl), (ao, al), (bo, bl) = _halves(1, "float32")
    f32 = lambda x: cupy.ascontiguousarray(x, dtype=cupy.float32)  # noqa: E731
    o, l = ca.merge_attention_states(f32(ao), f32(al), f32(bo), f32(bl))
    assert o.dtype == cupy.float32 and o.shape == fo.shape and l.shape == fl.shape
    assert float(abs(o - fo).max()) <= 1e-5 * float(abs(fo).max())
    assert float(abs(l - fl).max()) <= 1e-5 * max(1.0, float(abs(fl).max()))


@pytest.mark.parametrize("dtype", DTYPES)
def test_merge_16bit_against_the_float64_merge(dtype):
    import cupy

    from cupy_attention.reference import merge_attention_states_reference
    from helpers import cast

    _, (ao, al), (bo, bl) = _halves(2, dtype)
    a16, b16 = cast(ao, dtype), cast(bo, dtype)
    al32, bl32 = al.astype(cupy.float32), bl.astype(cupy.float32)
    o, l = ca.merge_attention_states(a16, al32, b16, bl32)
    ro, rl = merge_attention_states_reference(
        [cupy.asnumpy(as_float(a16)), cupy.asnumpy(as_float(b16))],
        [cupy.asnumpy(al32), cupy.asnumpy(bl32)])
    assert float(abs(cupy.asnumpy(as_float(o)) - ro).max()) <= noise_floor(ro, dtype)
    assert float(abs(cupy.asnumpy(l) - rl).max()) <= 1e-6 * max(1.0, float(abs(rl).max()))


def test_merge_with_an_empty_side_is_exact():
    import cupy

    _, (ao, al), _ = _halves(3, "float32")
    a, la = ao.astype(cupy.float32), al.astype(cupy.float32)
    empty_o = cupy.full_like(a, cupy.nan)
    empty_l = cupy.full_like(la, -cupy.inf)
    o, l = ca.merge_attention_states(a, la, empty_o, empty_l)
    assert bool((o == a).all()) and bool((l == la).all())
    o, l = ca.merge_attention_states(empty_o, empty_l, a, la)
    assert bool((o == a).all()) and bool((l == la).all())
    o, l = ca.merge_attention_states(empty_o, empty_l, empty_o, empty_l)
    assert bool((o == 0).all()) and bool(cupy.isneginf(l).all())


def test_merge_many_and_bshd_layout():
    """Five states stacked, laid out as ca.attention returns them (bshd out, lse [B, H, S])."""
    import cupy

    q = normal(cupy, 4, (2, 3, 4, 64)).astype(cupy.float32)
    k = normal(cupy, 5, (2, 500, 4, 64)).astype(cupy.float32)
    v = normal(cupy, 6, (2, 500, 4, 64)).astype(cupy.float32)
    cuts = (0, 1, 120, 121, 400, 500)
    outs, lses = [], []
    for lo, hi in zip(cuts, cuts[1:]):
        o, l = ca.attention(q, k[:, lo:hi], v[:, lo:hi], layout="bshd", return_lse=True,
                            kernel="flash")
        outs.append(o)
        lses.append(l)
    o, l = ca.merge_attention_states_many(cupy.stack(outs), cupy.stack(lses), layout="bshd")
    ref_o, ref_l = plain_attention(q, k, v, layout="bshd")
    assert float(abs(o.swapaxes(1, 2) - ref_o).max()) <= 1e-5 * float(abs(ref_o).max())
    assert float(abs(l - ref_l).max()) <= 1e-5 * max(1.0, float(abs(ref_l).max()))
    o2, l2 = ca.merge_attention_states(outs[0], lses[0], outs[1], lses[1], layout="bshd")
    r2o, r2l = plain_attention(q, k[:, :120], v[:, :120], layout="bshd")
    assert float(abs(o2.swapaxes(1, 2) - r2o).max()) <= 1e-5 * float(abs(r2o).max())
    assert float(abs(l2 - r2l).max()) <= 1e-5 * max(1.0, float(abs(r2l).max()))


# ---------------------------------------------------------------------------
# Appending to the cache

def _slots(b, positions, page, table_h):
    """(batch or page ids, rows) of positions of sequence b, as device index arrays."""
    import cupy

    positions = np.asarray(positions)
    if page is None:
        return cupy.asarray(np.full(len(positions), b)), cupy.asarray(positions)
    return (cupy.asarray(table_h[b, positions // page].astype(np.int64)),
            cupy.asarray(positions % page))


@pytest.mark.parametrize("page", [None, 1, 16])
@pytest.mark.parametrize("through", ["append_kv", "attention_decode"])
def test_appended_tokens_land_in_their_slots(page, through):
    """Take the last S_new tokens of each sequence out of a full cache (their slots
    become NaN) and put them back through append_kv or attention_decode(k_new=...):
    the cache must come back bit for bit, and the decode must see them."""
    import cupy

    before, s_new, dtype = np.array([0, 5, 31], dtype=np.int32), 3, "bfloat16"
    q, k, v, table, _, ks, vs = make_cache(seed_for("append", page, through), B=3, Hq=8, Hkv=2,
                                           D=64, Sq=s_new, lengths=before + s_new, page=page,
                                           dtype=dtype)
    table_h = None if table is None else cupy.asnumpy(table)
    k_new = cupy.stack([x[n:n + s_new].view(cupy.uint16) for x, n in zip(ks, before)]).view(k.dtype)
    v_new = cupy.stack([x[n:n + s_new].view(cupy.uint16) for x, n in zip(vs, before)]).view(v.dtype)
    k_full, v_full = k.copy(), v.copy()
    for b, n in enumerate(before):
        at = _slots(b, np.arange(n, n + s_new), page, table_h)
        for cache in (k, v):
            cache.view(cupy.uint16)[at] = 0x7FC0      # NaN
    lens = cupy.asarray(before)
    if through == "append_kv":
        ca.append_kv(k, v, k_new, v_new, cache_seqlens=lens, block_table=table)
    else:
        out, lse = ca.attention_decode(q, k, v, cache_seqlens=lens, block_table=table,
                                       k_new=k_new, v_new=v_new, return_lse=True)
        ref, same, ref_lse, same_lse = reference(q, ks, vs, causal=True, dtype=dtype)
        check_attention(as_float(out).swapaxes(1, 2), ref, same, dtype,
                        lse=lse.astype(np.float64), ref_lse=ref_lse, same_lse=same_lse)
    assert bool((lens == cupy.asarray(before)).all()), "the lengths are the caller's to advance"
    assert bool((k.view(cupy.uint16) == k_full.view(cupy.uint16)).all())
    assert bool((v.view(cupy.uint16) == v_full.view(cupy.uint16)).all())
