"""`flash_mma`: the fused tensor-core forward (fp16/bf16, mma.sync, sm_80+)."""

from __future__ import annotations

import functools

from .. import jit
from ..params import FWD_DTYPE
from ..problem import Problem
from ..variant import Variant
from .base import (CPP_DTYPE, FWD_SECTION_KEYS, SHORT_DTYPE, Family, HotLaunch, Tensors, section,
                   section_grid, sectioned)

# Tile heuristics: the first row whose bound covers the head dim padded to 16.
# Each config is (BLOCK_M, BLOCK_N, warps, stages); a warp owns BLOCK_M / warps
# rows, and 32 rows (two m16 tiles) let every K/V fragment read from shared memory
# feed two MMAs. Dense masks need registers for their per-element reads, so they
# take 16-row warps. Figures: bf16, S=4096, H200, 2026-11-22 (benchmarks/results).
# Packed sequences and dropout hold per-sequence params or Philox state beside the
# fragments: their column keeps configs that do not spill with it.
# (max D_PAD, plain config, dense-mask config, packed/dropout config, reason)
TILES = (
    (48, (128, 64, 4, 2), (128, 64, 8, 2), (128, 64, 4, 2),
     "as D = 49-64 with 64-key tiles (96 not measured at D <= 48)"),
    (64, (128, 96, 4, 2), (128, 64, 8, 2), (128, 64, 4, 2),
     "32 rows/warp: 232 vs 162 TFLOPs at 16 rows/warp; Q stays in registers. 96-key "
     "tiles (249 registers; 128 spill 72-92 B): H100, S=4k/16k, 1.03-1.11x 64 keys; "
     "packed sequences and dropout spill 24-92 B with 96 and keep 64"),
    (128, (128, 64, 4, 2), (128, 64, 8, 2), (128, 64, 8, 2),
     "32 rows/warp: 272 vs 198 TFLOPs; acc 128 + S 64 regs, no spills; packed sequences "
     "and dropout spilled 48-92 B on sm_80 with 32-row warps: 16 rows"),
    (160, (128, 64, 8, 2), (64, 64, 4, 2), (128, 64, 8, 2),
     "acc alone is D/2 regs: 16 rows/warp, 8 warps share each K/V tile"),
    (176, (128, 64, 8, 2), (64, 32, 4, 2), (128, 64, 8, 2), "as D = 208-256"),
    (192, (128, 64, 8, 3), (64, 32, 4, 2), (128, 64, 8, 2),
     "three stages: 254-262 TFLOPs non-causal against 218-229 with two (H200, S = 2k-8k; "
     "causal 1.00x); at D_PAD = 176 and 208 three ran 0.86x and 1.01x. Devices without "
     "its 200 KB take two (tiles_for)"),
    (240, (128, 64, 8, 2), (64, 32, 4, 2), (128, 64, 8, 2),
     "as above; dense masks need the narrower S tile to avoid spills"),
    (256, (64, 64, 4, 1), (64, 32, 4, 2), (128, 64, 8, 2),
     "one stage in FlashAttention-2's order (V loaded under S, the next K under P V): "
     "101 KB, two blocks an SM. H200, bf16 / fp16: 1.05-1.11x 128 x 64 on 8 warps with "
     "two stages at S = 2k-4k and causal 8k, 0.96-1.00x non-causal 8k; no gain at "
     "D_PAD = 208-224"),
)


# Smaller fallbacks for GPUs with less shared memory per block than Hopper's
# 227 KB (A100: 163 KB, consumer Ampere/Ada: 99 KB).
SMALL_SMEM_TILES = ((64, 32, 4, 2), (64, 16, 4, 2))

HOPPER_SMEM = 227 * 1024


def tiles_for(head_dim: int, dense: bool = False, smem_limit: int = HOPPER_SMEM,
              stateful: bool = False):
    """(BLOCK_M, BLOCK_N, warps, stages) for this head dim, mask (``dense``), packed
    sequences or dropout (``stateful``) and shared-memory budget: the table's config,
    or where that does not fit, the same with two stages, then SMALL_SMEM_TILES."""
    d_pad = -(-head_dim // 16) * 16
    for bound, plain, masked, lean, _ in TILES:
        if d_pad <= bound:
            first = masked if dense else lean if stateful else plain
            for cfg in (first, first[:3] + (min(first[3], 2),)) + SMALL_SMEM_TILES:
                if _smem(d_pad, cfg) <= smem_limit:
                    return cfg
            break
    raise ValueError(f"flash_mma has no tile config for D={head_dim} within {smem_limit} bytes")


def _smem(d_pad: int, cfg) -> int:
    bm, bn, _, stages = cfg
    # rows swizzled at D_PAD = 256, padded by 8 elements elsewhere (MmaTraits and
    # SmemRows in kernels/common/copy.cuh)
    row = d_pad if d_pad == 256 else d_pad + 8
    return (bm + 2 * stages * bn) * row * 2


def _columns(vt: Variant) -> tuple[bool, bool]:
    """(dense, stateful): which column of TILES the variant takes."""
    return vt.reads_mask, vt.ragged or vt.dropout


def sections(head_dim: int, vt: Variant, vec: bool, cfg) -> bool:
    """Whether the kernel for ``vt`` and ``cfg`` takes section_block's grid
    (base.section: causal grids in sections of (head, batch) pairs): the 16-byte
    (``vec``) builds, as flash_mma_bwd.sections, but where a thread's output
    accumulator and S tile take more than 160 registers (D_PAD = 112 and 128 on
    32-row warps). There the computed head and entry spilled 16-88 bytes under ptxas
    13.5, and at D = 128 the causal forward ran 0.98x without sections (H200,
    2026-11-28, benchmarks/results/notes-bwd-loops.md section 22)."""
    return vec and sectioned(vt) and _fragment_regs(head_dim, cfg) <= 160


def spec(head_dim: int, dtype: str, vt: Variant, vec: bool, cfg=None) -> jit.KernelSpec:
    dense, stateful = _columns(vt)
    bm, bn, warps, stages = cfg or tiles_for(head_dim, dense, stateful=stateful)
    traits = (f"MmaTraits<{head_dim}, {bm}, {bn}, {warps}, {stages}, {CPP_DTYPE[dtype]}, "
              f"{'true' if vec else 'false'}>")
    sec = sections(head_dim, vt, vec, (bm, bn, warps, stages))
    expr = f"flash_mma_fwd<{traits}, {vt.cpp()}, {'true' if sec else 'false'}>"
    name = (f"flash_mma[D={head_dim},BM={bm},BN={bn},W={warps},ST={stages},{SHORT_DTYPE[dtype]}"
            f"{vt.suffix()}{'' if vec else ',unaligned'}{',sections' if sec else ''}]")
    return jit.KernelSpec("flash_mma.cu", expr, name)


# Candidates for ``cupy-attention tune``: the table's rows and their neighbours
# (BLOCK_N 32..128, a third stage, 4 or 8 warps of 16 or 32 rows). Registers: a
# thread holds rows/warp * (D_PAD + BLOCK_N) / 32 accumulators and scores, which the
# table keeps at most 192 (D=128: acc 128 + S 64, no spills); dense masks take
# 16-row warps (their per-element reads need registers).
CANDIDATE_POOL = ((128, 64, 4, 2), (128, 96, 4, 2), (128, 64, 8, 2), (64, 64, 4, 2), (128, 32, 4, 2),
                  (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (64, 32, 4, 2),
                  (64, 64, 4, 3), (64, 16, 4, 2), (64, 64, 4, 1), (128, 64, 8, 1), (128, 64, 4, 1))
MAX_CANDIDATES = 6
MAX_FRAGMENT_REGS = 192


def _fragment_regs(head_dim: int, cfg) -> int:
    """fp32 registers a thread's output accumulator and S tile take: rows a warp x
    (D_PAD + BLOCK_N) / 32."""
    bm, bn, warps, _ = cfg
    return (bm // warps if warps else 0) * (-(-head_dim // 16) * 16 + bn) // 32


def config_fits(head_dim: int, cfg, dense: bool = False, smem_limit: int = HOPPER_SMEM) -> bool:
    """Whether ``cfg`` satisfies the kernel's static checks for ``head_dim`` (BLOCK_M =
    16 * M_TILES * WARPS, whole k16 key steps, one stage or more), the register rule
    above and ``smem_limit``."""
    bm, bn, warps, stages = cfg
    d_pad = -(-head_dim // 16) * 16
    rows = bm // warps if warps else 0
    return (warps in (4, 8) and bm % (16 * warps) == 0 and bn % 16 == 0 and bn > 0
            and stages >= 1 and _fragment_regs(head_dim, cfg) <= MAX_FRAGMENT_REGS
            and (not dense or rows == 16) and _smem(d_pad, cfg) <= smem_limit)


def candidates(head_dim: int, dense: bool = False, smem_limit: int = HOPPER_SMEM,
               stateful: bool = False) -> list[tuple]:
    """The table's config first, then the pool's fitting configs nearest to it (same
    rows per warp, nearest BLOCK_N, same stages)."""
    table = tiles_for(head_dim, dense, smem_limit, stateful)
    rows = table[0] // table[2]
    pool = [c for c in CANDIDATE_POOL if c != table and config_fits(head_dim, c, dense, smem_limit)]
    pool.sort(key=lambda c: (c[0] // c[2] != rows, abs(c[1] - table[1]), c[3] != table[3],
                             c[0] != table[0]))
    return [table] + pool[:MAX_CANDIDATES - 1]


@functools.lru_cache(maxsize=None)
def _plan(head_dim: int, dtype: str, vt: Variant, vec: bool, cfg):
    """(spec, BLOCK_M, threads, shared bytes, sections), memoized: a hot call builds no
    strings."""
    return (spec(head_dim, dtype, vt, vec, cfg), cfg[0], 32 * cfg[2],
            _smem(-(-head_dim // 16) * 16, cfg) + ragged_smem(vt),
            sections(head_dim, vt, vec, cfg))


def ragged_smem(vt: Variant) -> int:
    """Packed sequences: the sequence's params behind the tiles (Seqs::bind_block)."""
    return FWD_DTYPE.itemsize if vt.ragged else 0


def strides_aligned(head_dim: int, arrays) -> bool:
    """D % 8 == 0 and every stride but the head dim's (batch, head, row; packed
    sequences: row, head) of the 16-bit ``arrays`` a multiple of 16 bytes (strides of
    length-1 axes do not matter)."""
    if head_dim % 8:
        return False
    return not any((s // arr.itemsize) % 8
                   for arr in arrays
                   for s, n in zip(arr.strides[:-1], arr.shape[:-1]) if n > 1)


def vectorizable_arrays(head_dim: int, arrays) -> bool:
    """16-byte cp.async/stores need aligned strides and 16-byte aligned base pointers."""
    return strides_aligned(head_dim, arrays) and not any(arr.data.ptr % 16 for arr in arrays)


class FlashMma(Family):
    name = "flash_mma"
    summary = "fused FlashAttention-2 style forward on tensor cores (mma.sync, cp.async)"
    source = "flash_mma.cu"
    dtypes = ("float16", "bfloat16")
    min_cc = 80
    varlen = True
    dropout = True

    def planner(self, p: Problem, device_id: int):
        """``plan(vec)`` -> (spec, BLOCK_M, threads, shared bytes, sections) of the aligned
        (``vec``) or unaligned kernel for ``p`` (flash_mma's config, tuned or the
        table's, also where a subclass falls back to this kernel)."""
        from ..device import max_shared_per_block

        mma = self if type(self) is FlashMma else FlashMma()
        cfg = mma.config_for(p, device_id, max_shared_per_block(device_id) - ragged_smem(p.variant))
        return lambda vec: _plan(p.head_dim, p.dtype, p.variant, vec, cfg)

    def table_config(self, p: Problem, smem_limit: int = HOPPER_SMEM) -> tuple:
        dense, stateful = _columns(p.variant)
        return tiles_for(p.head_dim, dense, smem_limit, stateful)

    def candidates(self, p: Problem, smem_limit: int = HOPPER_SMEM) -> list[tuple]:
        dense, stateful = _columns(p.variant)
        return candidates(p.head_dim, dense, smem_limit, stateful)

    def launch(self, p: Problem, t: Tensors, stream, device_id: int, arch: str) -> None:
        """One call through the same launch object a hot call reuses (:meth:`prepare`)."""
        lse = t.lse.data.ptr if t.lse is not None else 0
        self.prepare(p, t, device_id, arch).run(t.q.data.ptr, t.k.data.ptr, t.v.data.ptr,
                                                t.out.data.ptr, lse, stream)

    def prepare(self, p: Problem, t: Tensors, device_id: int, arch: str, plan=None,
                extra=None, grid=None) -> HotLaunch:
        """``plan`` (default :meth:`planner`), ``extra`` and ``grid`` let a subclass
        choose other kernels, pass arguments after the params struct (HotLaunch) and
        launch another grid than one block per BLOCK_M query rows of each head
        (``grid(vec)`` returns it, or None for that one)."""
        plan = plan or self.planner(p, device_id)

        @functools.lru_cache(maxsize=2)
        def variant(vec: bool):
            kspec, block_m, threads, smem, sec = plan(vec)
            blocks = (grid(vec) if grid else None) or (
                (p.seqlen_q // block_m + p.batch, p.heads_q, 1) if p.varlen  # common/seqs.cuh
                else section_grid(-(-p.seqlen_q // block_m), p.heads_q, p.batch,
                                  section(p, p.heads_q, FWD_SECTION_KEYS) if sec else 1))
            return jit.get_function(kspec, arch, device_id), blocks, (threads,), smem

        return HotLaunch(p, t, strides_aligned(p.head_dim, (t.q, t.k, t.v, t.out)), variant, extra)

    def ci_specs(self) -> list[jit.KernelSpec]:
        out = []
        for d in (8, 32, 64, 72, 80, 96, 128, 160, 192, 256):
            for dtype in ("float16", "bfloat16"):
                for causal in (False, True):
                    out.append(spec(d, dtype, Variant(causal), True))
        for d in (1, 40, 59, 111, 224):
            out.append(spec(d, "bfloat16", Variant(d % 2 == 0), d % 8 == 0))
        for mask in ("bool", "add"):
            out.append(spec(128, "float16", Variant(True, dense=mask), True))
            out.append(spec(64, "bfloat16", Variant(dense=mask), False))
        for d, causal in ((64, True), (128, False), (128, True), (256, True)):
            out.append(spec(d, "bfloat16", Variant(causal, ragged=True), True))
        for d, causal in ((64, False), (96, True), (128, True), (256, False)):
            out.append(spec(d, "float16", Variant(causal, dropout=True), True))
        out.append(spec(128, "bfloat16", Variant(True, softcap=30.0, dropout=True), True))
        out.append(spec(128, "bfloat16", Variant(False, ragged=True, dropout=True), True))
        out.append(spec(40, "float16", Variant(True, (32, 0), 30.0, ragged=True), False))
        return out
