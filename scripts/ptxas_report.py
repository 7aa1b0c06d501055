"""ptxas' registers and spills of every CI instantiation, forward and backward, as JSON.

Compiles (NVRTC, no GPU) each family's ``ci_specs()`` for its CI archs in a process
pool and writes ``{"arch|spec name": {"registers", "spills", "stack"}}``. Two
reports (before and after a change) compare with ``--diff OLD NEW``: the
instantiations whose registers or spills moved.

    python scripts/ptxas_report.py --json after.json
    python scripts/ptxas_report.py --diff before.json after.json
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing
import os
import sys


def ci_jobs():
    from cupy_attention.dispatch import FAMILIES
    from cupy_attention.families import flash_bwd, flash_mma_bwd, flash_wgmma_bwd

    jobs = [(spec, arch) for fam in FAMILIES.values() for spec in fam.ci_specs()
            for arch in fam.ci_archs]
    jobs += [(s, a) for s in flash_bwd.ci_specs() + flash_mma_bwd.ci_specs()
             for a in ("sm_80", "sm_90a")]
    jobs += [(s, "sm_90a") for s in flash_wgmma_bwd.ci_specs()]
    return list(dict.fromkeys(jobs))


def _one(job):
    from cupy_attention import jit

    spec, arch = job
    r = jit.compile_spec(spec, arch).resources
    return f"{arch}|{spec.name}", {"registers": r.registers, "spills": r.spills,
                                   "stack": r.stack_frame}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"))
    ap.add_argument("--match", default="", help="only spec names containing this")
    a = ap.parse_args()
    if a.diff:
        old, new = (json.load(open(x)) for x in a.diff)
        moved = [(k, old.get(k), v) for k, v in sorted(new.items()) if old.get(k) != v]
        for k, o, n in moved:
            print(f"{k}: {o} -> {n}")
        print(f"{len(moved)} of {len(new)} moved; {len(set(old) - set(new))} only in OLD")
        return 0
    jobs = [j for j in ci_jobs() if a.match in j[0].name]
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max(2, os.cpu_count() or 2), mp_context=ctx) as pool:
        report = dict(pool.map(_one, jobs))
    text = json.dumps(report, indent=1, sort_keys=True)
    if a.json:
        open(a.json, "w").write(text)
    else:
        print(text)
    print(f"{len(report)} instantiations, {sum(v['spills'] > 0 for v in report.values())} spill",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
