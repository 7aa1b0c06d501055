"""Typed exceptions.

Every error a caller can trigger with bad input derives from ``ValueError`` or
``TypeError`` (so generic handlers keep working) and from ``AttentionError`` (so
callers can catch this library's errors alone). Messages name the argument and
say how to fix it.
"""

from __future__ import annotations


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
