"""`tiled`: three kernels through a full score matrix, each tiled through shared memory."""

from __future__ import annotations

from .. import jit
from ..problem import Problem
from ..variant import Variant
from .base import CPP_DENSE, CPP_DTYPE, SHORT_DTYPE, Family, Tensors, fwd_params

TILE = 32       # output tile side (queries x keys, or queries x head-dim columns)
THREADS = 256   # 8 warps: each thread computes 4 rows of one column
_WARPS = THREADS // 32
_TRAITS = f"TiledTraits<{TILE}, {THREADS}>"


def specs(dtype: str, vt: Variant) -> tuple[jit.KernelSpec, ...]:
    t, band, short = CPP_DTYPE[dtype], vt.band_only(), SHORT_DTYPE[dtype]
    return (
        jit.KernelSpec("tiled.cu", f"tiled_scores<{_TRAITS}, {t}, {vt.cpp()}>",
                       f"tiled_scores[TILE={TILE},{short}{vt.suffix()}]"),
        jit.KernelSpec("tiled.cu", f"tiled_softmax<{_TRAITS}, {band.cpp()}>",
                       f"tiled_softmax[{band.suffix().lstrip(',') or 'full'}]"),
        jit.KernelSpec("tiled.cu", f"tiled_pv<{_TRAITS}, {t}, {band.cpp()}>",
                       f"tiled_pv[TILE={TILE},{short}{band.suffix()}]"),
    )


def _tiles(n: int) -> int:
    return -(-n // TILE)


class Tiled(Family):
    name = "tiled"
    summary = "three shared-memory tiled kernels, full score matrix in global memory"
    source = "tiled.cu"
    max_head_dim = 4096
    memory = "O(S^2)"

    def launch(self, p: Problem, t: Tensors, stream, device_id: int, arch: str) -> None:
        import cupy

        scratch = cupy.empty((p.batch, p.heads_q, p.seqlen_q, p.seqlen_k), dtype=cupy.float32)
        args = (fwd_params(p, t, scratch),)
        k_scores, k_softmax, k_pv = (jit.get_function(s, arch, device_id)
                                     for s in specs(p.dtype, p.variant))
        q_tiles = _tiles(p.seqlen_q)
        k_scores.launch((q_tiles * _tiles(p.seqlen_k), p.heads_q, p.batch), (THREADS,), args, 0,
                        stream)
        k_softmax.launch((-(-p.seqlen_q // _WARPS), p.heads_q, p.batch), (THREADS,), args, 0,
                         stream)
        k_pv.launch((q_tiles * _tiles(p.head_dim), p.heads_q, p.batch), (THREADS,), args, 0,
                    stream)

    def table_config(self, p: Problem, smem_limit: int = 0) -> tuple:
        """(TILE, THREADS): fixed, nothing to tune."""
        return (TILE, THREADS)

    def ci_specs(self) -> list[jit.KernelSpec]:
        out = []
        for dtype in CPP_DTYPE:
            for causal in (False, True):
                for mask in CPP_DENSE:
                    out.extend(specs(dtype, Variant(causal, dense=mask)))
        return list(dict.fromkeys(out))
