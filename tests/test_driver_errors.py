"""A CUDA driver or runtime error at a launch surfaces as cupy_attention's DriverError
naming the kernel (jit.LoadedKernel.launch, through which every family launches),
with the driver's exception as its cause; other exceptions pass unchanged. CPU only:
the launches are fakes that raise what CuPy raises."""
from __future__ import annotations

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention import jit
from cupy_attention.errors import AttentionError, DriverError, translate_oom

pytest.importorskip("cupy")
from cupy.cuda import driver, runtime  # noqa: E402  (CuPy's bindings import without a GPU)


def cuda_error(cls, status: int, text: str):
    """An instance of CuPy's CUDADriverError / CUDARuntimeError. Their constructors ask
    libcuda for the error's name, which a machine without a driver lacks, so build one
    the way unpickling would, then give it its message and status."""
    try:
        return cls(status)
    except Exception:   # no libcuda here
        exc = cls.__new__(cls)
        Exception.__init__(exc, text)
        exc.status = status
        return exc


SPEC = jit.KernelSpec("flash.cu", "flash_fwd<X>", "flash[D=128,BM=64,BN=64,f16,causal]")


class FakeFunction:
    ptr = 1234

    def __init__(self, exc=None):
        self.exc, self.calls = exc, []

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        self.calls.append((grid, block, shared_mem))
        if self.exc is not None:
            raise self.exc


def loaded(fn) -> jit.LoadedKernel:
    compiled = jit.Compiled(SPEC, "sm_90a", b"", "_Z3fooX", "", jit.parse_resources(""))
    return jit.LoadedKernel(compiled, module=None, function=fn)


@pytest.mark.parametrize("cls,status,text", [
    (driver.CUDADriverError, 700,
     "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered"),
    (driver.CUDADriverError, 701,
     "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested for launch"),
    (runtime.CUDARuntimeError, 1, "cudaErrorInvalidValue: invalid argument"),
])
def test_launch_error_becomes_driver_error_naming_the_kernel(cls, status, text):
    exc = cuda_error(cls, status, text)
    kernel = loaded(FakeFunction(exc))
    with pytest.raises(DriverError) as info:
        kernel.launch((3, 4, 2), (128,), (), 1024, None)
    err = info.value
    assert isinstance(err, AttentionError) and isinstance(err, RuntimeError)
    assert err.__cause__ is exc
    assert err.kernel == SPEC.name and err.status == status
    msg = str(err)
    assert SPEC.name in msg and "(3, 4, 2)" in msg and "(128,)" in msg
    assert "\n" not in msg


def test_shared_memory_attribute_error_is_translated(monkeypatch):
    exc = cuda_error(driver.CUDADriverError, 1, "CUDA_ERROR_INVALID_VALUE: invalid argument")

    def refuse(ptr, attr, value):
        raise exc

    monkeypatch.setattr(driver, "funcSetAttribute", refuse)
    monkeypatch.setattr(driver, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8,
                        raising=False)
    fn = FakeFunction()
    with pytest.raises(DriverError, match="flash\\[D=128") as info:
        loaded(fn).launch((1,), (32,), (), 200 * 1024, None)
    assert info.value.__cause__ is exc and fn.calls == []


@pytest.mark.parametrize("exc", [ValueError("bad args"), TypeError("not an int"),
                                 RuntimeError("something else")])
def test_other_errors_pass_unchanged(exc):
    with pytest.raises(type(exc)) as info:
        loaded(FakeFunction(exc)).launch((1,), (32,), (), 0, None)
    assert info.value is exc


def test_successful_launch_is_untouched():
    fn = FakeFunction()
    loaded(fn).launch((5,), (64,), (), 0, None)
    assert fn.calls == [((5,), (64,), 0)]


def test_entry_points_let_driver_error_through():
    """translate_oom (on attention, attention_backward, attention_decode) keeps a
    DriverError as it is: it is no out-of-memory."""
    err = DriverError("CUDA error launching kernel k", kernel="k", status=700)

    @translate_oom
    def entry():
        raise err

    with pytest.raises(DriverError) as info:
        entry()
    assert info.value is err


def test_family_launch_surfaces_driver_error(monkeypatch):
    """Through a family's launch code (flash: params struct, grid, launch), with the JIT
    handing out a kernel whose launch fails: the API-level exception is DriverError."""
    from cupy_attention.families.base import Tensors
    from cupy_attention.families.flash import Flash

    from helpers import problem_for

    exc = cuda_error(driver.CUDADriverError, 719,
                     "CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure")
    fn = FakeFunction(exc)
    monkeypatch.setattr(jit, "get_function", lambda spec, arch, dev: loaded_as(spec, fn))
    import cupy_attention.device as device
    monkeypatch.setattr(device, "max_shared_per_block", lambda dev: 227 * 1024)
    monkeypatch.setattr(driver, "funcSetAttribute", lambda ptr, attr, value: None)
    monkeypatch.setattr(driver, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8,
                        raising=False)

    def launch_kernel(*args):   # LoadedKernel.launch_packed's driver call
        raise exc
    monkeypatch.setattr(driver, "launchKernel", launch_kernel)

    class Host:
        """A NumPy array with the .data.ptr a CuPy array has."""
        def __init__(self, shape, dtype):
            self.a = np.zeros(shape, dtype=dtype)
            self.strides, self.shape, self.itemsize = self.a.strides, self.a.shape, self.a.itemsize
            self.data = type("Ptr", (), {"ptr": self.a.ctypes.data})()

    p = problem_for(batch=1, heads_q=2, heads_kv=1, seqlen_q=33, seqlen_k=40, head_dim=64,
                    dtype="float16", causal=True)
    q, k, v, o = (Host(s, np.float16) for s in ((1, 2, 33, 64), (1, 1, 40, 64), (1, 1, 40, 64),
                                                 (1, 2, 33, 64)))
    with pytest.raises(DriverError) as info:
        Flash().launch(p, Tensors(q, k, v, o), None, 0, "sm_90a")
    assert info.value.kernel.startswith("flash[D=64") and info.value.status == 719
    assert info.value.__cause__ is exc


def test_packed_launch_error_becomes_driver_error(monkeypatch):
    """LoadedKernel.launch_packed (the hot paths' launch: the parameter struct's bytes
    through cuLaunchKernel's extra buffer) names the kernel as launch does, and passes
    the grid, block, shared memory and stream it was given."""
    seen = []
    exc = cuda_error(driver.CUDADriverError, 701,
                     "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested")

    def launch_kernel(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        seen.append((f, (gx, gy, gz), (bx, by, bz), smem, stream, params))
        raise exc
    monkeypatch.setattr(driver, "launchKernel", launch_kernel)
    fn = FakeFunction(None)
    fn.ptr = 1234
    with pytest.raises(DriverError) as info:
        loaded(fn).launch_packed((3, 4), (128,), bytearray(64), 1024, 77)
    assert info.value.status == 701 and info.value.__cause__ is exc
    assert seen == [(1234, (3, 4, 1), (128, 1, 1), 1024, 77, 0)]


def loaded_as(spec, fn) -> jit.LoadedKernel:
    compiled = jit.Compiled(spec, "sm_90a", b"", "_Z3fooX", "", jit.parse_resources(""))
    return jit.LoadedKernel(compiled, module=None, function=fn)


def test_driver_error_is_exported():
    assert ca.DriverError is DriverError
