"""`decode`: a few query rows per sequence against a contiguous or paged KV cache
(``kernels/decode.cu``), split over the keys when the batch is too small to fill
the GPU, the splits combined by ``kernels/merge.cu``.

The planning (:func:`plan`) is host arithmetic only, memoized per shape: which
instantiation (packed rows per block, pipeline depth), how many blocks per
sequence, how many key splits. ``ca.attention`` takes this family under
``kernel="auto"`` for ``Sq <= AUTO_MAX_SEQLEN_Q``; :mod:`cupy_attention.decode`
is the paged-cache entry point.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import struct

import numpy as np

from .. import jit
from ..params import FWD_DTYPE, make_struct
from ..problem import Problem
from ..variant import Variant
from .base import CPP_DTYPE, LOG2E, SHORT_DTYPE, Family, Tensors, bhs_strides
from .flash_mma import strides_aligned, vectorizable_arrays

WARPS = 4
# ca.attention(kernel="auto") sends problems with at most this many query rows here.
AUTO_MAX_SEQLEN_Q = 8

# Packed query rows per block (query heads of one KV group x queries), smallest row
# whose bound covers group * Sq; more rows take several blocks of 8.
# (max packed rows, ROWS, STAGES, reason)
ROW_TILES = (
    (1, 1, 4, "MHA, Sq = 1: one row; a ring of 4 stages of 16 KB (K+V), 3 in flight"),
    (2, 2, 4, "as above; rQ + acc = 32 registers"),
    (4, 4, 4, "rQ + acc = 64 registers, 4 keys per slot per tile"),
    (8, 8, 6, "rQ + acc = 128 registers leave room for 2 keys per slot per tile "
              "(half-size tiles), so 6 stages keep as many bytes in flight"),
)

# Split-KV: blocks (row blocks x Hkv x B) below this many per SM split each
# sequence's keys so that the grid reaches it; a split streams at least
# MIN_SPLIT_KEYS keys (its partial costs D fp32 per row to write and merge, against
# 4 D bytes per key read) and there are at most MAX_SPLITS.
SPLIT_BLOCKS_PER_SM = 2
MIN_SPLIT_KEYS = 256
MAX_SPLITS = 64
# A grid that fills the GPU without splitting (many sequences) runs more blocks per
# SM with a two-tile ring than with ROW_TILES' four: H100, bf16, Hq/Hkv 32/8, D 128,
# B = 64, Sk = 4k: contiguous 2.22 -> 2.90 TB/s, page size 1: 1.35 -> 2.13; split
# grids kept four stages (benchmarks/results/notes-decode.md).
UNSPLIT_STAGES = 2

_PTR, _I64, _I32 = np.uint64, np.int64, np.int32
# Mirrors of kernels/common/paged.cuh (CacheParams), kernels/decode.cu (DecodeParams)
# and kernels/merge.cu (StateView, MergeParams); tests/test_decode.py checks every
# offset with NVRTC.
CACHE_DTYPE = np.dtype([("block_table", _PTR), ("seqlens", _PTR), ("block_table_stride", _I64),
                        ("page_size", _I32), ("max_pages", _I32)], align=True)
DECODE_DTYPE = np.dtype([("fwd", FWD_DTYPE), ("cache", CACHE_DTYPE), ("o_part", _PTR),
                         ("lse_part", _PTR), ("num_splits", _I32), ("split_keys", _I32)],
                        align=True)
STATE_DTYPE = np.dtype([("o", _PTR), ("lse", _PTR), ("o_stride", _I64, (4,)),
                        ("lse_stride", _I64, (4,)), ("states", _I32)], align=True)
MERGE_DTYPE = np.dtype([("a", STATE_DTYPE), ("b", STATE_DTYPE), ("o", _PTR), ("lse", _PTR),
                        ("o_stride", _I64, (3,)), ("lse_stride", _I64, (3,)), ("n0", _I32),
                        ("n1", _I32), ("n2", _I32), ("head_dim", _I32)], align=True)
MERGE_WARPS = 4
APPEND_DTYPE = np.dtype([("k_new", _PTR), ("v_new", _PTR), ("k_cache", _PTR), ("v_cache", _PTR),
                         ("cache", CACHE_DTYPE)]
                        + [(f"{x}_{w}_stride", _I64) for x in ("k_new", "v_new")
                           for w in ("batch", "row", "head")]
                        + [(f"{x}_{w}_stride", _I64) for x in ("k", "v")
                           for w in ("page", "row", "head")]
                        + [("seqlen_new", _I32), ("head_dim", _I32)], align=True)
APPEND_THREADS = 64


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def row_tile(rows_total: int):
    """(ROWS, STAGES) for group * Sq packed rows."""
    for bound, rows, stages, _ in ROW_TILES:
        if rows_total <= bound:
            return rows, stages
    return ROW_TILES[-1][1], ROW_TILES[-1][2]


def traits(head_dim: int, rows: int):
    """(LANES, SLOTS, BLOCK_N) of DecodeTraits (kernels/decode.cu)."""
    chunks = -(-head_dim // 8)
    lanes = _pow2_at_least(chunks)
    slots = WARPS * (32 // lanes)
    return lanes, slots, slots * (2 if rows > 4 else 4)


def smem_bytes(head_dim: int, rows: int, stages: int) -> int:
    """``sizeof(DecodeTraits::Storage)``: the K/V ring, or the slots' merge area."""
    d_pad = -(-head_dim // 8) * 8
    _, slots, block_n = traits(head_dim, rows)
    ring = 2 * stages * block_n * d_pad * 2
    merge = slots * rows * d_pad * 4 + 2 * slots * rows * 4
    return max(ring, merge)


def split_count(blocks: int, capacity: int, sms: int) -> int:
    """Key splits per sequence for ``blocks`` blocks of ``capacity`` keys each."""
    want = -(-SPLIT_BLOCKS_PER_SM * sms // max(blocks, 1))
    most = max(1, capacity // MIN_SPLIT_KEYS)
    return max(1, min(want, most, MAX_SPLITS))


@dataclasses.dataclass(frozen=True)
class DecodeShape:
    """What a decode launch's configuration depends on (hashable)."""

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    # the keys the split plan is made for: the longest sequence where the host knows
    # it, else the cache's capacity (Sk of a contiguous cache, pages x page size)
    capacity: int
    head_dim: int
    dtype: str
    variant: Variant
    paged: bool

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv


@dataclasses.dataclass(frozen=True)
class Plan:
    spec: jit.KernelSpec
    rows: int
    row_blocks: int
    num_splits: int
    split_keys: int
    smem: int
    threads: int = 32 * WARPS

    def grid(self, s: DecodeShape) -> tuple:
        return (self.row_blocks * self.num_splits, s.heads_kv, s.batch)


def spec(head_dim: int, dtype: str, rows: int, stages: int, variant: Variant, paged: bool,
         vec: bool) -> jit.KernelSpec:
    t = (f"DecodeTraits<{head_dim}, {rows}, {WARPS}, {stages}, {CPP_DTYPE[dtype]}, "
         f"{'true' if vec else 'false'}, {'true' if paged else 'false'}>")
    name = (f"decode[D={head_dim},R={rows},ST={stages},{SHORT_DTYPE[dtype]}"
            f"{',paged' if paged else ''}{variant.suffix()}{'' if vec else ',unaligned'}]")
    return jit.KernelSpec("decode.cu", f"decode_fwd<{t}, {variant.cpp()}>", name)


def merge_spec(in_dtype: str, out_dtype: str, head_dim: int) -> jit.KernelSpec:
    per_lane = _pow2_at_least(-(-head_dim // 32))
    expr = f"merge_states<{CPP_DTYPE[in_dtype]}, {CPP_DTYPE[out_dtype]}, {per_lane}>"
    name = f"merge[{SHORT_DTYPE[in_dtype]}->{SHORT_DTYPE[out_dtype]},D<={32 * per_lane}]"
    return jit.KernelSpec("merge.cu", expr, name)


def append_spec(dtype: str, vec: bool, paged: bool) -> jit.KernelSpec:
    expr = (f"append_kv<{CPP_DTYPE[dtype]}, {'true' if vec else 'false'}, "
            f"{'true' if paged else 'false'}>")
    name = (f"append_kv[{SHORT_DTYPE[dtype]}{',paged' if paged else ''}"
            f"{'' if vec else ',unaligned'}]")
    return jit.KernelSpec("append.cu", expr, name)


@functools.lru_cache(maxsize=4096)
def plan(s: DecodeShape, vec: bool, sms: int, num_splits: int | None = None) -> Plan:
    """The launch of ``s`` on a GPU of ``sms`` multiprocessors (``num_splits`` forces
    the split count, for tests and benchmarks)."""
    rows_total = s.group * s.seqlen_q
    rows, stages = row_tile(rows_total)
    row_blocks = -(-rows_total // rows)
    _, _, block_n = traits(s.head_dim, rows)
    if num_splits is None:
        num_splits = split_count(row_blocks * s.heads_kv * s.batch, s.capacity, sms)
    split_keys = -(-max(-(-s.capacity // num_splits), 1) // block_n) * block_n
    num_splits = max(1, -(-s.capacity // split_keys))
    if num_splits == 1 and rows <= 4:
        stages = UNSPLIT_STAGES
    return Plan(spec(s.head_dim, s.dtype, rows, stages, s.variant, s.paged, vec), rows,
                row_blocks, num_splits, split_keys, smem_bytes(s.head_dim, rows, stages))


def _ptr(x) -> int:
    return 0 if x is None else x.data.ptr


def _strides(x) -> list:
    return [st // x.itemsize for st in x.strides]


def decode_params(s: DecodeShape, scale: float, q, k, v, out, lse, *, q_strides, o_strides,
                  k_strides, v_strides, lse_strides=(0, 0, 0), block_table=None, seqlens=None,
                  page_size=0, o_part=None, lse_part=None, p: Plan) -> np.void:
    """The ``DecodeParams`` struct. ``*_strides``: (batch, head, row) of q, out and lse
    in elements, (page or batch, head, row) of the caches."""
    scale_log2 = float(np.float32(scale * LOG2E))
    fwd = {
        "q": _ptr(q), "k": _ptr(k), "v": _ptr(v), "o": _ptr(out), "lse": _ptr(lse),
        "q_batch_stride": q_strides[0], "q_head_stride": q_strides[1], "q_row_stride": q_strides[2],
        "k_batch_stride": k_strides[0], "k_head_stride": k_strides[1], "k_row_stride": k_strides[2],
        "v_batch_stride": v_strides[0], "v_head_stride": v_strides[1], "v_row_stride": v_strides[2],
        "o_batch_stride": o_strides[0], "o_head_stride": o_strides[1], "o_row_stride": o_strides[2],
        "batch": s.batch, "heads_q": s.heads_q, "heads_kv": s.heads_kv, "group": s.group,
        "seqlen_q": s.seqlen_q, "seqlen_k": s.capacity, "head_dim": s.head_dim,
        "scale": scale, "scale_log2": scale_log2, "scale_log2_lo": scale * LOG2E - scale_log2,
        # the band for Sk = 0: the kernel adds each sequence's own length
        **s.variant.params(s.seqlen_q, 0, scale),
    }
    fwd.update(lse_batch_stride=lse_strides[0], lse_head_stride=lse_strides[1])
    cache = {"block_table": _ptr(block_table), "seqlens": _ptr(seqlens), "page_size": page_size}
    if block_table is not None:
        cache.update(block_table_stride=_strides(block_table)[0],
                     max_pages=block_table.shape[1])
    return make_struct(DECODE_DTYPE, {
        "fwd": make_struct(FWD_DTYPE, fwd), "cache": make_struct(CACHE_DTYPE, cache),
        "o_part": _ptr(o_part), "lse_part": _ptr(lse_part), "num_splits": p.num_splits,
        "split_keys": p.split_keys})


def merge_params(views, o, o_strides, lse, lse_strides, dims, head_dim) -> np.void:
    """``MergeParams``: ``views`` are up to two (o, lse, o_strides[4], lse_strides[4],
    states) stacks; strides in elements; ``dims`` = (n0, n1, n2)."""
    m = np.zeros((), MERGE_DTYPE)
    for key, view in zip(("a", "b"), views):
        vo, vl, vos, vls, states = view
        m[key]["o"], m[key]["lse"] = _ptr(vo), _ptr(vl)
        m[key]["o_stride"], m[key]["lse_stride"] = vos, vls
        m[key]["states"] = states
    m["o"], m["lse"] = _ptr(o), _ptr(lse)
    m["o_stride"], m["lse_stride"] = o_strides, lse_strides
    m["n0"], m["n1"], m["n2"] = dims
    m["head_dim"] = head_dim
    return m[()]


def launch_merge(params: np.void, rows: int, kspec: jit.KernelSpec, stream, device_id: int,
                 arch: str) -> None:
    kernel = jit.get_function(kspec, arch, device_id)
    kernel.launch((-(-rows // MERGE_WARPS),), (32 * MERGE_WARPS,), (params,), 0, stream)


_POINTERS = struct.Struct("<5Q")   # q, k, v, o, lse: the first fields of DecodeParams.fwd
_PARTS = struct.Struct("<2Q")      # o_part, lse_part
_PARTS_AT = DECODE_DTYPE.fields["o_part"][1]
# MergeParams: a.o, a.lse, o, lse
_MERGE_AT = (MERGE_DTYPE.fields["a"][1] + STATE_DTYPE.fields["o"][1],
             MERGE_DTYPE.fields["a"][1] + STATE_DTYPE.fields["lse"][1],
             MERGE_DTYPE.fields["o"][1], MERGE_DTYPE.fields["lse"][1])


class DecodeLaunch:
    """One decode configuration with everything but the data pointers fixed.

    ``run(q, k, v, out, lse, stream)`` patches the five pointers into a packed
    DecodeParams, allocates the split partials (on ``stream``), launches the decode
    and, with splits, the merge of the partials into out and lse. ``tensors``:
    decode_params' keyword arguments (their pointers are placeholders, except the
    block table and lengths, which stay fixed)."""

    def __init__(self, s: DecodeShape, scale: float, p: Plan, o_strides, lse_strides,
                 device_id: int, arch: str, **tensors):
        self.s, self.p = s, p
        self.template = decode_params(s, scale, tensors.pop("q"), tensors.pop("k"),
                                      tensors.pop("v"), None, None, o_strides=o_strides,
                                      lse_strides=lse_strides, p=p, **tensors).tobytes()
        self.kernel = jit.get_function(p.spec, arch, device_id)
        self.grid = p.grid(s)
        if p.num_splits > 1:
            rows = s.batch * s.heads_q * s.seqlen_q
            o4 = (rows * s.head_dim, s.heads_q * s.seqlen_q * s.head_dim,
                  s.seqlen_q * s.head_dim, s.head_dim)
            l4 = (rows, s.heads_q * s.seqlen_q, s.seqlen_q, 1)
            self.merge_template = merge_params(
                ((None, None, o4, l4, p.num_splits),), None, o_strides, None, lse_strides,
                (s.batch, s.heads_q, s.seqlen_q), s.head_dim).tobytes()
            self.merge_kernel = jit.get_function(merge_spec("float32", s.dtype, s.head_dim),
                                                 arch, device_id)
            self.merge_grid = (-(-rows // MERGE_WARPS),)

    def run(self, q: int, k: int, v: int, o: int, lse: int, stream) -> None:
        import cupy

        s, p = self.s, self.p
        buf = bytearray(self.template)
        _POINTERS.pack_into(buf, 0, q, k, v, o, lse)
        if p.num_splits == 1:
            self.kernel.launch(self.grid, (p.threads,), (np.frombuffer(buf, DECODE_DTYPE)[0],),
                               p.smem, stream)
            return
        with stream:   # the partials live on the launch stream (stream-ordered reuse)
            o_part = cupy.empty((p.num_splits, s.batch, s.heads_q, s.seqlen_q, s.head_dim),
                                dtype=cupy.float32)
            lse_part = cupy.empty((p.num_splits, s.batch, s.heads_q, s.seqlen_q),
                                  dtype=cupy.float32)
        _PARTS.pack_into(buf, _PARTS_AT, o_part.data.ptr, lse_part.data.ptr)
        self.kernel.launch(self.grid, (p.threads,), (np.frombuffer(buf, DECODE_DTYPE)[0],),
                           p.smem, stream)
        mbuf = bytearray(self.merge_template)
        for at, ptr in zip(_MERGE_AT, (o_part.data.ptr, lse_part.data.ptr, o, lse)):
            struct.pack_into("<Q", mbuf, at, ptr)
        self.merge_kernel.launch(self.merge_grid, (32 * MERGE_WARPS,),
                                 (np.frombuffer(mbuf, MERGE_DTYPE)[0],), 0, stream)


def launch_decode(s: DecodeShape, scale: float, p: Plan, out, lse, o_strides, stream,
                  device_id: int, arch: str, **tensors) -> None:
    """Decode (and, with splits, the merge of its partials) on ``stream``.
    ``tensors``: decode_params' keyword arguments."""
    lse_strides = (0, 0, 0) if lse is None else (*_strides(lse)[:2], 1)
    q, k, v = (tensors[n].data.ptr for n in ("q", "k", "v"))
    DecodeLaunch(s, scale, p, o_strides, lse_strides, device_id, arch, **tensors).run(
        q, k, v, out.data.ptr, _ptr(lse), stream)


class HotDecode:
    """What ``ca.attention``'s hot path repeats for new pointers (HotLaunch's
    interface): the aligned or the element-copy launch, chosen per call."""

    def __init__(self, make, strides_aligned: bool):
        self.make = functools.lru_cache(maxsize=2)(make)
        self.strides_aligned = strides_aligned

    def run(self, q: int, k: int, v: int, o: int, lse: int, stream) -> None:
        vec = self.strides_aligned and not ((q | k | v | o) & 15)
        self.make(vec).run(q, k, v, o, lse, stream)


def launch_append(k_cache, v_cache, k_new, v_new, *, seqlens, block_table, page_size, dtype,
                  stream, device_id: int, arch: str) -> None:
    """Write k_new, v_new [B, S_new, Hkv, D] at positions seqlens[b] + t of the caches
    ([B, Sk, Hkv, D] contiguous, or [pages, page_size, Hkv, D] with block_table)."""
    B, s_new, hkv, d = k_new.shape
    if not (B and s_new and hkv and d):
        return
    nk, nv, ck, cv = (_strides(x) for x in (k_new, v_new, k_cache, v_cache))
    cache = {"block_table": _ptr(block_table), "seqlens": _ptr(seqlens), "page_size": page_size}
    if block_table is not None:
        cache.update(block_table_stride=_strides(block_table)[0], max_pages=block_table.shape[1])
    values = {"k_new": _ptr(k_new), "v_new": _ptr(v_new), "k_cache": _ptr(k_cache),
              "v_cache": _ptr(v_cache), "cache": make_struct(CACHE_DTYPE, cache),
              "seqlen_new": s_new, "head_dim": d}
    for name, st in (("k_new", nk), ("v_new", nv)):
        values.update({f"{name}_batch_stride": st[0], f"{name}_row_stride": st[1],
                       f"{name}_head_stride": st[2]})
    for name, st in (("k", ck), ("v", cv)):
        values.update({f"{name}_page_stride": st[0], f"{name}_row_stride": st[1],
                       f"{name}_head_stride": st[2]})
    vec = vectorizable_arrays(d, (k_new, v_new, k_cache, v_cache))
    kernel = jit.get_function(append_spec(dtype, vec, block_table is not None), arch, device_id)
    kernel.launch((s_new, hkv, B), (APPEND_THREADS,), (make_struct(APPEND_DTYPE, values),), 0,
                  stream)


class Decode(Family):
    name = "decode"
    summary = ("few query rows per sequence: GQA heads packed per block, split-KV with a "
               "merge (cp.async, CUDA cores)")
    source = "decode.cu"
    dtypes = ("float16", "bfloat16")
    min_cc = 80

    def check(self, p: Problem, cc: int | None) -> str | None:
        reason = super().check(p, cc)
        if reason is not None:
            return reason
        if p.seqlen_q > AUTO_MAX_SEQLEN_Q:
            return f"decode takes Sq <= {AUTO_MAX_SEQLEN_Q} query rows, not {p.seqlen_q}"
        if p.mask_kind != "none":
            return "decode takes no dense mask"
        if p.alibi:
            return ("decode takes no ALiBi (its blocks see a split's keys, not the "
                    "sequence's length)")
        return None

    def auto_takes(self, p: Problem) -> bool:
        """GQA/MQA only: packing a group's query heads onto each K/V read is where this
        kernel wins; with one query row per KV head the tensor-core families ran it
        faster (H100, bf16, B = 8, H = 32, Sq = 1, Sk = 8k, MHA: decode 0.86-0.89x the
        previous choice; benchmarks/results/notes-variant-ab.md)."""
        return p.group > 1

    def launch(self, p: Problem, t: Tensors, stream, device_id: int, arch: str) -> None:
        """One call through the same launch object a hot call reuses (:meth:`prepare`)."""
        self.prepare(p, t, device_id, arch).run(t.q.data.ptr, t.k.data.ptr, t.v.data.ptr,
                                                t.out.data.ptr, _ptr(t.lse), stream)

    def prepare(self, p: Problem, t: Tensors, device_id: int, arch: str) -> HotDecode:
        from ..device import multiprocessor_count

        s = DecodeShape(p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim,
                        p.dtype, p.variant, False)
        sms = multiprocessor_count(device_id)
        o_strides = bhs_strides(t.out, p.layout)
        lse_strides = (0, 0, 0) if t.lse is None else (*_strides(t.lse)[:2], 1)
        strides = dict(q_strides=bhs_strides(t.q, p.layout), k_strides=bhs_strides(t.k, p.layout),
                       v_strides=bhs_strides(t.v, p.layout))

        def make(vec: bool) -> DecodeLaunch:
            return DecodeLaunch(s, p.scale, plan(s, vec, sms), o_strides, lse_strides, device_id,
                                arch, q=None, k=None, v=None, **strides)

        return HotDecode(make, strides_aligned(p.head_dim, (t.q, t.k, t.v, t.out)))

    def table_config(self, p: Problem, smem_limit: int = 0) -> tuple:
        """(ROWS, STAGES) of ROW_TILES for the packed rows; the split count follows
        the grid at launch. Not tuned (one candidate)."""
        return row_tile(p.group * p.seqlen_q)

    def ci_specs(self) -> list[jit.KernelSpec]:
        out = []
        for d in (64, 128, 256):
            for dtype in ("float16", "bfloat16"):
                for rows, stages in ((1, 4), (4, 4), (4, UNSPLIT_STAGES), (8, 6)):
                    for paged in (False, True):
                        out.append(spec(d, dtype, rows, stages, Variant(causal=True), paged, True))
        for d in (8, 72, 96, 160, 192, 224):
            out.append(spec(d, "bfloat16", 4, 4, Variant(causal=True), True, True))
        for d in (1, 59, 111, 250):
            out.append(spec(d, "float16", 8, 6, Variant(causal=d % 2 == 0), False, False))
        out.append(spec(128, "bfloat16", 2, 4, Variant(), False, True))
        out.append(spec(128, "bfloat16", 8, 6, Variant(causal=True, window=(64, 0), softcap=30.0),
                        True, True))
        out.append(spec(256, "float16", 4, 4, Variant(window=(32, 32), softcap=50.0), True, False))
        for d in (32, 64, 128, 256):
            for dtype in ("float16", "bfloat16"):
                out.append(merge_spec("float32", dtype, d))
                out.append(merge_spec(dtype, dtype, d))
        out.append(merge_spec("float32", "float32", 256))
        for dtype in ("float16", "bfloat16"):
            for vec in (False, True):
                for paged in (False, True):
                    out.append(append_spec(dtype, vec, paged))
        return list(dict.fromkeys(out))
