"""`flash_wgmma`: the fused Hopper forward (fp16/bf16, wgmma, sm_90a only).

Takes the problems flash_mma takes except dense masks, on compute capability 9.0
only, for head dims that are multiples of 8 from 64 to 256 (smaller ones stay with
flash_mma). Q K^T steps over the head dim rounded up to 16 (k16), P V computes
exactly D columns, the shared tiles hold whole 64-column swizzle blocks. The kernel needs
16-byte aligned base pointers and strides, and Q, K and V load through tensor maps
(TMA, ``cupy_attention/tma.py``), which need positive row strides and head and
batch strides that are not negative; those are properties of the arrays, not of
the Problem, so a launch whose arrays do not qualify runs flash_mma's kernel
instead. The kernel is persistent: one block per SM claims work tiles from a
counter per stream (:func:`tile_counter`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
import os
import struct

import numpy as np

from .. import jit, tma
from ..device import multiprocessor_count
from ..problem import Problem
from ..params import FWD_DTYPE, make_struct
from ..variant import Variant
from .base import _POINTERS, CPP_DTYPE, SHORT_DTYPE, HotLaunch, Tensors, bhs_strides
from .decode import CACHE_DTYPE, cache_fwd_fields, cache_params
from .flash_mma import FlashMma

# Tile heuristics: the first row whose bound covers the head dim. Each config is
# (consumer warpgroups, BLOCK_N, blocks per SM, STAGES); BLOCK_M = 64 * consumers,
# plus one producer warpgroup; K and V have STAGES shared buffers each. Registers:
# with two consumers the producer keeps 40 and the consumers take 232 each, with
# three 32 and 160; a consumer holds S BLOCK_N/2 + P BLOCK_N/4 + acc D/2 of them.
# Three consumers pay off where the softmax (the same work per score at every D)
# weighs most: each one's softmax then hides behind two other warpgroups' MMAs.
# Figures: bf16, TFLOPs on the true D, non-causal / causal, S=4096 then S=16384,
# H200, 2026-11-22, from three sweeps in benchmarks/results/: [1] h200-wgmma-tiles.json
# (kernel of a4555a7, before the max-free softmax), [2] h200-wgmma-tiles-2.json
# (3eb98a1), [3] h200-wgmma-tiles-3.json (48aec4f: a third K/V stage where the
# shared memory has room: 0.98-1.15x, median 1.02x over two). Since K and V load
# through TMA (h200-wgmma-tma-before.json / -after.json: 1.03-1.27x at S >= 4k), a
# re-sweep [4] h200-wgmma-tiles-4.json found no row to change: the alternatives
# were within its +-5% noise (D=72 BLOCK_N = 96: 521 / 409, 524 / 501 vs
# 519 / 431, 521 / 500; D=128 two consumers at BLOCK_N = 112: 708, 756 vs 698, 725)
# or spilled (three consumers at BLOCK_N = 128 with D >= 80).
# (max head dim, config, causal config, reason)
TILES = (
    (64, (3, 128, 1, 3), (3, 128, 1, 3),
     "[1] three consumers 423 / 339, 464 / 428 vs 383 / 306, 412 / 397 with two and "
     "BLOCK_N = 192; [3] three stages 509 / 395, 537 / 485 vs 506 / 397, 535 / 490"),
    (88, (3, 112, 1, 3), (3, 112, 1, 3),
     "[2] D=72: 470 / 337, 468 / 449 (BLOCK_N = 128: 453 / 346, 473 / 451; 96: 422 / 360, "
     "458 / 432); D=80: 495 / 397, 516 / 494 (BLOCK_N = 96: 502 / 408, 508 / 487); [1] two "
     "consumers at D=72: 372 / 332, 378 / 368; [3] three stages at D=80: 492 / 416, 522 / 496 "
     "vs 498 / 361, 517 / 487; 220 KB"),
    (96, (3, 96, 1, 3), (3, 96, 1, 3),
     "[2] 571 / 441, 569 / 536 vs 565 / 427, 575 / 505 at BLOCK_N = 112; [3] three stages "
     "545 / 437, 576 / 534 vs 558 / 411, 564 / 508"),
    (112, (3, 96, 1, 2), (3, 96, 1, 2),
     "[1] D=112: 542 / 466, 568 / 508 vs 498 / 447, 511 / 504 with two consumers (three "
     "spill at BLOCK_N = 112)"),
    (128, (3, 64, 1, 3), (2, 128, 1, 2),
     "[2] three consumers at BLOCK_N = 64: 618 / 475, 615 / 581; two at 128: 584 / 520, "
     "592 / 574 (S 64 + P 32 + acc 64 registers, 167 KB): the wider tile wins with the "
     "causal mask (fewer diagonal tiles); [3] three stages without it 626, 617 vs 600, 608"),
    (160, (3, 64, 1, 3), (3, 64, 1, 3),
     "[2] D=160: 633 / 469, 638 / 587 vs 578 / 486, 584 / 576 with two consumers and "
     "BLOCK_N = 112 (BLOCK_N = 64: 560 / 449, 558 / 534); [3] three stages 655 / 481, "
     "635 / 596 vs 615 / 493, 630 / 582; 220 KB"),
    (192, (2, 112, 1, 2), (2, 112, 1, 2),
     "[1] D=192: 629 / 501, 635 / 622; [3] 612 / 539, 632 / 650 vs 627 / 501, 615 / 605 at "
     "BLOCK_N = 96; 219 KB"),
    (256, (2, 64, 1, 2), (2, 64, 1, 2),
     "[1] 663 / 559, 648 / 633; acc alone is D/2 registers, and K and V take D rounded up "
     "to 64 columns: 195 KB at D=256; BLOCK_N = 80 (227 KB with the slots and barriers in "
     "the alignment slack; 8-64 bytes spilled) measured 0.93-1.00x at S = 1k-4k and "
     "1.00-1.01x at 16k, H100 2026-11-27 (h100-wgmma-fwd-d256-bn80-rejected-ab.json)"),
)


def d_pad(head_dim: int) -> int:
    """Columns of the shared tiles: whole 64-column swizzle blocks."""
    return -(-head_dim // 64) * 64


def tiles_for(head_dim: int, causal: bool = False, transforms: bool = False,
              dropout: bool = False):
    """(consumer warpgroups, BLOCK_N, blocks per SM, STAGES) for this head dim and mask;
    ``transforms``: the variant transforms the score (softcap, ALiBi), ``dropout``: it
    drops probabilities (:func:`narrowed`)."""
    for bound, plain, causal_cfg, _ in TILES:
        if head_dim <= bound:
            cfg = causal_cfg if causal else plain
            if transforms:
                cfg = narrowed(head_dim, cfg)
            return narrowed(head_dim, cfg, DROPOUT_LIVE_REGS, dropout_live) if dropout else cfg
    raise ValueError(f"flash_wgmma has no tile config for D={head_dim}")


def payload(head_dim: int, consumers: int, block_n: int) -> int:
    """A consumer's payload registers: S BLOCK_N/2 + P BLOCK_N/4 + acc D/2."""
    return block_n * 3 // 4 + -(-head_dim // 2)


# Variants that transform the score (softcap, ALiBi) keep more values live through
# the softmax: with the table's rows ptxas (CUDA 13) spilled 4-120 bytes at payloads
# of 120-128 registers (three consumers) and 180 (two), and nothing at 116 and 168
# (benchmarks/results/notes-alibi.md). Those variants take the row narrowed to these.
TRANSFORM_PAYLOAD_REGS = {3: 116, 2: 168}

def dropout_live(head_dim: int, consumers: int, block_n: int) -> int:
    """What a consumer holds beside dropout's Philox rounds (after the softmax, P
    packed): acc D/2 + P BLOCK_N/4."""
    return block_n // 4 + -(-head_dim // 2)


# Dropout clears the dropped halves of P's 16-bit A fragments, one Philox call per 16
# keys of a warp's rows in a rolled loop (PhiloxDropout::fragment_packed), where acc
# and P are live. With the table's rows (ptxas of CUDA 13, sm_90a) three consumers
# spilled 8-56 bytes at D = 160 (acc 80 + P 16 registers) and nothing up to D = 152
# (92), whatever the band; two consumers nothing up to D = 256 (144) except with
# packed sequences at D = 248-256 (16-120 bytes; 12 at D = 232 with a window and
# softcap) and causal ALiBi at D = 248 (16), where no narrower row exists. Dropout
# takes the rows narrowed to these (at D = 160: two consumers, BLOCK_N = 112).
DROPOUT_LIVE_REGS = {3: 92, 2: 144}


def narrowed(head_dim: int, cfg, cap: dict = TRANSFORM_PAYLOAD_REGS, regs=payload) -> tuple:
    """``cfg`` with BLOCK_N lowered (by 16, to 64 at least) until ``regs`` (the
    payload, or :func:`dropout_live`) fits ``cap``; three consumers that do not fit at
    64 become two (BLOCK_N as wide as ``cap`` and shared memory allow), and the stages
    drop to what the shared memory holds."""
    consumers, block_n, min_blocks, stages = cfg
    while block_n > 64 and regs(head_dim, consumers, block_n) > cap[consumers]:
        block_n -= 16
    if consumers == 3 and regs(head_dim, consumers, block_n) > cap[3]:
        consumers, block_n = 2, 128
        while block_n > 64 and (regs(head_dim, consumers, block_n) > cap[2] or smem_bytes(
                head_dim, (consumers, block_n, min_blocks, 2)) > SMEM_LIMIT):
            block_n -= 16
    while stages > 2 and smem_bytes(head_dim,
                                    (consumers, block_n, min_blocks, stages)) > SMEM_LIMIT:
        stages -= 1
    return consumers, block_n, min_blocks, stages


def smem_bytes(head_dim: int, cfg) -> int:
    """``WgmmaTraits::SMEM_BYTES``: Q, STAGES buffers of K and V, the consumers' l_i
    slots, two work tile slots, the mbarriers, and 1024 bytes to align the base."""
    consumers, block_n, _, stages = cfg
    return ((64 * consumers + 2 * stages * block_n) * d_pad(head_dim) * 2 + 128 * consumers * 8
            + 64 + (2 * consumers + 4 * stages) * 8 + 1024)


def spec(head_dim: int, dtype: str, vt: Variant, cfg=None, gather: bool = False
         ) -> jit.KernelSpec:
    """The kernel of ``vt``: ``flash_wgmma_fwd``, or on a KV cache (``vt.cache``)
    ``flash_wgmma_cache_fwd`` (tensor-map boxes) or, with ``gather`` (a paged cache),
    ``flash_wgmma_gather_fwd`` (rows gathered with cp.async)."""
    consumers, block_n, min_blocks, stages = cfg or tiles_for(head_dim, vt.causal, vt.transforms,
                                                              vt.dropout)
    traits = (f"WgmmaTraits<{head_dim}, {consumers}, {block_n}, {CPP_DTYPE[dtype]}, {min_blocks}, "
              f"{stages}>")
    if gather and vt.cache != "paged":
        raise ValueError("gathered rows read a paged cache")
    kernel = ("flash_wgmma_gather_fwd" if gather else
              "flash_wgmma_cache_fwd" if vt.cache else "flash_wgmma_fwd")
    expr = f"{kernel}<{traits}, {vt.cpp()}>"
    name = (f"flash_wgmma[D={head_dim},BM={64 * consumers},BN={block_n},S={stages},"
            f"{SHORT_DTYPE[dtype]}{vt.suffix()}{',gather' if gather else ''}]")
    return jit.KernelSpec("flash_wgmma.cu", expr, name)


# Candidates for ``cupy-attention tune``: BLOCK_N values (multiples of 16, wgmma
# n-steps), one or two more K/V stages, two or three consumers, one block per SM (the
# kernel is persistent). A consumer's payload registers (S BLOCK_N/2 + P BLOCK_N/4 +
# acc D/2) stay within what the table's rows show does not spill: 128 with three
# consumers (D=80 at BLOCK_N = 128, 136, spilled), 184 with two (232 registers each).
CANDIDATE_BLOCK_NS = (64, 80, 96, 112, 128, 160, 192)
PAYLOAD_REGS = {3: 128, 2: 184}
MAX_CANDIDATES = 6
SMEM_LIMIT = 227 * 1024


def config_fits(head_dim: int, cfg, smem_limit: int = SMEM_LIMIT,
                transforms: bool = False, dropout: bool = False) -> bool:
    """Whether ``cfg`` is one the kernel compiles for ``head_dim`` without spilling (by
    the payload rule above; TRANSFORM_PAYLOAD_REGS for variants that transform the
    score, and DROPOUT_LIVE_REGS with dropout) and whose shared memory fits
    ``smem_limit``."""
    consumers, block_n, min_blocks, stages = cfg
    caps = TRANSFORM_PAYLOAD_REGS if transforms else PAYLOAD_REGS
    return (consumers in caps and block_n % 16 == 0 and 64 <= block_n <= 256
            and min_blocks == 1 and stages in (2, 3)
            and payload(head_dim, consumers, block_n) <= caps[consumers]
            and (not dropout or dropout_live(head_dim, consumers, block_n)
                 <= DROPOUT_LIVE_REGS[consumers])
            and smem_bytes(head_dim, cfg) <= smem_limit)


def candidates(head_dim: int, causal: bool, smem_limit: int = SMEM_LIMIT,
               transforms: bool = False, dropout: bool = False) -> list[tuple]:
    """The table's config first, then the other mask's row, then its neighbours: the
    same consumers before the other count, the nearest BLOCK_N, the same stages."""
    table = tiles_for(head_dim, causal, transforms, dropout)
    out = [table]
    other = tiles_for(head_dim, not causal, transforms, dropout)
    if other != table and config_fits(head_dim, other, smem_limit, transforms, dropout):
        out.append(other)
    pool = [(c, n, 1, st) for c in (3, 2) for n in CANDIDATE_BLOCK_NS for st in (3, 2)]
    pool = [cfg for cfg in pool
            if cfg not in out and config_fits(head_dim, cfg, smem_limit, transforms, dropout)]
    pool.sort(key=lambda cfg: (cfg[0] != table[0], abs(cfg[1] - table[1]), cfg[3] != table[3],
                               cfg[1]))
    return out + pool[:MAX_CANDIDATES - len(out)]


@functools.lru_cache(maxsize=None)
def _plan(head_dim: int, dtype: str, vt: Variant, cfg):
    """(spec, BLOCK_M, threads, shared bytes, sections: none, its grid is its own),
    memoized: a hot call builds no strings."""
    return (spec(head_dim, dtype, vt, cfg), 64 * cfg[0], 128 * (cfg[0] + 1),
            smem_bytes(head_dim, cfg), False)


@functools.lru_cache(maxsize=256)
def query_shift(seqlen_q: int, seqlen_k: int, block_m: int, block_n: int,
                aligned: bool = False) -> int:
    """Where the causal kernel's query blocks start: block m at row
    ``m * block_m - shift``, 0 <= shift <= the rows the last block overhangs; with
    ``aligned`` (dropout) a multiple of 16, so that each warp's 16 rows are one row
    block of the keep mask (``cupy_attention.dropout``).

    A shift moves the partial block of a length that is not a multiple of BLOCK_M
    from the end, where the causal mask gives it the most key tiles, to the start,
    where it gets the fewest, but it also moves where every block ends against the
    key tiles. The choice minimizes sum over blocks of (key tiles) x (1 + consumers
    with rows in it): MMA rounds plus MMAs, equal weights, which orders an A/B of
    shift 0 against the largest shift the way the H200 did at S = 512..8k
    (2026-11-22; e.g. D = 64, S = 1k: 1.07x measured, 1.06x modelled; D = 96, S =
    2k, BLOCK_N = 96: 0.96x both, so there it stays 0). Ties keep the smaller shift.
    Memoized: calls with ``out=`` plan every launch, and the model costs about 50 us
    at S = 16k.
    """
    m_blocks = -(-seqlen_q // block_m)
    excess = m_blocks * block_m - seqlen_q
    if excess == 0:
        return 0
    shifts = set(range(0, excess, 16)) | {excess}
    if aligned:
        shifts = {x for x in shifts if x % 16 == 0}
    shifts = np.array(sorted(shifts))[:, None]
    q0 = np.arange(m_blocks)[None, :] * block_m - shifts
    k_end = np.clip(np.minimum(q0 + block_m, seqlen_q) + (seqlen_k - seqlen_q), 0, seqlen_k)
    key_tiles = -(-k_end // block_n)
    rows = q0[..., None] + 64 * np.arange(block_m // 64)
    consumers = ((rows < seqlen_q) & (rows + 64 > 0)).sum(axis=-1)
    cost = (key_tiles * (1 + consumers)).sum(axis=1)
    return int(shifts[int(np.argmin(cost)), 0])


L2_KV_BYTES = 40 * 2**20  # of the H100's and H200's 50 MB L2, what K and V may take


def l2_section(p: Problem) -> int:
    """The scheduler's section: 0 = head after head, G > 0 = (head, batch) pairs in
    sections of G, block by block inside a section (the kernel's TileScheduler).

    Causal problems with at least CAUSAL_SECTION_MIN_KEYS keys take sections of
    CAUSAL_SECTION: blocks of eight heads share the heaviest query blocks' turn, so the
    long rows of several heads start together and their K and V stay in L2 between
    them (H100, bf16, D = 64/128/256, S = 2k-16k: 0.99-1.13x the head-after-head order;
    at S = 1k it lost 2.5% at D <= 128: benchmarks/results/notes-variant-ab.md). Others
    keep 0. ``CUPY_ATTENTION_WGMMA_SECTION`` overrides it: an int, or ``lpt`` for the
    largest power of two whose query heads' K and V fit in L2_KV_BYTES (heads of one
    GQA group share theirs)."""
    override = os.environ.get("CUPY_ATTENTION_WGMMA_SECTION")
    if override is None:
        return CAUSAL_SECTION if p.causal and p.seqlen_k >= CAUSAL_SECTION_MIN_KEYS else 0
    if override != "lpt":
        return max(0, int(override))
    per_head = 2 * p.seqlen_k * p.head_dim * 2 / p.group  # K and V, 16-bit, per query head
    fit = max(1, int(L2_KV_BYTES // max(per_head, 1)))
    return min(1 << (fit.bit_length() - 1), p.heads_q * p.batch)


CAUSAL_SECTION = 8
CAUSAL_SECTION_MIN_KEYS = 2048


# (device, stream handle) -> (counter, its address as a kernel argument)
_counters: dict = {}
_NO_COUNTER = np.uint64(0)  # a null pointer: the kernel's fixed tile order
_NO_COUNTER_ARG = ctypes.c_uint64(0)


def tile_counter(device_id: int, stream):
    """The work tile counter of launches on ``stream`` (a uint32 in device memory).

    The kernel's blocks claim tiles from it with atomics and the last claim sets it
    back to 0, so launches in one stream (which run one after another) share it;
    launches in two streams, which may overlap, each have their own. Zeroed once, in
    that stream, before its first launch; kept for the life of the process (one
    small allocation a stream). A stream that is being captured into a CUDA graph
    and has no counter yet gets none (allocating there could fail the capture): the
    kernel then takes its tiles in a fixed order, which is slower only under the
    causal mask at long sequences."""
    entry = _counter_entry(device_id, stream)
    return _NO_COUNTER if entry is None else entry[0]


def tile_counter_arg(device_id: int, stream) -> ctypes.c_uint64:
    """:func:`tile_counter`'s address as a kernel argument (a launch's ``tail``)."""
    entry = _counter_entry(device_id, stream)
    return _NO_COUNTER_ARG if entry is None else entry[1]


def _counter_entry(device_id: int, stream):
    key = (device_id, stream.ptr)
    entry = _counters.get(key)
    if entry is None:
        if stream.is_capturing():
            return None
        import cupy

        with cupy.cuda.Device(device_id), stream:
            counter = cupy.zeros(1, dtype=cupy.uint32)
        entry = _counters.setdefault(key, (counter, ctypes.c_uint64(counter.data.ptr)))
    return entry


class FlashWgmma(FlashMma):
    name = "flash_wgmma"
    summary = "fused FlashAttention-3 style forward on Hopper tensor cores (wgmma, TMA)"
    source = "flash_wgmma.cu"
    min_cc = 90
    ci_archs = ("sm_90a",)

    def head_dim_range(self) -> str:
        return "multiples of 8 from 64 to 256"

    def check(self, p: Problem, cc: int | None) -> str | None:
        if cc is not None and cc != 90:
            return f"{self.name} uses wgmma (sm_90a): compute capability 9.0 only, device has {cc / 10:.1f}"
        if not (64 <= p.head_dim <= 256 and p.head_dim % 8 == 0):
            return f"{self.name} takes head dims {self.head_dim_range()}, not {p.head_dim}"
        if p.mask_kind != "none":
            return f"{self.name} takes no dense mask (flash_mma does)"
        return super().check(p, cc)

    def prepare(self, p: Problem, t: Tensors, device_id: int, arch: str) -> HotLaunch:
        """The wgmma kernel with Q, K and V tensor maps where the arrays allow it
        (16-byte aligned, strides a tensor map takes), flash_mma's kernel otherwise.
        The wgmma kernel is persistent: one block per SM (blocks per SM of its
        config) walks the work tiles."""
        strides = [bhs_strides(a, p.layout) for a in (t.q, t.k, t.v)]
        rows = (p.heads_q, p.seqlen_q), (p.heads_kv, p.seqlen_k), (p.heads_kv, p.seqlen_k)
        batch = 1 if p.varlen else p.batch  # packed sequences: one entry of total rows
        if not all(tma.tileable(batch, heads, n, s) for (heads, n), s in zip(rows, strides)):
            return super().prepare(p, t, device_id, arch)
        mma_plan = self.planner(p, device_id)
        cfg = self.config_for(p, device_id)
        maps = tma.MapBuffers(
            tma.tile_maps(tma.map_geometry(batch, heads, n, p.head_dim, s, box_rows))
            for (heads, n), s, box_rows in zip(rows, strides, (64, cfg[1], cfg[1])))
        block_m = 64 * cfg[0]
        if p.varlen:  # virtual query blocks (common/seqs.cuh); no shift, no sections
            tiles = (p.seqlen_q // block_m + p.batch) * p.heads_q
            shift = section = 0
        else:
            tiles = -(-p.seqlen_q // block_m) * p.heads_q * p.batch
            shift = query_shift(p.seqlen_q, p.seqlen_k, block_m, cfg[1],
                                p.variant.dropout) if p.causal else 0
            section = l2_section(p)
        blocks = min(tiles, multiprocessor_count(device_id) * cfg[2])

        def plan(vec: bool):
            return _plan(p.head_dim, p.dtype, p.variant, cfg) if vec else mma_plan(False)

        def grid(vec: bool):
            return (blocks,) if vec else None

        ints = (ctypes.c_int32(shift), ctypes.c_int32(section))

        def extra(vec: bool, q: int, k: int, v: int, stream):
            if not vec:
                return ()
            return maps(q, k, v) + (tile_counter_arg(device_id, stream),) + ints

        return super().prepare(p, t, device_id, arch, plan, extra, grid)

    def table_config(self, p: Problem, smem_limit: int = SMEM_LIMIT) -> tuple:
        return tiles_for(p.head_dim, p.causal, p.variant.transforms, p.variant.dropout)

    def candidates(self, p: Problem, smem_limit: int = SMEM_LIMIT) -> list[tuple]:
        return candidates(p.head_dim, p.causal, smem_limit, p.variant.transforms,
                          p.variant.dropout)

    def ci_specs(self) -> list[jit.KernelSpec]:
        out = []
        for d in (64, 128, 256):
            for dtype in ("float16", "bfloat16"):
                for causal in (False, True):
                    out.append(spec(d, dtype, Variant(causal)))
        for d in (72, 80, 88, 96, 112, 120, 160, 192, 232):
            out.append(spec(d, "bfloat16", Variant(d % 16 == 0)))
        out.append(spec(96, "float16", Variant()))
        out.append(spec(232, "float16", Variant(True)))
        for d, causal in ((64, True), (128, False), (128, True), (256, True)):
            out.append(spec(d, "bfloat16", Variant(causal, ragged=True)))
        out.append(spec(80, "float16", Variant(True, (32, 0), 30.0, ragged=True)))
        # score transforms on their narrowed rows (TRANSFORM_PAYLOAD_REGS)
        for d, vt in ((64, Variant(softcap=30.0)), (64, Variant(True, softcap=30.0)),
                      (64, Variant(True, dense="alibi")),
                      (88, Variant(True, dense="alibi")), (128, Variant(dense="alibi")),
                      (160, Variant(True, softcap=30.0, dense="alibi")),
                      (192, Variant(dense="alibi")), (256, Variant(True, dense="alibi")),
                      (128, Variant(True, dense="alibi", ragged=True))):
            out.append(spec(d, "bfloat16", vt))
        # dropout (DROPOUT_LIVE_REGS: D = 160 on two consumers), alone and with the others
        for d, causal in ((64, False), (64, True), (128, False), (128, True), (160, False),
                          (192, True), (256, True)):
            out.append(spec(d, "float16" if causal else "bfloat16", Variant(causal, dropout=True)))
        for d, vt in ((80, Variant(True, (64, 0), dropout=True)),
                      (128, Variant(True, softcap=30.0, dropout=True)),
                      (128, Variant(True, ragged=True, dropout=True)),
                      (192, Variant(True, ragged=True, dropout=True)),
                      (256, Variant(True, dense="alibi", dropout=True))):
            out.append(spec(d, "bfloat16", vt))
        # KV caches (attention_decode's chunked prefill: CachedSeqs)
        for d, dtype, vt in ((64, "float16", Variant(True, cache="paged")),
                             (128, "bfloat16", Variant(True, cache="paged")),
                             (128, "bfloat16", Variant(False, cache="contiguous")),
                             (256, "bfloat16", Variant(True, cache="paged")),
                             (80, "float16", Variant(True, cache="contiguous")),
                             (128, "bfloat16", Variant(True, softcap=30.0, cache="paged")),
                             (192, "float16", Variant(False, (100, 50), cache="contiguous"))):
            out.append(spec(d, dtype, vt))
        # paged caches gathered row by row (GatheredKV: the producer warpgroup's cp.async)
        for d, dtype, vt in ((64, "float16", Variant(True, cache="paged")),
                             (128, "bfloat16", Variant(True, cache="paged")),
                             (96, "bfloat16", Variant(False, cache="paged")),
                             (192, "float16", Variant(True, (200, 0), cache="paged")),
                             (256, "bfloat16", Variant(True, softcap=30.0, cache="paged")),
                             # spare lanes past the tile's blocks; one row offset a load
                             (136, "float16", Variant(False, cache="paged")),
                             (64, "bfloat16", Variant(True, softcap=30.0, cache="paged"))):
            out.append(spec(d, dtype, vt, gather=True))
        out.append(spec(160, "bfloat16", Variant(True, cache="paged"), GATHER_CAUSAL_WIDE,
                        gather=True))
        return out


# ---------------------------------------------------------------------------
# Prefill on a KV cache (attention_decode with many query rows): the kernel's
# CachedSeqs variant, flash_wgmma_cache_fwd. Each batch entry's Sq query rows see its
# own cache_seqlens[b] keys; K and V load as boxes of cache_box_rows rows at the
# block table's pages (a contiguous cache: at the entry's own rows), V's last rows
# exact (kernels/common/paged.cuh, CacheTiles). No key splits: the route below takes
# it only where its work tiles fill the GPU.

# attention_decode sends a call here (sm_90a, tensor maps possible, no forced split
# count) when Sq reaches CACHE_MIN_SEQLEN_Q and the work tiles fill every SM. A work
# tile holds 128 or 192 rows of one head, the decode kernel packs a group's heads into
# its rows: H100, 2026-11-27, bf16, Hq/Hkv 32/8, TFLOPs against the decode kernel's, at
# Sq = 64 page 16 0.65-0.89x, contiguous 0.93-1.11x; at Sq = 96 (D = 128) page 16 1.51x,
# contiguous 1.18x (benchmarks/results/h100-chunked-prefill-cache.json, "sq_64_96").
CACHE_MIN_SEQLEN_Q = 96
# V's boxes of 16, 1, 2, 4 and 8 rows (CacheRowMaps), after Q, K and V
_ROW_BOXES = (16, 1, 2, 4, 8)


def cache_box_rows(block_n: int, page_size: int | None) -> int:
    """Rows of the cache kernel's K and V boxes: the key tile (a contiguous cache), or
    the largest multiple of 16 dividing both it and the page size (a box never crosses
    a page; one copy instruction per box and 64 columns, the producer warp's lanes
    issuing them side by side)."""
    return block_n if not page_size else math.gcd(block_n, page_size)


# Gathered rows under a causal mask at D = 136-160 (no score transform) take two
# consumers of 112 keys, not the table's three of 64: their producer's 40 registers hold
# a batch of 16 row offsets (GatheredKV), and at D = 160 the table's row spills 48 bytes
# in the gathering build (ptxas 12.9). Chunked prefill, H200, pages 16 and 1: D = 136
# 1.05-1.12x, 144 1.11-1.14x, 152 1.05-1.08x, 160 1.21x (benchmarks/results/notes-decode.md
# section 37). At D = 80-112 two consumers lost (0.90-0.99x).
GATHER_CAUSAL_WIDE = (2, 112, 1, 2)


def cache_config(s, gather: bool = False) -> tuple:
    """flash_wgmma's tile config for a DecodeShape ``s`` (the table's row); ``gather``:
    for rows gathered with cp.async (GATHER_CAUSAL_WIDE)."""
    if (gather and s.variant.causal and not s.variant.transforms
            and 128 < s.head_dim <= 160):
        return GATHER_CAUSAL_WIDE
    return tiles_for(s.head_dim, s.variant.causal, s.variant.transforms)


def takes_cache(s, tma_ok: bool, arch: str, sms: int, q_strides, gather_ok: bool = False
                ) -> bool:
    """Whether ``attention_decode``'s call of DecodeShape ``s`` runs here: sm_90a, K
    and V with tensor maps of 16-row boxes (``tma_ok``: decode's use_tma, which needs
    pages of a multiple of 16 rows) or a paged cache that can be gathered row by row
    (``gather_ok``: can_gather), a head dim this kernel takes, Q with a tensor map of
    its own, at least CACHE_MIN_SEQLEN_Q query rows and one work tile per SM."""
    from .. import tma

    if not ((tma_ok or gather_ok) and arch == "sm_90a" and 64 <= s.head_dim <= 256
            and s.head_dim % 8 == 0):
        return False
    if s.seqlen_q < CACHE_MIN_SEQLEN_Q:
        return False
    if not tma.tileable(s.batch, s.heads_q, s.seqlen_q, q_strides):
        return False
    return -(-s.seqlen_q // (64 * cache_config(s)[0])) * s.heads_q * s.batch >= sms


# A paged cache whose tensor-map boxes would hold at most GATHER_MAX_BOX rows
# (cache_box_rows: gcd(page, BLOCK_N)), or whose pages hold a number of rows that is
# not a multiple of 16 (no box at all), is gathered row by row
# (flash_wgmma_gather_fwd: the producer warpgroup's cp.async): one copy instruction
# per box and 64 columns falls behind at 16-row boxes (2 KB).
GATHER_MAX_BOX = 16


def gather_smem_bytes(block_n: int) -> int:
    """GatheredKV::Ring (the row offsets of three K tiles and two claim slots, 16-byte
    aligned) and 16 bytes to align it."""
    return -(-(3 * block_n * 4 + 8) // 16) * 16 + 16


def can_gather(s, vec: bool, kv_dims, k_strides, v_strides) -> bool:
    """Whether the paged cache of DecodeShape ``s`` can be gathered row by row: 16-byte
    aligned rows (``vec``), K and V strided alike (one row offset serves both) with no
    negative stride, each row's element offset / 8 within 32 bits (caches up to 64
    GiB), and the gather's shared memory beside the tiles. ``kv_dims``: (pages,
    page_size); strides (page, head, row) in elements."""
    if not (s.paged and vec and tuple(k_strides) == tuple(v_strides)):
        return False
    page, head, row = k_strides
    if min(k_strides) < 0 or (page | head | row) % 8:
        return False
    pages, rows = kv_dims
    if ((pages - 1) * page + (rows - 1) * row) // 8 >= 2 ** 32:
        return False
    cfg = cache_config(s, gather=True)
    return smem_bytes(s.head_dim, cfg) + gather_smem_bytes(cfg[1]) <= SMEM_LIMIT


def cache_gathers(s, page_size: int, tma_ok: bool) -> bool:
    """Whether a paged cache that can_gather is gathered (GATHER_MAX_BOX)."""
    return not tma_ok or cache_box_rows(cache_config(s)[1], page_size) <= GATHER_MAX_BOX


class CacheLaunch:
    """flash_wgmma's cache kernel for one DecodeShape with everything but the pointers
    fixed; ``run`` has DecodeLaunch's signature (attention_decode's hot path repeats
    it). ``kv_dims``: (pages, page_size) of a paged cache, (B, Sk_max) of a contiguous
    one; strides in elements: (batch, head, row) of q, out and lse, (page or batch,
    head, row) of the caches. ``gather``: a paged cache's rows gathered with cp.async
    (flash_wgmma_gather_fwd, can_gather), else boxes through tensor maps
    (flash_wgmma_cache_fwd)."""

    def __init__(self, s, scale: float, *, q_strides, o_strides, lse_strides, k_strides,
                 v_strides, kv_dims, block_table, seqlens, page_size: int, device_id: int,
                 arch: str, gather: bool = False):
        cfg = cache_config(s, gather)
        self.vt = dataclasses.replace(s.variant, cache="paged" if s.paged else "contiguous")
        self.gather = gather
        self.kernel = jit.get_function(spec(s.head_dim, s.dtype, self.vt, cfg, gather), arch,
                                       device_id)
        self.smem = smem_bytes(s.head_dim, cfg) + (gather_smem_bytes(cfg[1]) if gather else 0)
        self.threads = 128 * (cfg[0] + 1)
        block_m = 64 * cfg[0]
        tiles = -(-s.seqlen_q // block_m) * s.heads_q * s.batch
        self.grid = (min(tiles, multiprocessor_count(device_id) * cfg[2]),)
        self.device_id = device_id
        causal = s.variant.causal
        self.shift = ctypes.c_int32(
            query_shift(s.seqlen_q, s.capacity, block_m, cfg[1]) if causal else 0)
        self.section = ctypes.c_int32(
            CAUSAL_SECTION if causal and s.capacity >= CAUSAL_SECTION_MIN_KEYS else 0)
        fwd = cache_fwd_fields(
            s, scale, q_strides=q_strides, o_strides=o_strides, k_strides=k_strides,
            v_strides=v_strides, lse_strides=lse_strides,
            # the keys of a sequence without lengths (a contiguous cache's Sk_max)
            seqlen_k=kv_dims[1] if not s.paged else s.capacity,
            variant_fields=self.vt.params(s.seqlen_q, s.capacity, scale))
        self.template = make_struct(FWD_DTYPE, fwd).tobytes()
        self.cache = bytes(cache_params(block_table, seqlens, page_size).tobytes())
        q_geo = tma.map_geometry(s.batch, s.heads_q, s.seqlen_q, s.head_dim, q_strides, 64)
        geos = [q_geo]
        if not gather:   # K and V in boxes, V's exact tails in boxes of 16, 1, 2, 4, 8 rows
            box = cache_box_rows(cfg[1], page_size if s.paged else None)
            self.box = ctypes.c_int32(box)
            geos += [tma.map_geometry(kv_dims[0], s.heads_kv, kv_dims[1], s.head_dim, st, box)
                     for st in (k_strides, v_strides)]
            geos += [tma.map_geometry(kv_dims[0], s.heads_kv, kv_dims[1], s.head_dim, v_strides,
                                      rows) for rows in _ROW_BOXES]
        self.maps = tma.MapBuffers(tma.tile_maps(g) for g in geos)
        self.rows: dict = {}   # v -> V's five row maps as one CacheRowMaps parameter

    def run(self, q: int, k: int, v: int, o: int, lse: int, stream, table: int | None = None,
            lengths: int | None = None) -> None:
        buf = bytearray(self.template)
        _POINTERS.pack_into(buf, 0, q, k, v, o, lse)
        cache = (ctypes.c_char * len(self.cache)).from_buffer_copy(self.cache)
        if table is not None:
            struct.pack_into("<Q", cache, _CACHE_TABLE_AT, table)
        if lengths is not None:
            struct.pack_into("<Q", cache, _CACHE_LENGTHS_AT, lengths)
        counter = tile_counter_arg(self.device_id, stream)
        if self.gather:
            tail = (*self.maps(q), counter, self.shift, self.section, cache)
        else:
            maps = self.maps(q, k, v, v, v, v, v, v)
            rows = self.rows.get(v)
            if rows is None:
                if len(self.rows) >= tma.MAPS_KEPT:
                    self.rows.clear()
                rows = self.rows[v] = (ctypes.c_char * 640).from_buffer_copy(
                    b"".join(bytes(m) for m in maps[3:]))
            tail = (*maps[:3], counter, self.shift, self.section, cache, self.box, rows)
        self.kernel.launch_packed(self.grid, (self.threads,), buf, self.smem, stream.ptr,
                                  tail=tail)


_CACHE_TABLE_AT = CACHE_DTYPE.fields["block_table"][1]
_CACHE_LENGTHS_AT = CACHE_DTYPE.fields["seqlens"][1]
