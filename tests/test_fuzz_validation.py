"""Property-based fuzzing of argument validation (CPU, NumPy inputs): whatever the
ranks, shapes, strides (negative, zero, overlapping, huge), dtypes, masks, layouts,
windows, softcaps and argument types, ``validate`` returns a Problem or raises one of
the typed errors of ``cupy_attention.errors``: never another exception."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import as_strided

from cupy_attention.errors import AttentionError
from cupy_attention.problem import validate

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int32, np.bool_, np.complex64]
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def arrays(draw, rank=None):
    """A small real buffer viewed through random shapes and strides (possibly
    negative, zero, overlapping or claiming more than 2^31 or 2^63 elements)."""
    rank = draw(st.integers(0, 6)) if rank is None else rank
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = tuple(draw(st.lists(st.sampled_from([0, 1, 2, 3, 8, 64, 2 ** 31, 2 ** 62]),
                                min_size=rank, max_size=rank)))
    while int(np.prod(shape, dtype=object) if shape else 1) * dtype.itemsize >= 2 ** 62:
        big = shape.index(max(shape))   # NumPy refuses views past 2^63 bytes
        shape = shape[:big] + (shape[big] >> 20,) + shape[big + 1:]
    base = np.zeros(64, dtype)
    if draw(st.booleans()) or any(n > 64 for n in shape):
        # stride tricks: the view never reads memory, validation only looks at it
        strides = tuple(draw(st.sampled_from([0, dtype.itemsize, -dtype.itemsize,
                                              3 * dtype.itemsize, 1 << 40]))
                        for _ in shape)
        try:
            return as_strided(base, shape=shape, strides=strides)
        except ValueError:   # an extent NumPy itself cannot represent: no user has it
            return base[:0]
    size = int(np.prod(shape)) if shape else 1
    return np.zeros(shape, dtype) if size <= 4096 else base


def _call(*args, **kw):
    try:
        return validate(*args, **kw)
    except AttentionError:
        return None


@SETTINGS
@given(q=arrays(), k=arrays(), v=arrays(), causal=st.booleans(),
       layout=st.sampled_from(["bhsd", "bshd", "BHSD", "", None, 3]))
def test_any_arrays_give_a_problem_or_a_typed_error(q, k, v, causal, layout):
    _call(q, k, v, causal=causal, layout=layout)


@SETTINGS
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 9),
                       st.sampled_from([1, 8, 64, 72, 256, 257])),
       kv_heads=st.integers(1, 4), seqlen_k=st.integers(0, 9),
       dtype=st.sampled_from([np.float16, np.float32]),
       mask=st.one_of(st.none(), st.sampled_from(["bool", "float", "int", "bad-shape", "list"])),
       scale=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True),
                       st.integers(-3, 3), st.text(max_size=2)),
       window=st.one_of(st.none(), st.tuples(st.integers(-3, 12), st.integers(-3, 12)),
                        st.tuples(st.floats(-2, 5), st.integers(-1, 3)),
                        st.lists(st.integers(-1, 3), max_size=3), st.text(max_size=2)),
       softcap=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True),
                         st.integers(-2, 50), st.booleans()))
def test_well_formed_arrays_with_random_options(shape, kv_heads, seqlen_k, dtype, mask, scale,
                                                window, softcap):
    B, H, S, D = shape
    q = np.zeros((B, H, S, D), dtype)
    k = np.zeros((B, kv_heads, seqlen_k, D), dtype)
    m = None
    if mask == "bool":
        m = np.ones((1, 1, S, seqlen_k), bool)
    elif mask == "float":
        m = np.zeros((B, 1, 1, seqlen_k), np.float32)
    elif mask == "int":
        m = np.ones((S, seqlen_k), np.int64)
    elif mask == "bad-shape":
        m = np.ones((S + 1, seqlen_k + 2), bool)
    elif mask == "list":
        m = [[True]]
    p = _call(q, k, k, mask=m, scale=scale, window=window, softcap=softcap)
    if p is not None:   # an accepted problem is self-consistent
        assert p.heads_q % p.heads_kv == 0 and p.seqlen_k == seqlen_k
        assert p.softcap >= 0.0 and np.isfinite(p.scale)


@pytest.mark.parametrize("bad", [None, 3, "q", [[1.0]], object()])
def test_non_arrays_are_typed_errors(bad):
    q = np.zeros((1, 1, 2, 8), np.float16)
    for args in ((bad, q, q), (q, bad, q), (q, q, bad)):
        _call(*args)
