"""Tensor-map geometry (cupy_attention/tma.py) on the host: which K/V views get a
map, and the dims, byte strides and box the driver is asked to encode."""

from __future__ import annotations

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
