"""`naive`: three plain kernels through a full [B, Hq, Sq, Sk] score matrix."""

from __future__ import annotations

from .. import jit
from ..problem import Problem
from ..variant import Variant
from .base import CPP_DENSE, CPP_DTYPE, SHORT_DTYPE, Family, Tensors, fwd_params

THREADS = 128


def specs(dtype: str, vt: Variant) -> tuple[jit.KernelSpec, ...]:
    t, band, short = CPP_DTYPE[dtype], vt.band_only(), SHORT_DTYPE[dtype]
    return (
        jit.KernelSpec("naive.cu", f"naive_scores<{t}, {vt.cpp()}>",
                       f"naive_scores[{short}{vt.suffix()}]"),
        jit.KernelSpec("naive.cu", "naive_softmax", "naive_softmax"),
        jit.KernelSpec("naive.cu", f"naive_pv<{t}, {band.cpp()}>",
                       f"naive_pv[{short}{band.suffix()}]"),
    )


class Naive(Family):
    name = "naive"
    summary = "one kernel per stage, full score matrix in global memory (debugging baseline)"
    source = "naive.cu"
    max_head_dim = 4096
    memory = "O(S^2)"

    def launch(self, p: Problem, t: Tensors, stream, device_id: int, arch: str) -> None:
        import cupy

        scratch = cupy.empty((p.batch, p.heads_q, p.seqlen_q, p.seqlen_k), dtype=cupy.float32)
        args = (fwd_params(p, t, scratch),)
        k_scores, k_softmax, k_pv = (jit.get_function(s, arch, device_id)
                                     for s in specs(p.dtype, p.variant))
        cells = p.seqlen_q * p.seqlen_k
        k_scores.launch((-(-cells // THREADS), p.heads_q, p.batch), (THREADS,), args, 0, stream)
        k_softmax.launch((-(-p.seqlen_q // THREADS), p.heads_q, p.batch), (THREADS,), args, 0, stream)
        outs = p.seqlen_q * p.head_dim
        k_pv.launch((-(-outs // THREADS), p.heads_q, p.batch), (THREADS,), args, 0, stream)

    def table_config(self, p: Problem, smem_limit: int = 0) -> tuple:
        """(THREADS,): fixed, nothing to tune."""
        return (THREADS,)

    def ci_specs(self) -> list[jit.KernelSpec]:
        out = []
        for dtype in CPP_DTYPE:
            for causal in (False, True):
                for mask in CPP_DENSE:
                    out.extend(specs(dtype, Variant(causal, dense=mask)))
        return list(dict.fromkeys(out))
