"""Tensor-map geometry (cupy_attention/tma.py) on the host: which K/V views get a
map, and the dims, byte strides and box the driver is asked to encode; and
flash_wgmma's work tile counter while a stream is being captured."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_attention import tma


def test_contiguous_bhsd():
    # [B=2, H=4, S=100, D=72] contiguous: strides (H*S*D, S*D, D) elements
    dims, strides, box = tma.map_geometry(2, 4, 100, 72, (4 * 100 * 72, 100 * 72, 72), 112)
    assert dims == (72, 100, 4, 2)
    assert strides == (144, 100 * 144, 4 * 100 * 144)
    assert box == (64, 112, 1, 1)


def test_bshd_keeps_the_head_stride_below_the_row_stride():
    # [B, S, H, D] seen as [B, H, S, D]: row stride H*D, head stride D
    dims, strides, _ = tma.map_geometry(3, 8, 50, 128, (50 * 8 * 128, 128, 8 * 128), 64)
    assert dims == (128, 50, 8, 3)
    assert strides == (8 * 256, 256, 50 * 8 * 256)


def test_paged_column_blocks_are_an_axis_after_the_rows():
    # a paged cache [pages=40, page=16, Hkv=8, D=256] seen as [pages, H, S, D]: the rank-5
    # map (64, rows, D / 64, H, pages) whose box (64, 16, 4, 1, 1) covers a page's 16 rows
    # of every 64-column block, 128 bytes between blocks
    dims, strides, box = tma.map_geometry(40, 8, 16, 256, (16 * 8 * 256, 256, 8 * 256), 16,
                                          column_blocks=True)
    assert dims == (64, 16, 4, 8, 40)
    assert strides == (8 * 512, 128, 512, 16 * 8 * 512)
    assert box == (64, 16, 4, 1, 1)


def test_rank5_maps_are_encoded_with_their_rank(monkeypatch):
    import ctypes

    seen = []

    def fake_encode(addr, dtype, rank, ptr, dims, strides, box, elem_strides, *modes):
        seen.append((rank, list((ctypes.c_uint64 * rank).from_address(dims)),
                     list((ctypes.c_uint64 * (rank - 1)).from_address(strides)),
                     list((ctypes.c_uint32 * rank).from_address(box)),
                     list((ctypes.c_uint32 * rank).from_address(elem_strides))))
        return 0

    monkeypatch.setattr(tma, "_encode", fake_encode)
    geometry = tma.map_geometry(40, 8, 16, 128, (16 * 8 * 128, 128, 8 * 128), 16,
                                column_blocks=True)
    tma.TileMaps(geometry)(256)
    assert seen == [(5, [64, 16, 2, 8, 40], [8 * 256, 128, 256, 16 * 8 * 256],
                     [64, 16, 2, 1, 1], [1] * 5)]


@pytest.mark.parametrize("axis", ["head", "batch"])
def test_broadcast_axis_is_a_map_axis_of_size_one(axis):
    b_stride, h_stride = (0, 64 * 80) if axis == "batch" else (2 * 64 * 80, 0)
    dims, strides, _ = tma.map_geometry(2, 2, 64, 80, (b_stride, h_stride, 80), 96)
    assert dims[2 if axis == "head" else 3] == 1
    assert dims[3 if axis == "head" else 2] == 2
    spare = strides[1 if axis == "head" else 2]
    assert spare > 0 and spare % 16 == 0


def test_axes_of_size_one_take_a_valid_stride():
    # a torch view may carry any stride on a length-1 axis, even an unaligned one
    dims, strides, _ = tma.map_geometry(1, 1, 1, 96, (7, 3, 5), 64)
    assert dims == (96, 1, 1, 1)
    assert all(s > 0 and s % 16 == 0 for s in strides)


@pytest.mark.parametrize("strides, rows, ok", [
    ((800, 80, 8), 10, True),       # plain
    ((800, 0, 8), 10, True),        # broadcast heads
    ((0, 80, 8), 10, True),         # broadcast batches
    ((800, 80, 0), 10, False),      # every row the same row: no map
    ((800, 80, 0), 1, True),        # ... unless there is one row
    ((800, 80, -8), 10, False),     # reversed rows
    ((800, -80, 8), 10, False),     # reversed heads
    ((-800, 80, 8), 10, False),     # reversed batches
])
def test_tileable(strides, rows, ok):
    assert tma.tileable(2, 2, rows, strides) is ok


GEOMETRY = ((72, 100, 2, 2), (144, 14400, 28800), (64, 112, 1, 1))


def test_maps_are_encoded_once_per_pointer(monkeypatch):
    """TileMaps asks the driver once per new pointer while it has room, and hands
    back the map for that pointer (here a fake encoder writes the pointer into it)."""
    import ctypes

    encoded = []

    def fake_encode(addr, dtype, rank, ptr, dims, strides, box, elem_strides, *modes):
        assert addr % 64 == 0 and rank == 4
        assert list((ctypes.c_uint64 * 4).from_address(dims)) == [72, 100, 2, 2]
        encoded.append(ptr)
        ctypes.memmove(addr, ptr.to_bytes(8, "little") * 16, 128)
        return 0

    monkeypatch.setattr(tma, "_encode", fake_encode)
    maps = tma.TileMaps(GEOMETRY, keep=3)
    for ptr in (16, 32, 16, 48, 32, 64, 16):
        assert int(maps(ptr)["words"][0]) == ptr
    assert encoded == [16, 32, 48, 64, 16]  # the fourth pointer found the memory full


def test_a_refused_encoding_raises_a_typed_error(monkeypatch):
    from cupy_attention import DriverError

    monkeypatch.setattr(tma, "_encode", lambda *args: 1)  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(DriverError, match="cuTensorMapEncodeTiled failed"):
        tma.TileMaps(GEOMETRY)(256)


def test_no_work_tile_counter_is_allocated_during_a_capture():
    """flash_wgmma's launches take a work tile counter per stream; a stream being
    captured into a CUDA graph that has none yet gets a null pointer (the kernel's
    fixed tile order) and nothing is allocated or remembered for it."""
    from cupy_attention.families import flash_wgmma

    class CapturingStream:
        ptr = 0x5EED

        def is_capturing(self):
            return True

    counter = flash_wgmma.tile_counter(0, CapturingStream())
    assert counter is flash_wgmma._NO_COUNTER
    assert counter.dtype == np.uint64 and int(counter) == 0
    assert (0, CapturingStream.ptr) not in flash_wgmma._counters
    arg = flash_wgmma.tile_counter_arg(0, CapturingStream())  # a launch's tail argument
    assert arg.value == 0 and (0, CapturingStream.ptr) not in flash_wgmma._counters


@pytest.mark.parametrize("ptr, geometry, argument", [
    (256, GEOMETRY, None),                                        # all valid: context/device
    (8, GEOMETRY, "globalAddress"),                               # not 16-byte aligned
    (256, ((64, 0, 1, 1), GEOMETRY[1], GEOMETRY[2]), "globalDim"),
    (256, (GEOMETRY[0], (136, 144, 144), GEOMETRY[2]), "globalStrides"),
    (256, (GEOMETRY[0], GEOMETRY[1], (64, 512, 1, 1)), "boxDim"),
    (256, (GEOMETRY[0], GEOMETRY[1], (72, 64, 1, 1)), "boxDim"),  # 144 bytes > 128B swizzle
])
def test_a_refused_encoding_names_the_argument(monkeypatch, ptr, geometry, argument):
    """A CUresult failure becomes a TensorMapError (a DriverError) whose ``argument``
    names the first argument that breaks a documented cuTensorMapEncodeTiled rule."""
    monkeypatch.setattr(tma, "_encode", lambda *args: 1)  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(tma.TensorMapError, match="CUDA_ERROR_INVALID_VALUE 1") as info:
        tma.TileMaps(geometry)(ptr)
    assert info.value.argument == argument and info.value.status == 1
    assert (argument or "argument unknown") in str(info.value)


def test_fp32_rows_geometry_of_dq_accum():
    # dq_accum [B=2, H=3, S=100, D=96] fp32 contiguous: boxes of 32 columns (128 bytes)
    dims, strides, box = tma.fp32_rows_geometry(2, 3, 100, 96, 64)
    assert dims == (96, 100, 3, 2)
    assert strides == (384, 100 * 384, 3 * 100 * 384)
    assert box == (32, 64, 1, 1)
    assert tma.faulty_argument(256, dims, strides, box, elem_size=4) is None


def test_fp32_maps_encode_fp32_and_name_the_box_in_fp32_bytes(monkeypatch):
    """TileMaps(dtype=F32) asks the driver for 32-bit floats; a refused fp32 map is
    checked with 4-byte elements (a 40-column box spans 160 bytes, past the swizzle)."""
    seen = []

    def fake_encode(addr, dtype, *args):
        seen.append(dtype)
        return 1

    monkeypatch.setattr(tma, "_encode", fake_encode)
    geometry = tma.fp32_rows_geometry(1, 2, 64, 128, 64)
    with pytest.raises(tma.TensorMapError) as info:
        tma.TileMaps(geometry, dtype=tma.F32)(256)
    assert seen == [tma.F32] and info.value.argument is None
    dims, strides, _ = geometry
    with pytest.raises(tma.TensorMapError) as info:
        tma.TileMaps((dims, strides, (40, 64, 1, 1)), dtype=tma.F32)(256)
    assert info.value.argument == "boxDim" and "160 bytes" in str(info.value)


def test_map_buffers_per_pointer_tuple():
    """MapBuffers (the backward's and decode's kernel arguments): one 128-byte buffer
    per map, the maps of a pointer tuple kept, and zeros for a null pointer (the
    backward's dq_accum in deterministic mode)."""
    calls = []

    def encoder(tag):
        def encode(ptr):
            calls.append((tag, ptr))
            return np.frombuffer(bytes([tag]) * 128, tma.MAP_DTYPE)[0]
        return encode

    maps = tma.MapBuffers(encoder(i + 1) for i in range(5))
    bufs = maps(16, 32, 48, 64, 0)
    assert [bytes(b)[:2] for b in bufs] == [b"\x01\x01", b"\x02\x02", b"\x03\x03",
                                            b"\x04\x04", b"\x00\x00"]
    assert all(len(bytes(b)) == 128 for b in bufs)
    assert maps(16, 32, 48, 64, 0) is bufs and len(calls) == 4, "kept for the same pointers"
    maps(16, 32, 48, 64, 80)
    assert calls[-1] == (5, 80) and len(calls) == 9
