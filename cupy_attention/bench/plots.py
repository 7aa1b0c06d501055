"""PNG charts of a report (matplotlib, optional)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape

from .cases import SHORT


def write_plots(report: dict, directory: Path) -> list[Path]:
    """TFLOPs vs S per head dim, and speedup vs torch flash/cuDNN, per (dtype, causal).

    Raises ModuleNotFoundError when matplotlib is missing.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    env = report["env"]
    stamp = (f"{env['device']['name']} · {env.get('date', '')[:10]} · "
             f"{(env.get('commit') or 'unknown')[:10]}")
    rows = [r for r in report["results"] if r["kind"] == "fwd" and "ms" in r]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dtype"], r["causal"]), []).append(r)
    written = []
    for (dtype, causal), group in groups.items():
        dims = list(dict.fromkeys(r["head_dim"] for r in group))
        tag = f"{SHORT[dtype]}-{'causal' if causal else 'noncausal'}"
        name = f"{dtype}, {'causal' if causal else 'non-causal'}"
        charts = [("tflops", "TFLOPs", lambda r: [(r["kernel"], r["tflops"])])]
        if any("speedup_flash" in r or "speedup_cudnn" in r for r in group):
            charts.append(("speedup", "speedup (anchor time / ours)", lambda r: [
                (f"{r['kernel']} vs {a}", r[f"speedup_{a}"]) for a in ("flash", "cudnn")
                if r["impl"] == "ours" and f"speedup_{a}" in r]))
        for stem, ylabel, points in charts:
            # One color per series across all panels, one legend for the figure.
            labels = list(dict.fromkeys(label for r in group for label, _ in points(r)))
            cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
            color = {label: cycle[i % len(cycle)] for i, label in enumerate(labels)}
            fig, axes = plt.subplots(1, len(dims), figsize=(4.2 * len(dims), 3.8), squeeze=False,
                                     sharey=True)
            for ax, d in zip(axes[0], dims):
                series: dict[str, list[tuple[int, float]]] = {}
                for r in group:
                    if r["head_dim"] == d:
                        for label, y in points(r):
                            series.setdefault(label, []).append((r["seqlen_q"], y))
                for label, pts in series.items():
                    pts.sort()
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                            linestyle="--" if label.startswith("torch") or " vs cudnn" in label
                            else "-", label=label, color=color[label])
                if stem == "speedup":
                    ax.axhline(1.0, color="gray", linewidth=0.8)
                ax.set_xscale("log", base=2)
                seqlens = sorted({r["seqlen_q"] for r in group if r["head_dim"] == d})
                ax.set_xticks(seqlens, [f"{s // 1024}k" if s % 1024 == 0 else str(s)
                                        for s in seqlens])
                ax.minorticks_off()
                ax.set_title(f"D={d}")
                ax.set_xlabel("S")
                ax.grid(True, alpha=0.3)
            axes[0][0].set_ylabel(ylabel)
            handles = [plt.Line2D([], [], color=color[label], marker="o",
                                  linestyle="--" if label.startswith("torch") or " vs cudnn" in label
                                  else "-") for label in labels]
            fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8)
            fig.suptitle(f"forward {name} · {stamp}", fontsize=10)
            fig.tight_layout(rect=(0, 0.1, 1, 1))
            path = directory / f"{stem}-{tag}.png"
            fig.savefig(path, dpi=120)
            plt.close(fig)
            written.append(path)
    return written


def plot_or_say(report: dict, directory: Path, console: Console) -> None:
    try:
        paths = write_plots(report, directory)
    except ModuleNotFoundError:
        console.print("[yellow]matplotlib is not importable: no plots written "
                      "(pip install matplotlib)[/]")
        return
    if paths:
        console.print(f"wrote {len(paths)} plot(s) to {escape(str(directory))}")
    else:
        console.print("no forward results to plot")
