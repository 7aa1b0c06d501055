"""Kernel families by name, and the choice behind ``kernel="auto"``.

``FAMILIES`` (forward) and ``BACKWARD_FAMILIES`` list the device families fastest
first: ``auto`` takes the first one whose ``check`` accepts the problem on the
current device. ``reference`` (float64 NumPy on the host) is handled by the API.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

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
            if family.check(p, cc) is None and family.auto_takes(p):
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


# ---------------------------------------------------------------------------
# Backward


@dataclasses.dataclass(frozen=True)
class BackwardFamily:
    """A backward family module (``check``, ``launch``, ``prepare``, ``specs``, ``ci_specs``)
    under its kernel name. ``smem_bound``: its ``check`` takes the device's
    shared-memory limit per block (the tensor-core ones size tiles by it)."""
    name: str
    module: ModuleType
    smem_bound: bool

    def check(self, p: Problem, cc: int | None, smem: int) -> str | None:
        return self.module.check(p, cc, smem) if self.smem_bound else self.module.check(p, cc)

    def launch(self, p: Problem, t, stream, device_id: int, arch: str,
               deterministic: bool) -> None:
        self.module.launch(p, t, stream, device_id, arch, deterministic)

    def kv_splits(self, p: Problem, device_id: int, deterministic: bool) -> int:
        """Blocks per block of keys the family's dK/dV kernel takes for ``p`` (> 1: the
        caller hands in zeroed float32 dk_accum and dv_accum [B, Hkv, Sk, D])."""
        split = getattr(self.module, "kv_splits", None)
        if split is None:
            return 1
        from .device import multiprocessor_count

        return split(p, multiprocessor_count(device_id), deterministic)

    def dq_accum_shape(self, p: Problem, deterministic: bool) -> tuple | None:
        """The float32 ``dq_accum`` scratch the family's launch takes for ``p``: [B, Hq,
        Sq, D] in the default mode; in deterministic mode None, or where the family
        orders its dQ additions (flash_wgmma_bwd.dq_turns) B Hq Sq D floats and the
        int32 turn counters behind them, flat. None too where the family says its
        launch takes none (``takes_dq_accum``: flash_wgmma_bwd's own dQ pass)."""
        takes = getattr(self.module, "takes_dq_accum", None)
        if takes is not None and not takes(p, deterministic):
            return None
        if not deterministic:
            return (p.batch, p.heads_q, p.seqlen_q, p.head_dim)
        turns = getattr(self.module, "dq_turns", None)
        n = turns(p) if turns is not None else 0
        return (p.batch * p.heads_q * p.seqlen_q * p.head_dim + n,) if n else None

    def prepare(self, p: Problem, t, device_id: int, arch: str, deterministic: bool):
        """The hot path's launcher (flash_bwd.HotBackward), or None where a later call
        with other pointers could need other kernels."""
        return self.module.prepare(p, t, device_id, arch, deterministic)


_backward_families: dict[str, BackwardFamily] | None = None


def backward_families() -> dict[str, BackwardFamily]:
    """The backward families by name, fastest first. Their modules are imported on
    first use (a forward-only process never loads them); ``BACKWARD_FAMILIES`` is the
    same dict."""
    global _backward_families
    if _backward_families is None:
        from .families import flash_bwd, flash_mma_bwd, flash_wgmma_bwd

        _backward_families = {f.name: f for f in (
            BackwardFamily("flash_wgmma", flash_wgmma_bwd, True),
            BackwardFamily("flash_mma", flash_mma_bwd, True),
            BackwardFamily("flash", flash_bwd, False))}
    return _backward_families


def __getattr__(name: str):
    if name == "BACKWARD_FAMILIES":
        return backward_families()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def choose_backward(p: Problem, kernel: str, cc: int | None, smem: int) -> BackwardFamily:
    """The backward family that runs ``p`` (``kernel`` "auto" or a name of
    ``BACKWARD_FAMILIES``); a typed error naming the alternatives if none can."""
    families = backward_families()
    if kernel == "auto":
        for family in families.values():
            if family.check(p, cc, smem) is None:
                return family
        last = list(families.values())[-1]
        raise UnsupportedError(f"{last.check(p, cc, smem)}; kernel='reference' runs it on the host")
    family = families[kernel]
    reason = family.check(p, cc, smem)
    if reason is None:
        return family
    alts = [n for n, f in families.items() if n != kernel and f.check(p, cc, smem) is None]
    if not alts:
        raise UnsupportedError(f"{reason}; kernel='reference' runs it on the host")
    alt = " or ".join(f"kernel='{a}'" for a in alts + ["reference"])
    raise UnsupportedError(f"{reason}; {alt} runs it")
