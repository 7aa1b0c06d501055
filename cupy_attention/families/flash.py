"""`flash`: one fused kernel on CUDA cores, online softmax, O(S) extra memory.

The kernel (``kernels/flash.cu``) is specialized to the exact head dim D; its
traits struct ``FlashTraits<D, BLOCK_M, BLOCK_N, THREADS, T>`` derives the shared
memory layout, which :func:`smem_bytes` mirrors here (the kernel traps if a launch
passes fewer bytes than it lays out).
"""

from __future__ import annotations

import dataclasses

from .. import jit
from ..problem import Problem
from ..variant import Variant
from .base import CPP_DTYPE, SHORT_DTYPE, Family, Tensors, fwd_params

_KB = 1024

# Tile heuristics, first matching row wins: a row matches when D <= max_d and its
# shared memory fits the device. Shared-memory tiles are fp32 for every storage
# dtype, so the choice depends on D (and the device), not on the dtype.
#   (max_d, BLOCK_M, BLOCK_N, THREADS, reason)
HEURISTICS = (
    (128, 64, 64, 256,
     "4x4 scores per thread: two float4 shared reads feed 16 FMAs. 25-85 KB of shared "
     "memory: three blocks per SM up to D=64, two per H100 SM up to D=128 (one on A100)"),
    (256, 64, 32, 256,
     "D > 128: 64-key tiles would take up to 153 KB (one block per SM); 32-key tiles "
     "keep <= 113 KB, so two blocks share an H100 SM up to D=224 (register cap allowing)"),
    (256, 32, 32, 256,
     "devices with 99 KB per block (sm_86, sm_89, sm_120) at D > 192: 32 query rows "
     "halve sQ to fit"),
)

# Largest dynamic shared memory one block may opt into, by compute capability:
# check() sees only the compute capability; launch() asks the device itself.
_SMEM_OPTIN = {70: 96 * _KB, 72: 96 * _KB, 75: 64 * _KB, 80: 163 * _KB, 86: 99 * _KB,
               87: 163 * _KB, 89: 99 * _KB, 90: 227 * _KB, 100: 227 * _KB, 103: 227 * _KB,
               120: 99 * _KB, 121: 99 * _KB}
_SMEM_UNKNOWN = 99 * _KB
SM80_SMEM = 163 * _KB


@dataclasses.dataclass(frozen=True)
class Config:
    head_dim: int
    block_m: int
    block_n: int
    threads: int

    @property
    def smem(self) -> int:
        return smem_bytes(self.head_dim, self.block_m, self.block_n)


def smem_bytes(d: int, block_m: int, block_n: int) -> int:
    """``FlashTraits::SMEM_BYTES``: sQ [D][BLOCK_M+4], sKV, sP [BLOCK_M][BLOCK_N+4] floats."""
    dp = -(-d // 32) * 32
    sq = d * (block_m + 4)
    skv = max(d * (block_n + 4), block_n * dp)
    sp = block_m * (block_n + 4)
    return 4 * (sq + skv + sp)


def smem_limit_for_cc(cc: int | None) -> int:
    return SM80_SMEM if cc is None else _SMEM_OPTIN.get(cc, _SMEM_UNKNOWN)


def config(head_dim: int, smem_limit: int = SM80_SMEM) -> Config | None:
    """The first heuristics row for ``head_dim`` whose shared memory fits ``smem_limit`` bytes."""
    for max_d, bm, bn, threads, _reason in HEURISTICS:
        c = Config(head_dim, bm, bn, threads)
        if head_dim <= max_d and c.smem <= smem_limit:
            return c
    return None


def spec(c: Config, dtype: str, vt: Variant) -> jit.KernelSpec:
    traits = f"FlashTraits<{c.head_dim}, {c.block_m}, {c.block_n}, {c.threads}, {CPP_DTYPE[dtype]}>"
    expr = f"flash_fwd<{traits}, {vt.cpp()}>"
    name = f"flash[D={c.head_dim},BM={c.block_m},BN={c.block_n},{SHORT_DTYPE[dtype]}{vt.suffix()}]"
    return jit.KernelSpec("flash.cu", expr, name)


# CI spread: every head dim of the test grid once, dtype / causal / dense mask
# rotating so each value of each axis appears, plus the benchmark shapes in full.
_CI_HEAD_DIMS = (1, 8, 32, 40, 59, 64, 72, 80, 96, 111, 128, 160, 192, 224, 256)
_CI_MASKS = ("none", "bool", "add")


class Flash(Family):
    name = "flash"
    summary = "fused online-softmax kernel on CUDA cores, specialized per head dim"
    source = "flash.cu"
    max_head_dim = 256
    min_cc = 70  # dynamic shared memory above 48 KB per block
    memory = "O(S)"

    def check(self, p: Problem, cc: int | None) -> str | None:
        reason = super().check(p, cc)
        if reason is None and config(p.head_dim, smem_limit_for_cc(cc)) is None:
            reason = (f"{self.name} at D={p.head_dim} needs more than the "
                      f"{smem_limit_for_cc(cc) // _KB} KB of shared memory per block this device has")
        return reason

    def launch(self, p: Problem, t: Tensors, stream, device_id: int, arch: str) -> None:
        from ..device import max_shared_per_block
        from ..errors import UnsupportedError

        limit = max_shared_per_block(device_id)
        c = config(p.head_dim, limit)
        if c is not None:
            c = Config(p.head_dim, *self.config_for(p, device_id, limit))
        if c is None:
            raise UnsupportedError(f"{self.name} at D={p.head_dim} needs more than the "
                                   f"{limit // _KB} KB of shared memory per block this device has")
        kernel = jit.get_function(spec(c, p.dtype, p.variant), arch, device_id)
        grid = (-(-p.seqlen_q // c.block_m), p.heads_q, p.batch)
        kernel.launch(grid, (c.threads,), (fwd_params(p, t),), c.smem, stream)

    def table_config(self, p: Problem, smem_limit: int = SM80_SMEM) -> tuple:
        c = config(p.head_dim, smem_limit)
        return () if c is None else (c.block_m, c.block_n, c.threads)

    def candidates(self, p: Problem, smem_limit: int = SM80_SMEM) -> list[tuple]:
        """The heuristics' rows whose shared memory fits (and sm_80's 163 KB, which the
        kernel asserts), the table's first: every row is a tile shape the kernel
        compiles at any head dim."""
        limit = min(smem_limit, SM80_SMEM)
        out = [self.table_config(p, smem_limit)]
        for _max_d, bm, bn, threads, _reason in HEURISTICS:
            cfg = (bm, bn, threads)
            if cfg not in out and Config(p.head_dim, *cfg).smem <= limit:
                out.append(cfg)
        return [c for c in out if c]

    def ci_specs(self) -> list[jit.KernelSpec]:
        dtypes = tuple(CPP_DTYPE)
        out = []
        for idx, d in enumerate(_CI_HEAD_DIMS):
            out.append(spec(config(d), dtypes[idx % 3],
                             Variant(idx % 2 == 1, dense=_CI_MASKS[(idx // 2) % 3])))
        for d in (64, 128):
            for dtype in dtypes:
                for causal in (False, True):
                    out.append(spec(config(d), dtype, Variant(causal)))
        out.append(spec(config(256, _SMEM_OPTIN[86]), "bfloat16", Variant(True, dense="bool")))
        return list(dict.fromkeys(out))
