"""The tensor-core backward (``kernels/flash_mma_bwd.cu``): fp16/bf16, mma.sync, sm_80+.

Behind :func:`cupy_attention.attention_backward` with ``kernel="flash_mma"``, and
``kernel="auto"`` whenever :func:`check` accepts the problem. Launch sequence on
the caller's stream (the row kernels come from ``flash_bwd.cu``):

1. ``flash_bwd_delta``: ``delta = rowsum(dout * out)`` (and zeroes ``dq_accum``);
2. ``flash_mma_bwd_dkdv``: dK, dV per block of keys on tensor cores (and, unless
   deterministic, dQ / scale added into ``dq_accum`` with fp32 reductions);
3. ``flash_bwd_dq_convert`` (``dq = dq_accum * scale``), or with
   ``deterministic=True`` ``flash_mma_bwd_dq``, which recomputes P and dS per
   query block on tensor cores and writes dQ without atomics.

Dense masks are declined (:func:`check` says so); ``kernel="auto"`` then runs the
CUDA-core backward, which takes them.
"""

from __future__ import annotations

import dataclasses
import functools

from .. import jit
from ..params import BWD_DTYPE
from ..problem import Problem
from ..variant import CAUSAL, Variant
from . import flash_bwd
from .base import CPP_DTYPE, SHORT_DTYPE, grid_check, section, section_grid, sectioned
from .flash_mma import vectorizable_arrays

_KB = 1024
HOPPER_SMEM = 227 * _KB

# dK/dV kernel tiles, first row whose bound covers the head dim padded to 16 and
# whose shared memory fits the device. Each warp owns 16 keys (the mma M
# dimension); dK and dV of those keys stay in registers for the whole block.
#   (max D_PAD, BLOCK_M queries, BLOCK_N keys, warps, reason)
DKDV_TILES = (
    (32, 64, 128, 8, "D <= 32: as D = 65-128 (128-query tiles not measured there)"),
    (64, 128, 128, 8,
     "D = 33-64: 128-query tiles (S^T and dP^T 128 registers, dK and dV 64; 182 KB): half "
     "the tiles' fixed costs of 64 rows. H100, bf16, S=4k/16k: 1.04-1.07x 64 rows"),
    (128, 64, 128, 8,
     "8 warps; in phase 2 two warps share 32 keys, one head-dim half each: dK, dV take "
     "D registers, S^T and dP^T 64 more (255 at D=128, no spills); 173 KB at D=128. "
     "H200, S=4096, bf16: 217 TFLOPs (FA2 289)"),
    (128, 32, 128, 8,
     "devices with less than 173 KB per block (A100: 163 KB): half the query tile"),
    (208, 64, 64, 8,
     "D > 128: 64 keys per block, four warps share 32 keys along the head dim, so dK, "
     "dV stay at 128 registers; 173 KB of shared memory at D=192, 185 KB at D=208"),
    (224, 32, 64, 8,
     "D_PAD = 224: 64-row query tiles spill 8-12 bytes in sm_80 builds"),
    (256, 64, 64, 8,
     "D_PAD = 240-256 on Hopper (222 KB at D=256; FA2's tile). H100, bf16, S=4k/16k: "
     "1.10-1.12x 32 rows"),
    (256, 32, 64, 8,
     "A100 at D > 128: 32-row query tiles, ~230 registers and 145 KB at D=256"),
)

# Deterministic dQ kernel tiles: (max D_PAD, BLOCK_N keys, warps); BLOCK_M = 16 * warps.
DQ_TILES = (
    (128, 64, 4),   # dQ 64 + S, dP 64 registers
    (256, 32, 4),   # dQ alone is D / 2 registers: narrower key tiles
)


@dataclasses.dataclass(frozen=True)
class Config:
    head_dim: int
    block_m: int        # dK/dV kernel: query rows per tile
    block_n: int        # dK/dV kernel: keys per block
    warps: int
    dq_block_n: int     # deterministic dQ kernel: keys per tile
    dq_warps: int

    @property
    def d_pad(self) -> int:
        return -(-self.head_dim // 16) * 16

    @property
    def smem(self) -> int:
        """``MmaBwdTraits::SMEM_BYTES`` with padded rows: sK, sV, two buffers of sQ and
        sdO, sP, sdS (16-bit), two buffers of lse and delta (fp32). Where the kernel
        swizzles sK .. sdO (rows D_PAD apart, ``SmemRows`` in common/copy.cuh:
        16-byte builds at D_PAD = 64, 128 and 192, and sm_90
        builds at D_PAD = 256) it uses less of it."""
        srow, prow = self.d_pad + 8, self.block_m + 8
        return (2 * self.block_n * srow + 4 * self.block_m * srow
                + 2 * self.block_n * prow) * 2 + 4 * self.block_m * 4

    @property
    def dq_block_m(self) -> int:
        return 16 * self.dq_warps

    @property
    def dq_smem(self) -> int:
        """``MmaBwdDqTraits::SMEM_BYTES``: sQ, sdO, two buffers of sK and sV."""
        return (2 * self.dq_block_m + 4 * self.dq_block_n) * (self.d_pad + 8) * 2


def config(head_dim: int, smem_limit: int = HOPPER_SMEM, narrow: bool = False,
           two_transforms: bool = False) -> Config | None:
    """The tiles for ``head_dim`` within ``smem_limit``; ``narrow`` (dropout, whose keep
    bits join S^T and dP^T: the 64-query tile spilled 8-40 bytes at D = 128, the
    128-query tile 616-760 at D = 64) skips the 128-query row and, past D = 64, starts
    from the 32-query row of the same head dims. ``two_transforms`` (softcap with ALiBi,
    whose values both stay live through phase 1: ptxas 12.9 spilled 4-16 bytes on the
    128-query tiles at D = 40 and 64, on the 64-query tiles at D = 104-120 and in the
    dQ kernel over packed sequences at D = 96 and 120) skips the 128-query row, takes
    the 32-query row from D_PAD = 112 and the dQ kernel's 32-key tiles from D = 96
    (at D = 88 those spilled 4 bytes on sm_80 where the 64-key ones spill nothing)."""
    d_pad = -(-head_dim // 16) * 16
    dq = next((bn, w) for bound, bn, w in DQ_TILES
              if d_pad <= bound and (bn == 32 or not (two_transforms and head_dim >= 96)))
    for bound, bm, bn, warps, _reason in DKDV_TILES:
        c = Config(head_dim, bm, bn, warps, *dq)
        if narrow and (bm == 128 or (d_pad > 64 and bm > 32 and bound == 128)):
            continue
        if two_transforms and (bm == 128 or (d_pad >= 112 and bm > 32 and bound == 128)):
            continue
        if d_pad <= bound and c.smem <= smem_limit and c.dq_smem <= smem_limit:
            return c
    return None


def two_transforms(vt: Variant) -> bool:
    """Softcap and ALiBi together (:func:`config`'s narrower tiles)."""
    return bool(vt.softcap) and vt.dense == "alibi"


def _flag(x: bool) -> str:
    return "true" if x else "false"


def sections(vt: Variant, vec: bool) -> bool:
    """Whether the tile kernels for ``vt`` take section_block's grid (base.section: the
    causal grids in sections of (head, batch) pairs): the 16-byte (``vec``) builds. Its
    head and entry are computed values live through the loop (blockIdx is read again
    where used instead); the unaligned dK/dV kernel at D = 112 spilled 16 bytes with
    them under ptxas 12.9."""
    return vec and sectioned(vt)


def dkdv_sections(c: Config, vt: Variant, vec: bool, atomic_dq: bool) -> bool:
    """:func:`sections` for the dK/dV kernel, but at D_PAD = 64 with the atomic dQ: its
    swizzled rows spilled 8 bytes in sections (ptxas 12.9 and 13.5, sm_90a), and swizzled
    without sections it ran faster than padded in them (notes-bwd-loops.md section 27)."""
    return sections(vt, vec) and not (c.d_pad == 64 and atomic_dq)


def rows8(p: Problem, vec: bool, deterministic: bool) -> bool:
    """Whether the atomic dQ of ``p`` keeps dq_accum's rows in groups of 8 (each 8 x D
    floats as D / 8 row-major blocks of 8 x 8: common/bwd_tiles.cuh), so that a
    warp's reduction covers two whole 128-byte lines, not a 32-byte sector in each of
    eight rows: fixed lengths with Sq % 8 == 0, 16-byte builds (D % 8 == 0). Same
    buffer, other order; flash_bwd_dq_convert<T, true> reads it."""
    return not deterministic and vec and not p.varlen and p.seqlen_q % 8 == 0


def dkdv_spec(c: Config, dtype: str, vt: Variant, vec: bool, atomic_dq: bool,
              dq_rows8: bool = False) -> jit.KernelSpec:
    traits = (f"MmaBwdTraits<{c.head_dim}, {c.block_m}, {c.block_n}, {c.warps}, "
              f"{CPP_DTYPE[dtype]}, {_flag(vec)}>")
    sec = dkdv_sections(c, vt, vec, atomic_dq)
    expr = (f"flash_mma_bwd_dkdv<{traits}, {vt.cpp()}, {_flag(atomic_dq)}, {_flag(sec)}"
            f"{', true' if dq_rows8 else ''}>")
    name = (f"flash_mma_bwd_dkdv[D={c.head_dim},BM={c.block_m},BN={c.block_n},W={c.warps},"
            f"{SHORT_DTYPE[dtype]}{vt.suffix()}{'' if vec else ',unaligned'}"
            f"{',atomic-dq' if atomic_dq else ''}{',rows8' if dq_rows8 else ''}"
            f"{',sections' if sec else ''}]")
    return jit.KernelSpec("flash_mma_bwd.cu", expr, name)


def dq_spec(c: Config, dtype: str, vt: Variant, vec: bool) -> jit.KernelSpec:
    traits = (f"MmaBwdDqTraits<{c.head_dim}, {c.dq_block_n}, {c.dq_warps}, {CPP_DTYPE[dtype]}, "
              f"{_flag(vec)}>")
    sec = sections(vt, vec)
    expr = f"flash_mma_bwd_dq<{traits}, {vt.cpp()}, {_flag(sec)}>"
    name = (f"flash_mma_bwd_dq[D={c.head_dim},BN={c.dq_block_n},W={c.dq_warps},"
            f"{SHORT_DTYPE[dtype]}{vt.suffix()}{'' if vec else ',unaligned'}"
            f"{',sections' if sec else ''}]")
    return jit.KernelSpec("flash_mma_bwd.cu", expr, name)


def specs(c: Config, dtype: str, vt: Variant, vec: bool, deterministic: bool,
          dq_rows8: bool = False) -> list[jit.KernelSpec]:
    """Every instantiation one backward launch uses, in launch order (``dq_rows8``:
    :func:`rows8`)."""
    if deterministic:
        return [flash_bwd.delta_spec(dtype), dkdv_spec(c, dtype, vt, vec, False),
                dq_spec(c, dtype, vt, vec)]
    return [flash_bwd.delta_spec(dtype), dkdv_spec(c, dtype, vt, vec, True, dq_rows8),
            flash_bwd.convert_spec(dtype, dq_rows8)]


def check(p: Problem, cc: int | None, smem_limit: int = HOPPER_SMEM) -> str | None:
    """None if the tensor-core backward runs ``p``, else why not."""
    if p.dtype not in ("float16", "bfloat16"):
        return f"the flash_mma backward takes float16, bfloat16, not {p.dtype}"
    if p.head_dim > 256:
        return f"the flash_mma backward takes head dims 1..256, not {p.head_dim}"
    if cc is not None and cc < 80:
        return f"the flash_mma backward needs compute capability 8.0+, device has {cc / 10:.1f}"
    if p.mask_kind != "none":
        return "the flash_mma backward takes no dense mask (causal is fine)"
    if config(p.head_dim, smem_limit) is None:
        return (f"the flash_mma backward at D={p.head_dim} needs more than the "
                f"{smem_limit // _KB} KB of shared memory per block this device has")
    return grid_check(p)


def vectorizable(p: Problem, t: flash_bwd.BwdTensors) -> bool:
    """16-byte cp.async for every tensor the kernels copy into shared memory."""
    return vectorizable_arrays(p.head_dim, (t.fwd.q, t.fwd.k, t.fwd.v, t.dout))


@functools.lru_cache(maxsize=None)
def _plan(head_dim: int, dtype: str, vt: Variant, vec: bool, deterministic: bool,
          device_id: int, dq_rows8: bool = False):
    from ..device import max_shared_per_block

    c = config(head_dim, max_shared_per_block(device_id) - (BWD_DTYPE.itemsize if vt.ragged else 0),
               vt.dropout, two_transforms(vt))
    return c, specs(c, dtype, vt, vec, deterministic, dq_rows8)


def passes(p: Problem, t: flash_bwd.BwdTensors, device_id: int, arch: str,
           deterministic: bool) -> list[tuple]:
    """The launches of ``p``'s backward (flash_bwd.passes' form)."""
    vec = vectorizable(p, t)
    c, kspecs = _plan(p.head_dim, p.dtype, p.variant, vec, deterministic, device_id,
                      rows8(p, vec, deterministic))
    return pass_list(p, [jit.get_function(s, arch, device_id) for s in kspecs],
                     (c.block_n, 32 * c.warps, c.smem + ragged_smem(p)), c, deterministic,
                     grid_section(p, p.heads_kv,
                                  dkdv_sections(c, p.variant, vec, not deterministic)),
                     dq_section(p, vec))


def launch(p: Problem, t: flash_bwd.BwdTensors, stream, device_id: int, arch: str,
           deterministic: bool) -> None:
    flash_bwd.launch_from(passes, p, t, stream, device_id, arch, deterministic)


def prepare(p: Problem, t: flash_bwd.BwdTensors, device_id: int, arch: str,
            deterministic: bool, passes_of=None) -> flash_bwd.HotBackward | None:
    """The hot path's launches (``passes_of``, default :func:`passes`), for the 16-byte
    kernels only (unaligned arrays of a later call take the general path, which picks
    the kernels by alignment)."""
    if not vectorizable(p, t):
        return None
    return flash_bwd.HotBackward(p, t, (passes_of or passes)(p, t, device_id, arch,
                                                              deterministic), aligned=True)


def ragged_smem(p: Problem) -> int:
    """Shared bytes a packed-sequence kernel adds behind its tiles: the sequence's
    params (Seqs::bind_block in kernels/common/seqs.cuh)."""
    return BWD_DTYPE.itemsize if p.varlen else 0


def grid_section(p: Problem, heads: int, sectioned_build: bool) -> int:
    """base.section for a tile grid over ``heads`` of a build that takes sections
    (:func:`sections`, :func:`dkdv_sections`); 1 where it takes none."""
    return section(p, heads) if sectioned_build else 1


def dq_section(p: Problem, vec: bool = True) -> int:
    """grid_section for flash_mma_bwd_dq's grid (query heads)."""
    return grid_section(p, p.heads_q, sections(p.variant, vec))


def pass_list(p: Problem, kernels, dkdv: tuple, dq: Config, deterministic: bool,
              dkdv_section: int = 1, dq_section: int = 1) -> list[tuple]:
    """The delta pre-pass, a dK/dV kernel (``dkdv`` = keys per block, threads, shared
    bytes), then dq_convert, or with ``deterministic`` the dQ kernel of ``dq``'s
    tiles, as flash_bwd.passes' (kernel, grid, block, shared bytes). The tile
    kernels' grids come in sections of ``dkdv_section`` and ``dq_section`` (head,
    batch) pairs (base.section). flash_wgmma_bwd runs its own dK/dV kernel through
    this too."""
    k_delta, k_dkdv, k_dq = kernels
    block_n, threads, smem = dkdv
    # packed sequences: the row kernels see one entry of total rows, the tile kernels
    # the virtual blocks of every sequence (kernels/common/seqs.cuh)
    batch = 1 if p.varlen else p.batch
    rows = (-(-p.seqlen_q // flash_bwd.ROWS_PER_BLOCK), p.heads_q, batch)
    row_pass = (rows, (flash_bwd.THREADS,), 0)
    if deterministic:
        dq_pass = (k_dq, section_grid(blocks(p, p.seqlen_q, dq.dq_block_m), p.heads_q, batch,
                                      dq_section),
                   (32 * dq.dq_warps,), dq.dq_smem + ragged_smem(p))
    else:
        dq_pass = (k_dq,) + row_pass
    return [(k_delta,) + row_pass,
            (k_dkdv, section_grid(blocks(p, p.seqlen_k, block_n), p.heads_kv, batch,
                                  dkdv_section), (threads,), smem),
            dq_pass]


def blocks(p: Problem, rows: int, block: int) -> int:
    """Grid x of a tile kernel over ``rows`` (per entry, or in all sequences)."""
    return rows // block + p.batch if p.varlen else -(-rows // block)


# CI spread: every head dim of the test grid (aligned where D % 8 == 0) with dtype,
# causal and dQ mode rotating, both modes of the training shapes (D = 64, 128), and
# the A100 fallback tiles.
_CI_HEAD_DIMS = (1, 8, 32, 40, 59, 64, 72, 80, 96, 111, 128, 160, 192, 224, 256)


def ci_specs() -> list[jit.KernelSpec]:
    """A representative set of instantiations that CI compiles for sm_80 and sm_90a."""
    out = []
    for idx, d in enumerate(_CI_HEAD_DIMS):
        c = config(d)
        dtype, causal, vec = ("float16", "bfloat16")[idx % 2], idx % 3 != 0, d % 8 == 0
        out.append(dkdv_spec(c, dtype, Variant(causal), vec, idx % 4 != 3))
        out.append(dq_spec(c, dtype, Variant(causal), vec))
    for d in (64, 128):
        for dtype in ("float16", "bfloat16"):
            for causal in (False, True):
                out += specs(config(d), dtype, Variant(causal), True, False)
                out += specs(config(d), dtype, Variant(causal), True, True)
    # dq_accum's rows in groups of 8 (rows8): the training shapes, a head dim that is
    # not a multiple of 16 and the two-round dQ jobs of D_PAD > 128
    for d, dtype, causal in ((64, "bfloat16", False), (64, "float16", True),
                             (128, "bfloat16", True), (128, "float16", False),
                             (40, "bfloat16", True), (192, "float16", False),
                             (256, "bfloat16", True)):
        out += specs(config(d), dtype, Variant(causal), True, False, dq_rows8=True)
    for d in (128, 256):
        out += specs(config(d, 163 * _KB), "bfloat16", CAUSAL, True, False)
    # The 255-register row (D_PAD = 112, 128) with the mask and copy paths that
    # spilled before its phase 1 was rolled (MmaBwdTraits::P1_TIGHT).
    for d, vec in ((104, True), (112, False), (120, False)):
        out.append(dkdv_spec(config(d), "bfloat16", CAUSAL, vec, True))
    out.append(dkdv_spec(config(112), "float16", Variant(), True, True))
    for d, causal in ((64, True), (128, True), (256, False)):
        out += specs(config(d), "bfloat16", Variant(causal, ragged=True), True, False)
        out += specs(config(d), "bfloat16", Variant(causal, ragged=True), True, True)
    out.append(dkdv_spec(config(40), "float16", Variant(True, (16, 0), 20.0, ragged=True), False,
                         True))
    for d, causal in ((64, True), (96, False), (128, True), (256, True)):
        vt = Variant(causal, dropout=True)
        out += specs(config(d, narrow=True), "float16", vt, True, d != 96)
    out += specs(config(128, narrow=True), "bfloat16", Variant(True, softcap=30.0, dropout=True),
                 True, True)
    # softcap with ALiBi on the narrower tiles (config's two_transforms), where the
    # table's own spilled
    for d, causal, ragged, deterministic in ((40, False, False, False), (64, True, True, False),
                                             (112, True, False, False), (120, False, True, True)):
        vt = Variant(causal, softcap=30.0, dense="alibi", ragged=ragged)
        out += specs(config(d, two_transforms=True), "bfloat16", vt, True, deterministic,
                     dq_rows8=not (ragged or deterministic))
    return list(dict.fromkeys(out))
