"""The softcap, sliding-window and ALiBi instantiations of the non-Hopper kernel families
(flash, flash_mma, naive, tiled and the backwards flash_bwd, flash_mma_bwd) compile
with NVRTC for sm_80 and sm_90a with no register spills (no GPU needed).

Each kernel template of those families is instantiated once, from its CI spec of
the largest head dim without a dense mask (the one nearest to spilling), with the
variant type swapped for:
  window          Band<true, true>: a sliding window, both bounds
  causal-softcap  Band<false, true> with Softcap logits
  window-softcap  both bounds with Softcap logits
  causal-softcap-alibi  Band<false, true>, Softcap logits and the AlibiBias dense part
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import multiprocessing
import os
import re

import pytest

from cupy_attention.dispatch import FAMILIES
from cupy_attention.families import flash_bwd, flash_mma_bwd
from cupy_attention.variant import Variant

ARCHS = ("sm_80", "sm_90a")
VARIANTS = {
    "window": Variant(window=(64, 16)),
    "causal-softcap": Variant(causal=True, softcap=30.0),
    "window-softcap": Variant(window=(64, 16), softcap=30.0),
    "causal-softcap-alibi": Variant(causal=True, softcap=30.0, dense="alibi"),
}
PLAIN = (Variant().cpp(), Variant(causal=True).cpp())


def _head_dim(expr: str) -> int:
    m = re.search(r"<\w+Traits<(\d+)", expr)
    return int(m.group(1)) if m else 0


def _base_specs():
    """One CI spec per kernel template that takes a variant: the largest head dim."""
    specs = [s for name in ("flash", "flash_mma", "naive", "tiled") for s in FAMILIES[name].ci_specs()]
    specs += flash_bwd.ci_specs() + flash_mma_bwd.ci_specs()
    chosen: dict = {}
    for s in specs:
        if not any(v in s.expr for v in PLAIN):
            continue  # takes no variant, or a dense mask
        key = (s.source, s.expr.split("<", 1)[0])
        if key not in chosen or _head_dim(s.expr) > _head_dim(chosen[key].expr):
            chosen[key] = s
    return list(chosen.values())


def _variant_specs():
    out = []
    for base in _base_specs():
        plain = next(v for v in PLAIN if v in base.expr)
        for label, variant in VARIANTS.items():
            out.append(dataclasses.replace(base, expr=base.expr.replace(plain, variant.cpp()),
                                           name=f"{base.name}[{label}]"))
    return out


def _compile_one(job):
    spec, arch = job
    from cupy_attention import jit as _jit
    from cupy_attention.errors import CompileError

    try:
        c = _jit.compile_spec(spec, arch)
    except CompileError as exc:
        return spec, arch, None, exc.log
    return spec, arch, c.resources, ""


@pytest.fixture(scope="module")
def compiled():
    jobs = [(spec, arch) for spec in _variant_specs() for arch in ARCHS]
    workers = max(2, min(os.cpu_count() or 2, 8))
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        return list(pool.map(_compile_one, jobs))


def test_every_variant_kernel_is_covered():
    kernels = {s.expr.split("<", 1)[0] for s in _base_specs()}
    assert {"flash_fwd", "flash_mma_fwd", "naive_scores", "tiled_scores", "flash_bwd_dkdv",
            "flash_bwd_dq", "flash_mma_bwd_dkdv", "flash_mma_bwd_dq"} <= kernels
    for spec in _variant_specs():
        assert "Softcap" in spec.expr or "Band<true, true>" in spec.expr, spec.expr


@pytest.mark.parametrize("arch", ARCHS)
def test_variants_compile_without_spills(compiled, arch):
    rows = [r for r in compiled if r[1] == arch]
    assert len(rows) == len(_variant_specs())
    failed = [f"{spec.name}:\n{log}" for spec, _, res, log in rows if res is None]
    assert not failed, f"{len(failed)} fail to compile for {arch}:\n" + "\n".join(failed[:3])
    spills = [f"{spec.name}: {res.spill_stores} B spill stores, {res.spill_loads} B spill loads, "
              f"{res.registers} registers" for spec, _, res, _ in rows if res.spills]
    assert not spills, f"register spills on {arch}:\n" + "\n".join(spills)
