"""Typed exceptions.

Every error a caller can trigger with bad input derives from ``ValueError`` or
``TypeError`` (so generic handlers keep working) and from ``AttentionError`` (so
callers can catch this library's errors alone). Messages name the argument and
say how to fix it.
"""

from __future__ import annotations

import functools


class AttentionError(Exception):
    """Base class of every error raised by cupy_attention."""


class ShapeError(AttentionError, ValueError):
    """An argument has the wrong rank or shape, or shapes disagree."""


class LayoutError(AttentionError, ValueError):
    """An argument's memory layout is unsupported (e.g. last-dim stride != 1)."""


class DTypeError(AttentionError, TypeError):
    """An argument has an unsupported dtype, or dtypes disagree."""


class DeviceMismatchError(AttentionError, ValueError):
    """Arguments live on different devices."""


class UnsupportedError(AttentionError, ValueError):
    """The chosen kernel cannot run this problem (head dim, dtype, arch...)."""


class NoDeviceError(AttentionError, RuntimeError):
    """No usable CUDA device (or driver) is present."""


class CompileError(AttentionError, RuntimeError):
    """NVRTC failed to compile a kernel instantiation.

    ``spec_name`` is the readable instantiation name, ``log`` the NVRTC log.
    """

    def __init__(self, spec_name: str, log: str):
        self.spec_name = spec_name
        self.log = log
        super().__init__(f"NVRTC failed to compile {spec_name}:\n{log}")

    def __reduce__(self):
        # rebuilt from its fields, so that it crosses process boundaries (a process
        # pool's worker that compiles ahead pickles it)
        return type(self), (self.spec_name, self.log)


class DriverError(AttentionError, RuntimeError):
    """The CUDA driver refused a step of a launch: its setup (such as a tensor map) or
    the launch itself. ``kernel`` names the kernel instantiation where one was being
    launched, ``status`` is the CUDA error code where the driver gave one; the
    driver's own exception is the ``__cause__``."""

    def __init__(self, message: str, *, kernel: str | None = None, status: int | None = None):
        super().__init__(message)
        self.kernel = kernel
        self.status = status


def _is_cuda_error(exc: BaseException) -> bool:
    # cupy.cuda.driver.CUDADriverError and cupy.cuda.runtime.CUDARuntimeError, by name
    # (as _is_device_oom does): nothing here imports CuPy
    return type(exc).__name__ in ("CUDADriverError", "CUDARuntimeError") and isinstance(
        exc, RuntimeError)


def driver_error(exc: BaseException, kernel: str, what: str) -> DriverError | None:
    """The :class:`DriverError` for a CUDA error ``exc`` raised while ``what`` (for
    example "launching") the kernel ``kernel``; None for any other exception."""
    if not _is_cuda_error(exc):
        return None
    status = getattr(exc, "status", None)
    return DriverError(
        f"CUDA error {what} kernel {kernel}: {exc} (status {status}); an error left by an "
        "earlier asynchronous launch can surface here too, and a sticky one (such as an "
        "illegal address) leaves the CUDA context unusable until the process exits",
        kernel=kernel, status=status)


class OutOfMemoryError(AttentionError, MemoryError):
    """The GPU had no memory for a result or a scratch buffer (CuPy's or torch's
    allocator refused). Nothing of the call is kept: the next call can run once memory
    is free."""


def _is_device_oom(exc: BaseException) -> bool:
    # cupy.cuda.memory.OutOfMemoryError (a MemoryError) and torch.OutOfMemoryError (a
    # RuntimeError), named alike; neither package need be imported to recognise them
    return type(exc).__name__ == "OutOfMemoryError" and isinstance(exc, (MemoryError, RuntimeError))


def translate_oom(fn):
    """Entry points raise :class:`OutOfMemoryError` for an allocator's out-of-memory."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except AttentionError:
            raise
        except Exception as exc:
            if _is_device_oom(exc):
                raise OutOfMemoryError(
                    f"{fn.__name__}: the GPU ran out of memory ({exc}); nothing was kept: "
                    "free memory (for example cupy.get_default_memory_pool().free_all_blocks()) "
                    "or use a smaller batch") from exc
            raise
    return wrapper
