#!/usr/bin/env python3
"""Line charts of a ``scripts/peer_bench.py`` JSON: TFLOPs against the sequence length,
one panel per head dim and direction (forward, backward), causal off and on, ours
beside each peer the run timed.

    python scripts/peers_chart.py benchmarks/results/h200-peers-train-grid-bf16-ab53dcf.json \\
        benchmarks/results/plots/peers-train-h200-bf16.png
"""

from __future__ import annotations

import sys

from decode_chart import chart_inputs  # scripts/ is sys.path[0]

LABELS = {"ours": "ours", "ours_det": "ours, deterministic", "ours_mma": "ours, flash_mma",
          "cudnn": "torch cuDNN", "flash2": "torch FA2", "fa4": "FA4"}
COLORS = dict(zip(LABELS, ("C0", "C9", "C4", "C1", "C2", "C3")))


def main() -> int:
    report, png, plt = chart_inputs(__doc__)
    rows = [r for r in report["rows"] if "error" not in r]
    dims = sorted({r["D"] for r in rows})
    impls = [i for i in LABELS if any(r["impl"] == i for r in rows)]
    panels = [(key, causal) for key in ("fwd_tflops", "bwd_tflops") for causal in (False, True)]
    fig, axes = plt.subplots(len(panels), len(dims), figsize=(4.2 * len(dims), 3.0 * len(panels)),
                             squeeze=False)
    for i, (key, causal) in enumerate(panels):
        for j, d in enumerate(dims):
            ax = axes[i][j]
            for impl in impls:
                if impl == "ours_det" and key == "fwd_tflops":
                    continue   # the deterministic mode changes only the backward
                pts = sorted((r["S"], r[key]) for r in rows
                             if r["impl"] == impl and r["D"] == d and r["causal"] == causal)
                if pts:
                    ax.plot([s for s, _ in pts], [t for _, t in pts], marker="o", ms=3,
                            lw=2.2 if impl == "ours" else 1.2, color=COLORS[impl],
                            label=LABELS[impl])
            ax.set_xscale("log", base=2)
            ax.set_title(f"{'forward' if key == 'fwd_tflops' else 'backward'}, D = {d}, "
                         f"{'causal' if causal else 'non-causal'}", fontsize=9)
            ax.set_xlabel("sequence length (B x S = 16k)", fontsize=8)
            ax.set_ylabel("TFLOPs", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    handles, labels = axes[-1][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.suptitle(f"training attention, {report['dtype']}, H x D = 2048, {report['device']}, "
                 f"{report['date'][:10]}, tree {report.get('tree', report['commit'])[:7]}",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(png, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
