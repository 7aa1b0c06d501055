"""Where a kernel's warps wait, from Nsight Compute's per-instruction samples: the
instructions that hold the most warp-state samples, with their stall reasons.

Input: the CSV that ``ncu --section SourceCounters --section WarpStateStats --page source
--print-source sass --csv`` writes (one block per profiled kernel, each starting with a
"Kernel Name" line). For each kernel: its total samples, then the ``--top`` instructions
by samples (share, SASS, executed count, the non-zero stall reasons), and with ``--few``
the share of samples on instructions that ran fewer times than the kernel's most
frequent ones (a single warp's or thread's code path, such as a copy issued by one
thread, shows up there). CPU only.

    ncu --profile-from-start off --section SourceCounters --section WarpStateStats \\
        --page source --print-source sass --csv python3 case.py > stalls.csv
    python scripts/ncu_stalls.py stalls.csv --top 12 --few
"""
from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass, field

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


@dataclass
class Kernel:
    name: str
    rows: list = field(default_factory=list)   # dicts: one per SASS instruction

    @property
    def samples(self) -> float:
        return sum(_num(r.get(SAMPLES)) for r in self.rows)


def _num(text) -> float:
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return 0.0


def parse(lines) -> list[Kernel]:
    """The kernels of an ncu source-page CSV, each with its instruction rows."""
    kernels: list[Kernel] = []
    block: list[str] = []
    name = None

    def flush():
        if name is not None and block:
            reader = csv.DictReader(block)
            kernels.append(Kernel(name, [dict(r) for r in reader]))

    for line in lines:
        if line.startswith('"Kernel Name"'):
            flush()
            name = next(csv.reader([line]))[1]
            block = []
        elif name is not None and line.strip() and not line.startswith("=="):
            block.append(line)
    flush()
    return kernels


def stalls(row: dict) -> dict:
    """The row's non-zero stall reasons (issued and not issued together)."""
    out = {}
    for key, value in row.items():
        if key and key.startswith("stall_") and "(Not Issued)" not in key and _num(value):
            out[key[len("stall_"):]] = _num(value)
    return out


def report(k: Kernel, top: int, few: bool) -> str:
    total = k.samples or 1.0
    lines = [f"{k.name[:110]}", f"  {len(k.rows)} instructions, {total:.0f} samples"]
    for r in sorted(k.rows, key=lambda r: -_num(r.get(SAMPLES)))[:top]:
        share = 100 * _num(r.get(SAMPLES)) / total
        named = stalls(r)
        # samples that no exported column names (a warpgroup MMA's wait for its
        # warpgroup, for one): the rest of the row's count
        rest = _num(r.get(SAMPLES)) - sum(named.values())
        if rest >= 1:
            named["unnamed"] = rest
        reasons = ", ".join(f"{n} {v:.0f}" for n, v in
                            sorted(named.items(), key=lambda x: -x[1])[:3])
        lines.append(f"  {share:5.1f}%  {_num(r.get(EXECUTED)):>10.0f}  "
                     f"{r.get('Source', '').strip()[:60]:60s}  {reasons}")
    if few:
        most = max((_num(r.get(EXECUTED)) for r in k.rows), default=0)
        rare = [r for r in k.rows if 0 < _num(r.get(EXECUTED)) < most / 4]
        share = 100 * sum(_num(r.get(SAMPLES)) for r in rare) / total
        lines.append(f"  instructions run under a quarter as often as the most frequent: "
                     f"{len(rare)}, {share:.1f}% of the samples")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --csv output")
    ap.add_argument("--top", type=int, default=12, help="instructions to list per kernel")
    ap.add_argument("--few", action="store_true",
                    help="also the samples on rarely executed instructions")
    a = ap.parse_args(argv)
    with open(a.csv) as f:
        kernels = parse(f)
    if not kernels:
        print(f"{a.csv}: no kernel blocks (is it ncu --page source --csv output?)",
              file=sys.stderr)
        return 1
    for k in kernels:
        print(report(k, a.top, a.few))
    return 0


if __name__ == "__main__":
    sys.exit(main())
