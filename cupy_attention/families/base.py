"""What every kernel family provides, and the shared launch plumbing.

A family is one way to compute the forward pass (one source file under
``kernels/``). It states what it supports (:meth:`Family.check`), how it picks a
configuration for a problem, which instantiations CI compiles, and how to
launch. ``Tensors`` carries CuPy views of the caller's arrays (strides intact).
"""

from __future__ import annotations

import dataclasses
import os
import struct

import numpy as np

from .. import jit, tuning
from ..params import FWD_DTYPE, make_struct
from ..problem import Problem
from ..variant import Variant, dropout_params

LOG2E = 1.4426950408889634
HOPPER_SMEM = 227 * 1024  # opt-in shared memory per block of sm_90 (and sm_100)

CPP_DTYPE = {"float32": "float", "float16": "f16", "bfloat16": "bf16"}
SHORT_DTYPE = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
CPP_DENSE = {"none": "NoDense", "bool": "BoolDense", "add": "AddDense"}
MASK_SUFFIX = {"none": "", "bool": ",bool-mask", "add": ",add-mask"}


@dataclasses.dataclass
class Tensors:
    q: object
    k: object
    v: object
    out: object
    lse: object = None    # float32 [B, Hq, Sq] (varlen: [Hq, total_q]) or None
    mask: object = None   # broadcast to [B, Hq, Sq, Sk]: uint8 or float32, or None
    cu_seqlens_q: object = None   # varlen: int32 [B + 1]
    cu_seqlens_k: object = None
    alibi_slopes: object = None   # float32 [Hq] or [B, Hq], or None


def bhs_strides(arr, layout: str):
    """(batch, head, row) strides in elements of a rank-4 q/k/v/out view, or of a
    rank-3 packed one (layout "thd": [total, H, D], batch stride 0)."""
    s = [x // arr.itemsize for x in arr.strides]
    if layout == "thd":
        return (0, s[1], s[0])
    return (s[0], s[1], s[2]) if layout == "bhsd" else (s[0], s[2], s[1])


def fwd_params(p: Problem, t: Tensors, scratch=None) -> np.void:
    """The ``FwdParams`` struct for one launch."""
    qs, ks, vs, os_ = (bhs_strides(a, p.layout) for a in (t.q, t.k, t.v, t.out))
    scale_log2 = float(np.float32(p.scale * LOG2E))
    scale_log2_lo = p.scale * LOG2E - scale_log2
    values = {
        "q": t.q.data.ptr, "k": t.k.data.ptr, "v": t.v.data.ptr, "o": t.out.data.ptr,
        "q_batch_stride": qs[0], "q_head_stride": qs[1], "q_row_stride": qs[2],
        "k_batch_stride": ks[0], "k_head_stride": ks[1], "k_row_stride": ks[2],
        "v_batch_stride": vs[0], "v_head_stride": vs[1], "v_row_stride": vs[2],
        "o_batch_stride": os_[0], "o_head_stride": os_[1], "o_row_stride": os_[2],
        "batch": p.batch, "heads_q": p.heads_q, "heads_kv": p.heads_kv, "group": p.group,
        "seqlen_q": p.seqlen_q, "seqlen_k": p.seqlen_k, "head_dim": p.head_dim,
        "scale": p.scale, "scale_log2": scale_log2, "scale_log2_lo": scale_log2_lo,
        **p.variant.params(p.seqlen_q, p.seqlen_k, p.scale),
    }
    if t.lse is not None:
        ls = [x // 4 for x in t.lse.strides]
        if p.varlen:  # [Hq, total_q]
            ls = [0, ls[0]]
        values.update(lse=t.lse.data.ptr, lse_batch_stride=ls[0], lse_head_stride=ls[1])
    if p.varlen:
        values.update(cu_seqlens_q=t.cu_seqlens_q.data.ptr, cu_seqlens_k=t.cu_seqlens_k.data.ptr)
    if t.mask is not None:
        ms = [x // t.mask.itemsize for x in t.mask.strides]
        values.update(mask=t.mask.data.ptr, mask_batch_stride=ms[0], mask_head_stride=ms[1],
                      mask_row_stride=ms[2], mask_col_stride=ms[3])
    if t.alibi_slopes is not None:
        a = t.alibi_slopes
        values.update(alibi_slopes=a.data.ptr,
                      alibi_batch_stride=a.strides[0] // 4 if len(a.shape) == 2 else 0)
    if p.dropout_p:
        values.update(dropout_params(p.dropout_p, p.dropout_seed, p.dropout_offset))
    if scratch is not None:
        values["scratch"] = scratch.data.ptr
    return make_struct(FWD_DTYPE, values)


_POINTERS = struct.Struct("<5Q")  # q, k, v, o, lse: the first fields of FwdParams
_CU_POINTERS = struct.Struct("<2Q")  # cu_seqlens_q, cu_seqlens_k (adjacent in FwdParams)
_CU_OFFSET = FWD_DTYPE.fields["cu_seqlens_q"][1]
assert FWD_DTYPE.fields["cu_seqlens_k"][1] == _CU_OFFSET + 8


class HotLaunch:
    """One family's launch with everything but the data pointers fixed.

    ``variants(vec)`` returns (loaded kernel, grid, block, shared bytes) for the
    aligned (vec) or unaligned code path; the params struct is a packed template
    whose five leading pointers are patched per call. ``extra(vec, q, k, v, stream)``,
    where given, returns the kernel arguments that follow the struct as ctypes objects
    holding their bytes (jit's ``launch_packed`` ``tail``; flash_wgmma: tensor maps of
    Q, K and V, its work tile counter and two ints).
    """

    def __init__(self, p: Problem, t: Tensors, strides_aligned: bool, variants, extra=None):
        self.template = fwd_params(p, t).tobytes()
        self.strides_aligned = strides_aligned
        self.variants = variants
        self.extra = extra

    def run(self, q: int, k: int, v: int, o: int, lse: int, stream, cu=None) -> None:
        """Launch for these pointers; ``cu``: packed sequences' (cu_seqlens_q,
        cu_seqlens_k) pointers, patched in too (None keeps the template's)."""
        vec = self.strides_aligned and not ((q | k | v | o) & 15)
        kernel, grid, block, smem = self.variants(vec)
        buf = bytearray(self.template)
        _POINTERS.pack_into(buf, 0, q, k, v, o, lse)
        if cu is not None:
            _CU_POINTERS.pack_into(buf, _CU_OFFSET, *cu)
        tail = () if self.extra is None else self.extra(vec, q, k, v, stream)
        kernel.launch_packed(grid, block, buf, smem, stream.ptr, tail=tail)


# Sections of a tile grid (section_block in kernels/common/seqs.cuh): under a causal
# band a grid of one (head, batch) pair after another starts the last pair's heaviest
# block near the end. Sections of G pairs go block by block over G pairs, so each
# section starts its heaviest blocks first. H200, bf16, B*S = 16k, flash_wgmma's
# backward (benchmarks/results/notes-bwd-loops.md section 21): 3-4% at D = 128 and
# 2.5-3.6% at D = 256 for S = 2k-4k with G up to 8. A section's pairs walk their
# query tiles at once, so G shrinks as the keys grow: G * Sk up to SECTION_KEYS
# (section 42: a per-block trace at S = 8k, G = 1, D = 128: the last pair's heaviest
# blocks ran 5.6% past the SMs' mean finish; G = 2-4 there ran 1.02-1.04x, G = 4 at 4k
# 1.01-1.03x over G = 8; at 16k keys G = 2 or 4 read 0.98-1.02x G = 1). flash_mma's
# forward takes FWD_SECTION_KEYS: with 16k it lost up to 3.6% at 4k (G = 4 against
# 8); with 32k it keeps G = 8 at 4k and gains 3-11% at 8k (G = 4 against 1).
SECTION = 8
SECTION_KEYS = 16384
FWD_SECTION_KEYS = 32768


def sectioned(vt: Variant) -> bool:
    """Whether a tile grid of the variant ``vt`` may come in sections (section): fixed
    lengths under a band with an upper bound (causal)."""
    return not vt.ragged and not vt.cache and bool(vt.band_flags[1])


def section(p: Problem, heads: int, keys: int = SECTION_KEYS) -> int:
    """G (head, batch) pairs a section of a tile grid over ``heads`` heads of each batch
    entry; 1: one pair after another. The largest divisor of B * heads up to SECTION
    (``CUPY_ATTENTION_SECTION`` overrides that bound) and up to ``keys`` keys over the
    section's pairs, where ``sectioned`` holds."""
    if not sectioned(p.variant):
        return 1
    bound = int(os.environ.get("CUPY_ATTENTION_SECTION", SECTION))
    bound = min(bound, keys // max(1, p.seqlen_k))
    pairs = heads * p.batch
    return max((g for g in range(1, max(1, bound) + 1)
                if pairs % g == 0 and pairs // g <= 65535), default=1)


def section_grid(blocks: int, heads: int, batch: int, g: int) -> tuple:
    """The grid of ``blocks`` blocks per (head, batch) pair in sections of ``g`` pairs."""
    return (blocks * g, heads * batch // g, 1) if g > 1 else (blocks, heads, batch)


def grid_check(p: Problem) -> str | None:
    if p.varlen:
        if p.heads_q > 65535:
            return f"Hq={p.heads_q} must be at most 65535 (CUDA grid limits)"
        return None
    if p.heads_q > 65535 or p.batch > 65535:
        return f"B={p.batch} and Hq={p.heads_q} must each be at most 65535 (CUDA grid limits)"
    return None


class Family:
    """Base class of a forward kernel family."""

    name: str = ""
    summary: str = ""
    source: str = ""
    dtypes: tuple = ("float32", "float16", "bfloat16")
    max_head_dim: int = 256
    min_cc: int = 0
    memory: str = "O(S)"
    # Architectures CI compiles ci_specs() for; a family whose instructions exist on
    # Hopper alone (wgmma) lists only sm_90a.
    ci_archs: tuple = ("sm_80", "sm_90a")

    def head_dim_range(self) -> str:
        return f"1..{self.max_head_dim}"

    def auto_takes(self, p: Problem) -> bool:
        """Whether ``kernel="auto"`` picks this family for ``p`` when ``check`` allows it
        (a family may run a problem that another runs faster)."""
        return True

    # Packed sequences (attention_varlen): families that instantiate RaggedSeqs.
    varlen: bool = False
    # Attention dropout: families that instantiate PhiloxDropout.
    dropout: bool = False

    def check(self, p: Problem, cc: int | None) -> str | None:
        """None if this family runs ``p`` on a device of compute capability ``cc``,
        else the reason it cannot."""
        if p.varlen and not self.varlen:
            return f"{self.name} takes no packed sequences (flash_mma and flash_wgmma do)"
        if p.dropout_p and not self.dropout:
            return f"{self.name} takes no dropout (flash_mma and flash_wgmma do)"
        if p.dtype not in self.dtypes:
            return f"{self.name} takes {', '.join(self.dtypes)}, not {p.dtype}"
        if p.head_dim > self.max_head_dim:
            return f"{self.name} takes head dims {self.head_dim_range()}, not {p.head_dim}"
        if cc is not None and cc < self.min_cc:
            return f"{self.name} needs compute capability {self.min_cc / 10:.1f}+, device has {cc / 10:.1f}"
        return grid_check(p)

    def launch(self, p: Problem, t: Tensors, stream, device_id: int, arch: str) -> None:
        raise NotImplementedError

    def prepare(self, p: Problem, t: Tensors, device_id: int, arch: str):
        """A :class:`HotLaunch` that repeats this launch for new pointers, or None.

        Called after a launch succeeded; the API keeps it for later calls with the
        same shapes, strides and dtypes, so they skip validation and packing.
        """
        return None

    def ci_specs(self) -> list[jit.KernelSpec]:
        """A representative set of instantiations that CI compiles for each of ``ci_archs``."""
        raise NotImplementedError

    # -- tile configurations (``cupy-attention tune``, docs/tuning.md) ---------
    def table_config(self, p: Problem, smem_limit: int = HOPPER_SMEM) -> tuple:
        """The configuration the family's measured table / heuristics give ``p`` on a
        device with ``smem_limit`` bytes of shared memory per block: a tuple of ints.
        Families with nothing to tune return a fixed description of their launch."""
        return ()

    def candidates(self, p: Problem, smem_limit: int = HOPPER_SMEM) -> list[tuple]:
        """Configurations worth timing for ``p``, the table's first; every one compiles
        and fits ``smem_limit``. One entry: nothing to tune."""
        return [self.table_config(p, smem_limit)]

    def config_for(self, p: Problem, device_id: int, smem_limit: int = HOPPER_SMEM) -> tuple:
        """The configuration a launch of ``p`` on ``device_id`` uses: a tuned one
        (:func:`cupy_attention.tuning.lookup`) when the tuned table has an entry that is
        still one of :meth:`candidates`, else the table's. Called where a launch is
        planned (a hot call reuses the plan), not per call."""
        table = self.table_config(p, smem_limit)
        tuned = tuning.lookup(self.name, p, device_id)
        if tuned is not None and tuned != table and tuned in self.candidates(p, smem_limit):
            return tuned
        return table
