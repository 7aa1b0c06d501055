"""Kernel families by name, and the choice behind ``kernel="auto"``.

``FAMILIES`` lists the device families fastest first: ``auto`` takes the first one
whose :meth:`~cupy_attention.families.base.Family.check` accepts the problem on the
current device. ``reference`` (float64 NumPy on the host) is handled by the API.
"""

from __future__ import annotations

from .errors import UnsupportedError
from .families.base import Family
from .families.decode import Decode
from .families.flash import Flash
from .families.flash_mma import FlashMma
from .families.flash_wgmma import FlashWgmma
from .families.naive import Naive
from .families.tiled import Tiled
from .problem import Problem

FAMILIES: dict[str, Family] = {
    f.name: f for f in (Decode(), FlashWgmma(), FlashMma(), Flash(), Tiled(), Naive())}
HOST_KERNELS = ("reference",)


def kernel_names() -> list[str]:
    return ["auto", *FAMILIES, *HOST_KERNELS]


def check_kernel_name(kernel: str) -> None:
    if kernel not in kernel_names():
        raise UnsupportedError(f"unknown kernel {kernel!r}; choose one of {kernel_names()}")


def supporting(p: Problem, cc: int | None) -> list[str]:
    return [name for name, f in FAMILIES.items() if f.check(p, cc) is None]


def choose(p: Problem, kernel: str, cc: int | None) -> Family:
    """The family that runs ``p``; a typed error naming the alternatives if none can."""
    if kernel == "auto":
        for family in FAMILIES.values():
            if family.check(p, cc) is None:
                return family
        reasons = "; ".join(f.check(p, cc) for f in FAMILIES.values())
        raise UnsupportedError(f"no kernel runs {p.describe()}: {reasons}")
    check_kernel_name(kernel)
    family = FAMILIES[kernel]
    reason = family.check(p, cc)
    if reason is not None:
        others = [n for n in supporting(p, cc) if n != kernel] + list(HOST_KERNELS)
        raise UnsupportedError(f"{reason}; kernels that run this problem: {', '.join(others)}")
    return family
