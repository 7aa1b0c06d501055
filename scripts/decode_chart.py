#!/usr/bin/env python3
"""A grouped bar chart of a ``scripts/decode_bench.py`` JSON: TB/s of K and V per shape,
ours (contiguous and each page size) beside torch SDPA's backends.

    python scripts/decode_chart.py benchmarks/results/h100-decode-mma.json \\
        benchmarks/results/plots/decode-h100.png
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("png")
    a = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.load(open(a.json))
    shapes, series = [], {}
    for r in report["rows"]:
        if "tbps" not in r:
            continue
        shape = (r["B"], r["Hq"], r["Hkv"], r["Sq"], r["Sk"], r["D"])
        if shape not in shapes:
            shapes.append(shape)
        if r["impl"] == "ours":
            name = f"ours, page {r['page']}" if r["page"] else "ours, contiguous"
        else:
            name = f"torch {r['impl']}"
        series.setdefault(name, {})[shape] = r["tbps"]
    names = sorted(series, key=lambda n: (not n.startswith("ours"), "page" in n,
                                          int(n.split()[-1]) if n.split()[-1].isdigit() else 0,
                                          n))
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(shapes)), 4.5))
    for i, name in enumerate(names):
        xs = [x + (i - (len(names) - 1) / 2) * width for x in range(len(shapes))]
        ax.bar(xs, [series[name].get(s, 0) for s in shapes], width, label=name)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([f"B{b} Sk{sk // 1024}k\n{hq}/{hkv} D{d} Sq{sq}"
                        for b, hq, hkv, sq, sk, d in shapes], fontsize=7)
    ax.set_ylabel("TB/s of K and V read")
    ax.set_title(f"decode, {report['dtype']}, {report['device']}, {report['date'][:10]}",
                 fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.png, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
