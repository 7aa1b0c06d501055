"""A real out-of-memory in the middle of a call: a typed error, the memory pool back
where it was, and the next call works."""
from __future__ import annotations

import numpy as np
import pytest

import cupy_attention as ca

pytestmark = pytest.mark.gpu


def test_out_of_memory_mid_call_then_recovers():
    import cupy

    pool = cupy.get_default_memory_pool()
    rng = cupy.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 8, 2048, 128), dtype=cupy.float32).astype(cupy.float16)
               for _ in range(3))
    expected = ca.attention(q, k, v, causal=True)
    cupy.cuda.Device().synchronize()
    hog, chunk = [], 1 << 30
    try:
        while chunk >= 1 << 20:   # take every free byte, in shrinking chunks
            try:
                hog.append(cupy.empty(chunk, dtype=cupy.uint8))
            except cupy.cuda.memory.OutOfMemoryError:
                chunk //= 2
        used = pool.used_bytes()
        with pytest.raises(ca.OutOfMemoryError):
            ca.attention(q, k, v, causal=True, return_lse=True)
        with pytest.raises(ca.OutOfMemoryError):
            ca.attention_backward(q, q, k, v, expected, cupy.zeros((2, 8, 2048), cupy.float32),
                                  causal=True)
        assert pool.used_bytes() == used, "a failed call keeps no memory"
    finally:
        del hog
        pool.free_all_blocks()
    again = ca.attention(q, k, v, causal=True)
    assert np.array_equal(again.get().view(np.uint16), expected.get().view(np.uint16))
