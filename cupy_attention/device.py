"""CUDA device discovery: one clear error where there is no GPU."""

from __future__ import annotations

import functools

from .errors import NoDeviceError


def require_cupy():
    try:
        import cupy
    except ImportError as exc:
        raise NoDeviceError(
            "CuPy is not installed; install cupy-attention with the extra for your CUDA "
            "major version: pip install 'cupy-attention[cuda12]' or '[cuda13]'"
        ) from exc
    return cupy


@functools.lru_cache(maxsize=None)
def device_count() -> int:
    cupy = require_cupy()
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def require_device() -> None:
    """Raise :class:`NoDeviceError` unless a CUDA device is usable."""
    if device_count() == 0:
        raise NoDeviceError(
            "no CUDA device is available (no NVIDIA GPU or driver found); cupy_attention "
            "kernels need one. kernel='reference' runs on the CPU."
        )


@functools.lru_cache(maxsize=None)
def compute_capability(device_id: int) -> int:
    cupy = require_cupy()
    return int(cupy.cuda.Device(device_id).compute_capability)


def arch_for_cc(cc: int) -> str:
    """NVRTC target for a compute capability: the `a` variant on Hopper (wgmma)."""
    return f"sm_{cc}a" if cc == 90 else f"sm_{cc}"


@functools.lru_cache(maxsize=None)
def driver_library():
    """The CUDA driver library (``libcuda``, which CuPy loads already) through ctypes,
    for the entry points CuPy does not bind (tensor maps, cuLaunchKernelEx)."""
    import ctypes
    import sys

    return ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")


def arch_cc(arch: str) -> int:
    """The compute capability of an NVRTC target: ``sm_90a`` -> 90."""
    return int(arch[3:].rstrip("af"))


@functools.lru_cache(maxsize=None)
def device_arch(device_id: int) -> str:
    return arch_for_cc(compute_capability(device_id))


@functools.lru_cache(maxsize=None)
def device_name(device_id: int) -> str:
    cupy = require_cupy()
    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


@functools.lru_cache(maxsize=None)
def multiprocessor_count(device_id: int) -> int:
    cupy = require_cupy()
    return int(cupy.cuda.Device(device_id).attributes["MultiProcessorCount"])


@functools.lru_cache(maxsize=None)
def max_shared_per_block(device_id: int) -> int:
    cupy = require_cupy()
    return int(cupy.cuda.Device(device_id).attributes["MaxSharedMemoryPerBlockOptin"])
