#!/usr/bin/env python3
"""A chart of decode TB/s: a grouped bar chart of a ``scripts/decode_bench.py`` JSON (TB/s
of K and V per shape, ours contiguous and each page size beside torch SDPA's backends),
or, for a ``cupy-attention bench --decode-grid`` JSON, one scatter panel per head dim:
TB/s against the bytes of K and V, query rows per sequence (Sq) as the marker.

    python scripts/decode_chart.py benchmarks/results/h100-decode-mma.json \\
        benchmarks/results/plots/decode-h100.png
    python scripts/decode_chart.py benchmarks/results/h200-decode-grid-40264e6.json \\
        benchmarks/results/plots/decode-grid-h200.png
"""

from __future__ import annotations

import argparse
import json
import sys


def chart_inputs(doc: str):
    """The command line of a chart script (a JSON in, a PNG out): (report, png path,
    matplotlib.pyplot with the Agg backend). scripts/peers_chart.py shares it."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("png")
    a = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return json.load(open(a.json)), a.png, plt


def main() -> int:
    report, png, plt = chart_inputs(__doc__)
    if "results" in report:
        return grid_chart(report, png, plt)
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
    fig.savefig(png, dpi=120)
    return 0


def grid_chart(report: dict, png: str, plt) -> int:
    """The decode grid of a bench report: a panel per head dim, TB/s of K and V against
    their bytes; ours contiguous and pages of 16 and 1, torch's two backends."""
    rows = [r for r in report["results"] if r.get("kind") == "decode" and "tbps" in r]
    series = (("ours, contiguous", "decode", 0, "C0"), ("ours, page 16", "decode", 16, "C9"),
              ("ours, page 1", "decode", 1, "C4"), ("torch cuDNN", "torch:cudnn", 0, "C1"),
              ("torch FA2", "torch:flash", 0, "C2"))
    markers = {1: "o", 4: "s", 16: "^"}
    dims = sorted({r["head_dim"] for r in rows})
    fig, axes = plt.subplots(1, len(dims), figsize=(5.2 * len(dims), 4.4), squeeze=False)
    for ax, d in zip(axes[0], dims):
        for name, kernel, page, color in series:
            for sq, marker in markers.items():
                pts = [(r["batch"] * r["seqlen_k"] * r["heads_kv"] * d * 4, r["tbps"])
                       for r in rows if r["kernel"] == kernel and r["page"] == page
                       and r["head_dim"] == d and r["seqlen_q"] == sq]
                if pts:
                    ax.scatter([x / 2**20 for x, _ in pts], [y for _, y in pts], s=14,
                               marker=marker, color=color, alpha=0.75,
                               label=f"{name}, Sq = {sq}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("MiB of K and V", fontsize=8)
        ax.set_ylabel("TB/s of K and V read", fontsize=8)
        ax.set_title(f"D = {d}, Hq 32 / Hkv 8 and 32", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=7)
    env = report.get("env", {})
    dev = env.get("device", "")
    dev = dev.get("name", "") if isinstance(dev, dict) else dev
    fig.suptitle(f"decode grid, bf16, {dev}, {env.get('date', '')[:10]}, "
                 f"tree {report.get('tree', env.get('commit', ''))[:7]}", fontsize=10)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.savefig(png, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
