"""Interop and ordering on the device: torch tensors in and out (zero-copy, same
dtype), non-default CuPy and torch streams (edge case 10), NumPy in/NumPy out,
forward determinism, and the errors that need a device to trigger."""

from __future__ import annotations

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention.dispatch import FAMILIES
from cupy_attention.errors import DeviceMismatchError, UnsupportedError

from helpers import (
    as_float,
    check_attention,
    make_qkv,
    nan_array,
    plain_attention,
    problem_for,
    seed_for,
)

pytestmark = pytest.mark.gpu

NAMES = list(FAMILIES)
FAMILY_DTYPES = [(n, d) for n in NAMES for d in FAMILIES[n].dtypes]


def require(name, cc, **kw):
    reason = FAMILIES[name].check(problem_for(**kw), cc)
    if reason:
        pytest.skip(f"{name}: {reason}")


def dims(dtype, B=2, Hq=4, Hkv=2, Sq=150, Sk=200, D=64, layout="bshd"):
    return dict(batch=B, heads_q=Hq, heads_kv=Hkv, seqlen_q=Sq, seqlen_k=Sk, head_dim=D,
                dtype=dtype, layout=layout)


def check(out_bhsd, lse, q, k, v, dtype, *, causal, layout):
    ref, ref_lse = plain_attention(q, k, v, causal=causal, layout=layout)
    same, same_lse = plain_attention(q, k, v, causal=causal, layout=layout, precision=dtype)
    check_attention(out_bhsd, ref, same, dtype, lse=lse, ref_lse=ref_lse, same_lse=same_lse)


# torch ---------------------------------------------------------------------------

def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


def _torch_inputs(torch, d, seed):
    """q, k, v as torch CUDA tensors in the bshd layout."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tdt = getattr(torch, d["dtype"])
    shape = lambda h, s: (d["batch"], s, h, d["head_dim"])  # noqa: E731  (bshd)
    q = torch.randn(shape(d["heads_q"], d["seqlen_q"]), generator=gen, device="cuda", dtype=tdt)
    k = torch.randn(shape(d["heads_kv"], d["seqlen_k"]), generator=gen, device="cuda", dtype=tdt)
    v = torch.randn(shape(d["heads_kv"], d["seqlen_k"]), generator=gen, device="cuda", dtype=tdt)
    return q, k, v


def _as_cupy64(t):
    import cupy

    return cupy.from_dlpack(t.detach().to(dtype=__import__("torch").float64))


@pytest.mark.parametrize("name,dtype", FAMILY_DTYPES, ids=[f"{n}-{d}" for n, d in FAMILY_DTYPES])
def test_torch_in_torch_out(name, dtype, device_cc):
    torch = _torch()
    d = dims(dtype)
    require(name, device_cc, **d, causal=True)
    q, k, v = _torch_inputs(torch, d, seed_for(name, dtype, "torch"))
    out, lse = ca.attention(q, k, v, causal=True, layout="bshd", return_lse=True, kernel=name)
    assert isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor)
    assert out.dtype == q.dtype and out.device == q.device and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, 150)
    qc, kc, vc = (_as_cupy64(t) for t in (q, k, v))
    check(_as_cupy64(out).swapaxes(1, 2), _as_cupy64(lse), qc, kc, vc, dtype, causal=True,
          layout="bshd")


@pytest.mark.parametrize("name,dtype", FAMILY_DTYPES, ids=[f"{n}-{d}" for n, d in FAMILY_DTYPES])
def test_torch_out_is_written_in_place(name, dtype, device_cc):
    torch = _torch()
    d = dims(dtype, Sq=77, Sk=77)
    require(name, device_cc, **d, causal=False)
    q, k, v = _torch_inputs(torch, d, seed_for(name, dtype, "inplace"))
    out = torch.full_like(q, float("nan"))
    lse = torch.full((2, 4, 77), float("nan"), device="cuda", dtype=torch.float32)
    ptr, lse_ptr = out.data_ptr(), lse.data_ptr()
    res, res_lse = ca.attention(q, k, v, layout="bshd", out=out, lse_out=lse, return_lse=True,
                                kernel=name)
    assert res is out and res_lse is lse
    assert out.data_ptr() == ptr and lse.data_ptr() == lse_ptr
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    qc, kc, vc = (_as_cupy64(t) for t in (q, k, v))
    check(_as_cupy64(out).swapaxes(1, 2), _as_cupy64(lse), qc, kc, vc, dtype, causal=False,
          layout="bshd")


@pytest.mark.parametrize("name", NAMES)
def test_torch_inputs_are_read_in_place(name, device_cc):
    """Zero-copy in: a view of a packed torch QKV tensor works, and the kernel reads
    what torch wrote just before (no stale copy)."""
    torch = _torch()
    dtype = "float16" if "float16" in FAMILIES[name].dtypes else FAMILIES[name].dtypes[0]
    d = dims(dtype, Hq=4, Hkv=4, Sq=96, Sk=96)
    require(name, device_cc, **d, causal=True)
    qkv = torch.randn(2, 96, 3, 4, 64, device="cuda", dtype=getattr(torch, dtype))
    q, k, v = qkv.unbind(dim=2)
    first = ca.attention(q, k, v, causal=True, layout="bshd", kernel=name).clone()
    qkv[:, :, 2] *= -1                                     # v <- -v, in place
    second = ca.attention(q, k, v, causal=True, layout="bshd", kernel=name)
    torch.testing.assert_close(second, -first, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_torch_non_default_stream(name, device_cc):
    """On a side torch stream, q is produced after a ~50 ms sleep kernel; attention
    must run after it on the same stream, with no extra synchronisation."""
    torch = _torch()
    dtype = "float16" if "float16" in FAMILIES[name].dtypes else FAMILIES[name].dtypes[0]
    d = dims(dtype)
    require(name, device_cc, **d, causal=True)
    q_src, k, v = _torch_inputs(torch, d, seed_for(name, "stream"))
    q = torch.full_like(q_src, float("nan"))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        q.copy_(q_src)
        out = ca.attention(q, k, v, causal=True, layout="bshd", kernel=name)
        result = out.clone()
        out.fill_(float("nan"))          # a later write on the same stream
    side.synchronize()
    qc, kc, vc = (_as_cupy64(t) for t in (q_src, k, v))
    ref, _ = plain_attention(qc, kc, vc, causal=True, layout="bshd")
    same, _ = plain_attention(qc, kc, vc, causal=True, layout="bshd", precision=dtype)
    check_attention(_as_cupy64(result).swapaxes(1, 2), ref, same, dtype)


# CuPy streams --------------------------------------------------------------------

_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) { }
}
"""


@pytest.mark.parametrize("name", NAMES)
def test_cupy_non_default_stream(name, device_cc):
    import cupy

    dtype = "float16" if "float16" in FAMILIES[name].dtypes else FAMILIES[name].dtypes[0]
    d = dims(dtype, layout="bhsd")
    require(name, device_cc, **d, causal=False)
    q_src, k, v, _ = make_qkv(cupy, seed_for(name, "cupy-stream"), **d)
    q = nan_array(q_src.shape, dtype, cupy)
    bits = lambda x: x.view(cupy.uint16 if x.itemsize == 2 else cupy.uint32)  # noqa: E731
    spin = cupy.RawKernel(_SPIN, "spin")
    spin.compile()
    cupy.cuda.Device().synchronize()
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        spin((1,), (1,), (np.int64(100_000_000),))     # ~50 ms
        bits(q)[...] = bits(q_src)
        out = ca.attention(q, k, v, kernel=name)
        result = bits(out).copy().view(out.dtype)
        bits(out).fill(0)                              # a later write on the same stream
    side.synchronize()
    ref, _ = plain_attention(q_src, k, v)
    same, _ = plain_attention(q_src, k, v, precision=dtype)
    check_attention(as_float(result), ref, same, dtype)


# NumPy in / NumPy out on the device ----------------------------------------------

@pytest.mark.parametrize("name,dtype", FAMILY_DTYPES, ids=[f"{n}-{d}" for n, d in FAMILY_DTYPES])
def test_numpy_in_numpy_out(name, dtype, device_cc):
    d = dims(dtype, Sq=33, Sk=65, layout="bhsd")
    require(name, device_cc, **d, causal=True)
    q, k, v, _ = make_qkv(np, seed_for(name, dtype, "numpy"), **d)
    out, lse = ca.attention(q, k, v, causal=True, return_lse=True, kernel=name)
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)
    assert out.dtype == q.dtype and out.shape == q.shape and lse.dtype == np.float32
    check(as_float(out), lse.astype(np.float64), q, k, v, dtype, causal=True, layout="bhsd")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_auto_picks_a_family_that_runs_the_problem(dtype):
    import cupy

    d = dims(dtype, layout="bhsd")
    q, k, v, _ = make_qkv(cupy, seed_for("auto", dtype), **d)
    out, lse = ca.attention(q, k, v, causal=True, return_lse=True)
    check(as_float(out), lse.astype(cupy.float64), q, k, v, dtype, causal=True, layout="bhsd")


# determinism ---------------------------------------------------------------------

@pytest.mark.parametrize("name,dtype", FAMILY_DTYPES, ids=[f"{n}-{d}" for n, d in FAMILY_DTYPES])
def test_forward_is_bitwise_deterministic(name, dtype, device_cc):
    import cupy

    d = dims(dtype, B=2, Hq=6, Hkv=2, Sq=333, Sk=517, D=96, layout="bhsd")
    require(name, device_cc, **d, causal=True)
    q, k, v, _ = make_qkv(cupy, seed_for(name, dtype, "det"), **d)
    runs = [ca.attention(q, k, v, causal=True, return_lse=True, kernel=name) for _ in range(3)]
    bits = lambda x: x.view(cupy.uint16 if x.itemsize == 2 else cupy.uint32)  # noqa: E731
    for out, lse in runs[1:]:
        assert bool((bits(out) == bits(runs[0][0])).all()), "output differs between runs"
        assert bool((bits(lse) == bits(runs[0][1])).all()), "LSE differs between runs"
    assert bool(cupy.isfinite(as_float(runs[0][0])).all())


# errors that need a device -------------------------------------------------------

def test_numpy_and_cupy_mixed_is_a_device_mismatch():
    import cupy

    q = np.ones((1, 2, 4, 8), dtype=np.float16)
    k = cupy.ones((1, 2, 4, 8), dtype=cupy.float16)
    with pytest.raises(DeviceMismatchError, match=r"q, k and v are on different devices"):
        ca.attention(q, k, np.ones_like(q))
    with pytest.raises(DeviceMismatchError, match=r"^out is on device"):
        ca.attention(k, k, k, out=np.ones_like(q))


def test_arrays_on_two_devices():
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two CUDA devices")
    q = cupy.ones((1, 2, 4, 8), dtype=cupy.float16)
    with cupy.cuda.Device(1):
        k = cupy.ones((1, 2, 4, 8), dtype=cupy.float16)
    with pytest.raises(DeviceMismatchError, match=r"different devices \(0, 1, 0\)"):
        ca.attention(q, k, q)


def test_unknown_kernel_through_the_api():
    import cupy

    q = cupy.ones((1, 2, 4, 8), dtype=cupy.float16)
    with pytest.raises(UnsupportedError, match=r"unknown kernel 'fastest'.*'reference'"):
        ca.attention(q, q, q, kernel="fastest")


@pytest.mark.parametrize("name", NAMES)
def test_head_dim_beyond_the_family_through_the_api(name, device_cc):
    import cupy

    family = FAMILIES[name]
    dtype = family.dtypes[0]
    for D in (257, 300, 512, 4097, 8192):
        p = problem_for(batch=1, heads_q=2, heads_kv=2, seqlen_q=4, seqlen_k=4, head_dim=D,
                        dtype=dtype)
        if family.check(p, device_cc) is not None:
            break
    else:
        pytest.skip(f"{name} takes head dims up to 8192")
    q = nan_array((1, 2, 4, D), dtype, cupy)
    with pytest.raises(UnsupportedError, match=rf"{D}.*kernels that run this problem: .*reference"):
        ca.attention(q, q, q, kernel=name)


@pytest.mark.parametrize("kind", ["cupy", "torch"])
@pytest.mark.parametrize("D", [64, 72])
def test_backward_hot_path_matches_the_general_path(kind, D):
    """A repeated backward signature repeats the launches with new pointers: bitwise the
    general path's gradients (deterministic dQ) for new values; pointers that are not
    16-byte aligned (an offset view) leave the hot path for the kernels that take them."""
    import cupy

    from cupy_attention import backward

    torch = pytest.importorskip("torch") if kind == "torch" else None
    rng = np.random.default_rng(5)

    def arrays(offset=0):
        def one(h):   # same shape and strides; the base moved by `offset` elements
            n = 2 * h * 48 * D
            a = rng.standard_normal(n + offset).astype(np.float16)
            x = torch.from_numpy(a).cuda() if torch is not None else cupy.asarray(a)
            return x[offset:].reshape(2, h, 48, D)
        q, k, v, dout = one(4), one(2), one(2), one(4)
        out, lse = ca.attention(q, k, v, causal=True, return_lse=True)
        return dout, q, k, v, out, lse

    def bits(x):
        x = x.contiguous().view(torch.int16).cpu().numpy() if torch is not None else x.get()
        return x.view(np.uint16)

    def run(args):
        return ca.attention_backward(*args, causal=True, deterministic=True)

    run(arrays())                                     # registers the signature
    before = len(backward._HOT)
    for args in (arrays(), arrays(offset=1)):
        hot = run(args)
        assert len(backward._HOT) == before
        saved = dict(backward._HOT.entries)
        backward._HOT.entries.clear()
        try:
            general = run(args)
        finally:
            backward._HOT.entries.clear()
            backward._HOT.entries.update(saved)
        for x, y in zip(hot, general):
            assert (bits(x) == bits(y)).all()
