"""Device helpers of kernels/common/ run on the GPU against the host's arithmetic:
Divisor (the backward's query tile walk divides by a run-time tile count with it) and
SwizzledTile's per-thread addresses (lane, at: the wgmma backward's dS^T and dQ stores).
Compiled as the kernels are (NVRTC, include path kernels/, the device's arch)."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from cupy_attention import jit

pytestmark = pytest.mark.gpu

_SOURCE = r"""
#include "common/wgmma.cuh"
__global__ void divide(const int* d, const int* x, int n_x, int* q, int* r) {
  const Divisor by(d[blockIdx.y]);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_x; i += gridDim.x * blockDim.x) {
    q[blockIdx.y * n_x + i] = by.div(x[i]);
    r[blockIdx.y * n_x + i] = by.mod(x[i]);
  }
}
// One thread per (r0, c0, dr, dc) of a R-row, W-column tile at byte `tile`:
// out = at(lane(tile, r0, c0), dr, dc) and offset(r0 + dr, c0 + dc) + tile.
template <int R, int W>
__global__ void swizzle(const int4* cases, int n, u32 tile, u32* got, u32* want) {
  using Tile = SwizzledTile<R, W>;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int4 c = cases[i];
  got[i] = Tile::at(Tile::lane(tile, c.x, c.y), c.z, c.w);
  want[i] = tile + Tile::offset(c.x + c.z, c.y + c.w);
}
"""
_SHAPES = ((64, 64), (64, 128), (128, 128), (64, 256), (128, 256))


@functools.lru_cache(maxsize=1)
def _functions(arch: str):
    """(module, {name expression: function}), compiled and loaded once, the way
    jit.get_function loads kernels (the module stays referenced)."""
    import cupy as cp

    exprs = ["divide"] + [f"swizzle<{r}, {w}>" for r, w in _SHAPES]
    cubin, lowered, log = jit.compile_source(_SOURCE, "device_helpers.cu", exprs, arch)
    assert cubin is not None, log
    module = cp.cuda.function.Module()
    module.load(cubin)
    return module, {expr: module.get_function(name) for expr, name in lowered.items()}


def _function(cp, expr: str):
    from cupy_attention import device

    return _functions(device.device_arch(cp.cuda.runtime.getDevice()))[1][expr]


def test_divisor_matches_integer_division():
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(0)
    divisors = np.concatenate([
        np.arange(1, 1025), 2 ** np.arange(11, 31), 2 ** np.arange(11, 31) - 1,
        2 ** np.arange(11, 31) + 1, rng.integers(1025, 2 ** 31 - 1, 200),
        [2 ** 31 - 1]]).astype(np.int32)
    xs = np.concatenate([
        np.arange(0, 4096), 2 ** 31 - 1 - np.arange(0, 256), 2 ** np.arange(12, 31),
        2 ** np.arange(12, 31) - 1, rng.integers(0, 2 ** 31 - 1, 4096)]).astype(np.int32)
    kernel = _function(cp, "divide")
    d_dev, x_dev = cp.asarray(divisors), cp.asarray(xs)
    q = cp.full((divisors.size, xs.size), -1, dtype=cp.int32)
    r = cp.full_like(q, -1)
    kernel((16, divisors.size), (256,), (d_dev, x_dev, np.int32(xs.size), q, r))
    want_q = xs[None, :].astype(np.int64) // divisors[:, None].astype(np.int64)
    want_r = xs[None, :].astype(np.int64) % divisors[:, None].astype(np.int64)
    got_q, got_r = cp.asnumpy(q), cp.asnumpy(r)
    bad = np.argwhere(got_q != want_q)
    assert bad.size == 0, [(int(divisors[i]), int(xs[j]), int(got_q[i, j]), int(want_q[i, j]))
                           for i, j in bad[:5]]
    assert np.array_equal(got_r, want_r)


@pytest.mark.parametrize("rows,cols", _SHAPES)
def test_swizzled_lane_addresses_match_offset(rows, cols):
    """Every (r0, c0, dr, dc) that `at`'s contract admits: dr a multiple of 8 and dc's
    low three bits disjoint from c0's."""
    cp = pytest.importorskip("cupy")
    chunks = cols // 8
    cases = np.array([(r0, c0, dr, dc)
                      for r0 in range(rows) for c0 in range(chunks)
                      for dr in range(0, rows - r0, 8) for dc in range(chunks - c0)
                      if not (c0 % 8) & (dc % 8)], dtype=np.int32)
    kernel = _function(cp, f"swizzle<{rows}, {cols}>")
    n = len(cases)
    got, want = cp.zeros(n, dtype=cp.uint32), cp.ones(n, dtype=cp.uint32)
    kernel(((n + 255) // 256,), (256,), (cp.asarray(cases), np.int32(n), np.uint32(3 * 1024),
                                         got, want))
    got, want = cp.asnumpy(got), cp.asnumpy(want)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(tuple(cases[i]), int(got[i]), int(want[i])) for i in bad[:5]]
