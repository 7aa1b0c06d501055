"""Tensor maps for the Hopper copy engine (TMA), encoded by the CUDA driver.

A kernel that loads tiles with ``cp.async.bulk.tensor`` takes a tensor map (128
opaque bytes) by value; ``kernels/common/tma.cuh`` is the device side. The map
holds the base address, so it is encoded for each new pointer: ``TileMaps`` keeps
everything else fixed and remembers the maps of a few pointers, so a loop that
calls attention on the same buffers encodes nothing after the first calls.

``cuTensorMapEncodeTiled`` lives in the driver library (``libcuda``), which CuPy
loads already; nothing here needs the CUDA toolkit.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from .errors import DriverError

# One kernel parameter (struct TmaMap in tma.cuh): 16 64-bit words.
MAP_DTYPE = np.dtype([("words", "<u8", (16,))])

_U16 = 1          # CU_TENSOR_MAP_DATA_TYPE_UINT16: the copy moves 16-bit words
F32 = 7           # CU_TENSOR_MAP_DATA_TYPE_FLOAT32: reductions add fp32 values
_SWIZZLE_128B = 3  # CU_TENSOR_MAP_SWIZZLE_128B: SwizzledTile's layout
# CU_TENSOR_MAP_L2_PROMOTION_L2_128B: a box row's own 128 bytes. With 256-byte promotion
# the decode's copies asked the L2 for 25% more sectors than they used (ncu, H200, B = 64,
# Sk = 4k: 42.0M against 33.6M read from DRAM), which left it L2-bound at 4.14 TB/s; with
# 128 (or none, or 64) it reads 4.45-4.55. The prefill and backward kernels: no change
# (same-run A/B, median 1.000 on the H200 and the H100; benchmarks/results/notes-decode.md
# section 14).
_L2_128B = 2

_encode = None

# cuTensorMapEncodeTiled's CUresult codes worth naming (cuda.h); any other is shown by number.
_CU_RESULT = {1: "CUDA_ERROR_INVALID_VALUE", 3: "CUDA_ERROR_NOT_INITIALIZED",
              101: "CUDA_ERROR_INVALID_DEVICE", 201: "CUDA_ERROR_INVALID_CONTEXT"}


class TensorMapError(DriverError):
    """The driver refused to encode a tensor map. ``argument`` names the
    cuTensorMapEncodeTiled argument that breaks a documented rule (``globalAddress``,
    ``globalDim``, ``globalStrides``, ``boxDim``, ``elementStrides``), or is None when
    every argument satisfies them (then the fault is elsewhere: context, device);
    ``status`` is the CUresult."""

    def __init__(self, message: str, *, argument: str | None, status: int):
        super().__init__(message, status=status)
        self.argument = argument


def faulty_argument(ptr: int, dims, strides, box, element_strides=(1, 1, 1, 1),
                    elem_size: int = 2, swizzle_bytes: int = 128) -> tuple[str, str] | None:
    """(argument, rule) of the first documented cuTensorMapEncodeTiled rule the
    arguments break, or None (CUDA driver API, cuTensorMapEncodeTiled: a 16-byte
    aligned address, dims in [1, 2^32], strides multiples of 16 below 2^40, box
    dims in [1, 256] with an inner box of a multiple of 16 bytes and at most the
    swizzle span, element strides in [1, 8])."""
    if ptr % 16:
        return "globalAddress", f"{ptr:#x} is not 16-byte aligned"
    for i, d in enumerate(dims):
        if not 1 <= d <= 1 << 32:
            return "globalDim", f"globalDim[{i}] = {d} is outside [1, 2^32]"
    for i, s in enumerate(strides):
        if s % 16 or not 0 < s < 1 << 40:
            return "globalStrides", f"globalStrides[{i}] = {s} is not a multiple of 16 in (0, 2^40)"
    for i, b in enumerate(box):
        if not 1 <= b <= 256:
            return "boxDim", f"boxDim[{i}] = {b} is outside [1, 256]"
    inner = box[0] * elem_size
    if inner % 16 or inner > swizzle_bytes:
        return "boxDim", (f"boxDim[0] = {box[0]} spans {inner} bytes: not a multiple of 16 "
                          f"of at most the {swizzle_bytes}-byte swizzle")
    for i, e in enumerate(element_strides):
        if not 1 <= e <= 8:
            return "elementStrides", f"elementStrides[{i}] = {e} is outside [1, 8]"
    return None


def _encoder():
    global _encode
    if _encode is None:
        from .device import driver_library

        fn = driver_library().cuTensorMapEncodeTiled
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        _encode = fn
    return _encode


def tileable(batch: int, heads: int, rows: int, strides) -> bool:
    """Whether a [B, H, S, D] view with (batch, head, row) ``strides`` in elements
    has a tensor map: rows at a positive stride (or one row), heads and batches at
    a stride that is not negative (0 is a broadcast, mapped as one)."""
    b_stride, h_stride, r_stride = strides
    return ((r_stride > 0 or rows == 1) and (h_stride >= 0 or heads == 1)
            and (b_stride >= 0 or batch == 1))


def map_geometry(batch: int, heads: int, rows: int, head_dim: int, strides, box_rows: int,
                 column_blocks: bool = False):
    """(dims, byte strides, box) of the rank-4 map over a 16-bit [B, H, S, D] view
    (:func:`tileable`, 16-byte aligned strides) with (batch, head, row) ``strides``
    in elements, boxes of 64 columns x ``box_rows`` rows.

    Dimension order is (D, S, H, B). A head or batch axis that has stride 0 (a
    broadcast view) or size 1 becomes a map axis of size 1, which the kernel
    addresses at coordinate 0; an axis of size 1 takes any valid stride.

    ``column_blocks`` (D a multiple of 64): the rank-5 map (64, S, D / 64, H, B), D
    split into its 64-column blocks as an axis of its own after the rows, whose box
    (64, box_rows, D / 64, 1, 1) lands as the blocks one after another, each of
    ``box_rows`` rows: a chunk of kernels/common/wgmma.cuh's chunked SwizzledTile.
    """
    b_stride, h_stride, r_stride = (2 * s for s in strides)
    if rows == 1:
        r_stride = 2 * head_dim
    spare = r_stride * rows  # a valid stride (a multiple of 16) for an axis of size 1
    h_dim, h_stride = (heads, h_stride) if heads > 1 and h_stride else (1, spare)
    b_dim, b_stride = (batch, b_stride) if batch > 1 and b_stride else (1, spare)
    if column_blocks:
        assert head_dim % 64 == 0, head_dim
        return ((64, rows, head_dim // 64, h_dim, b_dim), (r_stride, 128, h_stride, b_stride),
                (64, box_rows, head_dim // 64, 1, 1))
    return (head_dim, rows, h_dim, b_dim), (r_stride, h_stride, b_stride), (64, box_rows, 1, 1)


def _encode_error(rc: int, ptr: int, dims, strides, box, element_strides,
                  elem_size: int = 2) -> TensorMapError:
    fault = faulty_argument(ptr, dims, strides, box, element_strides, elem_size)
    argument, why = fault if fault else (None, "no argument breaks a documented rule")
    return TensorMapError(
        f"cuTensorMapEncodeTiled failed ({_CU_RESULT.get(rc, 'CUresult')} {rc}): "
        f"{argument or 'argument unknown'}: {why} (globalAddress {ptr:#x}, globalDim {dims}, "
        f"globalStrides {strides}, boxDim {box})", argument=argument, status=rc)


def fp32_rows_geometry(batch: int, heads: int, rows: int, width: int, box_rows: int):
    """(dims, byte strides, box) of the rank-4 map over a contiguous fp32 [B, H, S,
    width] buffer (the backward's dq_accum), boxes of 32 columns (128 bytes, the
    swizzle's span) x ``box_rows`` rows."""
    row = 4 * width
    return ((width, rows, heads, batch), (row, row * rows, row * rows * heads),
            (32, box_rows, 1, 1))


# How many pointers (TileMaps) or pointer tuples (MapBuffers) an encoder remembers.
# A training step calls each layer's attention with the activations the caching
# allocator gave that layer the step before, so the working set is about the
# model's layer count; a cache smaller than that misses on every call (it is
# cleared when full), encoding three or more maps a call.
MAPS_KEPT = 256


class TileMaps:
    """Encodes one map geometry for new base pointers, remembering up to ``keep``
    of them (all forgotten when a new one finds the memory full). ``dtype``: the
    elements' CUtensorMapDataType (16-bit words unless told)."""

    def __init__(self, geometry, keep: int = MAPS_KEPT, dtype: int = _U16):
        dims, strides, box = geometry
        rank = len(dims)
        self._rank = rank
        self._args = ((ctypes.c_uint64 * rank)(*dims), (ctypes.c_uint64 * (rank - 1))(*strides),
                      (ctypes.c_uint32 * rank)(*box), (ctypes.c_uint32 * rank)(*[1] * rank))
        self._maps: dict = {}
        self._keep = keep
        self._dtype = dtype
        self._elem_size = 4 if dtype == F32 else 2

    def __call__(self, ptr: int) -> np.void:
        tmap = self._maps.get(ptr)
        if tmap is not None:
            return tmap
        dims, strides, box, ones = self._args
        # A buffer per encoding (the driver call releases the GIL): room to place
        # the map on a 64-byte boundary.
        buf = (ctypes.c_uint64 * 24)()
        addr = ctypes.addressof(buf) + (-ctypes.addressof(buf) % 64)
        rc = _encoder()(addr, self._dtype, self._rank, ptr, ctypes.addressof(dims),
                        ctypes.addressof(strides), ctypes.addressof(box), ctypes.addressof(ones),
                        0, _SWIZZLE_128B, _L2_128B, 0)
        if rc != 0:
            raise _encode_error(rc, ptr, list(dims), list(strides), list(box), list(ones),
                                self._elem_size)
        tmap = np.frombuffer(ctypes.string_at(addr, 128), MAP_DTYPE)[0]
        maps = self._maps if len(self._maps) < self._keep else {}  # full: start over
        maps[ptr] = tmap
        self._maps = maps
        return tmap


@functools.lru_cache(maxsize=64)
def tile_maps(geometry, dtype: int = _U16) -> TileMaps:
    """One encoder (with its per-pointer maps) per map geometry and element type,
    shared by every launch of that geometry: calls with ``out=`` take the non-hot
    path each time."""
    return TileMaps(geometry, dtype=dtype)


_NO_MAP = (ctypes.c_char * 128)()   # a kernel argument no launch reads: zeros


class MapBuffers:
    """A launch's tensor maps for its data pointers, as 128-byte ctypes buffers (the
    kernel arguments that jit's ``launch_packed`` takes as ``tail``): one encoder
    (a TileMaps) per pointer, zeros for a null pointer (a map the launch never
    reads). The buffers of the last ``keep`` pointer tuples are kept, all forgotten
    when a new one finds the memory full: a loop reads the same few buffers every
    step."""

    def __init__(self, encoders, keep: int = MAPS_KEPT):
        self.encoders = tuple(encoders)
        self.kept: dict = {}
        self._keep = keep

    def __call__(self, *ptrs: int) -> tuple:
        bufs = self.kept.get(ptrs)
        if bufs is None:
            bufs = tuple((ctypes.c_char * 128).from_buffer_copy(m(ptr)) if ptr else _NO_MAP
                         for m, ptr in zip(self.encoders, ptrs))
            if len(self.kept) >= self._keep:
                self.kept.clear()
            self.kept[ptrs] = bufs
        return bufs
