"""Every kernel family's CI instantiations compile with NVRTC for each architecture
in its ``ci_archs`` (sm_80 and sm_90a; sm_90a alone for wgmma) with no register spills
and no wgmma that ptxas serializes (no GPU needed).

The compilations run once per session in a process pool (NVRTC holds the GIL of
nothing: separate processes are what scales) and each (family, arch) test reads
the results.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import re
import time

import pytest

from cupy_attention import jit
from cupy_attention.dispatch import FAMILIES

ARCHS = ("sm_80", "sm_90a")


def _compile_one(job):
    spec, arch = job
    from cupy_attention import jit as _jit
    from cupy_attention.errors import CompileError

    t0 = time.perf_counter()
    try:
        c = _jit.compile_spec(spec, arch)
    except CompileError as exc:
        return spec, arch, None, exc.log, time.perf_counter() - t0
    return spec, arch, c.resources, c.log, time.perf_counter() - t0


@pytest.fixture(scope="module")
def compiled():
    """{(family, arch): [(spec, resources or None, ptxas or error log, seconds)]}."""
    jobs = [(name, spec, arch) for name, fam in FAMILIES.items() for spec in fam.ci_specs()
            for arch in fam.ci_archs]
    workers = max(2, min(os.cpu_count() or 2, 8))
    results: dict = {}
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        futures = {pool.submit(_compile_one, (spec, arch)): name for name, spec, arch in jobs}
        for fut in cf.as_completed(futures):
            spec, arch, res, log, secs = fut.result()
            results.setdefault((futures[fut], arch), []).append((spec, res, log, secs))
    return results


@pytest.mark.parametrize("name", list(FAMILIES))
def test_ci_specs_are_well_formed(name):
    specs = FAMILIES[name].ci_specs()
    assert specs, f"{name}.ci_specs() is empty"
    assert len({s.name for s in specs}) == len(specs), "readable names must be unique"
    assert len({(s.source, s.expr) for s in specs}) == len(specs), "no duplicate instantiations"
    for s in specs:
        assert (jit.kernels_dir() / s.source).is_file(), f"{s.name}: no kernels/{s.source}"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_compiles_without_spills(compiled, name, arch):
    if arch not in FAMILIES[name].ci_archs:
        pytest.skip(f"{name} is built for {', '.join(FAMILIES[name].ci_archs)} only")
    rows = compiled[(name, arch)]
    assert len(rows) == len(FAMILIES[name].ci_specs())
    failed = [f"{spec.name}:\n{log}" for spec, res, log, _ in rows if res is None]
    assert not failed, f"{len(failed)} {name} instantiations fail to compile for {arch}:\n" + \
        "\n".join(failed[:3])
    spills = [f"{spec.name}: {res.spill_stores} B spill stores, {res.spill_loads} B spill loads, "
              f"{res.registers} registers, {res.stack_frame} B stack"
              for spec, res, _, _ in rows if res.spills]
    assert not spills, f"register spills on {arch}:\n" + "\n".join(spills)
    for spec, res, _, _ in rows:
        assert 0 < res.registers <= 255, f"{spec.name}: {res.registers} registers"


# ptxas' wgmma advisories, codes C75xx: among them C7520 ("wgmma.mma_async
# instructions are serialized due to ...") and C7519 ("warpgroup.arrive is injected ...
# to allow use of registers in GMMA"). With either, ptxas waits after every wgmma of the
# kernel, which compiles and runs correctly at a fraction of the speed: two builds of
# flash_wgmma's forward with a wgmma issued under a branch ran at 0.54-0.92x and passed
# every GPU test (H100, 2026-11-27, benchmarks/results/h100-wgmma-tile-boundary-rejected.md).
# No CI instantiation draws any C75xx advisory today; a new one is a regression to read.
WGMMA_ADVISORY = re.compile(r"\(C75\d\d\)")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_wgmma_is_never_serialized(compiled, name):
    if "sm_90a" not in FAMILIES[name].ci_archs:
        pytest.skip(f"{name} is not built for sm_90a")
    serial = [f"{spec.name}: {line.strip()}" for spec, res, log, _ in compiled[(name, "sm_90a")]
              if res is not None for line in log.splitlines() if WGMMA_ADVISORY.search(line)]
    assert not serial, "ptxas wgmma advisories (C75xx):\n" + "\n".join(serial)
