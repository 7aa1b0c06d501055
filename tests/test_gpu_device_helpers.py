"""Device helpers of kernels/common/ run on the GPU against the host's arithmetic:
Divisor (the backward's query tile walk divides by a run-time tile count with it)."""
from __future__ import annotations

import numpy as np
import pytest

from cupy_attention import jit

pytestmark = pytest.mark.gpu

_SOURCE = r"""
#include "types.cuh"
extern "C" __global__ void divide(const int* d, const int* x, int n_x, int* q, int* r) {
  const Divisor by(d[blockIdx.y]);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_x; i += gridDim.x * blockDim.x) {
    q[blockIdx.y * n_x + i] = by.div(x[i]);
    r[blockIdx.y * n_x + i] = by.mod(x[i]);
  }
}
"""


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
    module = cp.RawModule(code=_SOURCE, options=("-I" + str(jit.kernels_dir() / "common"),
                                                 "--std=c++17"))
    kernel = module.get_function("divide")
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
