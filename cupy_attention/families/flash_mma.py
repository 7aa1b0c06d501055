"""`flash_mma`: the fused tensor-core forward (fp16/bf16, mma.sync, sm_80+)."""

from __future__ import annotations

from .. import jit
from ..problem import Problem
from .base import CPP_DENSE, CPP_DTYPE, MASK_SUFFIX, SHORT_DTYPE, Family, Tensors, fwd_params

# Tile heuristics: first row whose bound covers the head dim padded to 16.
# (max D_PAD, BLOCK_M, BLOCK_N, warps, reason)
TILES = (
    (64, 128, 128, 8, "small rows: wide key tiles amortize each Q fragment; acc is only 32 regs"),
    (128, 128, 64, 8, "8 warps share every K/V tile; acc 64 + S 32 + Q 32 regs fit under 255"),
    (256, 64, 64, 4, "acc alone is 128 regs: 4 warps and Q re-read from shared memory"),
)


def tiles_for(head_dim: int) -> tuple[int, int, int]:
    d_pad = -(-head_dim // 16) * 16
    for bound, bm, bn, warps, _ in TILES:
        if d_pad <= bound:
            return bm, bn, warps
    raise ValueError(f"flash_mma has no tile row for D={head_dim}")


def spec(head_dim: int, dtype: str, causal: bool, mask_kind: str, vec: bool) -> jit.KernelSpec:
    bm, bn, warps = tiles_for(head_dim)
    traits = (f"MmaTraits<{head_dim}, {bm}, {bn}, {warps}, {CPP_DTYPE[dtype]}, "
              f"{'true' if vec else 'false'}>")
    expr = (f"flash_mma_fwd<{traits}, {'Causal' if causal else 'NoCausal'}, "
            f"{CPP_DENSE[mask_kind]}>")
    name = (f"flash_mma[D={head_dim},BM={bm},BN={bn},W={warps},{SHORT_DTYPE[dtype]}"
            f"{',causal' if causal else ''}{MASK_SUFFIX[mask_kind]}{'' if vec else ',unaligned'}]")
    return jit.KernelSpec("flash_mma.cu", expr, name)


def smem_bytes(head_dim: int) -> int:
    bm, bn, _ = tiles_for(head_dim)
    srow = -(-head_dim // 16) * 16 + 8
    return (bm + 2 * bn) * srow * 2


def vectorizable(p: Problem, t: Tensors) -> bool:
    """16-byte cp.async/stores need D % 8 == 0 and 16-byte aligned rows."""
    if p.head_dim % 8:
        return False
    for arr in (t.q, t.k, t.v, t.out):
        if arr.data.ptr % 16:
            return False
        if any((s // arr.itemsize) % 8 for s, n in zip(arr.strides[:3], arr.shape[:3]) if n > 1):
            return False
    return True


class FlashMma(Family):
    name = "flash_mma"
    summary = "fused FlashAttention-2 style forward on tensor cores (mma.sync, cp.async)"
    source = "flash_mma.cu"
    dtypes = ("float16", "bfloat16")
    min_cc = 80

    def launch(self, p: Problem, t: Tensors, stream, device_id: int, arch: str) -> None:
        bm, _, warps = tiles_for(p.head_dim)
        kernel = jit.get_function(
            spec(p.head_dim, p.dtype, p.causal, p.mask_kind, vectorizable(p, t)), arch, device_id)
        kernel.launch((-(-p.seqlen_q // bm), p.heads_q, p.batch), (32 * warps,),
                      (fwd_params(p, t),), smem_bytes(p.head_dim), stream)

    def ci_specs(self) -> list[jit.KernelSpec]:
        out = []
        for d in (8, 32, 64, 72, 80, 96, 128, 160, 192, 256):
            for dtype in ("float16", "bfloat16"):
                for causal in (False, True):
                    out.append(spec(d, dtype, causal, "none", True))
        for d in (1, 40, 59, 111, 224):
            out.append(spec(d, "bfloat16", d % 2 == 0, "none", d % 8 == 0))
        for mask in ("bool", "add"):
            out.append(spec(128, "float16", True, mask, True))
            out.append(spec(64, "bfloat16", False, mask, False))
        return out
