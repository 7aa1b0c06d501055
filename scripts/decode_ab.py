"""Same-run A/B of the decode kernel in two checkouts of this package.

    python scripts/decode_ab.py --trees OLD_DIR NEW_DIR --rounds 2 --json out.json -- \\
        --pages 0,16,1 --shape 8,32,8,16,8192,64 --shape 64,32,8,1,8192,128

Each round runs each tree's own ``scripts/decode_bench.py --no-torch`` once, in its own
process (two copies of one package cannot share a process), alternating old, new, old,
new, so drift of the machine hits both alike; everything after ``--`` goes to
decode_bench (shapes, page sizes, --reps, --splits, --dtype ...). Per (shape, page size,
layout): each tree's fastest round, the new/old speed ratio, and the old tree's spread
over its rounds (slowest / fastest - 1), the noise floor a ratio has to clear. Prints
one row per cell and the median ratio last; --json keeps every round's report.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

KEY = ("B", "Hq", "Hkv", "Sq", "Sk", "D", "page", "layout")


def cells(report: dict) -> dict:
    """{cell key: seconds} of our rows of one decode_bench report (errors left out)."""
    return {tuple(r.get(k) for k in KEY): r["seconds"] for r in report["rows"]
            if r.get("impl") == "ours" and "seconds" in r}


def summarize(old_reports: list, new_reports: list) -> list:
    """Rows (key, old seconds, new seconds, new/old speed, old spread) for the cells both
    trees timed in every round: each tree's fastest round, spread = slowest / fastest - 1
    of the old tree's rounds."""
    old = [cells(r) for r in old_reports]
    new = [cells(r) for r in new_reports]
    keys = [k for k in old[0] if all(k in c for c in old + new)]
    rows = []
    for k in keys:
        o = [c[k] for c in old]
        n = min(c[k] for c in new)
        rows.append((k, min(o), n, min(o) / n, max(o) / min(o) - 1))
    return rows


def render(rows: list) -> str:
    lines = [f"{'B':>4} {'Hq':>3} {'Hkv':>3} {'Sq':>3} {'Sk':>7} {'D':>4} {'cache':>9} "
             f"{'old us':>9} {'new us':>9} {'new/old':>8} {'old spread':>10}"]
    for (b, hq, hkv, sq, sk, d, page, layout), o, n, ratio, spread in rows:
        cache = (f"page={page}" if page else "contig") + ("" if layout == "nhd" else f" {layout}")
        lines.append(f"{b:>4} {hq:>3} {hkv:>3} {sq:>3} {sk:>7} {d:>4} {cache:>9} "
                     f"{o * 1e6:9.1f} {n * 1e6:9.1f} {ratio:8.3f} {spread * 100:9.1f}%")
    if rows:
        lines.append(f"median new/old {statistics.median(r[3] for r in rows):.3f} over "
                     f"{len(rows)} cells; old spread median "
                     f"{statistics.median(r[4] for r in rows) * 100:.1f}%, "
                     f"max {max(r[4] for r in rows) * 100:.1f}%")
    return "\n".join(lines)


def run_tree(tree: str, bench_args: list, out: Path) -> dict:
    """One decode_bench run of ``tree``'s package and script; its JSON report."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    cmd = [sys.executable, "scripts/decode_bench.py", "--no-torch", "--json", str(out),
           *bench_args]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs=2, metavar=("OLD", "NEW"), required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", help="every round's reports and the summary")
    a = ap.parse_args(argv[:split])
    bench_args = argv[split + 1:]
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    for tree in a.trees:
        if not (Path(tree) / "scripts" / "decode_bench.py").is_file():
            ap.error(f"--trees: {tree} holds no scripts/decode_bench.py")
    reports = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for side, tree in zip(("old", "new"), a.trees):
                print(f"round {r + 1}: {side} ({tree})", file=sys.stderr)
                reports[side].append(run_tree(tree, bench_args,
                                              Path(tmp) / f"{side}{r}.json"))
    rows = summarize(reports["old"], reports["new"])
    print(render(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(
            {"trees": a.trees, "bench_args": bench_args, "rounds": reports,
             "summary": [dict(zip(KEY, k), old_s=o, new_s=n, ratio=x, old_spread=s)
                         for k, o, n, x, s in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
