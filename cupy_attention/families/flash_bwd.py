"""The backward pass (``kernels/flash_bwd.cu``): fused CUDA-core kernels, O(S) memory.

Behind :func:`cupy_attention.attention_backward` with ``kernel="auto"`` or
``"flash"``. Launch sequence on the caller's stream:

1. ``flash_bwd_delta``: ``delta = rowsum(dout * out)`` (and zeroes ``dq_accum``);
2. ``flash_bwd_dkdv``: dK, dV per key block (and, unless deterministic, dQ / scale
   added into ``dq_accum`` with fp32 atomics);
3. ``flash_bwd_dq_convert`` (``dq = dq_accum * scale``), or with
   ``deterministic=True`` ``flash_bwd_dq``, which recomputes P and dS per query
   block and writes dQ without atomics: bitwise identical run to run.

The traits struct ``BwdTraits<D, BLOCK_M, BLOCK_N, T>`` derives the shared-memory
layout; :func:`smem_bytes` mirrors it (the kernels trap if launched with less).
"""

from __future__ import annotations

import dataclasses
import struct

from .. import jit
from ..variant import Variant
from ..params import BWD_DTYPE, make_struct
from ..problem import DTYPES, Problem
from .base import (_CU_OFFSET, _CU_POINTERS, _POINTERS, CPP_DTYPE, SHORT_DTYPE, Tensors,
                   bhs_strides, fwd_params, grid_check)

_KB = 1024
SM80_SMEM = 163 * _KB
THREADS = 256
ROWS_PER_BLOCK = THREADS // 8   # the row kernels (delta, converts): 8 lanes per row

# Tile heuristics, first matching row wins: a row matches when D <= max_d and its
# shared memory fits the device. Tiles are fp32 for every storage dtype.
#   (max_d, BLOCK_M, BLOCK_N, reason)
HEURISTICS = (
    (64, 64, 64,
     "4 x 4 scores and dP per thread; 98 KB of shared memory and ~126 registers: "
     "two blocks per H100 / A100 SM"),
    (128, 32, 64,
     "dK, dV accumulators of 64 keys x 128 columns take 64 registers per thread; "
     "32-row query tiles keep shared memory at 113 KB"),
    (256, 32, 32,
     "D > 128: 32-key tiles keep dK, dV at 64 registers per thread and shared memory "
     "at 137 KB (sm_80 allows 163 KB)"),
    (256, 16, 16,
     "devices with 99 KB per block (sm_86, sm_89, sm_120) at D > 128: 67 KB at D = 256"),
)


@dataclasses.dataclass(frozen=True)
class Config:
    head_dim: int
    block_m: int
    block_n: int

    @property
    def smem(self) -> int:
        return smem_bytes(self.head_dim, self.block_m, self.block_n)


def smem_bytes(d: int, block_m: int, block_n: int) -> int:
    """``BwdTraits::SMEM_BYTES``: sK, sV, sQ, sdO rows of D rounded to 32 plus one,
    sP, sdS rows of BLOCK_N + 1, sLse and sDelta (fp32)."""
    ldd = -(-d // 32) * 32 + 1
    lds = block_n + 1
    return 4 * (2 * block_n * ldd + 2 * block_m * ldd + 2 * block_m * lds + 2 * block_m)


def config(head_dim: int, smem_limit: int = SM80_SMEM) -> Config | None:
    for max_d, bm, bn, _reason in HEURISTICS:
        c = Config(head_dim, bm, bn)
        if head_dim <= max_d and c.smem <= smem_limit:
            return c
    return None


def _traits(c: Config, dtype: str) -> str:
    return f"BwdTraits<{c.head_dim}, {c.block_m}, {c.block_n}, {CPP_DTYPE[dtype]}>"


def _tag(c: Config, dtype: str, vt: Variant) -> str:
    return f"D={c.head_dim},BM={c.block_m},BN={c.block_n},{SHORT_DTYPE[dtype]}{vt.suffix()}"


def dkdv_spec(c: Config, dtype: str, vt: Variant, atomic_dq: bool) -> jit.KernelSpec:
    expr = f"flash_bwd_dkdv<{_traits(c, dtype)}, {vt.cpp()}, {'true' if atomic_dq else 'false'}>"
    name = f"flash_bwd_dkdv[{_tag(c, dtype, vt)}{',atomic-dq' if atomic_dq else ''}]"
    return jit.KernelSpec("flash_bwd.cu", expr, name)


def dq_spec(c: Config, dtype: str, vt: Variant) -> jit.KernelSpec:
    expr = f"flash_bwd_dq<{_traits(c, dtype)}, {vt.cpp()}>"
    return jit.KernelSpec("flash_bwd.cu", expr, f"flash_bwd_dq[{_tag(c, dtype, vt)}]")


def delta_spec(dtype: str) -> jit.KernelSpec:
    return jit.KernelSpec("flash_bwd.cu", f"flash_bwd_delta<{CPP_DTYPE[dtype]}>",
                          f"flash_bwd_delta[{SHORT_DTYPE[dtype]}]")


def convert_spec(dtype: str, rows8: bool = False) -> jit.KernelSpec:
    """dq = dq_accum * scale; ``rows8``: dq_accum's rows in groups of 8
    (flash_mma_bwd.rows8)."""
    if rows8:
        return jit.KernelSpec("flash_bwd.cu", f"flash_bwd_dq_convert<{CPP_DTYPE[dtype]}, true>",
                              f"flash_bwd_dq_convert[{SHORT_DTYPE[dtype]},rows8]")
    return jit.KernelSpec("flash_bwd.cu", f"flash_bwd_dq_convert<{CPP_DTYPE[dtype]}>",
                          f"flash_bwd_dq_convert[{SHORT_DTYPE[dtype]}]")


def dkdv_convert_spec(dtype: str) -> jit.KernelSpec:
    return jit.KernelSpec("flash_bwd.cu", f"flash_bwd_dkdv_convert<{CPP_DTYPE[dtype]}>",
                          f"flash_bwd_dkdv_convert[{SHORT_DTYPE[dtype]}]")


def specs(c: Config, dtype: str, vt: Variant, deterministic: bool) -> list[jit.KernelSpec]:
    """Every instantiation one backward launch uses, in launch order."""
    if deterministic:
        return [delta_spec(dtype), dkdv_spec(c, dtype, vt, False), dq_spec(c, dtype, vt)]
    return [delta_spec(dtype), dkdv_spec(c, dtype, vt, True), convert_spec(dtype)]


@dataclasses.dataclass
class BwdTensors:
    """CuPy views for one backward launch (strides intact)."""

    fwd: Tensors        # q, k, v, out (the forward output), lse, mask
    dout: object
    dq: object
    dk: object
    dv: object
    delta: object       # float32 [B, Hq, Sq], contiguous
    # float32 [B, Hq, Sq, D], contiguous; None when deterministic, except for
    # flash_wgmma_bwd's ordered dQ: then B Hq Sq D floats and dq_turn_rows > 0, the
    # query rows per int32 turn counter behind them (kernels/common/params.cuh)
    dq_accum: object
    # flash_wgmma_bwd's split: kv_splits blocks per block of keys, summing dK and dV
    # into zeroed float32 [B, Hkv, Sk, D] buffers (None when not split)
    kv_splits: int = 1
    dk_accum: object = None
    dv_accum: object = None
    dq_turn_rows: int = 0
    # the ordered dQ's first key block of each query tile stores its dQ (1), so
    # flash_bwd_delta zeroes only the turn counters behind dq_accum's floats
    dq_store_first: int = 0
    # the ordered dQ's lockstep walk rotated per key block (flash_wgmma_bwd.rotated_turns)
    dq_rotate: int = 0


def bwd_params(p: Problem, t: BwdTensors) -> object:
    """The ``BwdParams`` struct for one launch."""
    values = {"fwd": fwd_params(p, t.fwd), "dout": t.dout.data.ptr, "dq": t.dq.data.ptr,
              "dk": t.dk.data.ptr, "dv": t.dv.data.ptr, "delta": t.delta.data.ptr}
    for name in ("dq_accum", "dk_accum", "dv_accum"):
        if getattr(t, name) is not None:
            values[name] = getattr(t, name).data.ptr
    values["kv_splits"] = t.kv_splits
    values["dq_turn_rows"] = t.dq_turn_rows
    values["dq_store_first"] = t.dq_store_first
    values["dq_rotate"] = t.dq_rotate
    for name in ("dout", "dq", "dk", "dv"):
        s = bhs_strides(getattr(t, name), p.layout)
        values.update({f"{name}_batch_stride": s[0], f"{name}_head_stride": s[1],
                       f"{name}_row_stride": s[2]})
    # delta: [B, Hq, Sq] contiguous, or [Hq, total_q] for packed sequences
    values.update(delta_batch_stride=0 if p.varlen else p.heads_q * p.seqlen_q,
                  delta_head_stride=p.seqlen_q)
    return make_struct(BWD_DTYPE, values)


def check(p: Problem, cc: int | None) -> str | None:
    """None if the fused backward runs ``p`` on compute capability ``cc``, else why not.

    Shared memory is checked at launch against the device itself: the last
    heuristics row (67 KB) fits every device of compute capability 7.0+ but sm_75.
    """
    if p.varlen:
        return "the flash backward takes no packed sequences (flash_mma and flash_wgmma do)"
    if p.dropout_p:
        return "the flash backward takes no dropout (flash_mma's and flash_wgmma's do)"
    if p.dtype not in DTYPES:
        return f"the flash backward takes {', '.join(DTYPES)}, not {p.dtype}"
    if p.head_dim > 256:
        return f"the flash backward takes head dims 1..256, not {p.head_dim}"
    if cc is not None and cc < 70:
        return f"the flash backward needs compute capability 7.0+, device has {cc / 10:.1f}"
    return grid_check(p)


def passes(p: Problem, t: BwdTensors, device_id: int, arch: str,
           deterministic: bool) -> list[tuple]:
    """The launches of ``p``'s backward in order: (loaded kernel, grid, block, shared
    bytes), each taking the one ``BwdParams`` struct."""
    from ..device import max_shared_per_block
    from ..errors import UnsupportedError

    limit = max_shared_per_block(device_id)
    c = config(p.head_dim, limit)
    if c is None:
        raise UnsupportedError(f"the flash backward at D={p.head_dim} needs more than the "
                               f"{limit // _KB} KB of shared memory per block this device has")
    k_delta, k_dkdv, k_dq = (jit.get_function(s, arch, device_id)
                             for s in specs(c, p.dtype, p.variant, deterministic))
    rows = (-(-p.seqlen_q // ROWS_PER_BLOCK), p.heads_q, p.batch)
    dq = ((k_dq, (-(-p.seqlen_q // c.block_m), p.heads_q, p.batch), (THREADS,), c.smem)
          if deterministic else (k_dq, rows, (THREADS,), 0))
    return [(k_delta, rows, (THREADS,), 0),
            (k_dkdv, (-(-p.seqlen_k // c.block_n), p.heads_kv, p.batch), (THREADS,), c.smem),
            dq]


def run_passes(launches: list[tuple], params: bytearray, stream_ptr: int,
               pointers: tuple = ()) -> None:
    """Launch ``launches`` (see :func:`passes`) with the struct's raw bytes. A launch
    of five entries also takes tensor maps: its fifth, called with ``pointers`` (q,
    k, v, dout, dq_accum), gives them as ctypes buffers (flash_wgmma_bwd)."""
    for kernel, grid, block, smem, *maps in launches:
        if maps:
            kernel.launch_packed(grid, block, params, smem, stream_ptr, tail=maps[0](*pointers))
        else:
            kernel.launch_packed(grid, block, params, smem, stream_ptr)


def launch_from(passes_of, p: Problem, t: BwdTensors, stream, device_id: int, arch: str,
                deterministic: bool) -> None:
    """A backward family's launch: the launches ``passes_of`` (its ``passes``) gives."""
    run_passes(passes_of(p, t, device_id, arch, deterministic),
               bytearray(bwd_params(p, t).tobytes()), stream.ptr,
               tuple(a.data.ptr for a in (t.fwd.q, t.fwd.k, t.fwd.v, t.dout))
               + (t.dq_accum.data.ptr if t.dq_accum is not None else 0,))


def launch(p: Problem, t: BwdTensors, stream, device_id: int, arch: str,
           deterministic: bool) -> None:
    launch_from(passes, p, t, stream, device_id, arch, deterministic)


def prepare(p: Problem, t: BwdTensors, device_id: int, arch: str,
            deterministic: bool) -> "HotBackward":
    return HotBackward(p, t, passes(p, t, device_id, arch, deterministic), aligned=False)


# dout, dq, dk, dv, dq_accum, delta, dk_accum, dv_accum: adjacent in BwdParams, behind
# the forward's struct
_GRAD_POINTERS = struct.Struct("<8Q")
_GRAD_OFFSET = BWD_DTYPE.fields["dout"][1]
assert BWD_DTYPE.fields["fwd"][1] == 0 and BWD_DTYPE.fields["dv_accum"][1] == _GRAD_OFFSET + 56


class HotBackward:
    """A backward's launches with everything but the data pointers fixed (the hot
    path of :func:`cupy_attention.attention_backward`): the ``BwdParams`` bytes of the
    first call, whose pointers are patched per call. ``aligned``: the launches are the
    16-byte copy kernels, which need 16-byte aligned q, k, v and dout (:meth:`run`
    says False for other pointers, and the caller takes the general path)."""

    def __init__(self, p: Problem, t: BwdTensors, launches: list[tuple], aligned: bool):
        self.template = bwd_params(p, t).tobytes()
        self.launches = launches
        self.aligned = aligned
        self.kv_splits = t.kv_splits   # > 1: the caller hands in zeroed dk_accum, dv_accum

    def run(self, q: int, k: int, v: int, out: int, lse: int, dout: int, dq: int, dk: int,
            dv: int, dq_accum: int, delta: int, stream_ptr: int, dk_accum: int = 0,
            dv_accum: int = 0, cu: tuple | None = None) -> bool:
        """Launch for these pointers; ``cu``: packed sequences' (cu_seqlens_q,
        cu_seqlens_k) pointers, patched in too (None keeps the template's)."""
        if self.aligned and (q | k | v | dout) & 15:
            return False
        buf = bytearray(self.template)
        _POINTERS.pack_into(buf, 0, q, k, v, out, lse)
        if cu is not None:
            _CU_POINTERS.pack_into(buf, _CU_OFFSET, *cu)   # BwdParams starts with FwdParams
        _GRAD_POINTERS.pack_into(buf, _GRAD_OFFSET, dout, dq, dk, dv, dq_accum, delta, dk_accum,
                                 dv_accum)
        run_passes(self.launches, buf, stream_ptr, (q, k, v, dout, dq_accum))
        return True


# CI spread: every head dim of the test grid once (both tile kernels) with dtype /
# causal / mask / atomic dQ rotating so each value of each axis appears, the common
# training shapes (D = 64, 128, every dtype, causal or not), and the
# small-shared-memory fallback.
_CI_HEAD_DIMS = (1, 8, 32, 40, 59, 64, 72, 80, 96, 111, 128, 160, 192, 224, 256)
_CI_MASKS = ("none", "bool", "add")


def ci_specs() -> list[jit.KernelSpec]:
    """A representative set of instantiations that CI compiles for sm_80 and sm_90a."""
    dtypes = tuple(CPP_DTYPE)
    out = []
    for dtype in dtypes:
        out += [delta_spec(dtype), convert_spec(dtype), dkdv_convert_spec(dtype)]
    for idx, d in enumerate(_CI_HEAD_DIMS):
        c = config(d)
        dtype, causal, mask = dtypes[idx % 3], idx % 2 == 1, _CI_MASKS[(idx // 2) % 3]
        vt = Variant(causal, dense=mask)
        out.append(dkdv_spec(c, dtype, vt, idx % 4 != 3))
        out.append(dq_spec(c, dtype, vt))
    for d in (64, 128):
        for dtype in dtypes:
            for causal in (False, True):
                out.append(dkdv_spec(config(d), dtype, Variant(causal), True))
    small = config(256, 99 * _KB)
    out += specs(small, "bfloat16", Variant(True, dense="bool"), False)
    out += specs(small, "float16", Variant(dense="add"), True)
    return list(dict.fromkeys(out))
