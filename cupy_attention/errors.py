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


class DriverError(AttentionError, RuntimeError):
    """The CUDA driver refused a step of a launch's setup (such as a tensor map)."""


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
