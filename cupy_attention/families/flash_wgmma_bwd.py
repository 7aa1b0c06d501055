"""The Hopper backward (``kernels/flash_wgmma_bwd.cu``): fp16/bf16, wgmma, sm_90a only.

Behind :func:`cupy_attention.attention_backward` with ``kernel="flash_wgmma"``, and
``kernel="auto"`` on compute capability 9.0 whenever :func:`check` accepts the
problem. Launch sequence on the caller's stream (the row kernels come from
``flash_bwd.cu``, the deterministic dQ kernel from ``flash_mma_bwd.cu``):

1. ``flash_bwd_delta``: ``delta = rowsum(dout * out)`` (and zeroes ``dq_accum``
   and the ordered mode's turn counters);
2. ``flash_wgmma_bwd_dkdv`` (D = 64-128, 128 keys a block),
   ``flash_wgmma_bwd_dkdv_mid`` (D = 136-192 over fixed lengths without dropout,
   softcap or a split: :func:`mid_fits`; 96 keys a block, one warpgroup holding dV^T
   and the other dK^T, dQ added in its own order, in the deterministic mode over whole
   query tiles in a fixed order) or
   ``flash_wgmma_bwd_dkdv_wide`` (D = 136-256 otherwise, 64 keys a block, one
   warpgroup holding dV and the other dK): dK, dV on wgmma, and dQ / scale added into
   ``dq_accum`` with fp32 reductions: in any order (``"atomic"``), or with
   ``deterministic=True`` where :func:`ordered_dq` holds in a fixed order of key
   blocks (``"ordered"``: bitwise reproducible);
3. ``flash_bwd_dq_convert`` (``dq = dq_accum * scale``); or, where the dK/dV kernel
   runs without dQ (``"separate"``), a dQ pass of its own: ``flash_wgmma_bwd_dq``
   (wgmma, query-parallel, dQ written once: the wide kernel over fixed lengths, in
   both modes, :func:`own_dq`) or flash_mma_bwd's ``flash_mma_bwd_dq`` (the other
   deterministic cases).

Head dims that are multiples of 8 from 64 to 256 (K Q^T and V dout^T step over D
rounded up to 16); other head dims, dense masks and other devices are declined by
:func:`check`. ``auto`` takes it wherever :func:`check` accepts the problem (it beat
flash_mma_bwd at every measured shape, bf16, H200: see TILES). The
kernel loads q, k, v and dout through tensor maps (:func:`tensor_maps`), so it
needs them 16-byte aligned (base pointers and strides) and in views a map takes
(``tma.tileable``): those are properties of the arrays, not of the Problem, so a
launch whose arrays are not runs flash_mma_bwd's kernels instead.
"""

from __future__ import annotations

import dataclasses
import functools

from .. import jit, tma
from ..problem import Problem
from ..variant import Variant
from . import flash_bwd, flash_mma, flash_mma_bwd, flash_wgmma
from .base import CPP_DTYPE, SHORT_DTYPE, bhs_strides, grid_check, section, section_grid

_KB = 1024
THREADS = 256     # two MMA warpgroups (Config.threads: and a producer warpgroup)

# Query-tile rows per head dim: the first row whose bound covers it. Up to D = 128
# (flash_wgmma_bwd_dkdv, 128 keys a block, 64 per warpgroup), registers per thread:
# dK, dV D; S^T, dP^T BLOCK_M; dQ 32 (D/2 with BLOCK_M = 128); P^T and dS^T as 16-bit
# A fragments BLOCK_M / 4 each. Past it (flash_wgmma_bwd_dkdv_wide, 64 keys a block,
# one warpgroup with dV and S^T, the other with dK and dP^T): D/2 + 32 + 16 + 32.
# One 8-warp block per SM either way.
# Figures: bf16, TFLOPs non-causal / causal, H200, 2026-11-22; [1]
# benchmarks/results/h200-wgmma-backward.json (FA2 = torch SDPA flash), [2]
# h200-wgmma-backward-head-dims.json (B*S = 16k, H = 2048 // D, S = 4096 then 16384);
# [3] h200-bf16-backward-wide.json (S = 2k-16k) and [4]
# h200-wgmma-backward-wide-variants.json; [5] h200-wgmma-bwd-d72-d80-rows64-ab.json
# (2026-11-29).
#   (max head dim, BLOCK_M, reason)
TILES = (
    (64, 128, "[1] D=64: S^T, dP^T 64 registers each (246 in all, no spills), dQ split by "
              "rows: one m64 tile per warpgroup; 131 KB. S=4096: 299 / 211-218 (FA2 257 / "
              "216); with an earlier schedule 278 / 224 against 249 / 175 at BLOCK_M = 64 "
              "(dQ split by columns)"),
    (128, 64, "[1] dK, dV take 128 registers, so 64-query tiles (~240 registers, no spills); "
              "146 KB. S=4096: 318-328 / 246-265 (FA2 278 / 239); S=16384: 377 / 361 "
              "(FA2 301 / 301). [2] D=96: 320 / 278, 337 / 312; D=112: 334 / 282, "
              "354 / 341 (flash_mma_bwd: 206 / 173, 218 / 191 and 209 / 180, 221 / 212). "
              "[5] D=80, non-causal: 380 / 413 at S = 2k / 8k against 359 / 397 on 128-query "
              "tiles, which fill shared memory without sdQ (227 KB), so add dQ from registers "
              "(ptxas serialized their wgmma: C7520)"),
    (256, 64, "the wide kernel: dK and dV of 64 keys take D registers, past 128 too many "
              "for one warpgroup, so one warpgroup holds each (172-255 registers, no "
              "spills); 64 keys a block, P^T handed over in shared memory (16 KB; 218 KB "
              "at D = 256). [3] D=160: 207-219 / 157-188 (FA2 180-200 / 157-206); D=192: "
              "221-239 / 175-210 (FA2 225-258 / 199-270); D=256: 254-272 / 200-246 (FA2 "
              "229-261 / 188-255); flash_mma_bwd 131-173. Bound by the dQ reductions "
              "([4]: 1.5-1.8x faster without them), so dQ has a pass of its own "
              "(own_dq)"),
)


@dataclasses.dataclass(frozen=True)
class Config:
    head_dim: int
    block_m: int
    mid: bool = False   # flash_wgmma_bwd_dkdv_mid (WgmmaBwdMidTraits; mid_fits)

    @property
    def wide(self) -> bool:
        """``WgmmaBwdTraits::WIDE``: flash_wgmma_bwd_dkdv_wide's split by role."""
        return self.head_dim > 128 and not self.mid

    def traits(self, dtype: str) -> str:
        if self.mid:
            return f"WgmmaBwdMidTraits<{self.head_dim}, {CPP_DTYPE[dtype]}>"
        return f"WgmmaBwdTraits<{self.head_dim}, {self.block_m}, {CPP_DTYPE[dtype]}>"

    def threads(self, dq: str, vt: Variant, split: bool = False) -> int:
        """The dK/dV kernel's threads, as ``BwdLaunch`` decides them: two MMA
        warpgroups, and a producer warpgroup where the narrow kernel's tile fits it
        (``PRODUCER_WG_FITS``: 64 or 80 queries, or 128 at D <= 64 with dV and dK
        from shared memory, not with ALiBi) in the ordered dQ modes and in the atomic
        one over fixed lengths without a split or softcap with ALiBi (not on 128-query
        tiles); under dropout only where ``_drop_fits``. flash_wgmma_bwd_dkdv_mid
        always has it."""
        if self.mid:
            return THREADS + 128
        atomic_fits = not (vt.ragged or split or (vt.softcap and vt.dense != "none")
                           or self.kv_ss)
        modes = ("ordered", "staggered") + (("atomic",) if atomic_fits else ())
        fits = self.block_m in (64, 80) or (self.kv_ss and vt.dense == "none")
        producer = (dq in modes and not self.wide and fits
                    and (not vt.dropout or self._drop_fits(dq, vt)))
        return THREADS + 128 if producer else THREADS

    def _drop_fits(self, dq: str, vt: Variant) -> bool:
        """``BwdLaunch::DROP_FITS``: dropout takes the producer warpgroup on 64-query tiles
        in the atomic dQ mode without softcap or a window's lower bound (ptxas of CUDA
        13.5 spilled 96 bytes at D = 128 with softcap, 8 with a window, 32 in the
        ordered mode)."""
        return self.block_m == 64 and dq == "atomic" and not vt.softcap and not vt.band_flags[0]

    @property
    def block_n(self) -> int:
        """Keys per block: 64 per warpgroup, 64 shared by both (wide), or 96 shared by
        both (mid)."""
        return 96 if self.mid else 64 if self.wide else 128

    @property
    def flat_fits(self) -> bool:
        """``WgmmaBwdTraits::DQ_FLAT_FITS``: the narrow kernel's tiles of dQ (64 and 128
        queries; not the 80-query tiles' dQ^T), which it may stage and add in their own
        order (flat_dq); flash_wgmma_bwd_dkdv_mid's always are."""
        return not self.wide and self.block_m != 80

    @property
    def kv_ss(self) -> bool:
        """``WgmmaBwdTraits::KV_SS_FITS``: 128-query tiles at D <= 64, whose ordered
        dQ modes take the producer warpgroup with P^T and dS^T in shared memory."""
        return self.block_m == 128 and self.head_dim <= 64

    @property
    def smem(self) -> int:
        """``WgmmaBwdTraits::SMEM_BYTES``: sK, sV, two buffers of sQ and sdO, sdS
        (16-bit; rows of whole 64-column blocks; not in the wide kernel), two buffers
        of lse and delta (fp32), 1 KB for the alignment, then sP (wide: fp32) or sdQ
        (narrow: the tile's dQ in fp32 rows of D), and at KV_SS_FITS
        P^T (16-bit, as sdS). flash_wgmma_bwd_dkdv_mid: sK, sV, two buffers of sQ,
        one of sdO, sPt and sdSt [key][query], one tile of dQ in fp32, lse per sQ
        buffer and delta, 1 KB for the alignment."""
        if self.mid:
            d, bm, bn = flash_wgmma.d_pad(self.head_dim), self.block_m, self.block_n
            return ((2 * bn * d + 3 * bm * d + 2 * bn * 64) * 2 + bm * self.head_dim * 4
                    + 3 * bm * 4 + 1024)
        if self.wide:   # no sdS (no dQ in that kernel)
            return self._tiles - self._sds + self.block_n * self.block_m * 4
        pt = self.block_n * self.block_m * 2 if self.kv_ss else 0
        return self._staged_tiles + self._sdq + pt

    @property
    def stage_dq(self) -> bool:
        """Whether sdQ fits in 227 KB beside the narrow kernel's tiles (two buffers, or
        one for 80-query tiles: dQ^T, the producer warpgroup's handshake only), as
        ``WgmmaBwdTraits`` asserts for every tile it takes: the narrow kernel always
        stages its dQ and adds it by bulk reductions."""
        return self._dq_buffers > 0

    @property
    def _dq_buffers(self) -> int:
        if self.wide:
            return 0
        for buffers in (2, 1) if self.block_m % 64 else (2,):
            if self._staged_tiles + buffers * self._sdq_tile <= 227 * _KB:
                return buffers
        return 0

    @property
    def _staged_tiles(self) -> int:   # sdQ starts on a 1024-byte boundary
        return -(-(self._tiles - 1024) // 1024) * 1024 + 1024

    @property
    def _tiles(self) -> int:
        d, bm, bn = flash_wgmma.d_pad(self.head_dim), self.block_m, self.block_n
        return (2 * bn * d + 4 * bm * d) * 2 + self._sds + 4 * bm * 4 + 1024

    @property
    def _sds(self) -> int:   # sdS [key][query]: whole 64-column blocks of queries
        return self.block_n * -(-self.block_m // 64) * 64 * 2

    @property
    def _sdq(self) -> int:
        return self._dq_buffers * self._sdq_tile

    @property
    def _sdq_tile(self) -> int:   # one tile of dQ in fp32, columns rounded up to 32
        return self.block_m * -(-self.head_dim // 32) * 32 * 4


# Softcap keeps more live in the 128-row tiles (d s / d dot per element beside S^T and
# dP^T): ptxas (CUDA 13) spilled 512-600 bytes at D = 64-80, and still 116-216 once
# its division became a multiplication, so softcap takes the 64-row tiles of the next
# row (benchmarks/results/notes-alibi.md). ALiBi fits the 128-row tiles. Dropout takes
# the 64-row tiles at every head dim: its draws decide P^T's and dP^T's elements as
# they are made, which fits 64 rows (with the producer warpgroup: Config.threads) and
# spilled 400-488 bytes on 128; at D = 64 the 64 rows ran 0.98-1.07x the 128 rows'
# keep-flag word (H100, benchmarks/results/notes-dropout.md).


def _narrow_rows(vt: Variant | None, deterministic: bool) -> bool:
    """Whether a variant leaves the 128-query tiles (D = 64) for the 64-query ones."""
    if vt is None:
        return False
    # the deterministic mode's ordered dQ: the 128-query tiles take the producer
    # warpgroup themselves (dV and dK from shared memory, KV_SS_FITS), except with
    # ALiBi, which takes the 64-query tiles' (fixed lengths, no dropout: Config.threads)
    ordered_pwg = (deterministic and not vt.ragged and not vt.dropout and vt.dense != "none")
    return bool(vt.softcap) or vt.dropout or ordered_pwg


def mid_fits(head_dim: int, vt: Variant | None, split: bool = False) -> bool:
    """Whether flash_wgmma_bwd_dkdv_mid takes the backward: D = 136-192 over fixed
    lengths, no split, causal or a window, ALiBi, in both modes (no dropout or softcap:
    those run the wide kernel and its dQ pass). Its dQ is always added in its own
    order: where that cannot run (flat_dq) the wide kernel takes the launch."""
    return (MID_MIN_D <= head_dim <= MID_MAX_D and vt is not None and not split
            and not vt.ragged and not vt.dropout and not vt.softcap
            and vt.dense in ("none", "alibi"))


def config(head_dim: int, vt: Variant | None = None, deterministic: bool = False,
           split: bool = False, mid: bool = True) -> Config | None:
    """The tile config for ``head_dim`` (and the variant ``vt``, when given) in the
    default or the deterministic mode, of the split kernel where ``split``; ``mid``:
    flash_wgmma_bwd_dkdv_mid where it fits (mid_fits), else the wide kernel."""
    if head_dim % 8 or head_dim < 64:
        return None
    if mid and mid_fits(head_dim, vt, split):
        return Config(head_dim, 64, True)
    for bound, bm, _reason in TILES:
        if head_dim <= bound:
            narrow = bm == 128 and _narrow_rows(vt, deterministic)
            if bm == 64 and bound == 128 and not split and _rows80(vt, head_dim):
                return Config(head_dim, 80)
            return Config(head_dim, 64 if narrow else bm)
    return None


# 80-query tiles (FlashAttention-3's non-causal tile at D = 128): S^T, dP^T and dQ^T
# at N = 80 ask less of shared memory per clock than N = 64, which the 64-query tiles
# saturate (benchmarks/results/notes-bwd-loops.md section 11). The kernel takes them
# on the producer warpgroup only (one sdQ buffer fits), so fixed lengths, no split
# (kv_splits decides with the split kernel's 64-query tiles), no dropout; not under a
# band (FlashAttention-3 keeps 64 there) nor softcap (dV issued after dS^T, LATE_DV,
# needs P^T unscaled). H100, 2026-11-27: 1.01-1.11x the 64-query tiles at D = 96-128.
# Not ALiBi past ROWS80_ALIBI_MAX_D: at D = 128 its 80-query tiles spilled 12 bytes
# and ptxas serialized every wgmma (C7512, both dQ modes, ptxas 12.9).
ROWS80_MIN_D = 88
# flash_wgmma_bwd_dkdv_mid's head dims (kernels/flash_wgmma_bwd.cu: dK^T and dV^T, 96
# keys a block, dQ in the kernel) in place of the wide kernel and its dQ pass.
MID_MIN_D = 136
MID_MAX_D = 192
ROWS80_ALIBI_MAX_D = 120


def _rows80(vt: Variant | None, head_dim: int) -> bool:
    return (vt is not None and ROWS80_MIN_D <= head_dim <= 128 and not vt.causal
            and vt.window is None and not vt.ragged and not vt.dropout and not vt.softcap
            and not (vt.dense == "alibi" and head_dim > ROWS80_ALIBI_MAX_D))


# Where the dK/dV kernel's dQ goes (kernels/flash_wgmma_bwd.cu: WgmmaBwdDq):
# "atomic" the default mode's; the deterministic mode's "ordered" (key blocks in
# lockstep) or "staggered" (causal: each key block's walk from its diagonal, the
# turns from the highest block down) where _ordered holds, "separate"
# (flash_mma_bwd_dq) elsewhere.
DQ_MODES = {"separate": "kDqSeparate", "atomic": "kDqAtomic", "ordered": "kDqOrdered",
            "staggered": "kDqStaggered"}
# The staggered turns start the shortest causal walks first, so the longest run
# last and the last wave idles while they finish: about 2 x SMs / blocks of the
# time. H100, 2026-11-27 (benchmarks/results/notes-deterministic-dq.md), bf16,
# causal: with 16 blocks an SM (MHA, 16k tokens, D = 64-128) staggered ran 1.03-1.18x
# lockstep in one run; with 4 (GQA 4, D = 128, S = 16k) staggered ran 0.59x the
# atomic mode, lockstep 0.71x. Staggered from this many blocks an SM.
STAGGERED_MIN_BLOCKS_PER_SM = 8


def dkdv_spec(c: Config, dtype: str, vt: Variant, dq: str,
              split: bool = False, flat: bool = False) -> jit.KernelSpec:
    """``flat``: dQ staged and added in its own order (the kernel's FLAT; flat_dq)."""
    if c.mid:   # (dQ always in its own order: fixed lengths, no split)
        name = (f"flash_wgmma_bwd_dkdv_mid[D={c.head_dim},BM={c.block_m},BN={c.block_n},"
                f"{SHORT_DTYPE[dtype]}{vt.suffix()},{dq}-dq]")
        return jit.KernelSpec("flash_wgmma_bwd.cu", f"flash_wgmma_bwd_dkdv_mid<{c.traits(dtype)}, "
                              f"{vt.cpp()}, {DQ_MODES[dq]}>", name)
    traits = c.traits(dtype)
    kernel = "flash_wgmma_bwd_dkdv_wide" if c.wide else "flash_wgmma_bwd_dkdv"
    expr = (f"{kernel}<{traits}, {vt.cpp()}, {DQ_MODES[dq]}, {'true' if split else 'false'}"
            f"{', true' if flat else ''}>")
    name = (f"{kernel}[D={c.head_dim},BM={c.block_m},BN={c.block_n},"
            f"{SHORT_DTYPE[dtype]}{vt.suffix()}{'' if dq == 'separate' else f',{dq}-dq'}"
            f"{',split' if split else ''}{',flat' if flat else ''}]")
    return jit.KernelSpec("flash_wgmma_bwd.cu", expr, name)


def _ordered(c: Config, vt: Variant) -> bool:
    """The deterministic mode's dQ in the dK/dV kernel in a fixed order of key blocks:
    the narrow kernel, over fixed-length sequences (the turn counters are per batch
    entry and query tile)."""
    return not c.wide and not vt.ragged


def _dq_mode(c: Config, vt: Variant, deterministic: bool, staggered: bool = False) -> str:
    if own_dq(c):
        return "separate"
    if not deterministic:
        return "atomic"
    if not _ordered(c, vt):
        return "separate"
    return "staggered" if staggered and vt.band_flags[1] else "ordered"


# The wide kernel's dQ goes to a pass of its own, flash_wgmma_bwd_dq (query-parallel,
# wgmma, dQ written once in the input dtype), in both modes: the dK/dV kernel then runs
# without dQ. On an H200 (2026-11-28, bf16, B*S = 16k, H*D = 2048, S = 4k and 16k) the
# wide kernel took 2.2x as long with its atomic dQ as without it
# (benchmarks/results/notes-bwd-dq-pass.md). Packed sequences too: the pass walks each
# sequence's virtual query blocks.
DQ_BLOCK_M = 128     # WgmmaBwdDqTraits::BLOCK_M: two consumer warpgroups of 64 rows
DQ_THREADS = 384     # and a producer warpgroup


def own_dq(c: Config) -> bool:
    """Whether dQ runs in flash_wgmma_bwd_dq: after the wide kernel, which has no dQ."""
    return c.wide


# flash_wgmma_bwd_dq takes 96 keys a tile up to this head dim: its S and dP at N = 96
# read 5 KB of shared memory per 48 clocks against N = 64's 4 KB per 32. H200,
# 2026-11-28: the backward 1.011-1.031x at D = 136 and 160; 80 keys at D = 192
# measured 0.997-1.011x, and 96 there serialized the wgmma (ptxas C7512)
# (benchmarks/results/notes-bwd-dq-pass.md).
DQ_WIDE_KEYS_MAX_D = 176


def dq_block_n(head_dim: int, vt: Variant) -> int:
    """flash_wgmma_bwd_dq's keys a tile: 96 up to D = 176 (not under dropout, which
    spilled 4 bytes at D = 160), else 64, or 48 where 64 spilled (ptxas of CUDA 13.5:
    4-24 bytes with dropout from D = 240, with softcap and ALiBi together at
    D = 256)."""
    if head_dim <= DQ_WIDE_KEYS_MAX_D and not vt.dropout:
        return 96
    tight = vt.dropout or (vt.softcap and vt.dense != "none")
    return 48 if tight and head_dim >= 240 else 64


def dq_smem(head_dim: int, block_n: int) -> int:
    """``WgmmaBwdDqTraits::SMEM_BYTES``: Q and dout of 128 rows, two K buffers and one
    or two V buffers (two where they fit in 227 KB), 16-bit rows of whole 64-column
    blocks, and 1 KB for the alignment (the mbarriers live in it)."""
    d = flash_wgmma.d_pad(head_dim)
    q, kv = DQ_BLOCK_M * d * 2, block_n * d * 2
    v_stages = 2 if 2 * q + 4 * kv + 1024 <= 227 * _KB else 1
    return 2 * q + (2 + v_stages) * kv + 1024


def dq_spec(head_dim: int, dtype: str, vt: Variant) -> jit.KernelSpec:
    bn = dq_block_n(head_dim, vt)
    expr = (f"flash_wgmma_bwd_dq<WgmmaBwdDqTraits<{head_dim}, {bn}, {CPP_DTYPE[dtype]}>, "
            f"{vt.cpp()}>")
    return jit.KernelSpec("flash_wgmma_bwd.cu", expr,
                          f"flash_wgmma_bwd_dq[D={head_dim},BN={bn},{SHORT_DTYPE[dtype]}"
                          f"{vt.suffix()}]")


def staggered_turns(p: Problem, sms: int) -> bool:
    """The ordered dQ's staggered turns for ``p`` on a GPU of ``sms`` SMs: under an
    upper bound, where the grid holds STAGGERED_MIN_BLOCKS_PER_SM blocks an SM."""
    c = config(p.head_dim, p.variant, deterministic=True)
    blocks = -(-p.seqlen_k // c.block_n) * p.heads_kv * p.batch
    return p.variant.band_flags[1] and blocks >= STAGGERED_MIN_BLOCKS_PER_SM * sms


# The lockstep turns without a band: every key block reaches every query tile on the
# same iteration, so each waits for its predecessor's addition of that tile (a chain).
# With the waits removed the deterministic mode ran 1.03-1.13x at D = 64 and 128,
# S = 2k-8k, and the causal grids (staggered) 1.00x (H200, 2026-11-29,
# benchmarks/results/notes-deterministic-dq.md). The rotated walk (TileScheduler in
# kernels/flash_wgmma_bwd.cu) starts block n's walk n tiles on, so a head's blocks
# sit on different tiles; a block may then wait for a higher-numbered one, so it runs
# only where a head's key blocks fit the GPU at once (one block an SM).
def rotated_turns(p: Problem, sms: int) -> bool:
    """Whether the ordered dQ of ``p`` takes the rotated walk: lockstep turns (no
    band), no more key blocks than query tiles, and no more than ``sms``."""
    if not ordered_dq(p) or p.causal or p.window is not None:   # (no band: never staggered)
        return False
    c = config(p.head_dim, p.variant, deterministic=True)
    blocks = -(-p.seqlen_k // c.block_n)
    if c.mid and sms % blocks > sms // ROTATED_SPLIT_HEAD and blocks * p.heads_kv * p.batch > sms:
        return False
    return blocks <= -(-p.seqlen_q // c.block_m) and blocks <= sms


# A head's rotated blocks wait on each other cyclically, so the blocks of a head that a
# wave holds only in part (sms % blocks of them) wait for the rest to start. The mid
# kernel (one sdQ buffer: a turn's wait stalls its next tile) measured 0.86-0.89x the
# wide kernel and its dQ pass with 86 key blocks a head (S = 8k, 46 of 132 SMs on a
# split head) and 1.13-1.17x with 22 (S = 2k, none split): H200, 2026-11-29,
# notes-bwd-loops.md section 37. Rotated only where at most sms / ROTATED_SPLIT_HEAD
# blocks sit on a split head, or the grid is one wave.
ROTATED_SPLIT_HEAD = 16


def ordered_dq(p: Problem) -> bool:
    """Whether the deterministic backward of ``p`` takes the ordered dQ (one kernel
    fewer than the separate dQ pass, which recomputes P and dS)."""
    c = config(p.head_dim, p.variant, deterministic=True)
    # (the mid kernel orders whole query tiles only: else the wide kernel's dQ pass)
    whole = c is not None and (not c.mid or p.seqlen_q % c.block_m == 0)
    return whole and _ordered(c, p.variant)


def dq_turns(p: Problem) -> int:
    """int32 turn counters behind dq_accum's floats in the deterministic mode of ``p``
    (one per batch entry, query head and query tile; 0: no ordered dQ)."""
    if not ordered_dq(p):
        return 0
    return p.batch * p.heads_q * -(-p.seqlen_q // config(p.head_dim, p.variant, True).block_m)


def specs(c: Config, dtype: str, vt: Variant, deterministic: bool,
          split: bool = False, staggered: bool = False, flat: bool = False) -> list[jit.KernelSpec]:
    """Every instantiation one backward launch uses, in launch order (``split``: the
    split dK/dV kernel and, last, the conversion of its sums; ``staggered``: the
    ordered dQ's staggered turns, where the variant has an upper bound; ``flat``: dQ
    in its own order, flat_dq)."""
    mode = _dq_mode(c, vt, deterministic, staggered)
    flat = flat or c.mid   # (flash_wgmma_bwd_dkdv_mid's dQ is always in its own order)
    if own_dq(c):
        out = [flash_bwd.delta_spec(dtype), dkdv_spec(c, dtype, vt, mode, split),
               dq_spec(c.head_dim, dtype, vt)]
        return out + [flash_bwd.dkdv_convert_spec(dtype)] if split else out
    if mode == "separate":
        dq = flash_mma_bwd.dq_spec(_mma_dq_config(c.head_dim, vt), dtype, vt, True)
        return [flash_bwd.delta_spec(dtype), dkdv_spec(c, dtype, vt, mode), dq]
    if counted(mode) or flat:
        convert = convert_spec(c, dtype, vt, flat, counted(mode))
    else:
        convert = flash_bwd.convert_spec(dtype)
    out = [flash_bwd.delta_spec(dtype), dkdv_spec(c, dtype, vt, mode, split, flat), convert]
    return out + [flash_bwd.dkdv_convert_spec(dtype)] if split else out


# The deterministic mode's conversion of dq_accum into dq (kernels/flash_wgmma_bwd.cu:
# flash_wgmma_bwd_dq_convert) runs as the dK/dV kernel's programmatic dependent where
# that kernel takes turns (the ordered dQ): the turn counter of a query tile says when
# its additions are complete, so the conversion's blocks start on the SMs the dK/dV
# grid's last blocks leave and convert those tiles while the rest run. H200,
# 2026-11-28: deterministic 1.004-1.055x. The atomic dQ counting its completed
# additions for the same purpose ran 0.99-1.02x, counted at once or a tile late
# (notes-deterministic-dq.md): there flash_bwd_dq_convert runs after the grid.
CONVERT_THREADS = 256


def counted(mode: str) -> bool:
    """Whether the dK/dV launch in dQ ``mode`` counts its additions per query tile
    (the ordered dQ's turns)."""
    return mode in ("ordered", "staggered")


def convert_spec(c: Config, dtype: str, vt: Variant, flat: bool = False,
                 turns: bool = True) -> jit.KernelSpec:
    """flash_wgmma_bwd_dq_convert for the tiles of ``c`` under ``vt``'s band (its only
    use of the variant: which key blocks reach a tile, where it waits for their
    ``turns``); ``flat``: from dq_accum in the tiles' own order (flat_dq), over
    packed sequences where ``vt`` is ragged."""
    band = Variant(vt.causal, vt.window) if turns else Variant(ragged=vt.ragged)
    tail = "" if not flat else ", true" if turns else ", true, false"
    return jit.KernelSpec("flash_wgmma_bwd.cu",
                          f"flash_wgmma_bwd_dq_convert<{c.traits(dtype)}, {band.cpp()}{tail}>",
                          f"flash_wgmma_bwd_dq_convert[D={c.head_dim},BM={c.block_m},"
                          f"{'mid,' if c.mid else ''}"
                          f"{SHORT_DTYPE[dtype]}{band.suffix()}{',flat' if flat else ''}"
                          f"{'' if turns else ',atomic'}]")


def flat_builds(c: Config, vt: Variant, mode: str) -> bool:
    """Whether the dK/dV kernel of ``c`` under ``vt`` in dQ ``mode`` has a FLAT build:
    Config.flat_fits, dQ in that kernel (packed sequences: the atomic mode, their
    partial tiles' rows in order); not under dropout in the atomic mode at D = 128,
    whose builds spilled 32-40 bytes with it (ptxas of CUDA 13.5; the build without
    FLAT spills 0-8 there)."""
    return (c.flat_fits and mode in ("atomic", "ordered", "staggered")
            and (not vt.ragged or mode == "atomic")
            and not (vt.dropout and mode == "atomic" and c.head_dim > 120))


def flat_dq(p: Problem, c: Config, mode: str, dq) -> bool:
    """Whether the dK/dV kernel stages each tile's dQ in its own order and adds it
    into dq_accum as one 1-D bulk reduction (its FLAT; flash_wgmma_bwd_dq_convert puts
    the rows back in order): a build that has it (flat_builds), query tiles all whole
    (a tile's floats take its rows' place in dq_accum; packed sequences: the tiles
    whole within their sequence, the last partial one in rows) and dq's rows 16-byte
    aligned (the conversion's stores). H200, 2026-11-29, same-run A/Bs: the backward
    1.01-1.03x at D = 64, 0.99-1.05x causal at D = 96 and 128, deterministic
    1.01-1.06x (notes-bwd-loops.md sections 32-33)."""
    # (the mid kernel's atomic mode adds a partial last tile in rows)
    whole = p.varlen or (c.mid and mode == "atomic") or p.seqlen_q % c.block_m == 0
    return flat_builds(c, p.variant, mode) and whole and _rows16(p, dq)


# Split: each block's query tiles shared by kv_splits blocks (TileScheduler in
# flash_wgmma_bwd.cu) where one block per (key block, KV head, batch), one block an
# SM, runs the GPU short. Under a causal band (no window) the first key blocks see all
# query tiles and the last a few, so a wave lasts as long as its heaviest block:
# split until the grid fills SPLIT_WAVES waves. Otherwise every block carries the
# same work, and splitting a grid that already fills a wave only adds the atomics
# (H100, B 2, Hq 16, Hkv 4, S 2k, D 128: causal 167 -> 232 TFLOPs with 3 splits,
# non-causal 335 -> 303): split only into SMs left idle. Each block keeps at least
# MIN_SPLIT_TILES query tiles; dK and dV are summed with atomics (so only in the
# default, atomic dQ mode) and converted by one more kernel.
SPLIT_WAVES = 2
MAX_SPLITS = 8
MIN_SPLIT_TILES = 4


def kv_splits(p: Problem, sms: int, deterministic: bool) -> int:
    """Blocks per block of keys for ``p`` on a GPU of ``sms`` SMs (1: no split)."""
    c = config(p.head_dim, p.variant, split=True)
    if deterministic or p.varlen or c is None:
        return 1
    blocks = -(-p.seqlen_k // c.block_n) * p.heads_kv * p.batch
    tiles = p.group * -(-p.seqlen_q // c.block_m)   # query tiles of a key block, at most
    if p.causal and p.window is None:
        fill = -(-SPLIT_WAVES * sms // blocks)
    else:
        fill = sms // blocks
    return max(1, min(fill, tiles // MIN_SPLIT_TILES, MAX_SPLITS))


def check(p: Problem, cc: int | None, smem_limit: int = flash_mma_bwd.HOPPER_SMEM) -> str | None:
    """None if the wgmma backward runs ``p`` on compute capability ``cc``, else why not."""
    if cc is not None and cc != 90:
        return (f"the flash_wgmma backward uses wgmma (sm_90a): compute capability 9.0 only, "
                f"device has {cc / 10:.1f}")
    if p.dtype not in ("float16", "bfloat16"):
        return f"the flash_wgmma backward takes float16, bfloat16, not {p.dtype}"
    c = config(p.head_dim, p.variant)
    if c is None:
        return (f"the flash_wgmma backward takes head dims that are multiples of 8 from 64 "
                f"to {TILES[-1][0]}, not {p.head_dim}")
    if p.mask_kind != "none":
        return "the flash_wgmma backward takes no dense mask (causal is fine)"
    if c.smem > smem_limit:
        return (f"the flash_wgmma backward at D={p.head_dim} needs {c.smem // _KB} KB of "
                f"shared memory per block, the device has {smem_limit // _KB} KB")
    return grid_check(p)


def _mma_dq_config(head_dim: int, vt: Variant) -> flash_mma_bwd.Config:
    """flash_mma_bwd's Config whose dQ kernel the deterministic mode's separate pass runs."""
    return flash_mma_bwd.config(head_dim, two_transforms=flash_mma_bwd.two_transforms(vt))


@functools.lru_cache(maxsize=None)
def _plan(head_dim: int, dtype: str, vt: Variant, deterministic: bool, split: bool = False,
          staggered: bool = False, flat: bool = False, mid: bool = True):
    """(Config, flash_mma_bwd's Config for the deterministic dQ kernel, specs), memoized."""
    c = config(head_dim, vt, deterministic, split, mid)
    return c, _mma_dq_config(head_dim, vt), specs(c, dtype, vt, deterministic, split, staggered,
                                                 flat)


def takes_dq_accum(p: Problem, deterministic: bool) -> bool:
    """Whether the launch of ``p`` adds dQ into a float32 dq_accum (dispatch's
    dq_accum_shape): not where flash_wgmma_bwd_dq writes dQ (own_dq), nor in the
    deterministic mode outside the ordered dQ."""
    c = config(p.head_dim, p.variant, deterministic)
    if c is not None and own_dq(c):
        return False
    return not deterministic or ordered_dq(p)


def tensor_maps(p: Problem, t: flash_bwd.BwdTensors, c: Config,
                kv_rows: int | None = None) -> tma.MapBuffers | None:
    """The dK/dV kernel's tensor maps for ``p``, called with the q, k, v, dout and
    dq_accum pointers: boxes of BLOCK_M query rows or BLOCK_N keys of q, k, v and
    dout, and for flash_wgmma_bwd_dkdv dq_accum's (fp32, boxes of 32 columns x
    BLOCK_M rows: the reductions of the staged dQ; zeros in deterministic mode). None
    where a view has no tensor map (tma.tileable: a row stride of 0 over several
    rows, negative strides). ``kv_rows``: k's and v's boxes of that many rows
    instead (flash_wgmma_bwd_dq's key tiles), no dq_accum map."""
    arrays = (t.fwd.q, t.fwd.k, t.fwd.v, t.dout)
    heads = (p.heads_q, p.heads_kv, p.heads_kv, p.heads_q)
    rows = (p.seqlen_q, p.seqlen_k, p.seqlen_k, p.seqlen_q)
    kv_box = kv_rows or c.block_n
    boxes = (c.block_m, kv_box, kv_box, c.block_m)
    batch = 1 if p.varlen else p.batch   # packed sequences: one entry of total rows
    strides = [bhs_strides(a, p.layout) for a in arrays]
    if not all(tma.tileable(batch, h, n, s) for h, n, s in zip(heads, rows, strides)):
        return None
    encoders = [tma.tile_maps(tma.map_geometry(batch, h, n, p.head_dim, s, box))
                for h, n, s, box in zip(heads, rows, strides, boxes)]
    if not (c.wide or c.mid) and kv_rows is None:   # dq_accum: [B, Hq, Sq, D] fp32 (packed: [Hq, total_q, D])
        encoders.append(tma.tile_maps(tma.fp32_rows_geometry(batch, p.heads_q, p.seqlen_q,
                                                             p.head_dim, c.block_m), tma.F32))
    return tma.MapBuffers(encoders)


def passes(p: Problem, t: flash_bwd.BwdTensors, device_id: int, arch: str,
           deterministic: bool) -> list[tuple]:
    """The launches of ``p``'s backward (flash_bwd.passes' form; the dK/dV launch
    with its tensor_maps fifth): flash_mma_bwd's kernels for arrays that are not
    16-byte aligned or have no tensor map."""
    split = t.kv_splits > 1
    from ..device import multiprocessor_count

    staggered = deterministic and staggered_turns(p, multiprocessor_count(device_id))
    c = config(p.head_dim, p.variant, deterministic, split)
    mode = _dq_mode(c, p.variant, deterministic, staggered)
    flat = flat_dq(p, c, mode, t.dq)
    if c.mid and not flat:   # (flash_wgmma_bwd_dkdv_mid adds dQ in its own order only)
        c = config(p.head_dim, p.variant, deterministic, split, mid=False)
        mode = _dq_mode(c, p.variant, deterministic, staggered)
        flat = flat_dq(p, c, mode, t.dq)
    c, dq, kspecs = _plan(p.head_dim, p.dtype, p.variant, deterministic, split, staggered, flat,
                          c.mid)
    maps = tensor_maps(p, t, c) if flash_mma_bwd.vectorizable(p, t) else None
    if maps is None:   # writes dK, dV itself: no split; without a dq_accum its dQ pass
        return flash_mma_bwd.passes(p, t, device_id, arch, deterministic or t.dq_accum is None)
    kernels = [jit.get_function(s, arch, device_id) for s in kspecs]
    own = own_dq(c)
    dkdv = (c.block_n, c.threads(mode, p.variant, split), c.smem)
    launches = flash_mma_bwd.pass_list(p, kernels[:3], dkdv, dq, mode == "separate" and not own,
                                       1 if split else bwd_section(p, mode, p.heads_kv),
                                       flash_mma_bwd.dq_section(p))
    k_dkdv, grid, block, smem = launches[1]
    if split:   # one 1-D grid of every (key block, KV head, batch, split); then the sums
        grid = (grid[0] * grid[1] * grid[2] * t.kv_splits,)
    launches[1] = (k_dkdv, grid, block, smem, maps)
    # flash_wgmma_bwd_dq_convert: a query tile a block (packed: the virtual tiles)
    tiles = (flash_mma_bwd.blocks(p, p.seqlen_q, c.block_m), p.heads_q,
             1 if p.varlen else p.batch)
    if flat and not counted(mode):   # after the dK/dV kernel
        launches[2] = (kernels[2], tiles, (CONVERT_THREADS,), 0)
    elif counted(mode):
        if _rows16(p, t.dq):   # each tile as its turns complete
            launches[2] = (jit.Dependent(kernels[2]), tiles, (CONVERT_THREADS,), 0)
        else:   # after the dK/dV kernel (dq's rows not 16-byte aligned)
            launches[2] = (jit.get_function(flash_bwd.convert_spec(p.dtype), arch, device_id),
                           ) + launches[2][1:]
    if own:   # the dQ pass: 128 query rows of one (head, batch) a block
        bn = dq_block_n(p.head_dim, p.variant)
        dq_maps = maps if bn == c.block_n else tensor_maps(p, t, c, bn)
        dq_grid = section_grid(flash_mma_bwd.blocks(p, p.seqlen_q, DQ_BLOCK_M), p.heads_q,
                               1 if p.varlen else p.batch, dq_section(p))
        launches[2] = (kernels[2], dq_grid, (DQ_THREADS,),
                       dq_smem(p.head_dim, bn) + flash_mma_bwd.ragged_smem(p), dq_maps)
    if split:
        launches.append((kernels[3], (-(-p.seqlen_k // flash_bwd.ROWS_PER_BLOCK), p.heads_kv,
                                      p.batch), (flash_bwd.THREADS,), 0))
    return launches


def bwd_section(p: Problem, mode: str, heads: int) -> int:
    """base.section for the dK/dV grid (``heads`` = Hkv); 1 in the ordered dQ modes,
    whose turns rely on the grid's own order."""
    return 1 if mode in ("ordered", "staggered") else section(p, heads)


def dq_section(p: Problem) -> int:
    """base.section for flash_wgmma_bwd_dq's grid; 1 under dropout (its kernel's
    bind_grid reads the head and entry from blockIdx there)."""
    return 1 if p.dropout_p else section(p, p.heads_q)


def _with_turns(p: Problem, t: flash_bwd.BwdTensors, deterministic: bool,
                sms: int) -> flash_bwd.BwdTensors:
    """``t`` with the ordered dQ's rows per turn counter where it runs (the caller
    handed in a dq_accum of dq_turns(p) more elements: dispatch.BackwardFamily), its
    first additions stored where every query tile has a key block (store_first), and
    its walk rotated where :func:`rotated_turns` holds on a GPU of ``sms`` SMs."""
    if not (deterministic and ordered_dq(p)):
        return t
    if t.dq_accum is None or t.dq_accum.size < t.delta.size * p.head_dim + dq_turns(p):
        raise ValueError("the ordered dQ needs dq_accum with room for its turn counters")
    return dataclasses.replace(t, dq_turn_rows=config(p.head_dim, p.variant, True).block_m,
                               dq_store_first=int(store_first(p)),
                               dq_rotate=int(rotated_turns(p, sms)))


def _rows16(p: Problem, dq) -> bool:
    """Whether ``dq``'s rows start 16-byte aligned (the per-tile conversion's
    16-byte stores; the GPU tests ran it on such rows only)."""
    return flash_mma.vectorizable_arrays(p.head_dim, (dq,))


# The ordered dQ's first key block of a query tile (turn 0) stores its dQ where every
# tile has one, so flash_bwd_delta does not zero dq_accum's B Hq Sq D floats (128 MB
# at B * S = 16k, H * D = 2048: half of the 256 MB that kernel moves).
# A tile that no key block reaches keeps what the buffer held, so not under a window,
# nor causal with Sq > Sk (the first Sq - Sk rows attend nothing).
def store_first(p: Problem) -> bool:
    """Whether every query tile of ``p`` has a key block adding into it."""
    return p.window is None and not (p.causal and p.seqlen_q > p.seqlen_k)


def launch(p: Problem, t: flash_bwd.BwdTensors, stream, device_id: int, arch: str,
           deterministic: bool) -> None:
    from ..device import multiprocessor_count

    t = _with_turns(p, t, deterministic, multiprocessor_count(device_id))
    flash_bwd.launch_from(passes, p, t, stream, device_id, arch, deterministic)


def prepare(p: Problem, t: flash_bwd.BwdTensors, device_id: int, arch: str,
            deterministic: bool) -> flash_bwd.HotBackward | None:
    """The hot path's launches (aligned arrays only, as flash_mma_bwd.prepare)."""
    from ..device import multiprocessor_count

    t = _with_turns(p, t, deterministic, multiprocessor_count(device_id))
    return flash_mma_bwd.prepare(p, t, device_id, arch, deterministic, passes)


def ci_specs() -> list[jit.KernelSpec]:
    """Every shipped dK/dV instantiation of one block per key block (every head dim,
    both dtypes, causal or not, both dQ modes) and the split kernel over a spread of
    head dims, which CI compiles for sm_90a; the other kernels of a launch are
    flash_bwd's and flash_mma_bwd's, compiled with their families."""
    out = []
    for d in range(64, TILES[-1][0] + 1, 8):
        for dtype in ("float16", "bfloat16"):
            for causal in (False, True):
                vt = Variant(causal)
                for deterministic in (False, True):
                    c = config(d, vt, deterministic)
                    out.append(dkdv_spec(c, dtype, vt, _dq_mode(c, vt, deterministic)))
    for d, causal in ((64, True), (128, True), (128, False), (256, True)):
        vt = Variant(causal, ragged=True)
        for deterministic in (False, True):
            c = config(d, vt, deterministic)
            out.append(dkdv_spec(c, "bfloat16", vt, _dq_mode(c, vt, deterministic)))
    vt = Variant(True, (32, 0), 30.0, ragged=True)
    out.append(dkdv_spec(config(96, vt), "float16", vt, "atomic"))
    # the ordered dQ's staggered turns (causal), and both orders under a window or
    # with softcap (64-query tiles)
    for d in list(range(64, 129, 8)) + [136, 168, 192]:
        vt = Variant(True)
        out.append(dkdv_spec(config(d, vt, True), ("float16", "bfloat16")[d % 16 // 8], vt,
                             "staggered"))
    for d, vt in ((64, Variant(True, (256, 0))), (128, Variant(False, (128, 128), 30.0))):
        for mode in ("ordered", "staggered"):
            out.append(dkdv_spec(config(d, vt, True), "bfloat16", vt, mode))
    # the ordered dQ's conversion per tile: each tile shape, a band, a window
    for d, vt in ((64, Variant(False)), (72, Variant(True)), (96, Variant(False)),
                  (128, Variant(True)), (104, Variant(True, (256, 0))), (160, Variant(True)),
                  (192, Variant(False))):
        c = config(d, vt, True)
        out.append(convert_spec(c, ("float16", "bfloat16")[d % 16 // 8], vt, c.mid))
    # dQ in its own order (flat_dq) and its conversions: both tile shapes, every dQ
    # mode, a window, ALiBi, softcap, dropout, packed sequences
    for d, vt in ((64, Variant(False)), (64, Variant(True)), (128, Variant(True)),
                  (72, Variant(True)), (80, Variant(False)), (96, Variant(True)),
                  (112, Variant(True)), (120, Variant(True)), (128, Variant(True, (256, 0))),
                  (64, Variant(True, dense="alibi")), (104, Variant(True, dense="alibi")),
                  (128, Variant(True, dense="alibi")), (88, Variant(True, softcap=30.0)),
                  (128, Variant(False, softcap=30.0)), (64, Variant(True, dropout=True)),
                  (96, Variant(False, dropout=True)), (128, Variant(True, dropout=True)),
                  (64, Variant(False, ragged=True)), (96, Variant(True, ragged=True)),
                  (128, Variant(True, (256, 0), 30.0, ragged=True)),
                  (136, Variant(False)), (160, Variant(True, (256, 0))), (192, Variant(True))):
        dtype = ("float16", "bfloat16")[d // 8 % 2 ^ vt.causal]
        for mode in ("atomic", "ordered", "staggered"):
            c = config(d, vt, mode != "atomic")
            if flat_builds(c, vt, mode) and (mode != "staggered" or vt.band_flags[1]):
                out.append(dkdv_spec(c, dtype, vt, mode, flat=True))
                out.append(convert_spec(c, dtype, vt, True, mode != "atomic"))
    # score transforms, on their rows (_narrow_rows)
    for d, vt in ((64, Variant(softcap=30.0)), (64, Variant(True, dense="alibi")),
                  (80, Variant(dense="alibi")), (128, Variant(True, dense="alibi")),
                  (120, Variant(dense="alibi")), (128, Variant(dense="alibi")),
                  (256, Variant(True, softcap=30.0, dense="alibi")),
                  (128, Variant(True, dense="alibi", ragged=True))):
        out.append(dkdv_spec(config(d, vt), "bfloat16", vt, _dq_mode(config(d, vt), vt, False)))
    # the split kernel: both tile shapes of the narrow kernel, the wide one, a transform
    for i, d in enumerate((64, 88, 96, 128, 136, 192, 256)):
        dtype, causal = ("float16", "bfloat16")[i % 2], i % 3 != 1
        vt = Variant(causal)
        out.append(dkdv_spec(config(d, vt, split=True), dtype, vt,
                             _dq_mode(config(d, vt, split=True), vt, False), True))
    vt = Variant(True, softcap=30.0)
    out.append(dkdv_spec(config(128, vt, split=True), "bfloat16", vt, "atomic", True))
    # the split kernel with dQ in its own order (flat_dq): both fragment shapes
    for d, vt in ((64, Variant(True)), (96, Variant(False)), (128, Variant(True))):
        out.append(dkdv_spec(config(d, vt, split=True), "bfloat16", vt, "atomic", True, True))
    # flash_wgmma_bwd_dq (own_dq): every wide head dim, dtype and causal rotating, and
    # the variants, on their key tiles (dq_block_n)
    for i, d in enumerate(range(136, TILES[-1][0] + 1, 8)):
        out.append(dq_spec(d, ("float16", "bfloat16")[i % 2], Variant(i % 3 != 1)))
    for d, vt in ((256, Variant(True, softcap=30.0, dense="alibi")),
                  (256, Variant(True, dropout=True)), (240, Variant(dropout=True)),
                  (232, Variant(True, dropout=True)), (256, Variant(True, (128, 0))),
                  (192, Variant(True, softcap=30.0, dense="alibi", dropout=True)),
                  (256, Variant(True, softcap=30.0, dense="alibi", dropout=True)),
                  (256, Variant(True, ragged=True)), (176, Variant(False, (64, 0), ragged=True)),
                  (256, Variant(True, softcap=30.0, dense="alibi", ragged=True, dropout=True))):
        out.append(dq_spec(d, "bfloat16", vt))
    # dropout, on its rows (_narrow_rows), both dQ modes
    for d, causal in ((64, True), (72, False), (80, False), (128, True), (136, False),
                      (256, True)):
        vt = Variant(causal, dropout=True)
        for deterministic in (False, True):
            c = config(d, vt, deterministic)
            out.append(dkdv_spec(c, "float16" if causal else "bfloat16", vt,
                                 _dq_mode(c, vt, deterministic)))
    for d, vt in ((128, Variant(True, softcap=30.0, dropout=True)),
                  (64, Variant(True, (32, 0), ragged=True, dropout=True)),
                  (72, Variant(True, dense="alibi", dropout=True)),
                  (128, Variant(True, (32, 0), 30.0, ragged=True, dropout=True)),
                  (256, Variant(True, softcap=30.0, dense="alibi", ragged=True, dropout=True))):
        out.append(dkdv_spec(config(d, vt), "bfloat16", vt, _dq_mode(config(d, vt), vt, False)))
    return list(dict.fromkeys(out))   # (the wide kernel's modes are one instantiation)
