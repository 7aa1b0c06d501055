"""pytest setup: GPU tests (marker ``gpu``) skip with a visible reason where CuPy
sees no CUDA device; the reason is repeated in the terminal summary."""

from __future__ import annotations

import functools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # `import helpers` from every test module


@functools.lru_cache(maxsize=None)
def gpu_unavailable_reason() -> str | None:
    """None when CuPy can use a CUDA device, else why not (one line)."""
    try:
        import cupy
    except ImportError as exc:
        return f"CuPy is not importable ({exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device, broken install
        return f"no CUDA device visible to CuPy ({type(exc).__name__}: {exc})".replace("\n", " ")
    if n == 0:
        return "no CUDA device visible to CuPy (device count 0)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "gpu" in getattr(r, "keywords", {})]
    if skipped:
        terminalreporter.write_line(
            f"{len(skipped)} GPU tests skipped: {reason}. Run `python -m pytest -m gpu` on a "
            "machine with an NVIDIA GPU (scripts/gpu_suite.sh).")


def prewarm_cases(items) -> list:
    """The ``PREWARM`` entries, (kernel name, case), of the modules of the selected GPU
    tests: a module's whole list, or, where the module sets ``PREWARM_PARAMS`` (its
    entries are its tests' ``name`` and ``case`` parameters), only those of selected
    tests, so a ``-k`` run compiles what it runs."""
    gpu = [item for item in items if "gpu" in item.keywords]
    selected = {(item.callspec.params.get("name"), id(item.callspec.params.get("case")))
                for item in gpu if hasattr(item, "callspec")}
    cases = []
    for m in dict.fromkeys(item.module for item in gpu):
        entries = getattr(m, "PREWARM", [])
        if getattr(m, "PREWARM_PARAMS", False):
            entries = [(n, c) for n, c in entries if (n, id(c)) in selected]
        cases += entries
    return cases


@pytest.fixture(scope="session", autouse=True)
def _compile_gpu_kernels_in_parallel(request):
    """Before the first test: when GPU tests are selected and a device is present,
    compile the kernel instantiations their modules list in ``PREWARM`` (prewarm_cases)
    in a process pool (helpers.prewarm), so tests load them from the disk cache instead
    of compiling one at a time."""
    if gpu_unavailable_reason() is not None:
        return
    cases = prewarm_cases(request.session.items)
    if cases:
        from helpers import prewarm

        prewarm(cases)


@pytest.fixture(scope="session")
def device_cc() -> int:
    """Compute capability of the current device (GPU tests only)."""
    from cupy_attention import device

    import cupy

    return device.compute_capability(cupy.cuda.runtime.getDevice())


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """A private, empty JIT disk cache for one test."""
    d = tmp_path / "jit-cache"
    monkeypatch.setenv("CUPY_ATTENTION_CACHE_DIR", str(d))
    monkeypatch.delenv("CUPY_ATTENTION_NO_CACHE", raising=False)
    monkeypatch.delenv("CUPY_ATTENTION_DUMP_SOURCE", raising=False)
    return d
