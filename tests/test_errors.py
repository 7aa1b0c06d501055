"""Clear errors (TESTING.md): typed exceptions whose message names the argument.

Validation reads only shapes, strides and dtypes, so NumPy arrays exercise it on a
machine with no GPU (kernel="reference" skips the device entirely).
"""

from __future__ import annotations

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention import dispatch
from cupy_attention.errors import (
    AttentionError,
    CompileError,
    DeviceMismatchError,
    DriverError,
    DTypeError,
    LayoutError,
    NoDeviceError,
    OutOfMemoryError,
    ShapeError,
    UnsupportedError,
)

from conftest import gpu_unavailable_reason
from helpers import np_dtype, problem_for


def arr(*shape, dtype="float32"):
    return np.ones(shape, dtype=np_dtype(dtype))


Q, K, V = arr(2, 4, 5, 8), arr(2, 2, 7, 8), arr(2, 2, 7, 8)


def raises(exc, match, *args, **kwargs):
    kwargs.setdefault("kernel", "reference")
    with pytest.raises(exc, match=match) as info:
        ca.attention(*args, **kwargs)
    assert "\n" not in str(info.value), "error messages are one line"
    return info.value


@pytest.mark.parametrize("exc,base", [
    (ShapeError, ValueError), (LayoutError, ValueError), (DTypeError, TypeError),
    (DeviceMismatchError, ValueError), (UnsupportedError, ValueError),
    (NoDeviceError, RuntimeError), (CompileError, RuntimeError),
])
def test_error_hierarchy(exc, base):
    assert issubclass(exc, base) and issubclass(exc, AttentionError)


def test_rank():
    raises(ShapeError, r"^q must have rank 4", arr(4, 5, 8), K, V)
    raises(ShapeError, r"^k must have rank 4", Q, arr(2, 2, 7, 8, 1), V)
    raises(ShapeError, r"^v must have rank 4", Q, K, arr(7, 8))


def test_shape_mismatches():
    raises(ShapeError, r"batch sizes differ: q has 2, k has 3", Q, arr(3, 2, 7, 8), arr(3, 2, 7, 8))
    raises(ShapeError, r"k and v must have the same heads and sequence length", Q, K, arr(2, 2, 6, 8))
    raises(ShapeError, r"k and v must have the same heads", Q, K, arr(2, 1, 7, 8))
    raises(ShapeError, r"head dims differ: q has D=8, k has D=4", Q, arr(2, 2, 7, 4), arr(2, 2, 7, 4))
    raises(ShapeError, r"head dims differ.*v has D=16", Q, K, arr(2, 2, 7, 16))
    # bshd reads the axes the other way round: [B, S, H, D]
    raises(ShapeError, r"k and v must have the same heads", arr(2, 5, 4, 8), arr(2, 7, 2, 8),
           arr(2, 7, 1, 8), layout="bshd")


def test_heads_not_divisible():
    raises(ShapeError, r"q heads \(4\) must be a multiple of k/v heads \(3\)", Q, arr(2, 3, 7, 8),
           arr(2, 3, 7, 8))


@pytest.mark.parametrize("bad", ["float64", "int32", "int8", "bool"])
def test_unsupported_dtype(bad):
    raises(DTypeError, r"^q has dtype " + bad, arr(2, 4, 5, 8, dtype=bad), arr(2, 2, 7, 8, dtype=bad),
           arr(2, 2, 7, 8, dtype=bad))


def test_dtype_mismatch():
    raises(DTypeError, r"q, k and v must share one dtype, got float32, float16, float32", Q,
           arr(2, 2, 7, 8, dtype="float16"), V)
    raises(DTypeError, r"share one dtype.*bfloat16", Q, K, arr(2, 2, 7, 8, dtype="bfloat16"))


def test_last_dim_stride():
    wide = arr(2, 4, 5, 16)
    raises(LayoutError, r"^q must have unit stride in its last", wide[..., ::2], K, V)
    raises(LayoutError, r"^v must have unit stride", Q, K, arr(2, 2, 7, 16)[..., ::2])
    # Other strides are fine: a transposed view with a contiguous last axis works.
    k_t = np.ascontiguousarray(K.swapaxes(1, 2)).swapaxes(1, 2)
    assert ca.attention(Q, k_t, V, kernel="reference").shape == Q.shape


@pytest.mark.parametrize("shape", [(3,), (5, 6), (2, 4, 5, 6), (3, 4, 5, 7), (1, 1, 1, 5, 7)])
def test_mask_not_broadcastable(shape):
    raises(ShapeError, r"^mask of shape .* is not broadcastable to \[B, Hq, Sq, Sk\] = "
           r"\[2, 4, 5, 7\]", Q, K, V, mask=np.ones(shape, dtype=bool))


def test_mask_dtype():
    raises(DTypeError, r"^mask must be boolean .* or floating", Q, K, V,
           mask=np.ones((5, 7), dtype=np.int32))


def test_out_and_lse_out():
    raises(ShapeError, r"^out must have shape \(2, 4, 5, 8\)", Q, K, V, out=arr(2, 4, 5, 7))
    raises(DTypeError, r"^out must have dtype float32", Q, K, V, out=arr(2, 4, 5, 8, dtype="float16"))
    raises(LayoutError, r"^out must have unit stride", Q, K, V, out=arr(2, 4, 5, 16)[..., ::2])
    raises(ShapeError, r"^lse_out must have shape \(2, 4, 5\)", Q, K, V, lse_out=arr(2, 4, 5, 1))
    raises(DTypeError, r"^lse_out must be float32", Q, K, V, lse_out=arr(2, 4, 5, dtype="float16"))
    raises(ShapeError, r"^out must have shape \(2, 5, 4, 8\)", arr(2, 5, 4, 8), arr(2, 7, 2, 8),
           arr(2, 7, 2, 8), layout="bshd", out=Q)


def test_other_arguments():
    raises(ShapeError, r"^layout must be one of", Q, K, V, layout="bsdh")
    raises(DTypeError, r"^causal must be a bool", Q, K, V, causal="yes")
    raises(ShapeError, r"^scale must be finite", Q, K, V, scale=float("inf"))
    raises(DTypeError, r"^scale must be a real number", Q, K, V, scale="big")
    raises(DTypeError, r"unsupported type list", [[1.0]], K, V)


class _FakeDeviceArray:
    """Quacks like a CuPy array on device 1 (validation reads only metadata)."""

    __module__ = "cupy._fake"

    def __init__(self, like, device_id):
        self.shape, self.strides, self.dtype = like.shape, like.strides, like.dtype
        self.device = type("Dev", (), {"id": device_id})()


def test_device_mismatch_from_metadata():
    raises(DeviceMismatchError, r"q, k and v are on different devices \(cpu, 1, cpu\)", Q,
           _FakeDeviceArray(K, 1), V)
    qd, kd, vd = (_FakeDeviceArray(x, 0) for x in (Q, K, V))
    raises(DeviceMismatchError, r"^mask is on device cpu but q is on 0", qd, kd, vd,
           mask=np.ones((5, 7), dtype=bool))
    raises(DeviceMismatchError, r"^out is on device 1 but q is on 0", qd, kd, vd,
           out=_FakeDeviceArray(Q, 1))
    raises(DeviceMismatchError, r"^lse_out is on device cpu but q is on 0", qd, kd, vd,
           lse_out=arr(2, 4, 5))


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="a CUDA device is present")
@pytest.mark.parametrize("kernel", ["auto", *dispatch.FAMILIES])
def test_no_device_is_one_clear_sentence(kernel):
    with pytest.raises(NoDeviceError) as info:
        ca.attention(Q, K, V, kernel=kernel)
    msg = str(info.value)
    assert "\n" not in msg and "CUDA device" in msg and "kernel='reference'" in msg
    assert "cudaError" not in msg and "Traceback" not in msg


def test_unknown_kernel_name():
    p = problem_for(batch=1, heads_q=2, heads_kv=2, seqlen_q=4, seqlen_k=4, head_dim=64,
                    dtype="float16")
    with pytest.raises(UnsupportedError, match=r"unknown kernel 'fastest'") as info:
        dispatch.choose(p, "fastest", 90)
    for name in dispatch.kernel_names():
        assert repr(name) in str(info.value)


def _too_big_head_dim(family):
    """A head dim this family rejects, and a dtype it takes, or None."""
    for d in (257, 300, 512, 1024, 4097, 8192):
        p = problem_for(batch=1, heads_q=2, heads_kv=1, seqlen_q=3, seqlen_k=5, head_dim=d,
                        dtype=family.dtypes[0])
        if family.check(p, 90) is not None:
            return d, p
    return None


@pytest.mark.parametrize("name", list(dispatch.FAMILIES))
def test_head_dim_out_of_range_names_the_alternatives(name):
    family = dispatch.FAMILIES[name]
    found = _too_big_head_dim(family)
    if found is None:
        pytest.skip(f"{name} takes every head dim up to 8192")
    d, p = found
    with pytest.raises(UnsupportedError) as info:
        dispatch.choose(p, name, 90)
    msg = str(info.value)
    assert str(d) in msg and name in msg
    assert "kernels that run this problem:" in msg
    offered = [s.strip() for s in msg.split("kernels that run this problem:")[-1].split(",")]
    alternatives = [n for n in dispatch.supporting(p, 90) if n != name] + ["reference"]
    assert sorted(offered) == sorted(alternatives)


def test_auto_with_no_capable_family():
    d = 1 + max(getattr(f, "max_head_dim", 0) for f in dispatch.FAMILIES.values())
    p = problem_for(batch=1, heads_q=1, heads_kv=1, seqlen_q=2, seqlen_k=2, head_dim=d,
                    dtype="float16")
    if dispatch.supporting(p, 90):
        pytest.skip(f"some family takes D={d}")
    with pytest.raises(UnsupportedError, match=rf"no kernel runs .*D={d}"):
        dispatch.choose(p, "auto", 90)


@pytest.mark.parametrize("name", list(dispatch.FAMILIES))
def test_family_check_rejects_its_unsupported_dtypes(name):
    family = dispatch.FAMILIES[name]
    for dtype in ("float32", "float16", "bfloat16"):
        p = problem_for(batch=1, heads_q=2, heads_kv=2, seqlen_q=3, seqlen_k=3, head_dim=64,
                        dtype=dtype)
        reason = family.check(p, 90)
        if dtype in family.dtypes:
            assert reason is None, f"{name} rejects {dtype}: {reason}"
        else:
            assert reason and dtype in reason
            with pytest.raises(UnsupportedError, match=dtype):
                dispatch.choose(p, name, 90)


@pytest.mark.parametrize("name", list(dispatch.FAMILIES))
def test_family_min_compute_capability(name):
    family = dispatch.FAMILIES[name]
    min_cc = getattr(family, "min_cc", 0)
    p = problem_for(batch=1, heads_q=2, heads_kv=2, seqlen_q=3, seqlen_k=3, head_dim=64,
                    dtype=family.dtypes[0])
    assert family.check(p, 90) is None
    if min_cc > 50:
        reason = family.check(p, min_cc - 10)
        assert reason and "compute capability" in reason


@pytest.mark.parametrize("exc", [
    ShapeError("q: shape"), LayoutError("k: strides"), DTypeError("v: dtype"),
    DeviceMismatchError("k: device"), UnsupportedError("head dim"),
    NoDeviceError("no GPU"), CompileError("flash[D=64]", "error: line 3"),
    DriverError("launch refused", kernel="flash[D=64]", status=700),
    OutOfMemoryError("attention: the GPU ran out of memory"),
])
def test_errors_survive_pickling(exc):
    # a process pool's worker (compiling ahead, say) hands its exception back pickled;
    # one that cannot be rebuilt breaks the pool instead of reaching the caller
    import pickle

    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and str(back) == str(exc)
    assert vars(back) == vars(exc)
