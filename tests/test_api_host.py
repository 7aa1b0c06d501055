"""The public API on the host: ``attention(..., kernel="reference")`` with NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import cupy_attention as ca

from helpers import DTYPES, as_float, cast, np_dtype, plain_attention, tensor_shape


def inputs(dtype, layout, B=2, Hq=4, Hkv=2, Sq=5, Sk=7, D=6, seed=0):
    rng = np.random.default_rng(seed)
    make = lambda h, s: cast(rng.standard_normal(tensor_shape(B, h, s, D, layout)), dtype)  # noqa: E731
    return make(Hq, Sq), make(Hkv, Sk), make(Hkv, Sk)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_kernel_numpy(dtype, layout, causal):
    q, k, v = inputs(dtype, layout)
    out, lse = ca.attention(q, k, v, causal=causal, layout=layout, kernel="reference",
                            return_lse=True)
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)
    assert out.dtype == np_dtype(dtype) and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (2, 4, 5)
    want, want_lse = plain_attention(q, k, v, causal=causal, layout=layout)
    got = as_float(out)
    got = got if layout == "bhsd" else got.swapaxes(1, 2)
    # float64 result rounded once to the dtype: within half an ulp of the dtype.
    eps = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]
    np.testing.assert_allclose(got, want, rtol=eps, atol=eps * 1e-3)
    np.testing.assert_allclose(lse, want_lse, rtol=2.0**-24, atol=1e-6)


def test_return_lse_false_returns_just_the_array():
    q, k, v = inputs("float32", "bhsd")
    out = ca.attention(q, k, v, kernel="reference")
    assert isinstance(out, np.ndarray) and out.shape == q.shape


@pytest.mark.parametrize("dtype", DTYPES)
def test_preallocated_nan_outputs_are_overwritten(dtype):
    q, k, v = inputs(dtype, "bshd", Sq=6, Sk=4)
    out = np.full(q.shape, np.nan, dtype=np.float32).astype(np_dtype(dtype))
    lse = np.full((2, 4, 6), np.nan, dtype=np.float32)
    res, res_lse = ca.attention(q, k, v, causal=True, layout="bshd", out=out, lse_out=lse,
                                return_lse=True, kernel="reference")
    assert res is out and res_lse is lse
    assert not np.isnan(as_float(out)).any() and not np.isnan(lse).any()
    # Sq=6 > Sk=4 causal: the first two query rows attend nothing.
    assert (as_float(out)[:, :2] == 0).all() and np.isneginf(lse[:, :, :2]).all()
    want, _ = plain_attention(q, k, v, causal=True, layout="bshd")
    np.testing.assert_allclose(as_float(out).swapaxes(1, 2), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("empty", ["B", "Sq", "Sk"])
def test_empty_inputs_give_empty_results(layout, empty):
    B, Sq, Sk = (0 if empty == "B" else 2), (0 if empty == "Sq" else 3), (0 if empty == "Sk" else 4)
    q, k, v = inputs("float16", layout, B=B, Sq=Sq, Sk=Sk)
    out, lse = ca.attention(q, k, v, layout=layout, kernel="reference", return_lse=True)
    assert out.shape == q.shape and out.dtype == np.float16
    assert lse.shape == (B, 4, Sq) and lse.dtype == np.float32
    if empty == "Sk":      # queries with no keys at all: output 0, LSE -inf
        assert out.size and (out == 0).all() and np.isneginf(lse).all()
    else:
        assert out.size == 0 and lse.size == 0


def test_kernels_table_lists_every_family_and_reference():
    from cupy_attention.dispatch import FAMILIES

    table = ca.kernels()
    assert set(FAMILIES) | {"reference"} == set(table)
    for name, family in FAMILIES.items():
        summary, dims, dtypes, _ = table[name]
        assert summary and dims and set(dtypes) <= set(DTYPES)
        assert set(family.dtypes) == set(dtypes)
