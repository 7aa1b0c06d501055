"""Decode and merge on the host (no GPU): the argument structs against the C ones,
the shared-memory formula against sizeof(Storage), the split planning, every
validation error, and the float64 references against the plain one."""

from __future__ import annotations

import math

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention import jit
from cupy_attention.decode import validate_decode
from cupy_attention.errors import (DeviceMismatchError, DTypeError, LayoutError, ShapeError,
                                   UnsupportedError)
from cupy_attention.families import decode as fam
from cupy_attention.reference import (attention_decode_reference, attention_reference,
                                      gather_kv_cache, merge_attention_states_reference)
from cupy_attention.variant import Variant

from helpers import BF16, nvrtc_probe

try:
    from test_params import OFFSETOF
except ImportError:  # pragma: no cover
    OFFSETOF = ""


def _nvrtc(src: str):
    return nvrtc_probe(src, ["-std=c++17", f"-I{jit.kernels_dir()}", "-arch=sm_80"])


# ---------------------------------------------------------------------------
# Structs and shared memory

def _asserts(struct: str, dt: np.dtype) -> list[str]:
    out = []
    for name in dt.names:
        ftype, off = dt.fields[name][:2]
        out.append(f'static_assert(CA_OFFSETOF({struct}, {name}) == {off}, "{struct}::{name}");')
        out.append(f'static_assert(sizeof((({struct}*)0)->{name}) == {ftype.itemsize}, '
                   f'"size of {struct}::{name}");')
    out.append(f'static_assert(sizeof({struct}) == {dt.itemsize}, "sizeof({struct})");')
    out.append(f'static_assert(alignof({struct}) == {dt.alignment}, "alignof({struct})");')
    return out


STRUCTS = [("CacheParams", fam.CACHE_DTYPE), ("DecodeParams", fam.DECODE_DTYPE),
           ("StateView", fam.STATE_DTYPE), ("MergeParams", fam.MERGE_DTYPE),
           ("AppendParams", fam.APPEND_DTYPE)]


def test_structs_match_the_kernels():
    lines = ['#include "decode.cu"', '#include "merge.cu"', '#include "append.cu"', OFFSETOF]
    for struct, dt in STRUCTS:
        lines += _asserts(struct, dt)
    ok, log = _nvrtc("\n".join(lines) + "\n")
    assert ok, log


def test_struct_probe_catches_a_wrong_offset():
    dt = fam.DECODE_DTYPE
    lie = f'static_assert(CA_OFFSETOF(DecodeParams, num_splits) == {dt.fields["num_splits"][1] + 4}, "x");'
    ok, _ = _nvrtc('#include "decode.cu"\n' + OFFSETOF + lie + "\n")
    assert not ok


def test_page_divisor_divides_every_key_index():
    """CacheParams' page_magic / page_shift (the host's, for types.cuh's Divisor):
    the device's (j * m >> 32) >> s is j // page_size for every page size 1-1024 and
    key indices at the edges of each page and of the 31-bit range."""
    rng = np.random.default_rng(5)
    top = 2**31 - 1
    for d in range(1, 1025):
        m, s = fam.divisor_magic(d)
        assert 0 <= m < 2**32 and 0 <= s < 31
        js = np.unique(np.concatenate([
            np.arange(0, 4 * d + 2), top - np.arange(0, 2 * d + 2),
            (np.arange(1, 200) * d)[:, None] + np.array([-1, 0, 1]),
            rng.integers(0, top, 500)], axis=None))
        js = js[(js >= 0) & (js <= top)].astype(object)
        got = js if d == 1 else (js * m >> 32) >> s
        assert (got == js // d).all(), d
    for d in (2**20 + 7, 2**30, 2**31 - 1):   # page sizes past any cache: the formula holds
        m, s = fam.divisor_magic(d)
        for j in (0, d - 1, d, top - 1, top):
            assert (j * m >> 32) >> s == j // d, (d, j)


TILES = [fam.Tile(1, 4, 16, 3), fam.Tile(1, 4, 32, 2), fam.Tile(1, 2, 16, 3),
         fam.Tile(2, 2, 32, 2), fam.Tile(4, 1, 64, 2), fam.Tile(4, 1, 16, 6),
         fam.Tile(1, 8, 16, 3), fam.Tile(4, 1, 128, 3, True), fam.Tile(4, 1, 64, 2, True),
         fam.Tile(4, 2, 64, 3, True)]


@pytest.mark.parametrize("head_dim", [1, 8, 59, 64, 96, 128, 160, 250, 256])
@pytest.mark.parametrize("tile", TILES, ids=str)
@pytest.mark.parametrize("paged,tma", [(False, False), (True, False), (False, True),
                                      (True, True)])
def test_smem_formula_is_sizeof_storage(head_dim, tile, paged, tma):
    vec = "true" if tma else "false"   # tensor maps take the aligned path only
    if tma and head_dim % 8:
        pytest.skip("16-byte copies need D % 8 == 0")
    if tile.wgmma and not (tma and head_dim <= 128):
        pytest.skip("the warpgroup tile reads the tensor maps' ring, Q in registers")
    traits = (f"DecodeTraits<{head_dim}, {tile.row_warps}, {tile.key_warps}, {tile.warp_keys}, "
              f"{tile.stages}, bf16, {vec}, {'true' if paged else 'false'}"
              f"{', true' if tma else ''}{', true' if tile.wgmma else ''}>")
    src = (f'#include "decode.cu"\n'
           f'static_assert({traits}::SMEM_BYTES == {fam.smem_bytes(head_dim, tile, paged, tma)}, '
           f'"smem");\n'
           f'static_assert({traits}::ROWS == {tile.rows} && {traits}::BLOCK_N == {tile.block_n} '
           f'&& {traits}::THREADS == {tile.threads}, "traits");\n'
           f'static_assert({traits}::BLOCK_THREADS == '
           f'{tile.threads + (128 if fam.has_producer(head_dim, tile, paged, tma) else 0)}, '
           f'"producer warpgroup");\n')
    ok, log = _nvrtc(src)
    assert ok, log


@pytest.mark.parametrize("head_dim", [1, 8, 59, 64, 72, 96, 128, 160, 250, 256])
@pytest.mark.parametrize("rows", [1, 4, 8, 16, 17, 32, 48, 64, 128])
@pytest.mark.parametrize("limit", [99 * 1024, 163 * 1024, 227 * 1024])
def test_tiles_fit_the_device(head_dim, rows, limit):
    t = fam.tile(rows, head_dim, True, limit)
    assert fam.smem_bytes(head_dim, t, True) <= limit
    assert fam.smem_bytes(head_dim, t, False) <= fam.smem_bytes(head_dim, t, True)
    assert t.rows >= min(rows, 64) and t.rows in (16, 32, 64)
    assert t.warp_keys % 16 == 0 and 2 <= t.stages <= fam.MAX_STAGES
    assert t.threads <= fam.MAX_THREADS
    if limit >= 163 * 1024 and head_dim <= 128:   # two blocks per SM on Hopper
        assert fam.smem_bytes(head_dim, t, True) <= fam.BLOCK_SMEM


# ---------------------------------------------------------------------------
# Planning

def shape(B=1, Hq=32, Hkv=8, Sq=1, cap=32768, D=128, dtype="bfloat16", paged=False, causal=True):
    return fam.DecodeShape(B, Hq, Hkv, Sq, cap, D, dtype, Variant(causal=causal), paged)


@pytest.mark.parametrize("head_dim", [64, 72, 96, 128])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("limit", [99 * 1024, 227 * 1024])
def test_warpgroup_tiles_fit(head_dim, paged, limit):
    t = fam.tile(64, head_dim, paged, limit, tma=True, wide=not paged, wgmma=True)
    assert t.wgmma and t.row_warps == 4 and t.key_warps == fam.KEY_WARPS_WGMMA[not paged]
    assert t.threads == 128 * t.key_warps    # whole warpgroups
    assert t.warp_keys % 16 == 0 and t.stages >= 2
    assert fam.smem_bytes(head_dim, t, paged, True) <= limit
    if limit > fam.BLOCK_SMEM and not paged:     # one block per SM: 128-key tiles
        assert t.block_n == 128


def test_use_wgmma():
    def s(Hq=32, Hkv=8, Sq=16, D=128):
        return shape(Hq=Hq, Hkv=Hkv, Sq=Sq, D=D)
    assert fam.use_wgmma(s(), True, "sm_90a")
    assert fam.use_wgmma(s(Sq=9), True, "sm_90a")                # 36 rows
    assert not fam.use_wgmma(s(Sq=8), True, "sm_90a")            # 32 rows: two m16 warps
    assert not fam.use_wgmma(s(), False, "sm_90a")               # no tensor maps
    assert fam.use_wgmma(s(D=256), True, "sm_90a")               # Q in 64 registers a thread
    for arch in ("sm_80", "sm_89", "sm_100a", "sm_120"):
        assert not fam.use_wgmma(s(), True, arch)
    p = fam.plan(s(), True, 132, None, 227 * 1024, True, True)
    assert p.tile.wgmma and p.tile.threads == 256 and p.spec.name.endswith(",tma,wgmma]")
    assert p.threads == 384   # (contiguous D = 128: the producer warpgroup beside the two)
    assert "true, true>" in p.spec.expr
    # half a wave of one-block-per-SM blocks: B = 8, Hkv = 8 fills 64 of 132 SMs
    assert fam.plan(shape(B=8, Sq=16, cap=8192), True, 132, None, 227 * 1024, True,
                    True).num_splits == 1
    assert fam.plan(shape(B=1, Sq=16), True, 132, None, 227 * 1024, True, True).num_splits == 8
    # paged: the one-block tile where the two-block plan would split, else two blocks an SM
    for B, kw, splits in ((1, 2, 16), (8, 2, 2), (16, 2, 1), (32, 1, 1), (64, 1, 1)):
        p = fam.plan(shape(B=B, Sq=16, cap=8192 if B > 1 else 32768, paged=True), True, 132,
                     None, 227 * 1024, True, True)
        assert (p.tile.key_warps, p.num_splits) == (kw, splits), B
    # the paged producer tile's barriers per consumer warpgroup (halves) where the grid
    # fills at most half the SMs: B = 8, Sk = 4k at one split (64 blocks), not at 8k (two)
    for cap, halves in ((4096, True), (8192, False)):
        p = fam.plan(shape(B=8, Sq=16, cap=cap, paged=True), True, 132, None, 227 * 1024, True,
                     True)
        assert p.producer and p.halves == halves and p.spec.name.endswith(",halves]") == halves
        assert p.smem == fam.smem_bytes(128, p.tile, True, True, halves)
    assert not fam.plan(shape(B=8, Sq=16, cap=4096), True, 132, None, 227 * 1024, True,
                        True).halves   # (contiguous)
    # gathered (pages without tensor maps): the one-block tile at 64 < D <= 192 where the
    # grid is one wave, 128-key tiles (three stages to D = 128, two past it); two blocks
    # an SM elsewhere
    for B, D, kw in ((8, 128, 2), (8, 112, 2), (8, 192, 2), (8, 64, 1), (8, 256, 1),
                     (64, 128, 1)):
        p = fam.plan(shape(B=B, Sq=16, cap=8192, D=D, paged=True), True, 132, None,
                     227 * 1024, False, True, 1)
        assert ",gather," in p.spec.name and p.tile.key_warps == kw, (B, D)
        if kw == 2:
            assert (p.tile.block_n, p.tile.stages) == (128, 3 if D <= 128 else 2)
        assert p.smem == fam.smem_bytes(D, p.tile, True, True) <= 227 * 1024


def test_short_blocks_copy_paged_rows_by_cp_async():
    """row_copies: sm_90's per-row bulk copies of paged rows without tensor maps, except
    in grids of at most one block an SM whose blocks read at most CHUNK_COPY_KEYS keys
    (16-byte cp.async there, spec ",chunks")."""
    def p(copy_engine=True, **kw):
        kw.setdefault("paged", True)
        return fam.plan(shape(**kw), True, 132, None, 227 * 1024, False, False, 1, copy_engine)

    short = p(B=1, cap=1024)   # eight splits of 128 keys
    assert short.split_keys <= fam.CHUNK_COPY_KEYS and not short.row_copies
    assert short.spec.name.endswith(",chunks]")
    assert short.spec.expr.split(">")[0].endswith("16, false, false")   # ROW_COPIES_ false
    assert p(B=64, cap=4096).row_copies                 # 4096 keys a block
    assert p(B=8, cap=1024).row_copies                  # 256 blocks of 256 keys
    assert p(B=1, cap=32768).row_copies                 # 1024 a split
    assert p(B=1, cap=1024, copy_engine=False).row_copies   # (sm_80: cp.async anyway)
    assert p(B=1, cap=1024, D=64).row_copies            # 128-byte rows: cp.async anyway
    assert p(B=1, cap=1024, paged=False).row_copies     # contiguous
    assert p(B=1, cap=1024, D=256).spec.name.endswith(",chunks]")


def test_chunked_prefill_route():
    """attention_decode's many-row calls go to flash_wgmma's cache kernel on sm_90a when
    K and V have tensor maps, Sq reaches CACHE_MIN_SEQLEN_Q and the work tiles fill
    every SM; everything else stays with the decode kernel."""
    from cupy_attention.families import flash_wgmma as fw

    def takes(B=4, Hq=32, Hkv=8, Sq=256, D=128, tma=True, arch="sm_90a", sms=132,
              q_strides=None, gather=False):
        s = shape(B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, D=D, paged=True)
        return fw.takes_cache(s, tma, arch, sms, q_strides or (Sq * Hq * D, D, Hq * D), gather)

    assert takes()                               # 2 x 32 x 4 = 256 tiles of 128 rows
    assert takes(B=5, Sq=96)                     # 160 tiles of 128 rows (96 of them real)
    assert not takes(B=4, Sq=96)                 # 128 tiles on 132 SMs
    assert not takes(B=64, Sq=64)                # decode packs a group's rows in its tiles
    assert not takes(B=1, Sq=256)                # 64 tiles on 132 SMs: decode splits the keys
    assert takes(B=1, Sq=1024)
    assert not takes(tma=False)                  # unaligned, page not a multiple of 16, D < 64
    assert not takes(D=40) and not takes(D=100)
    for arch in ("sm_80", "sm_89", "sm_100a", "sm_120"):
        assert not takes(arch=arch)
    assert not takes(q_strides=(0, 128, -4096))  # no tensor map for q
    # boxes: the key tile (contiguous), else the largest common divisor with the page
    assert [fw.cache_box_rows(128, p) for p in (None, 16, 48, 64, 256)] == [128, 16, 16, 64, 128]
    assert fw.cache_box_rows(112, 64) == 16 and fw.cache_box_rows(64, 256) == 64
    # pages without tensor maps take the route where their rows can be gathered
    assert not takes(tma=False) and takes(tma=False, gather=True)
    assert not takes(tma=False, gather=True, arch="sm_80")


def test_chunked_prefill_gather():
    """Which paged caches flash_wgmma gathers row by row (can_gather, cache_gathers)."""
    from cupy_attention.families import flash_wgmma as fw

    s = shape(B=4, Hq=32, Hkv=8, Sq=256, D=128, paged=True)
    st = (16 * 8 * 128, 128, 8 * 128)   # [pages, 16, 8, 128]: page, head, row strides
    assert fw.can_gather(s, True, (1000, 16), st, st)
    assert not fw.can_gather(s, False, (1000, 16), st, st)           # not 16-byte aligned
    assert not fw.can_gather(s, True, (1000, 16), st, (st[0] * 2, *st[1:]))  # k, v apart
    assert not fw.can_gather(s, True, (1000, 16), (st[0], st[1], -st[2]), st[:2] + (-st[2],))
    # each row's offset / 8 in 32 bits: caches up to 64 GiB
    big = 2 ** 35 // st[0] + 1
    assert fw.can_gather(s, True, (big - 2, 16), st, st)
    assert not fw.can_gather(s, True, (big + 1, 16), st, st)
    assert not fw.can_gather(shape(B=4, Hq=32, Hkv=8, Sq=256, D=128, paged=False), True,
                             (4, 4096), st, st)
    # boxes of gcd(page, BLOCK_N) rows up to GATHER_MAX_BOX, and pages no box divides
    assert [fw.cache_gathers(s, p, p % 16 == 0) for p in (1, 16, 24, 32, 48, 64, 256)] == \
        [True, True, True, False, True, False, False]
    paged = fw.spec(128, "bfloat16", Variant(True, cache="paged"))
    assert paged.expr.startswith("flash_wgmma_cache_fwd<") and "CachedSeqs<true>" in paged.expr
    assert paged.name.endswith(",causal,paged-cache]")
    contiguous = fw.spec(128, "bfloat16", Variant(cache="contiguous"))
    assert "CachedSeqs<false>" in contiguous.expr
    assert Variant(True, cache="paged").band(100, 5000) == (0, 0)   # each entry adds its own


def test_row_tiles_pack_a_group():
    assert fam.tile(1, 128).rows == 16
    assert fam.tile(16, 128).rows == 16
    assert fam.tile(17, 128).rows == 32
    assert fam.tile(64, 128).rows == 64
    p = fam.plan(shape(Hq=32, Hkv=8, Sq=4), True, 132)
    assert (p.rows, p.row_blocks) == (16, 1)         # 16 packed rows: one m16 tile
    p = fam.plan(shape(Hq=32, Hkv=8, Sq=16), True, 132)
    assert (p.rows, p.row_blocks) == (64, 1)         # K/V read once for 4 heads x 16 queries
    p = fam.plan(shape(Hq=64, Hkv=8, Sq=16), True, 132)
    assert (p.rows, p.row_blocks) == (64, 2)


@pytest.mark.parametrize("B,cap", [(1, 32768), (1, 131072), (8, 8192), (64, 4096), (128, 2048),
                                   (3, 1), (1, 0), (256, 1024), (2, 300)])
def test_split_plan_covers_every_key_once(B, cap):
    s = shape(B=B, cap=cap)
    p = fam.plan(s, True, 132)
    assert p.split_keys % p.tile.block_n == 0 and p.split_keys > 0
    assert 1 <= p.num_splits <= fam.MAX_SPLITS
    assert p.num_splits * p.split_keys >= cap
    assert (p.num_splits - 1) * p.split_keys < max(cap, 1)    # no split is empty by plan
    if p.num_splits > 1:   # MIN_SPLIT_KEYS a split, or SHORT_SPLIT_KEYS while they are few
        assert (p.split_keys >= fam.MIN_SPLIT_KEYS or p.num_splits <= fam.SHORT_SPLITS
                and p.split_keys >= fam.SHORT_SPLIT_KEYS or cap < 2 * fam.SHORT_SPLIT_KEYS)


def test_split_heuristic():
    assert fam.plan(shape(B=1, cap=32768), True, 132).num_splits > 16   # one long sequence
    assert fam.plan(shape(B=128, cap=2048), True, 132).num_splits == 1  # 1024 blocks fill it
    assert fam.plan(shape(B=8, cap=128), True, 132).num_splits == 1     # too short to split
    forced = fam.plan(shape(B=1, cap=4096), True, 132, 3)
    assert forced.num_splits == 3 and forced.split_keys * 3 >= 4096


def test_spec_names_are_readable_and_distinct():
    t = fam.Tile(1, 4, 16, 3)
    a = fam.spec(128, "bfloat16", t, Variant(causal=True), True, True)
    b = fam.spec(128, "bfloat16", t, Variant(causal=True), False, True)
    c = fam.spec(128, "bfloat16", t, Variant(causal=True, softcap=30.0), True, False)
    assert a.name == "decode[D=128,M=16,W=1x4,N=64,ST=3,bf16,paged,causal]"
    assert "softcap" in c.name and "unaligned" in c.name
    assert len({a.expr, b.expr, c.expr}) == 3


def test_auto_takes_decode_for_few_query_rows():
    from cupy_attention import dispatch
    from helpers import problem_for

    p = problem_for(batch=2, heads_q=8, heads_kv=2, seqlen_q=1, seqlen_k=1000, head_dim=128,
                    dtype="bfloat16", causal=True)
    assert dispatch.choose(p, "auto", 90).name == "decode"
    p = problem_for(batch=2, heads_q=8, heads_kv=2, seqlen_q=16, seqlen_k=1000, head_dim=128,
                    dtype="bfloat16", causal=True)
    assert dispatch.choose(p, "auto", 90).name == "decode"    # speculative rows
    p = problem_for(batch=2, heads_q=8, heads_kv=2, seqlen_q=64, seqlen_k=1000, head_dim=128,
                    dtype="bfloat16")
    assert dispatch.choose(p, "auto", 90).name != "decode"
    # MHA: decode's split-KV only where few (batch, head) pairs leave SMs idle
    p = problem_for(batch=1, heads_q=32, heads_kv=32, seqlen_q=1, seqlen_k=4000, head_dim=128,
                    dtype="bfloat16", causal=True)
    assert dispatch.choose(p, "auto", 90).name == "decode"
    p = problem_for(batch=8, heads_q=32, heads_kv=32, seqlen_q=1, seqlen_k=4000, head_dim=128,
                    dtype="bfloat16", causal=True)
    assert dispatch.choose(p, "auto", 90).name != "decode"
    p = problem_for(batch=2, heads_q=8, heads_kv=2, seqlen_q=1, seqlen_k=10, head_dim=64,
                    dtype="float32")
    assert dispatch.choose(p, "auto", 90).name != "decode"
    mask = np.ones((1, 1, 1, 10), dtype=bool)
    p = problem_for(batch=2, heads_q=8, heads_kv=2, seqlen_q=1, seqlen_k=10, head_dim=64,
                    dtype="float16", mask=mask)
    assert dispatch.choose(p, "auto", 90).name != "decode"


# ---------------------------------------------------------------------------
# Validation (raised before any device is touched)

def arr(*shape, dtype="float16"):
    return np.zeros(shape, dtype=BF16 if dtype == "bfloat16" else dtype)


B, SQ, HQ, HKV, D, PAGES, PAGE = 3, 1, 8, 2, 64, 10, 16
Q = arr(B, SQ, HQ, D)
KP = arr(PAGES, PAGE, HKV, D)
TABLE = np.arange(B * 3, dtype=np.int32).reshape(B, 3)
LENS = np.array([5, 48, 17], dtype=np.int32)


def raises(exc, pattern, *args, **kw):
    with pytest.raises(exc, match=pattern):
        ca.attention_decode(*args, **kw)


def test_valid_paged_and_contiguous_problems():
    s, scale, page = validate_decode(Q, KP, KP, cache_seqlens=LENS, block_table=TABLE)
    assert (s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.capacity, s.head_dim, s.paged) == \
        (B, HQ, HKV, SQ, 3 * PAGE, D, True)
    assert page == PAGE and math.isclose(scale, 1 / 8)
    s, _, _ = validate_decode(Q, arr(B, 100, HKV, D), arr(B, 100, HKV, D))
    assert s.capacity == 100 and not s.paged
    s, _, _ = validate_decode(Q, KP, KP, cache_seqlens=[1, 2, 3], block_table=TABLE.tolist())
    assert s.paged


def test_errors_name_the_argument():
    raises(ShapeError, r"q must have rank 4", arr(B, HQ, D), KP, KP, block_table=TABLE,
           cache_seqlens=LENS)
    raises(ShapeError, r"k_cache and v_cache must have the same shape", Q, KP,
           arr(PAGES, PAGE + 1, HKV, D), block_table=TABLE, cache_seqlens=LENS)
    raises(DTypeError, r"q has dtype float32", arr(B, SQ, HQ, D, dtype="float32"), KP, KP,
           block_table=TABLE, cache_seqlens=LENS)
    raises(DTypeError, r"share one dtype", Q, arr(PAGES, PAGE, HKV, D, dtype="bfloat16"),
           arr(PAGES, PAGE, HKV, D, dtype="bfloat16"), block_table=TABLE, cache_seqlens=LENS)
    raises(ShapeError, r"multiple of the cache's heads \(3\)", Q, arr(PAGES, PAGE, 3, D),
           arr(PAGES, PAGE, 3, D), block_table=TABLE, cache_seqlens=LENS)
    raises(ShapeError, r"head dims differ", Q, arr(PAGES, PAGE, HKV, 32),
           arr(PAGES, PAGE, HKV, 32), block_table=TABLE, cache_seqlens=LENS)
    raises(UnsupportedError, r"head dims 1..256, not 300", arr(B, SQ, HQ, 300),
           arr(PAGES, PAGE, HKV, 300), arr(PAGES, PAGE, HKV, 300), block_table=TABLE,
           cache_seqlens=LENS)
    raises(DTypeError, r"block_table must have dtype int32, got int64", Q, KP, KP,
           block_table=TABLE.astype(np.int64), cache_seqlens=LENS)
    raises(ShapeError, r"block_table must have shape \[3, \*\]", Q, KP, KP,
           block_table=TABLE[:2], cache_seqlens=LENS)
    raises(DTypeError, r"cache_seqlens must have dtype int32", Q, KP, KP, block_table=TABLE,
           cache_seqlens=LENS.astype(np.float32))
    raises(ShapeError, r"cache_seqlens must have shape \[3\]", Q, KP, KP, block_table=TABLE,
           cache_seqlens=LENS[:2])
    raises(ShapeError, r"cache_seqlens is required with block_table", Q, KP, KP,
           block_table=TABLE)
    raises(ShapeError, r"cache_seqlens\[1\] = 49 exceeds the cache's capacity 48", Q, KP, KP,
           block_table=TABLE, cache_seqlens=np.array([5, 49, 17], dtype=np.int32))
    raises(ShapeError, r"cache_seqlens must be >= 0", Q, KP, KP, block_table=TABLE,
           cache_seqlens=np.array([5, -1, 17], dtype=np.int32))
    bad = TABLE.copy()
    bad[2, 1] = PAGES
    raises(ShapeError, r"block_table\[2\] holds page id 10 outside \[0, 10\)", Q, KP, KP,
           block_table=bad, cache_seqlens=LENS)
    bad[2, 1] = -1
    raises(ShapeError, r"page id -1", Q, KP, KP, block_table=bad, cache_seqlens=LENS)
    raises(ShapeError, r"contiguous k_cache must have shape \[B=3", Q, arr(2, 50, HKV, D),
           arr(2, 50, HKV, D))
    raises(ShapeError, r"exceeds the cache's capacity 50", Q, arr(B, 50, HKV, D),
           arr(B, 50, HKV, D), cache_seqlens=np.array([1, 51, 2], dtype=np.int32))
    raises(LayoutError, r"k_cache must have unit stride", Q, arr(PAGES, PAGE, HKV, 2 * D)[..., ::2],
           KP, block_table=TABLE, cache_seqlens=LENS)
    raises(ShapeError, r"window must be \(left, right\)", Q, KP, KP, block_table=TABLE,
           cache_seqlens=LENS, window=(3,))
    raises(ShapeError, r"softcap must be >= 0", Q, KP, KP, block_table=TABLE,
           cache_seqlens=LENS, softcap=-1.0)
    raises(DTypeError, r"scale must be a real number", Q, KP, KP, block_table=TABLE,
           cache_seqlens=LENS, scale="x")
    raises(ShapeError, r"num_splits must be a positive integer", Q, KP, KP, block_table=TABLE,
           cache_seqlens=LENS, num_splits=0)


def test_append_errors_name_the_argument():
    new = arr(B, 2, HKV, D)
    raises(ShapeError, r"pass both k_new and v_new", Q, KP, KP, block_table=TABLE,
           cache_seqlens=LENS, k_new=new)
    raises(ShapeError, r"k_new must have shape \[B=3, S_new, Hkv=2, D=64\]", Q, KP, KP,
           block_table=TABLE, cache_seqlens=LENS, k_new=arr(B, 2, 1, D), v_new=new)
    raises(DTypeError, r"v_new must have the cache's dtype float16", Q, KP, KP,
           block_table=TABLE, cache_seqlens=LENS, k_new=new,
           v_new=arr(B, 2, HKV, D, dtype="float32"))
    raises(ShapeError, r"k_new and v_new must have the same shape", Q, KP, KP,
           block_table=TABLE, cache_seqlens=LENS, k_new=new, v_new=arr(B, 3, HKV, D))
    # 48 + 2 appended tokens do not fit 3 pages of 16
    raises(ShapeError, r"cache_seqlens\[1\] \+ 2 appended = 50 exceeds the cache's capacity 48",
           Q, KP, KP, block_table=TABLE, cache_seqlens=LENS, k_new=new, v_new=new)
    table = TABLE.copy()
    table[0, 1] = -1      # sequence 0: 5 keys + 12 new need a second page
    with pytest.raises(ShapeError, match=r"block_table\[0\] holds page id -1"):
        ca.append_kv(KP, KP, arr(B, 12, HKV, D), arr(B, 12, HKV, D),
                     cache_seqlens=np.array([5, 0, 0], dtype=np.int32), block_table=table)
    with pytest.raises(ShapeError, match=r"cache_seqlens is required with k_new"):
        ca.append_kv(arr(B, 50, HKV, D), arr(B, 50, HKV, D), new, new, cache_seqlens=None)
    with pytest.raises(DTypeError, match=r"append_kv takes float16, bfloat16"):
        ca.append_kv(arr(B, 50, HKV, D, dtype="float32"), arr(B, 50, HKV, D, dtype="float32"),
                     new, new, cache_seqlens=LENS)
    s, _, _ = validate_decode(Q, KP, KP, block_table=TABLE, cache_seqlens=[5, 46, 0], k_new=new,
                              v_new=new)
    assert s.capacity == 48


def test_the_split_plan_follows_known_lengths():
    big = arr(400, PAGE, HKV, D)
    table = np.arange(3 * 100, dtype=np.int32).reshape(3, 100)
    s, _, _ = validate_decode(Q, big, big, block_table=table, cache_seqlens=LENS)
    assert s.capacity == 48                        # host lengths: the longest, not 1600
    dev = _FakeDevice(LENS, "cpu")
    s, _, _ = validate_decode(Q, big, big, block_table=table, cache_seqlens=dev)
    assert s.capacity == 1600                      # device lengths: the capacity...
    s, _, _ = validate_decode(Q, big, big, block_table=table, cache_seqlens=dev, max_seqlen=300)
    assert s.capacity == 300                       # ...unless the caller says more
    with pytest.raises(ShapeError, match=r"max_seqlen must be an integer >= 0"):
        validate_decode(Q, big, big, block_table=table, cache_seqlens=LENS, max_seqlen=-1)


def test_pages_past_a_sequence_end_are_not_checked():
    table = TABLE.copy()
    table[0, 1:] = -1        # sequence 0 holds 5 keys: one page
    validate_decode(Q, KP, KP, block_table=table, cache_seqlens=LENS)


class _FakeDevice:
    """Quacks like a CuPy array on a device (validation reads only metadata)."""

    __module__ = "cupy._fake"

    def __init__(self, like, device_id):
        self.shape, self.strides, self.dtype = like.shape, like.strides, like.dtype
        self.device = type("Dev", (), {"id": device_id})()


def test_index_arrays_on_another_device():
    qd, kd = _FakeDevice(Q, 0), _FakeDevice(KP, 0)
    with pytest.raises(DeviceMismatchError, match=r"^block_table is on device 1 but q is on 0"):
        validate_decode(qd, kd, kd, block_table=_FakeDevice(TABLE, 1), cache_seqlens=LENS)
    with pytest.raises(DeviceMismatchError, match=r"^cache_seqlens is on device 1"):
        validate_decode(qd, kd, kd, block_table=TABLE, cache_seqlens=_FakeDevice(LENS, 1))
    with pytest.raises(DeviceMismatchError, match=r"different devices \(0, 1, 0\)"):
        validate_decode(qd, _FakeDevice(KP, 1), kd, block_table=TABLE, cache_seqlens=LENS)
    # device tables are trusted: no page-id check (documented)
    validate_decode(qd, kd, kd, block_table=_FakeDevice(TABLE * 100, 0), cache_seqlens=LENS)


def test_merge_errors_name_the_argument():
    o, lse = arr(4, 8, 64, dtype="float32"), arr(4, 8, dtype="float32")
    with pytest.raises(ShapeError, match=r"lse_b must have shape \(4, 8\)"):
        ca.merge_attention_states(o, lse, o, arr(8, 4, dtype="float32"))
    with pytest.raises(DTypeError, match=r"lse_a must have dtype float32"):
        ca.merge_attention_states(o, lse.astype(np.float16), o, lse)
    with pytest.raises(DTypeError, match=r"o_b has dtype float16 but o_a has float32"):
        ca.merge_attention_states(o, lse, o.astype(np.float16), lse)
    with pytest.raises(ShapeError, match=r"o_b .* must have the same shape"):
        ca.merge_attention_states(o, lse, arr(4, 9, 64, dtype="float32"),
                                  arr(4, 9, dtype="float32"))
    with pytest.raises(ShapeError, match=r"lse must have shape \(2, 1, 4, 3\)"):
        ca.merge_attention_states_many(arr(2, 1, 3, 4, 64, dtype="float32"),
                                       arr(2, 1, 3, 4, dtype="float32"), layout="bshd")
    with pytest.raises(UnsupportedError, match=r"head dims up to 256"):
        ca.merge_attention_states(arr(4, 300, dtype="float32"), arr(4, dtype="float32"),
                                  arr(4, 300, dtype="float32"), arr(4, dtype="float32"))


# ---------------------------------------------------------------------------
# References

def _rng_cache(seed, B=3, Hq=4, Hkv=2, Sq=2, D=16, page=4, lens=(0, 7, 13)):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Sq, Hq, D))
    pages_per = [-(-n // page) for n in lens]
    n_pages = sum(pages_per) + 2
    perm = rng.permutation(n_pages)
    table = np.full((B, max(pages_per) + 1), -1, dtype=np.int32)
    at = 0
    for b, n in enumerate(pages_per):
        table[b, :n] = perm[at:at + n]
        at += n
    kp = rng.standard_normal((n_pages, page, Hkv, D))
    vp = rng.standard_normal((n_pages, page, Hkv, D))
    return q, kp, vp, table, np.array(lens, dtype=np.int32)


@pytest.mark.parametrize("causal", [False, True])
def test_decode_reference_matches_attention_reference(causal):
    q, kp, vp, table, lens = _rng_cache(1)
    out, lse = attention_decode_reference(q, kp, vp, cache_seqlens=lens, block_table=table,
                                          causal=causal)
    ks, vs = gather_kv_cache(kp, lens, table), gather_kv_cache(vp, lens, table)
    for b in range(len(lens)):
        if lens[b] == 0:
            assert (out[b] == 0).all() and np.isneginf(lse[b]).all()
            continue
        ro, rl = attention_reference(q[b:b + 1], ks[b][None], vs[b][None], causal=causal,
                                     layout="bshd")
        np.testing.assert_allclose(out[b], ro[0], atol=1e-12)
        np.testing.assert_allclose(lse[b], rl[0], atol=1e-12)


def test_gather_follows_the_page_table():
    q, kp, vp, table, lens = _rng_cache(2)
    ks = gather_kv_cache(kp, lens, table)
    page = kp.shape[1]
    for b, n in enumerate(lens):
        assert ks[b].shape[0] == n
        for j in range(n):
            np.testing.assert_array_equal(ks[b][j], kp[table[b, j // page], j % page])


def test_window_and_softcap_reference():
    q, kp, vp, table, lens = _rng_cache(3, lens=(9, 13, 4), Sq=3)
    out, lse = attention_decode_reference(q, kp, vp, cache_seqlens=lens, block_table=table,
                                          causal=True, window=(2, -1), softcap=5.0)
    ks, vs = gather_kv_cache(kp, lens, table), gather_kv_cache(vp, lens, table)
    b, h, i = 1, 3, 2
    n = int(lens[b])
    pos = n - 3 + i
    keys = np.arange(pos - 2, pos + 1)
    s = ks[b][keys, h // 2] @ q[b, i, h] / math.sqrt(q.shape[-1])
    s = 5.0 * np.tanh(s / 5.0)
    p = np.exp(s - s.max())
    np.testing.assert_allclose(out[b, i, h], (p / p.sum()) @ vs[b][keys, h // 2], atol=1e-12)
    np.testing.assert_allclose(lse[b, h, i], s.max() + np.log(p.sum()), atol=1e-12)


def test_merge_reference_is_the_one_shot_softmax():
    q, kp, vp, _, _ = _rng_cache(4, lens=(13, 13, 13))
    k, v = kp[:3].reshape(1, 12, 2, 16), vp[:3].reshape(1, 12, 2, 16)
    q1 = q[:1]
    full_o, full_l = attention_reference(q1, k, v, layout="bshd")
    a_o, a_l = attention_reference(q1, k[:, :5], v[:, :5], layout="bshd")
    b_o, b_l = attention_reference(q1, k[:, 5:], v[:, 5:], layout="bshd")
    # bring lse [B, H, S] to o's leading axes [B, S, H]
    o, l = merge_attention_states_reference([a_o, b_o], [a_l.transpose(0, 2, 1),
                                                          b_l.transpose(0, 2, 1)])
    np.testing.assert_allclose(o, full_o, atol=1e-12)
    np.testing.assert_allclose(l, full_l.transpose(0, 2, 1), atol=1e-12)
    empty = np.full_like(a_l, -np.inf).transpose(0, 2, 1)
    o, l = merge_attention_states_reference([a_o, np.full_like(b_o, np.nan)],
                                            [a_l.transpose(0, 2, 1), empty])
    np.testing.assert_allclose(o, a_o, atol=1e-12)
    o, l = merge_attention_states_reference([a_o, b_o], [empty, empty])
    assert (o == 0).all() and np.isneginf(l).all()


def test_hot_signature_only_for_device_arrays():
    """The decode hot path skips validation, so host arrays, host tables and lengths,
    lists and unhashable arguments never get a signature."""
    from cupy_attention import decode as dec

    q = np.zeros((2, 1, 8, 64), np.float16)
    k = np.zeros((2, 16, 2, 64), np.float16)
    lens = np.array([3, 4], np.int32)
    assert dec._signature(q, k, k, lens, None, True, None, None, 0.0, False, None, None) is None
    assert dec._signature(q, k, k, [3, 4], None, True, None, None, 0.0, False, None, None) is None
    torch = pytest.importorskip("torch")
    tq, tk = torch.zeros(2, 1, 8, 64), torch.zeros(2, 16, 2, 64)
    assert dec._signature(tq, tk, tk, None, None, True, None, None, 0.0, False, None,
                          None) is None   # CPU tensors


def test_tensor_maps_for_aligned_caches_on_hopper():
    """use_tma: 16-byte aligned caches with D >= 64 on sm_90+, contiguous or paged
    with pages of a multiple of 16 rows, whose views have tensor maps without a
    broadcast head or outer axis; sm_80, unaligned launches, small head dims and
    other page sizes keep cp.async. The planned shared memory holds the 1024-byte
    alignment slack."""
    s = shape(B=8, Hq=32, Hkv=8, cap=8192, D=128)
    nhd = (8192 * 8 * 128, 128, 8 * 128)          # [B, Sk, Hkv, D]: (batch, head, row)
    assert fam.use_tma(s, True, "sm_90a", (8, 8192), nhd, nhd)
    assert fam.use_tma(s, True, "sm_100a", (8, 8192), nhd, nhd)
    assert not fam.use_tma(s, True, "sm_80", (8, 8192), nhd, nhd)
    assert not fam.use_tma(s, False, "sm_90a", (8, 8192), nhd, nhd)
    assert not fam.use_tma(shape(B=8, cap=8192, D=32), True, "sm_90a", (8, 8192), nhd, nhd)
    broadcast = (8192 * 128, 0, 128)              # one KV head viewed as eight
    assert not fam.use_tma(s, True, "sm_90a", (8, 8192), nhd, broadcast)
    paged = shape(B=8, cap=8192, D=128, paged=True)
    for page, ok in ((16, True), (48, True), (256, True), (1, False), (8, False), (40, False)):
        pool = (page * 8 * 128, 128, 8 * 128)     # [pages, page, Hkv, D]: (page, head, row)
        assert fam.use_tma(paged, True, "sm_90a", (4096, page), pool, pool) == ok, page
    p, q = fam.plan(s, True, 132, tma=True), fam.plan(s, True, 132)
    assert p.tma and not q.tma and ",tma]" in p.spec.name and "tma" not in q.spec.name
    assert p.smem == fam.smem_bytes(128, p.tile, False, True) <= fam.DEFAULT_SMEM_LIMIT
    paged_plan = fam.plan(paged, True, 132, tma=True)   # two blocks per SM
    assert paged_plan.smem == fam.smem_bytes(128, paged_plan.tile, True, True) <= fam.BLOCK_SMEM


def test_contiguous_tensor_map_plans_fill_one_block_per_sm():
    """Contiguous caches through tensor maps split for one block per SM, paged ones
    (and cp.async) for two (SPLIT_BLOCKS_PER_SM_TMA)."""
    for B, cap, one, two in ((1, 32768, 16, 33), (8, 8192, 2, 4), (2, 16384, 8, 16)):
        assert fam.plan(shape(B=B, cap=cap), True, 132, tma=True).num_splits == one
        assert fam.plan(shape(B=B, cap=cap), True, 132).num_splits in (two, two - 1)
        paged = fam.plan(shape(B=B, cap=cap, paged=True), True, 132, tma=True)
        assert paged.num_splits in (two, two - 1)


def test_one_block_plans_of_64_rows_take_twice_the_key_warps():
    """KEY_WARPS_WIDE: contiguous tensor-map plans of 64 packed rows run 8 warps in the
    device's whole budget; 16-row tiles and paged plans keep KEY_WARPS."""
    wide = fam.plan(shape(B=8, Sq=16, cap=8192), True, 132, tma=True)
    assert (wide.tile.row_warps, wide.tile.key_warps) == (4, 2) and wide.tile.threads == 256
    assert fam.BLOCK_SMEM < wide.smem <= fam.DEFAULT_SMEM_LIMIT
    assert fam.plan(shape(B=8, Sq=16, cap=8192), True, 132).tile.key_warps == 1
    paged = fam.plan(shape(B=8, Sq=16, cap=8192, paged=True), True, 132, tma=True)
    assert paged.tile.key_warps == 1
    assert fam.plan(shape(B=8, Sq=4, cap=8192), True, 132, tma=True).tile.key_warps == 4


def test_warpgroup_tile_gathers_caches_without_tensor_maps():
    """sm_90a, 64 packed rows, no tensor maps (pages of one row, say), 16-byte aligned,
    64 <= D <= 128: the warpgroup tile over the swizzled ring filled by cp.async
    (GATHER traits), two blocks per SM; not without alignment, below D = 64 or on
    sm_80, and not for 16 packed rows."""
    s = shape(B=8, Sq=16, cap=8192, D=64, paged=True)
    assert fam.use_wgmma(s, False, "sm_90a", True)
    assert not fam.use_wgmma(s, False, "sm_90a", False)
    assert not fam.use_wgmma(s, False, "sm_80", True)
    assert not fam.use_wgmma(shape(B=8, Sq=16, cap=8192, D=48, paged=True), False, "sm_90a", True)
    assert not fam.use_wgmma(shape(B=8, Sq=4, cap=8192, D=64, paged=True), False, "sm_90a", True)
    p = fam.plan(s, True, 132, None, fam.DEFAULT_SMEM_LIMIT, False, True)
    assert not p.tma and p.tile.wgmma and p.tile.key_warps == 1 and p.smem <= fam.BLOCK_SMEM
    assert p.spec.name.endswith(",gather,wgmma]") and p.num_splits == 4
    assert p.spec.expr.startswith("decode_fwd<DecodeTraits<64, 4, 1, 128, 3, bf16, true, true, "
                                  "true, true, true>")
    assert p.smem == fam.smem_bytes(64, p.tile, True, True)
    maps = fam.plan(s, True, 132, None, fam.DEFAULT_SMEM_LIMIT, True, True)
    assert maps.tma and ",tma,wgmma]" in maps.spec.name


def test_past_one_wave_64_row_plans_take_two_blocks_per_sm():
    """Grids of more 64-row blocks than SMs take the two-block tiles (BLOCK_SMEM),
    except the warpgroup tile past D = 64, which keeps its one-block tile."""
    for d, wgmma in ((64, True), (256, False)):
        for B, one_wave in ((2, True), (256, False)):   # 16 / 2048 blocks of 64 rows
            p = fam.plan(shape(B=B, Sq=16, cap=1024, D=d), True, 132, tma=True, wgmma=wgmma)
            assert (p.smem > fam.BLOCK_SMEM) == one_wave, (d, B)
            assert p.tile.key_warps == (2 if one_wave else 1), (d, B)
    d128 = fam.plan(shape(B=256, Sq=16, cap=1024), True, 132, tma=True, wgmma=True)
    assert d128.tile.key_warps == 2 and d128.smem > fam.BLOCK_SMEM


def test_warpgroup_tile_past_head_dim_128():
    """D = 160-256 take the warpgroup tile too (Q in registers): one block per SM in one
    wave of contiguous blocks with the one-block split rule (SPLIT_BLOCKS_PER_SM_TMA),
    two blocks per SM past it and on paged caches."""
    def plan(B, d, paged=False, cap=8192):
        return fam.plan(shape(B=B, Sq=16, cap=cap, D=d, paged=paged), True, 132, None,
                        fam.DEFAULT_SMEM_LIMIT, True, True)
    one = plan(8, 256)
    assert one.tile.wgmma and one.tile.key_warps == 2 and one.num_splits == 2
    assert one.spec.name == "decode[D=256,M=64,W=4x2,N=64,ST=3,bf16,causal,tma,wgmma]"
    many = plan(64, 256)
    assert many.tile.key_warps == 1 and many.smem <= fam.BLOCK_SMEM and many.num_splits == 1
    paged = plan(8, 256, paged=True)
    assert paged.tile.key_warps == 1 and paged.num_splits == 4
    assert plan(8, 192).tile.wgmma


def test_paged_warpgroup_plans_take_one_block_per_sm_past_head_dim_64():
    """Paged one-wave warpgroup plans: the one-block tile past D = 64; at D = 64 the
    two-block tile with twice the splits (SPLIT_BLOCKS_PER_SM)."""
    def plan(B, d):
        return fam.plan(shape(B=B, Sq=16, cap=8192, D=d, paged=True), True, 132, tma=True,
                        wgmma=True)
    for B, splits in ((8, 4), (1, 32)):
        p = plan(B, 64)
        assert p.tile.key_warps == 1 and p.smem <= fam.BLOCK_SMEM and p.num_splits == splits
        q = plan(B, 128)
        assert q.tile.key_warps == 2 and q.smem > fam.BLOCK_SMEM
        assert q.num_splits == splits // 2


def test_paged_one_block_warpgroup_plans_at_most_128_take_a_producer_warpgroup():
    """The one-block paged warpgroup tile at 64 < D <= 128 runs a producer warpgroup
    (384 threads), the contiguous one at D = 128; not gathered tiles (no tensor maps),
    D = 64 or 256, contiguous D = 96 or 120, nor the paged two-block tile past one wave.
    The paged splits: at least PRODUCER_SPLIT_KEYS keys each, and none below
    PRODUCER_MERGE_KEYS keys while the unsplit grid holds a third of the SMs; the
    contiguous ones as without a producer."""
    def plan(B=8, cap=8192, d=128, paged=True, tma=True):
        return fam.plan(shape(B=B, Sq=16, cap=cap, D=d, paged=paged), True, 132, tma=tma,
                        wgmma=True)
    for p, d in [(plan(d=d), d) for d in (72, 96, 128)] + [
            (plan(paged=False), 128), (plan(paged=False, B=64), 128)]:
        assert p.producer and p.threads == 384 and p.tile.key_warps == 2, d
    assert not any(q.producer or q.threads != q.tile.threads for q in (
        plan(tma=False), plan(d=64), plan(d=256), plan(B=64), plan(paged=False, d=96),
        plan(paged=False, d=120)))
    for B, cap in ((8, 8192), (1, 32768), (4, 4096)):
        with_producer = plan(B=B, cap=cap, paged=False)
        assert with_producer.num_splits == fam.split_count(
            8 * B, cap, 132, fam.SPLIT_BLOCKS_PER_SM_WGMMA), (B, cap)
    assert [plan(cap=c).num_splits for c in (1024, 2048, 4096, 8192)] == [1, 1, 1, 2]
    assert [plan(B=4, cap=c).num_splits for c in (2048, 4096)] == [4, 4]   # 32 blocks: split
    assert plan(B=1, cap=4096).num_splits == 4096 // fam.PRODUCER_SPLIT_KEYS
    assert plan(B=1, cap=32768).num_splits == 16


def test_pages_of_64_rows_take_64_row_boxes():
    """page_box: the producer warpgroup's tile takes 64-row boxes where the pages hold a
    multiple of 64 rows; 16 elsewhere, and the page-16 kernels' template arguments as
    before (PAGE_BOX left to its default)."""
    def plan(page, B=8, Sq=16, d=128, tma=True, paged=True):
        s = shape(B=B, Sq=Sq, cap=8192, D=d, paged=paged)
        return fam.plan(s, True, 132, tma=tma, wgmma=fam.use_wgmma(s, tma, "sm_90a", True),
                        page_size=page)
    for page in (64, 128, 256):
        for p in (plan(page), plan(page, d=96)):
            assert p.producer and p.page_box == 64 and p.spec.expr.count(", 64>") == 1, p.spec
            assert p.spec.name.endswith(",box64]")
    for p in (plan(16), plan(48), plan(192 + 16), plan(64, tma=False), plan(64, paged=False),
              plan(64, Sq=1), plan(64, d=64), plan(64, B=64), plan(64, d=256)):
        assert p.page_box == 16 and ",box" not in p.spec.name, p.spec
    assert ", 16>" not in plan(16).spec.expr


def test_paged_one_block_warpgroup_tile_past_head_dim_128_on_short_waves():
    """Past D = 128 the paged one-wave warpgroup plans take the one-block tile only while
    the wave holds at most PAGED_WIDE_KEYS_PER_SM keys an SM."""
    def kw(B, cap, d=256):
        return fam.plan(shape(B=B, Sq=16, cap=cap, D=d, paged=True), True, 132, tma=True,
                        wgmma=True).tile.key_warps
    assert (kw(1, 1024), kw(1, 8192), kw(8, 1024)) == (2, 2, 2)   # 8 x 8k keys: 496 an SM
    assert (kw(1, 32768), kw(8, 8192), kw(8, 8192, 192)) == (1, 1, 1)
    assert kw(8, 8192, 128) == 2


def test_warpgroup_split_count_at_head_dim_64():
    """The D <= 64 warpgroup tile splits for one block per SM from
    SPLIT_WGMMA_NARROW_MIN_KEYS keys on, for half of one past D = 64 or below them."""
    def splits(B, cap, d):
        return fam.plan(shape(B=B, Sq=16, cap=cap, D=d), True, 132, tma=True,
                        wgmma=True).num_splits
    assert fam.SPLIT_WGMMA_NARROW_MIN_KEYS == 4096
    assert (splits(8, 8192, 64), splits(8, 4096, 64), splits(8, 2048, 64)) == (2, 2, 1)
    assert (splits(1, 32768, 64), splits(1, 32768, 128)) == (16, 8)
    assert (splits(8, 8192, 128), splits(8, 8192, 96)) == (1, 1)
    assert splits(64, 8192, 64) == 1


def test_short_sequences_split_into_at_most_eight_128_key_splits():
    """SHORT_SPLIT_KEYS keys a split while there are at most SHORT_SPLITS, else
    MIN_SPLIT_KEYS: B = 1 at Sk = 512, 1k, 2k, 4k takes 4, 8, 8, 16 splits."""
    def splits(cap, **kw):
        return fam.plan(shape(B=1, Sq=1, cap=cap, **kw), True, 132, tma=True).num_splits
    assert [splits(c) for c in (512, 1024, 2048, 4096)] == [4, 8, 8, 16]
    assert splits(1024, paged=True, D=256) == 8
    assert fam.split_count(8, 1024, 132, 1) == 8 and fam.split_count(8, 2048, 132, 1) == 8


def test_four_block_tiles_past_two_waves_at_head_dim_64():
    """D <= 64 on tensor-map tiles takes BLOCK_SMEM_NARROW's four blocks an SM where its
    64-row blocks exceed two an SM: the warpgroup tile at any length, paged tiles below
    FOUR_BLOCK_KEYS keys; not contiguous mma.sync tiles, cp.async tiles, D > 64, nor
    grids within two waves."""
    def plan(B, cap, Sq=1, D=64, paged=False, tma=True, Hkv=8):
        s = shape(B=B, Hkv=Hkv, Sq=Sq, cap=cap, D=D, paged=paged)
        return fam.plan(s, True, 132, tma=tma, wgmma=fam.use_wgmma(s, tma, "sm_90a", True))
    four = plan(64, 1024, paged=True)                        # 512 blocks of 64 rows
    assert fam.BLOCK_SMEM_NARROW >= four.smem and 4 * (four.smem + 1024) <= 228 * 1024
    assert four.tile.block_n == 64
    assert plan(64, 32768, Sq=16).smem <= fam.BLOCK_SMEM_NARROW   # the warpgroup tile
    assert plan(64, 1024, Sq=16, paged=True).smem <= fam.BLOCK_SMEM_NARROW
    for other in (plan(64, 1024), plan(64, 8192, paged=True), plan(64, 1024, D=128, paged=True),
                  plan(64, 1024, paged=True, tma=False), plan(8, 1024, Hkv=32, paged=True),
                  plan(33, 1024, paged=True)):              # 256 and 264 blocks: two waves
        assert other.smem > fam.BLOCK_SMEM_NARROW, other.spec.name
    assert plan(34, 1024, paged=True).smem <= fam.BLOCK_SMEM_NARROW   # 272 blocks


def test_decode_launch_passes_the_maps_of_its_pointers(monkeypatch):
    """DecodeLaunch.run hands the kernel DecodeParams with the call's pointers and,
    after it, the K and V tensor maps of those pointers (zeros without tensor maps),
    as a dependent launch on sm_90. The driver is replaced by a recorder; the maps by
    a stand-in that writes the pointer into the map's bytes."""
    import ctypes

    from cupy_attention import tma

    launches = []

    class Kernel:
        def launch_packed(self, grid, block, params, smem, stream_ptr, dependent=False,
                          tail=()):
            launches.append((bytes(params), [bytes(t) for t in tail], dependent))

    monkeypatch.setattr(fam.jit, "get_function", lambda *a: Kernel())

    class Stream:
        ptr = 7

    def fake_map(ptr):
        m = np.zeros((), tma.MAP_DTYPE)
        m["words"][0] = ptr
        return m[()]

    s = shape(B=64, cap=4096)                       # one split: no partials to allocate
    strides = dict(q_strides=(32 * 128, 128, 32 * 128), k_strides=(4096 * 8 * 128, 128, 8 * 128),
                   v_strides=(4096 * 8 * 128, 128, 8 * 128))
    for arch, tma_on in (("sm_90a", True), ("sm_90a", False), ("sm_80", False)):
        launches.clear()
        p = fam.plan(s, True, 132, tma=tma_on)
        assert p.num_splits == 1
        launch = fam.DecodeLaunch(s, 0.1, p, (1, 1, 1), (0, 0, 0), 0, arch, (64, 4096),
                                  q=None, k=None, v=None, **strides)
        if tma_on:
            launch.maps = tma.MapBuffers((fake_map, fake_map))
        for k, v in ((0x1000, 0x2000), (0x3000, 0x4000), (0x1000, 0x2000)):
            launch.run(0x10, k, v, 0x20, 0, Stream())
        assert len(launches) == 3
        for (params, tail, dependent), (k, v) in zip(launches, ((0x1000, 0x2000),
                                                                (0x3000, 0x4000),
                                                                (0x1000, 0x2000))):
            assert params[8:24] == k.to_bytes(8, "little") + v.to_bytes(8, "little")
            assert len(tail) == 2 and all(len(t) == 128 for t in tail)
            want = ([k.to_bytes(8, "little") + bytes(120), v.to_bytes(8, "little") + bytes(120)]
                    if tma_on else [bytes(128), bytes(128)])
            assert tail == want
            assert dependent == (arch == "sm_90a")
        if tma_on:
            assert len(launch.maps.kept) == 2                     # kept per pointer pair
            assert all(isinstance(b, ctypes.Array) for bufs in launch.maps.kept.values()
                       for b in bufs)
