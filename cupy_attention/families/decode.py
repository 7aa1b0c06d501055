"""`decode`: a few query rows per sequence against a contiguous or paged KV cache
(``kernels/decode.cu``), split over the keys when the batch is too small to fill
the GPU, the splits combined by ``kernels/merge.cu``.

The planning (:func:`plan`) is host arithmetic only, memoized per shape: which
instantiation (packed rows per block, pipeline depth), how many blocks per
sequence, how many key splits. ``ca.attention`` takes this family under
``kernel="auto"`` for ``Sq <= AUTO_MAX_SEQLEN_Q``; :mod:`cupy_attention.decode`
is the paged-cache entry point.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
import struct

import numpy as np

from .. import device, jit
from ..params import FWD_DTYPE, make_struct
from ..problem import Problem
from ..variant import Variant
from .base import CPP_DTYPE, LOG2E, SHORT_DTYPE, Family, Tensors, bhs_strides
from .flash_mma import strides_aligned, vectorizable_arrays

# Key warps per block for 1, 2 and 4 row warps (16, 32, 64 packed rows). A plan of one
# block per SM with 64-row tiles (contiguous caches through tensor maps, whose copies
# one thread issues, so every warp computes) takes KEY_WARPS_WIDE and the device's
# whole per-block budget: H100 (2026-11-27), bf16, Hq/Hkv 32/8, D = 128, B = 8,
# Sq = 16, TB/s 2.05 -> 2.35. The same for 16-row tiles (8 key warps, 128-key tiles)
# measured 0.95-1.01x (D = 64 0.95x), so they keep KEY_WARPS (notes-decode.md).
KEY_WARPS = {1: 4, 2: 2, 4: 1}
KEY_WARPS_WIDE = {1: 8, 2: 4, 4: 2}
MAX_THREADS = 256
# ca.attention(kernel="auto") sends problems with at most this many query rows here
# (GQA/MQA; MHA where B x H <= MHA_MAX_PAIRS: Decode.auto_takes).
AUTO_MAX_SEQLEN_Q = 16
MHA_MAX_PAIRS = 64

# Tiles (kernels/decode.cu, DecodeTraits): a block packs group * Sq query rows into
# ROW_WARPS m16 tiles (1, 2 or 4: up to 16, 32 or 64 rows; more rows take several
# blocks, each reading K/V again) and splits every key tile over KEY_WARPS warps of
# WARP_KEYS keys each. A tile holds BLOCK_N keys: 128 for head
# dims up to 64, else 64 (about 32 KB of K and V per stage at D = 64 and 128; fewer
# where the warps' MAX_WARP_KEYS cap it), and
# the ring takes as many stages (2 to MAX_STAGES) as fit BLOCK_SMEM, so that two
# blocks share an SM on Hopper (228 KB per SM, 1 KB reserved per block). A device
# whose per-block limit is lower (99 KB on consumer parts) gets fewer stages, then
# fewer key warps. On sm_90 caches load through tensor maps where they can (use_tma):
# the ring's rows then take whole 64-column blocks and 1 KB of alignment slack.
BLOCK_SMEM = 113 * 1024
# ... and at D <= 64 past one wave of two blocks an SM, four blocks an SM on the
# warpgroup tile and on paged tensor-map tiles below FOUR_BLOCK_KEYS keys: their
# smaller rings hide each other's ring fills and epilogues, which short sequences pay
# often. H200 (2026-11-29), bf16, Hq/Hkv 32/8 unless named, us two / four blocks an SM:
# Sk = 1k, Sq = 16, B = 64 43.7 / 40.0 (page 16 47.7 / 42.9), B = 256 page 16 178 / 157;
# Sk = 8k, B = 256, Sq = 16 1023 / 961; Sq = 1, page 16, B = 64 38.5 / 36.3, Hkv 32
# 135 / 128; B = 34 (272 blocks) 32.4 / 27.0. Not kept: the contiguous mma.sync tiles
# (B = 34, Sq = 1 23.5 / 26.4; B = 64, 256 0.99-1.02x), pages of one row (cp.async;
# 0.71-0.95x at long sequences or within one wave), D = 128 and 256 (up to 20% lost;
# notes-decode.md, section 24).
BLOCK_SMEM_NARROW = 56 * 1024
FOUR_BLOCK_KEYS = 4096
MAX_STAGES = 6
# Keys per warp and tile: 64 left ptxas at 128 registers with spills (sm_90a, D = 64,
# two row warps, paged); 32 costs only more barriers per key.
MAX_WARP_KEYS = 32

# Split-KV: blocks (row blocks x Hkv x B) below this many per SM split each
# sequence's keys so that the grid reaches it; a split streams at least
# MIN_SPLIT_KEYS keys (its partial costs D fp32 per row to write and merge, against
# 4 D bytes per key read) and there are at most MAX_SPLITS.
SPLIT_BLOCKS_PER_SM = 2
# Contiguous caches through tensor maps stream at full rate from one block per SM, and
# fewer splits merge less: H100 (2026-11-27), bf16, Hq/Hkv 32/8, D = 128, TB/s one /
# two blocks per SM: B = 1, Sk = 32k 2.59 / 2.49; B = 8, Sk = 8k 2.86 / 2.81; B = 8,
# Sq = 4 2.72 / 2.64 (paged ones, 16 boxes a tile from one thread, keep two:
# notes-decode.md).
SPLIT_BLOCKS_PER_SM_TMA = 1
# The warpgroup tile on contiguous caches streams at full rate from half the SMs: H100
# (2026-11-27), bf16, Hq/Hkv 32/8, Sq = 16, TB/s at 1 / 2 splits (a wave / half of
# one): B = 8, Sk = 8k, D = 128 2.82 / 2.66, D = 64 2.39 / 2.33; B = 1, Sk = 32k, 8
# / 16 splits 2.38 / 2.31 (notes-decode.md).
SPLIT_BLOCKS_PER_SM_WGMMA = 0.5
# ... except at D <= 64, whose tiles spend twice the softmax per byte read: from
# SPLIT_WGMMA_NARROW_MIN_KEYS keys on, SPLIT_BLOCKS_PER_SM_TMA's one block per SM. H200
# (2026-11-29), bf16, Hq/Hkv 32/8, Sq = 16, us at 1 / 2 splits: B = 8, Sk = 2k 19.6 /
# 20.6, 4k 32.0 / 27.0, 8k 56.2 / 43.2, 32k 199 / 136; B = 1, 8 / 16 splits: Sk = 32k
# 34.3 / 27.0, 128k 106 / 73.4 (D = 128: within 4% either way; H100, B = 8, Sk = 8k, D =
# 64: 2.39 / 2.33 TB/s).
SPLIT_WGMMA_NARROW_MIN_KEYS = 4096
MIN_SPLIT_KEYS = 256
# ... or SHORT_SPLIT_KEYS while there are at most SHORT_SPLITS splits (the merge reads
# few partials): H200 (2026-11-29), bf16, Hq/Hkv 32/8, B = 1, Sk = 1k, us at 4 / 8
# splits: D = 64 6.6 / 6.1, D = 128 8.2 / 7.4, D = 256 13.7 / 11.3 (page 16 18.1 /
# 13.4), Sq = 16, D = 256 16.4 / 15.7; Sk = 2k at 8 / 16 splits: D = 128 9.2 / 9.8,
# Sq = 16, D = 256 18.4 / 22.1 (notes-decode.md, section 24).
SHORT_SPLIT_KEYS = 128
SHORT_SPLITS = 8
# The paged tile with a producer warpgroup (has_producer) splits less: a split streams
# at least PRODUCER_SPLIT_KEYS keys, and a grid that holds a third of the SMs unsplit
# stays unsplit below PRODUCER_MERGE_KEYS keys (the merge and a second ring fill cost
# more than the SMs gained). H200 (2026-11-29), bf16, Hq/Hkv 32/8, Sq = 16, D = 128,
# page 16, TB/s: B = 8 at 1 / 2 splits: Sk = 1k 1.95 / 1.67, 2k 2.55 / 2.30, 4k 3.03 /
# 2.97, 8k 3.33 / 3.61; D = 96, 2k 2.20 / 1.93; B = 4 at 2 / 4 splits: Sk = 2k 1.66 /
# 1.81, 4k 2.30 / 2.42; B = 1, Sk = 4k at 8 / 16 splits 1.15 / 1.03 (notes-decode.md
# section 31).
PRODUCER_SPLIT_KEYS = 512
PRODUCER_MERGE_KEYS = 8192
# Packed rows above this take the warpgroup tile on sm_90a (use_wgmma): 64 rows as one
# wgmma m64 stream where four m16 warps read each K and V tile four times. Warpgroups
# a block, each over its share of the key tile: two on the one-block-per-SM plans of
# contiguous caches (B = 8, Sk = 8k, Sq = 16, one split: D = 128 2.82 TB/s against one
# warpgroup's 2.77, D = 64 2.39 against 1.88), one on paged caches (two blocks per SM:
# 2.51 against 2.13).
WGMMA_MIN_ROWS = 32
# Paged one-wave warpgroup plans past D = 128 take the one-block tile while the wave
# holds at most this many keys an SM (plan()).
PAGED_WIDE_KEYS_PER_SM = 512
KEY_WARPS_WGMMA = {False: 1, True: 2}   # by `wide`
MAX_SPLITS = 64   # merge.cu's MERGE_SPLITS: merge_splits takes at most this many
# On sm_90, paged rows of 256 bytes or more without tensor maps are bulk copies, one a
# row (DecodeTraits' ROW_COPIES), except where a grid of at most one block per SM reads
# at most CHUNK_COPY_KEYS keys a block, which takes 16-byte cp.async instead
# (row_copies()): a warp issues its rows' copies one lane at a time, and the first
# tiles' copies held a short block 2-3 us; a second block on the SM hides that. H200,
# 2026-11-29, page 1, cp.async against per-row copies: 64 blocks of 128-256 keys (B = 1,
# Sk = 1k and 2k) 1.12-1.20x; 256 blocks of 128-512 keys 0.97-1.01x; 1024 to 4096 keys a
# block 0.98-1.01x (notes-decode.md section 34).
CHUNK_COPY_KEYS = 512
DEFAULT_SMEM_LIMIT = 227 * 1024   # sm_90's opt-in per-block limit; callers pass the device's

_PTR, _I64, _I32 = np.uint64, np.int64, np.int32
# Mirrors of kernels/common/paged.cuh (CacheParams), kernels/decode.cu (DecodeParams)
# and kernels/merge.cu (StateView, MergeParams); tests/test_decode.py checks every
# offset with NVRTC.
CACHE_DTYPE = np.dtype([("block_table", _PTR), ("seqlens", _PTR), ("block_table_stride", _I64),
                        ("page_size", _I32), ("max_pages", _I32), ("page_magic", np.uint32),
                        ("page_shift", _I32)], align=True)
DECODE_DTYPE = np.dtype([("fwd", FWD_DTYPE), ("cache", CACHE_DTYPE), ("o_part", _PTR),
                         ("lse_part", _PTR), ("num_splits", _I32), ("split_keys", _I32)],
                        align=True)
STATE_DTYPE = np.dtype([("o", _PTR), ("lse", _PTR), ("o_stride", _I64, (4,)),
                        ("lse_stride", _I64, (4,)), ("states", _I32)], align=True)
MERGE_DTYPE = np.dtype([("a", STATE_DTYPE), ("b", STATE_DTYPE), ("o", _PTR), ("lse", _PTR),
                        ("o_stride", _I64, (3,)), ("lse_stride", _I64, (3,)), ("n0", _I32),
                        ("n1", _I32), ("n2", _I32), ("head_dim", _I32)], align=True)
MERGE_WARPS = 4
APPEND_DTYPE = np.dtype([("k_new", _PTR), ("v_new", _PTR), ("k_cache", _PTR), ("v_cache", _PTR),
                         ("cache", CACHE_DTYPE)]
                        + [(f"{x}_{w}_stride", _I64) for x in ("k_new", "v_new")
                           for w in ("batch", "row", "head")]
                        + [(f"{x}_{w}_stride", _I64) for x in ("k", "v")
                           for w in ("page", "row", "head")]
                        + [("seqlen_new", _I32), ("head_dim", _I32)], align=True)
APPEND_THREADS = 64


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


@dataclasses.dataclass(frozen=True)
class Tile:
    """DecodeTraits' shape parameters (kernels/decode.cu)."""

    row_warps: int
    key_warps: int
    warp_keys: int
    stages: int
    wgmma: bool = False   # one warpgroup's wgmma m64 over the 64 rows (use_wgmma)

    @property
    def rows(self) -> int:
        return 16 * self.row_warps

    @property
    def block_n(self) -> int:
        return self.key_warps * self.warp_keys

    @property
    def threads(self) -> int:
        return 32 * self.row_warps * self.key_warps


def has_producer(head_dim: int, t: Tile, paged: bool, maps: bool) -> bool:
    """DecodeTraits' PRODUCER: the one-block warpgroup tile over tensor maps runs a
    producer warpgroup beside its two (Plan.threads): paged at 64 < D <= 128,
    contiguous at D = 128."""
    return (maps and t.wgmma and t.key_warps == 2 and 64 < head_dim <= 128
            and (paged or head_dim == 128))


def smem_bytes(head_dim: int, t: Tile, paged: bool, tma: bool = False,
               halves: bool = False) -> int:
    """``DecodeTraits::SMEM_BYTES``: sizeof(Storage) (the K/V ring or the key warps'
    merge area, Q's packed rows, the page ids, the ring's mbarriers: full, and empty
    under the producer warpgroup's tile shapes, has_producer, per consumer warpgroup
    with ``halves``), and with TMA the slack that places it on a 1024-byte boundary
    (its ring rows then take whole 64-column blocks of the swizzled layout)."""
    d_pad = -(-head_dim // 16) * 16
    srow = d_pad + 8
    kv_row = -(-d_pad // 64) * 64 if tma else srow
    ring = 2 * t.stages * t.block_n * kv_row * 2
    merge = t.key_warps * t.rows * (d_pad + 4) * 4 + 2 * t.key_warps * t.rows * 4
    ids = 4 * (2 * (t.stages - 1) * t.block_n if paged else 1)
    head = max(ring, merge) + t.rows * srow * 2 + ids
    # (halves: a full and an empty barrier per stage and consumer warpgroup)
    barriers = t.stages * ((2 * (t.key_warps if halves else 1))
                           if has_producer(head_dim, t, paged, True) else 1)
    return -(-head // 8) * 8 + 8 * barriers + (1024 if tma else 0)


def tile(rows_total: int, head_dim: int, paged: bool = True,
         smem_limit: int = DEFAULT_SMEM_LIMIT, tma: bool = False, wide: bool = False,
         wgmma: bool = False, block_smem: int = BLOCK_SMEM) -> Tile:
    """The tile for group * Sq packed rows (see BLOCK_SMEM): the first shape, in the
    order (all key warps, BLOCK_N keys), then fewer keys per warp, then fewer key
    warps, whose ring of two or more stages fits BLOCK_SMEM, with as many stages as
    fit; failing that, the first whose two stages fit the device. ``wide``: one block
    per SM (KEY_WARPS_WIDE, 128-key tiles, the device's whole per-block budget).
    ``wgmma`` (use_wgmma): one warpgroup over 64 rows and the whole key tile (its S is
    BLOCK_N / 2 registers a thread, not a warp's MAX_WARP_KEYS). ``block_smem``: the
    budget in place of BLOCK_SMEM (BLOCK_SMEM_NARROW)."""
    rw = 4 if wgmma else 1 if rows_total <= 16 else 2 if rows_total <= 32 else 4
    block_n = 128 if head_dim <= 64 or wide else 64
    shapes = []
    kw = KEY_WARPS_WGMMA[wide] if wgmma else (KEY_WARPS_WIDE if wide else KEY_WARPS)[rw]
    while kw >= 1:
        wk = max(16, block_n // kw) if wgmma else min(MAX_WARP_KEYS, max(16, block_n // kw))
        while wk >= 16:
            shapes.append((kw, wk))
            wk //= 2
        kw //= 2
    for budget in ((smem_limit,) if wide else (min(block_smem, smem_limit), smem_limit)):
        for kw, wk in shapes:
            fits = [st for st in range(2, MAX_STAGES + 1)
                    if smem_bytes(head_dim, Tile(rw, kw, wk, st), paged, tma) <= budget]
            if fits:
                return Tile(rw, kw, wk, max(fits), wgmma)
    return Tile(rw, 1, 16, 2, wgmma)


def split_count(blocks: int, capacity: int, sms: int,
                per_sm: float = SPLIT_BLOCKS_PER_SM, min_keys: int = MIN_SPLIT_KEYS) -> int:
    """Key splits per sequence for ``blocks`` blocks of ``capacity`` keys each: as
    many as one wave of ``per_sm`` blocks per SM holds (SPLIT_BLOCKS_PER_SM, or
    SPLIT_BLOCKS_PER_SM_TMA for contiguous caches through tensor maps, and
    SPLIT_BLOCKS_PER_SM_WGMMA for the warpgroup tile there; rounding up ran a second,
    mostly idle wave: B = 8, Hkv = 8 took 5 splits, 320 blocks for 264 slots on an
    H100)."""
    want = int(per_sm * sms) // max(blocks, 1)
    most = max(1, capacity // min_keys, min(SHORT_SPLITS, capacity // SHORT_SPLIT_KEYS))
    return max(1, min(want, most, MAX_SPLITS))


@dataclasses.dataclass(frozen=True)
class DecodeShape:
    """What a decode launch's configuration depends on (hashable)."""

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    # the keys the split plan is made for: the longest sequence where the host knows
    # it, else the cache's capacity (Sk of a contiguous cache, pages x page size)
    capacity: int
    head_dim: int
    dtype: str
    variant: Variant
    paged: bool

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv


@dataclasses.dataclass(frozen=True)
class Plan:
    spec: jit.KernelSpec
    tile: Tile
    row_blocks: int
    num_splits: int
    split_keys: int
    smem: int
    tma: bool = False   # K and V tiles through tensor maps (use_tma)
    producer: bool = False   # DecodeTraits' PRODUCER: a producer warpgroup beside the tile's
    page_box: int = 16   # DecodeTraits' PAGE_BOX: rows of a paged map's box (page_box())
    halves: bool = False   # DecodeTraits' HALVES_: a full and an empty barrier a warpgroup
    row_copies: bool = True   # DecodeTraits' ROW_COPIES_ (row_copies())

    @property
    def rows(self) -> int:
        return self.tile.rows

    @property
    def threads(self) -> int:
        return self.tile.threads + (128 if self.producer else 0)

    def grid(self, s: DecodeShape) -> tuple:
        return (self.row_blocks * self.num_splits, s.heads_kv, s.batch)


def spec(head_dim: int, dtype: str, t: Tile, variant: Variant, paged: bool,
         vec: bool, tma: bool = False, gather: bool = False,
         page_box: int = 16, halves: bool = False, row_copies: bool = True) -> jit.KernelSpec:
    """``tma``: the swizzled ring (DecodeTraits' TMA), filled through tensor maps or,
    with ``gather``, by cp.async (GATHER). ``page_box``: PAGE_BOX (page_box());
    ``halves``: HALVES_ (the paged producer tile's barriers per consumer warpgroup);
    ``row_copies``: ROW_COPIES_ (row_copies())."""
    assert not t.wgmma or tma, "the wgmma tile reads the swizzled ring"
    assert not gather or (tma and vec), "gathered tiles: 16-byte copies into the swizzled ring"
    assert page_box == 16 or (paged and tma and not gather and t.block_n % page_box == 0)
    assert not halves or (paged and tma and not gather and t.wgmma)
    assert row_copies or (paged and vec and not tma)
    # DecodeTraits' bools VEC, PAGED, TMA, WGMMA, GATHER, PAGE_BOX, HALVES_ and
    # ROW_COPIES_, the trailing defaults left out
    flags = [vec, paged, tma, t.wgmma, gather]
    tail = [str(page_box), "true" if halves else "false", "true" if row_copies else "false"]
    while tail and tail[-1] == ("16", "false", "true")[len(tail) - 1]:
        tail.pop()
    while len(flags) > 2 and not flags[-1] and not tail:
        flags.pop()
    flags = ["true" if x else "false" for x in flags] + tail
    traits = (f"DecodeTraits<{head_dim}, {t.row_warps}, {t.key_warps}, {t.warp_keys}, "
              f"{t.stages}, {CPP_DTYPE[dtype]}, {', '.join(flags)}>")
    copy = ",gather" if gather else ",tma" if tma else ""
    name = (f"decode[D={head_dim},M={t.rows},W={t.row_warps}x{t.key_warps},N={t.block_n},"
            f"ST={t.stages},{SHORT_DTYPE[dtype]}{',paged' if paged else ''}{variant.suffix()}"
            f"{'' if vec else ',unaligned'}{copy}{',wgmma' if t.wgmma else ''}"
            f"{'' if page_box == 16 else f',box{page_box}'}{',halves' if halves else ''}"
            f"{'' if row_copies else ',chunks'}]")
    return jit.KernelSpec("decode.cu", f"decode_fwd<{traits}, {variant.cpp()}>", name)


def split_merge_spec(out_dtype: str, head_dim: int) -> jit.KernelSpec:
    """The merge of split-KV's own partials (merge.cu's merge_splits: fp32, contiguous,
    ``head_dim`` a multiple of 4, at most MAX_SPLITS states); merge_spec elsewhere."""
    if head_dim % 4:
        return merge_spec("float32", out_dtype, head_dim)
    vecs = -(-head_dim // 128)
    expr = f"merge_splits<{CPP_DTYPE[out_dtype]}, {vecs}>"
    name = f"merge_splits[->{SHORT_DTYPE[out_dtype]},D<={128 * vecs}]"
    return jit.KernelSpec("merge.cu", expr, name)


def merge_spec(in_dtype: str, out_dtype: str, head_dim: int) -> jit.KernelSpec:
    per_lane = _pow2_at_least(-(-head_dim // 32))
    expr = f"merge_states<{CPP_DTYPE[in_dtype]}, {CPP_DTYPE[out_dtype]}, {per_lane}>"
    name = f"merge[{SHORT_DTYPE[in_dtype]}->{SHORT_DTYPE[out_dtype]},D<={32 * per_lane}]"
    return jit.KernelSpec("merge.cu", expr, name)


def append_spec(dtype: str, vec: bool, paged: bool) -> jit.KernelSpec:
    expr = (f"append_kv<{CPP_DTYPE[dtype]}, {'true' if vec else 'false'}, "
            f"{'true' if paged else 'false'}>")
    name = (f"append_kv[{SHORT_DTYPE[dtype]}{',paged' if paged else ''}"
            f"{'' if vec else ',unaligned'}]")
    return jit.KernelSpec("append.cu", expr, name)


def use_tma(s: DecodeShape, vec: bool, arch: str, kv_dims, k_strides, v_strides) -> bool:
    """Whether K and V tiles load through tensor maps (cp.async.bulk.tensor; sm_90+):
    16-byte aligned caches, D >= 64, whose [outer, Hkv, rows, D] views have a tensor
    map (tma.tileable) with no broadcast (stride 0) head or outer axis; paged caches
    whose pages hold a multiple of 16 rows. ``kv_dims``: (outer, rows), (B, Sk_max)
    of a contiguous cache, (pages, page_size) of a paged one; ``*_strides``: (outer,
    head, row) in elements."""
    from .. import tma

    outer, rows = kv_dims
    if not vec or s.head_dim < 64 or device.arch_cc(arch) < 90 or (s.paged and rows % 16):
        return False
    for o_stride, h_stride, r_stride in (k_strides, v_strides):
        if not tma.tileable(outer, s.heads_kv, rows, (o_stride, h_stride, r_stride)):
            return False
        if (h_stride == 0 and s.heads_kv > 1) or (o_stride == 0 and outer > 1):
            return False
    return True


def use_wgmma(s: DecodeShape, tma: bool, arch: str, vec: bool = False) -> bool:
    """Whether more than WGMMA_MIN_ROWS packed rows take the warpgroup tile (sm_90a:
    wgmma m64 over the swizzled ring, Q in registers), its tiles loaded through the
    tensor maps (``tma``) or, for 16-byte aligned caches without them (pages of a row,
    for instance; D >= 64), gathered by cp.async (``plan``'s GATHER traits)."""
    return (arch == "sm_90a" and s.group * s.seqlen_q > WGMMA_MIN_ROWS
            and (tma or (vec and s.head_dim >= 64)))


@functools.lru_cache(maxsize=4096)
def plan(s: DecodeShape, vec: bool, sms: int, num_splits: int | None = None,
         smem_limit: int = DEFAULT_SMEM_LIMIT, tma: bool = False, wgmma: bool = False,
         page_size: int = 16, copy_engine: bool = False) -> Plan:
    """The launch of ``s`` on a GPU of ``sms`` multiprocessors whose blocks may take
    ``smem_limit`` bytes of shared memory (``num_splits`` forces the split count, for
    tests and benchmarks; ``tma``, ``wgmma``: use_tma's and use_wgmma's answers; the
    warpgroup tile without tensor maps gathers its tiles; ``page_size``: a paged
    cache's, for page_box; ``copy_engine``: sm_90's bulk copies, for row_copies)."""
    rows_total = s.group * s.seqlen_q
    gather = wgmma and not tma
    swizzled = tma or gather
    # Paged caches take the one-block warpgroup tile past D = 64 where the two-block plan
    # would split the keys, i.e. where its 64-row blocks fill at most one block per SM
    # (H100, 2026-11-27, Sq = 16, page 16, TB/s two-block plan / one-block: B = 1, Sk =
    # 32k 2.19 / 2.28; B = 8, Sk = 8k 2.53 / 2.56; with the grid full without splits it
    # loses: B = 64 2.89 / 2.86, chunked prefill 296 / 241 TFLOPs). At D = 64 the
    # two-block plan wins on the H200 (2026-11-29, B = 8, Sk = 8k / 32k 2.93 / 3.81
    # against 2.31 / 2.79; B = 1, Sk = 32k 2.34 against 1.95; D = 128: 3.33 / 4.02 against
    # 3.40 / 3.98, B = 1 2.78 against 2.94). Past D = 128 (two stages of 64 keys) only
    # while the wave holds at most PAGED_WIDE_KEYS_PER_SM keys an SM (H200, 2026-11-29,
    # D = 256, Sq = 16, page 16, us two-block / one-block: B = 1, Sk = 1k 21.1 / 16.2,
    # 8k 45.4 / 38.0, 32k 92.6 / 91.0, 128k 276 / 315; B = 8, Sk = 1k 39.3 / 35.6, 8k
    # 148 / 164; D = 192, B = 8, Sk = 8k 114 / 121; notes-decode.md section 28).
    blocks64 = -(-rows_total // 64) * s.heads_kv * s.batch   # of 64-row tiles
    one_wave = blocks64 <= sms
    paged_wide = wgmma and s.paged and one_wave and 64 < s.head_dim and (
        s.head_dim <= 128 or s.capacity * blocks64 <= PAGED_WIDE_KEYS_PER_SM * sms)
    # The gathered tile (pages without tensor maps) takes the one-block tile on one-wave
    # grids at 64 < D <= 192: 128-key tiles, three stages at D <= 128 (two of 64 before),
    # two past it (three of 32). H200, 2026-11-30, Sq = 16, pages 1 and 8: D = 128
    # 1.03-1.11x at B = 1-16, D = 112 1.05x, D = 96 0.99-1.01x, D = 160 and 192
    # 1.05-1.07x; D = 64 0.86-0.94x, D = 256 0.97-1.03x (notes-decode.md section 38).
    one_block = (tma and (not s.paged or paged_wide)) or (
        gather and s.paged and one_wave and 64 < s.head_dim <= 192)
    # KEY_WARPS_WIDE, KEY_WARPS_WGMMA: the one-block tiles serve grids of at most one
    # wave (which the split count fills); past it two blocks an SM overlap one block's
    # ring fill with the other's stream, except the D = 128 warpgroup tile's. H200
    # (2026-11-29), bf16, Hq/Hkv 32/8, Sq = 16, TB/s one-block / two-block tiles: B = 64,
    # Sk = 1k, D = 64 2.22 / 3.04, D = 256 3.18 / 3.48; Sk = 4k, D = 256 4.05 / 4.23; Sk =
    # 8k within 1%, D = 256 4.25 / 4.36; D = 128 B = 256, Sk = 1k 3.61 / 3.37.
    wide = one_block and (rows_total > 32 or wgmma) and (
        one_wave or (wgmma and 64 < s.head_dim <= 128))
    four_block = (s.head_dim <= 64 and tma and blocks64 > 2 * sms
                  and (wgmma or s.paged and s.capacity < FOUR_BLOCK_KEYS))
    block_smem = BLOCK_SMEM_NARROW if four_block else BLOCK_SMEM
    t = tile(rows_total, s.head_dim, s.paged, smem_limit, swizzled, wide=wide, wgmma=wgmma,
             block_smem=block_smem)
    row_blocks = -(-rows_total // t.rows)
    blocks = row_blocks * s.heads_kv * s.batch
    producer = has_producer(s.head_dim, t, s.paged, tma)
    if num_splits is None:
        narrow = s.head_dim <= 64 and s.capacity >= SPLIT_WGMMA_NARROW_MIN_KEYS
        if not one_block:
            per_sm = SPLIT_BLOCKS_PER_SM
        elif t.wgmma and not s.paged and s.head_dim <= 128 and not narrow:
            per_sm = SPLIT_BLOCKS_PER_SM_WGMMA
        else:
            per_sm = SPLIT_BLOCKS_PER_SM_TMA
        if producer and s.paged:
            num_splits = split_count(blocks, s.capacity, sms, per_sm, PRODUCER_SPLIT_KEYS)
            if 3 * blocks >= sms and s.capacity < PRODUCER_MERGE_KEYS:
                num_splits = 1
        else:
            num_splits = split_count(blocks, s.capacity, sms, per_sm)
    split_keys = -(-max(-(-s.capacity // num_splits), 1) // t.block_n) * t.block_n
    num_splits = max(1, -(-s.capacity // split_keys))
    box = page_box(s, producer, page_size)
    # The paged producer tile's barriers per consumer warpgroup (DecodeTraits' HALVES)
    # where the grid fills at most half the SMs: there a block's own latency holds it
    halves = producer and s.paged and 2 * blocks * num_splits <= sms
    rows = row_copies(s, t, vec, swizzled, split_keys, blocks * num_splits <= sms, copy_engine)
    return Plan(spec(s.head_dim, s.dtype, t, s.variant, s.paged, vec, swizzled, gather, box,
                     halves, rows),
                t, row_blocks, num_splits, split_keys,
                smem_bytes(s.head_dim, t, s.paged, swizzled, halves), tma, producer, box, halves,
                rows)


def row_copies(s: DecodeShape, t: Tile, vec: bool, swizzled: bool, split_keys: int,
               one_wave: bool, copy_engine: bool) -> bool:
    """DecodeTraits' ROW_COPIES_: false where the kernel would copy paged rows one bulk
    copy a row (sm_90 and DecodeTraits::ROW_COPY_SHAPE, mirrored here: no tensor maps,
    16-byte aligned rows of 256 bytes or more) but its blocks, at most one an SM
    (``one_wave``), read at most CHUNK_COPY_KEYS keys each."""
    d_pad = -(-s.head_dim // 16) * 16
    bulk = (copy_engine and s.paged and vec and not swizzled and 2 * s.head_dim >= 256
            and t.block_n * (d_pad // 8) * 2 >= 16 * t.threads)
    return not (bulk and one_wave and split_keys <= CHUNK_COPY_KEYS)


def page_box(s: DecodeShape, producer: bool, page_size: int) -> int:
    """Rows of a paged tensor map's box (DecodeTraits' PAGE_BOX): 64 for the producer
    warpgroup's tile where the pages hold a multiple of 64 rows, else 16. Fewer, larger
    boxes, as the copy engine pays per box: H200, 2026-11-29, Sq = 16, D = 128, B = 8,
    pages of 64 and 256, 1.024-1.039x at Sk = 2k-4k; on the other paged tiles
    0.991-1.002x (notes-decode.md section 32)."""
    return 64 if s.paged and producer and page_size % 64 == 0 else 16


def _ptr(x) -> int:
    return 0 if x is None else x.data.ptr


def _strides(x) -> list:
    return [st // x.itemsize for st in x.strides]


def divisor_magic(d: int) -> tuple[int, int]:
    """The multiplier m and shift s of types.cuh's Divisor for a divisor d >= 1:
    x // d == (x * m >> 32) >> s for 0 <= x < 2**31 (d = 1: (0, 0), its own branch)."""
    if d <= 1:
        return 0, 0
    lg = (d - 1).bit_length()
    return ((1 << (31 + lg)) + d - 1) // d, lg - 1


def cache_params(block_table, seqlens, page_size: int) -> np.void:
    """The ``CacheParams`` struct: contiguous (block_table None) or paged."""
    magic, shift = divisor_magic(page_size)
    cache = {"block_table": _ptr(block_table), "seqlens": _ptr(seqlens), "page_size": page_size,
             "page_magic": magic, "page_shift": shift}
    if block_table is not None:
        cache.update(block_table_stride=_strides(block_table)[0], max_pages=block_table.shape[1])
    return make_struct(CACHE_DTYPE, cache)


def cache_fwd_fields(s: DecodeShape, scale: float, *, q_strides, o_strides, k_strides,
                     v_strides, lse_strides, seqlen_k: int, variant_fields: dict) -> dict:
    """The ``FwdParams`` fields of a call against a cache, pointers aside: strides in
    elements ((batch, head, row) of q, out and lse, (page or batch, head, row) of the
    caches), sizes, scale, and ``variant_fields`` (the band and softcap the kernel's
    sequences policy expects). Shared by the decode kernel and flash_wgmma's cache
    kernel."""
    scale_log2 = float(np.float32(scale * LOG2E))
    return {
        "q_batch_stride": q_strides[0], "q_head_stride": q_strides[1], "q_row_stride": q_strides[2],
        "k_batch_stride": k_strides[0], "k_head_stride": k_strides[1], "k_row_stride": k_strides[2],
        "v_batch_stride": v_strides[0], "v_head_stride": v_strides[1], "v_row_stride": v_strides[2],
        "o_batch_stride": o_strides[0], "o_head_stride": o_strides[1], "o_row_stride": o_strides[2],
        "lse_batch_stride": lse_strides[0], "lse_head_stride": lse_strides[1],
        "batch": s.batch, "heads_q": s.heads_q, "heads_kv": s.heads_kv, "group": s.group,
        "seqlen_q": s.seqlen_q, "seqlen_k": seqlen_k, "head_dim": s.head_dim,
        "scale": scale, "scale_log2": scale_log2, "scale_log2_lo": scale * LOG2E - scale_log2,
        **variant_fields,
    }


def decode_params(s: DecodeShape, scale: float, q, k, v, out, lse, *, q_strides, o_strides,
                  k_strides, v_strides, lse_strides=(0, 0, 0), block_table=None, seqlens=None,
                  page_size=0, o_part=None, lse_part=None, p: Plan) -> np.void:
    """The ``DecodeParams`` struct. ``*_strides``: (batch, head, row) of q, out and lse
    in elements, (page or batch, head, row) of the caches."""
    fwd = cache_fwd_fields(s, scale, q_strides=q_strides, o_strides=o_strides,
                           k_strides=k_strides, v_strides=v_strides, lse_strides=lse_strides,
                           seqlen_k=s.capacity,
                           # the band for Sk = 0: the kernel adds each sequence's own length
                           variant_fields=s.variant.params(s.seqlen_q, 0, scale))
    fwd.update(q=_ptr(q), k=_ptr(k), v=_ptr(v), o=_ptr(out), lse=_ptr(lse))
    return make_struct(DECODE_DTYPE, {
        "fwd": make_struct(FWD_DTYPE, fwd),
        "cache": cache_params(block_table, seqlens, page_size),
        "o_part": _ptr(o_part), "lse_part": _ptr(lse_part), "num_splits": p.num_splits,
        "split_keys": p.split_keys})


def merge_params(views, o, o_strides, lse, lse_strides, dims, head_dim) -> np.void:
    """``MergeParams``: ``views`` are up to two (o, lse, o_strides[4], lse_strides[4],
    states) stacks; strides in elements; ``dims`` = (n0, n1, n2)."""
    m = np.zeros((), MERGE_DTYPE)
    for key, view in zip(("a", "b"), views):
        vo, vl, vos, vls, states = view
        m[key]["o"], m[key]["lse"] = _ptr(vo), _ptr(vl)
        m[key]["o_stride"], m[key]["lse_stride"] = vos, vls
        m[key]["states"] = states
    m["o"], m["lse"] = _ptr(o), _ptr(lse)
    m["o_stride"], m["lse_stride"] = o_strides, lse_strides
    m["n0"], m["n1"], m["n2"] = dims
    m["head_dim"] = head_dim
    return m[()]


def launch_merge(params: np.void, rows: int, kspec: jit.KernelSpec, stream, device_id: int,
                 arch: str) -> None:
    kernel = jit.get_function(kspec, arch, device_id)
    kernel.launch((-(-rows // MERGE_WARPS),), (32 * MERGE_WARPS,), (params,), 0, stream)


_POINTERS = struct.Struct("<5Q")   # q, k, v, o, lse: the first fields of DecodeParams.fwd
_PARTS = struct.Struct("<2Q")      # o_part, lse_part
_PARTS_AT = DECODE_DTYPE.fields["o_part"][1]
# decode_fwd's arguments after DecodeParams: the K and V tensor maps (TmaMap, 128 bytes
# each, as ctypes buffers for jit.launch_packed's kernelParams; zeros where the launch
# takes no maps)
_NO_MAPS = tuple((ctypes.c_char * 128)() for _ in range(2))
_CACHE_AT = DECODE_DTYPE.fields["cache"][1]
_TABLE_AT = _CACHE_AT + CACHE_DTYPE.fields["block_table"][1]
_LENGTHS_AT = _CACHE_AT + CACHE_DTYPE.fields["seqlens"][1]
# MergeParams: a.o, a.lse, o, lse
_MERGE_AT = (MERGE_DTYPE.fields["a"][1] + STATE_DTYPE.fields["o"][1],
             MERGE_DTYPE.fields["a"][1] + STATE_DTYPE.fields["lse"][1],
             MERGE_DTYPE.fields["o"][1], MERGE_DTYPE.fields["lse"][1])


class DecodeLaunch:
    """One decode configuration with everything but the data pointers fixed.

    ``run(q, k, v, out, lse, stream)`` patches the five pointers into a packed
    DecodeParams, allocates the split partials (on ``stream``), launches the decode
    and, with splits, the merge of the partials into out and lse. ``tensors``:
    decode_params' keyword arguments (their pointers are placeholders, except the
    block table and lengths, which stay fixed)."""

    def __init__(self, s: DecodeShape, scale: float, p: Plan, o_strides, lse_strides,
                 device_id: int, arch: str, kv_dims=(0, 0), **tensors):
        self.s, self.p = s, p
        self.maps = None   # (k, v) -> their maps' buffers: kept per pointer pair
        if p.tma:   # kv_dims: use_tma's (outer, rows) of the caches
            from .. import tma

            box_rows = p.page_box if s.paged else p.tile.block_n
            # (DecodeTraits' FUSED_BOXES and V_FUSED: over paged caches past D = 64, D a
            # multiple of 64, the mma.sync tiles' K and V and the producer tile's V take
            # a box of every 64-column block of a box's rows)
            fused = s.paged and s.head_dim > 64 and s.head_dim % 64 == 0
            blocks = {"k": fused and not p.tile.wgmma,
                      "v": fused and (not p.tile.wgmma or p.producer)}
            self.maps = tma.MapBuffers(tma.TileMaps(tma.map_geometry(
                kv_dims[0], s.heads_kv, kv_dims[1], s.head_dim, tensors[f"{x}_strides"],
                box_rows, blocks[x])) for x in ("k", "v"))
        self.template = decode_params(s, scale, tensors.pop("q"), tensors.pop("k"),
                                      tensors.pop("v"), None, None, o_strides=o_strides,
                                      lse_strides=lse_strides, p=p, **tensors).tobytes()
        self.kernel = jit.get_function(p.spec, arch, device_id)
        self.grid = p.grid(s)
        # sm_90+: the decode is the programmatic dependent of the kernel before it and
        # the merge the decode's (kernels/common/pdl.cuh): their launches overlap the
        # kernel before them, each waits for it before touching memory
        self.dependent = device.arch_cc(arch) >= 90
        if p.num_splits > 1:
            rows = s.batch * s.heads_q * s.seqlen_q
            o4 = (rows * s.head_dim, s.heads_q * s.seqlen_q * s.head_dim,
                  s.seqlen_q * s.head_dim, s.head_dim)
            l4 = (rows, s.heads_q * s.seqlen_q, s.seqlen_q, 1)
            self.merge_template = merge_params(
                ((None, None, o4, l4, p.num_splits),), None, o_strides, None, lse_strides,
                (s.batch, s.heads_q, s.seqlen_q), s.head_dim).tobytes()
            self.merge_kernel = jit.get_function(split_merge_spec(s.dtype, s.head_dim), arch,
                                                 device_id)
            self.merge_grid = (-(-rows // MERGE_WARPS),)

    def run(self, q: int, k: int, v: int, o: int, lse: int, stream, table: int | None = None,
            lengths: int | None = None) -> None:
        """Launch on new pointers; ``table`` and ``lengths`` (when not None) replace
        the block table's and the lengths' (a hot decode call's own)."""
        import cupy

        s, p = self.s, self.p
        buf = bytearray(self.template)
        _POINTERS.pack_into(buf, 0, q, k, v, o, lse)
        if table is not None:
            struct.pack_into("<Q", buf, _TABLE_AT, table)
        if lengths is not None:
            struct.pack_into("<Q", buf, _LENGTHS_AT, lengths)
        maps = _NO_MAPS if self.maps is None else self.maps(k, v)
        if p.num_splits == 1:
            self.kernel.launch_packed(self.grid, (p.threads,), buf, p.smem, stream.ptr,
                                      dependent=self.dependent, tail=maps)
            return
        with stream:   # the partials live on the launch stream (stream-ordered reuse)
            o_part = cupy.empty((p.num_splits, s.batch, s.heads_q, s.seqlen_q, s.head_dim),
                                dtype=cupy.float32)
            lse_part = cupy.empty((p.num_splits, s.batch, s.heads_q, s.seqlen_q),
                                  dtype=cupy.float32)
        _PARTS.pack_into(buf, _PARTS_AT, o_part.data.ptr, lse_part.data.ptr)
        self.kernel.launch_packed(self.grid, (p.threads,), buf, p.smem, stream.ptr,
                                  dependent=self.dependent, tail=maps)
        mbuf = bytearray(self.merge_template)
        for at, ptr in zip(_MERGE_AT, (o_part.data.ptr, lse_part.data.ptr, o, lse)):
            struct.pack_into("<Q", mbuf, at, ptr)
        self.merge_kernel.launch_packed(self.merge_grid, (32 * MERGE_WARPS,), mbuf, 0, stream.ptr,
                                        dependent=self.dependent)


def launch_decode(s: DecodeShape, scale: float, p: Plan, out, lse, o_strides, stream,
                  device_id: int, arch: str, kv_dims=(0, 0), **tensors) -> DecodeLaunch:
    """Decode (and, with splits, the merge of its partials) on ``stream``.
    ``tensors``: decode_params' keyword arguments; ``kv_dims``: use_tma's (outer, rows)
    of the caches (their tensor maps, ``p.tma``). Returns the launch, which a hot call
    repeats on new pointers."""
    lse_strides = (0, 0, 0) if lse is None else (*_strides(lse)[:2], 1)
    q, k, v = (tensors[n].data.ptr for n in ("q", "k", "v"))
    launch = DecodeLaunch(s, scale, p, o_strides, lse_strides, device_id, arch, kv_dims,
                          **tensors)
    launch.run(q, k, v, out.data.ptr, _ptr(lse), stream)
    return launch


class HotDecode:
    """What ``ca.attention``'s hot path repeats for new pointers (HotLaunch's
    interface): the aligned or the element-copy launch, chosen per call."""

    def __init__(self, make, strides_aligned: bool):
        self.make = functools.lru_cache(maxsize=2)(make)
        self.strides_aligned = strides_aligned

    def run(self, q: int, k: int, v: int, o: int, lse: int, stream) -> None:
        vec = self.strides_aligned and not ((q | k | v | o) & 15)
        self.make(vec).run(q, k, v, o, lse, stream)


def launch_append(k_cache, v_cache, k_new, v_new, *, seqlens, block_table, page_size, dtype,
                  stream, device_id: int, arch: str) -> None:
    """Write k_new, v_new [B, S_new, Hkv, D] at positions seqlens[b] + t of the caches
    ([B, Sk, Hkv, D] contiguous, or [pages, page_size, Hkv, D] with block_table)."""
    B, s_new, hkv, d = k_new.shape
    if not (B and s_new and hkv and d):
        return
    nk, nv, ck, cv = (_strides(x) for x in (k_new, v_new, k_cache, v_cache))
    values = {"k_new": _ptr(k_new), "v_new": _ptr(v_new), "k_cache": _ptr(k_cache),
              "v_cache": _ptr(v_cache), "cache": cache_params(block_table, seqlens, page_size),
              "seqlen_new": s_new, "head_dim": d}
    for name, st in (("k_new", nk), ("v_new", nv)):
        values.update({f"{name}_batch_stride": st[0], f"{name}_row_stride": st[1],
                       f"{name}_head_stride": st[2]})
    for name, st in (("k", ck), ("v", cv)):
        values.update({f"{name}_page_stride": st[0], f"{name}_row_stride": st[1],
                       f"{name}_head_stride": st[2]})
    vec = vectorizable_arrays(d, (k_new, v_new, k_cache, v_cache))
    kernel = jit.get_function(append_spec(dtype, vec, block_table is not None), arch, device_id)
    kernel.launch((s_new, hkv, B), (APPEND_THREADS,), (make_struct(APPEND_DTYPE, values),), 0,
                  stream)


class Decode(Family):
    name = "decode"
    summary = ("few query rows per sequence: GQA heads and queries packed into mma tiles "
               "(wgmma on sm_90a), split-KV with a merge (cp.async, paged caches)")
    source = "decode.cu"
    dtypes = ("float16", "bfloat16")
    min_cc = 80

    def check(self, p: Problem, cc: int | None) -> str | None:
        reason = super().check(p, cc)
        if reason is not None:
            return reason
        if p.seqlen_q > AUTO_MAX_SEQLEN_Q:
            return f"decode takes Sq <= {AUTO_MAX_SEQLEN_Q} query rows, not {p.seqlen_q}"
        if p.mask_kind != "none":
            return "decode takes no dense mask"
        if p.alibi:
            return ("decode takes no ALiBi (its blocks see a split's keys, not the "
                    "sequence's length)")
        return None

    def auto_takes(self, p: Problem) -> bool:
        """GQA/MQA: packing a group's query heads onto each K/V read is where this
        kernel wins. MHA only for few (batch, head) pairs, where the tensor-core
        families leave most SMs idle and split-KV fills them (H100, bf16, H = 32, D =
        128, Sq = 1, TB/s decode / auto's previous choice: B = 1, Sk = 32k 2.77 / 1.97;
        B = 8, Sk = 8k 2.89 / 3.08; B = 64, Sk = 4k 2.94 / 3.14; notes-decode.md)."""
        return p.group > 1 or p.batch * p.heads_kv <= MHA_MAX_PAIRS

    def launch(self, p: Problem, t: Tensors, stream, device_id: int, arch: str) -> None:
        """One call through the same launch object a hot call reuses (:meth:`prepare`)."""
        self.prepare(p, t, device_id, arch).run(t.q.data.ptr, t.k.data.ptr, t.v.data.ptr,
                                                t.out.data.ptr, _ptr(t.lse), stream)

    def prepare(self, p: Problem, t: Tensors, device_id: int, arch: str) -> HotDecode:
        from ..device import max_shared_per_block, multiprocessor_count

        s = DecodeShape(p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim,
                        p.dtype, p.variant, False)
        sms, smem_limit = multiprocessor_count(device_id), max_shared_per_block(device_id)
        o_strides = bhs_strides(t.out, p.layout)
        lse_strides = (0, 0, 0) if t.lse is None else (*_strides(t.lse)[:2], 1)
        strides = dict(q_strides=bhs_strides(t.q, p.layout), k_strides=bhs_strides(t.k, p.layout),
                       v_strides=bhs_strides(t.v, p.layout))

        def make(vec: bool) -> DecodeLaunch:
            dims = (p.batch, p.seqlen_k)
            tma = use_tma(s, vec, arch, dims, strides["k_strides"], strides["v_strides"])
            pl = plan(s, vec, sms, None, smem_limit, tma, use_wgmma(s, tma, arch, vec))
            return DecodeLaunch(s, p.scale, pl, o_strides,
                                lse_strides, device_id, arch, dims, q=None, k=None, v=None,
                                **strides)

        return HotDecode(make, strides_aligned(p.head_dim, (t.q, t.k, t.v, t.out)))

    def table_config(self, p: Problem, smem_limit: int = 0) -> tuple:
        """The Tile's (ROW_WARPS, KEY_WARPS, WARP_KEYS, STAGES) for the packed rows;
        the split count follows the grid at launch. Not tuned (one candidate)."""
        t = tile(p.group * p.seqlen_q, p.head_dim, False, smem_limit or DEFAULT_SMEM_LIMIT)
        return (t.row_warps, t.key_warps, t.warp_keys, t.stages)

    def ci_specs(self) -> list[jit.KernelSpec]:
        out = []
        for d in (64, 128, 256):
            for dtype in ("float16", "bfloat16"):
                for rows in (4, 32, 64):
                    for paged in (False, True):
                        t = tile(rows, d, paged)
                        out.append(spec(d, dtype, t, Variant(causal=True), paged, True))
            # a consumer part's 99 KB per block
            out.append(spec(d, "bfloat16", tile(16, d, True, 99 * 1024), Variant(causal=True),
                            True, True))
            # through tensor maps (use_tma): packed rows 4, 16, 64, contiguous and paged;
            # 64 rows in the warpgroup tile (use_wgmma) where D allows it, contiguous
            # ones in the one-block and the two-block tiles
            for rows in (4, 16, 64):
                for paged in (False, True):
                    for wide in (True, False) if not paged and rows > 32 else (False,):
                        for wgmma in ((False, True) if rows > WGMMA_MIN_ROWS
                                      else (False,)):
                            out.append(spec(d, dtype, tile(rows, d, paged, tma=True, wide=wide,
                                                           wgmma=wgmma),
                                            Variant(causal=True), paged, True, True))
                    if paged and rows > WGMMA_MIN_ROWS and 64 < d:   # one-block paged
                        out.append(spec(d, dtype, tile(rows, d, True, tma=True, wide=True,
                                                       wgmma=True),
                                        Variant(causal=True), True, True, True))
        for d in (8, 72, 96, 160, 192, 224):
            out.append(spec(d, "bfloat16", tile(4, d, True), Variant(causal=True), True, True))
        for d in (1, 59, 111, 250):
            out.append(spec(d, "float16", tile(8, d, False), Variant(causal=d % 2 == 0), False,
                            False))
        out.append(spec(128, "bfloat16", tile(1, 128, False), Variant(), False, True))
        out.append(spec(128, "bfloat16", tile(8, 128, True),
                        Variant(causal=True, window=(64, 0), softcap=30.0), True, True))
        for d in (64, 96, 128, 256):   # the warpgroup tile gathering pages of a row (and such)
            for dtype in ("float16", "bfloat16"):
                out.append(spec(d, dtype, tile(64, d, True, tma=True, wgmma=True),
                                Variant(causal=True), True, True, True, gather=True))
        out.append(spec(128, "bfloat16", tile(64, 128, False, tma=True, wgmma=True),
                        Variant(causal=True, window=(64, 0), softcap=30.0), False, True, True,
                        gather=True))
        for d in (112, 128, 192):   # ... its one-block tile on one-wave grids (plan)
            out.append(spec(d, "bfloat16", tile(64, d, True, tma=True, wide=True, wgmma=True),
                            Variant(causal=True), True, True, True, gather=True))
        for d in (160, 192):   # past D = 128, head dims that are not a power of two
            out.append(spec(d, "bfloat16", tile(64, d, True, tma=True, wgmma=True),
                            Variant(causal=True), True, True, True))
        # the warpgroup tile's variants (contiguous D = 128: its producer warpgroup)
        for d, paged in ((72, True), (128, False), (256, True)):
            out.append(spec(d, "bfloat16", tile(64, d, paged, tma=True, wide=not paged,
                                                wgmma=True),
                            Variant(causal=True, window=(64, 0), softcap=30.0), paged, True, True))
        # ... and the one-block paged tile's (its producer warpgroup; at D < 128 ptxas
        # drops its setmaxnreg, C7508: notes-decode.md section 31)
        out.append(spec(128, "bfloat16", tile(64, 128, True, tma=True, wide=True, wgmma=True),
                        Variant(causal=True, window=(64, 0), softcap=30.0), True, True, True))
        # ... over pages of 64 rows: 64-row boxes (page_box)
        out.append(spec(128, "bfloat16", tile(64, 128, True, tma=True, wide=True, wgmma=True),
                        Variant(causal=True), True, True, True, page_box=64))
        # ... with a full and an empty barrier per consumer warpgroup (halves)
        for box in (16, 64):
            out.append(spec(128, "bfloat16", tile(64, 128, True, tma=True, wide=True,
                                                  wgmma=True),
                            Variant(causal=True), True, True, True, page_box=box, halves=True))
        # ... paged rows by cp.async where a block reads few keys (row_copies)
        for d in (128, 256):
            out.append(spec(d, "bfloat16", tile(4, d, True), Variant(causal=True), True, True,
                            row_copies=False))
        out.append(spec(256, "float16", tile(48, 256, True), Variant(window=(32, 32), softcap=50.0),
                        True, False))
        for d in (32, 64, 128, 256):
            for dtype in ("float16", "bfloat16"):
                out.append(merge_spec("float32", dtype, d))
                out.append(split_merge_spec(dtype, d))
                out.append(merge_spec(dtype, dtype, d))
        out.append(merge_spec("float32", "float32", 256))
        for dtype in ("float16", "bfloat16"):
            for vec in (False, True):
                for paged in (False, True):
                    out.append(append_spec(dtype, vec, paged))
        return list(dict.fromkeys(out))
