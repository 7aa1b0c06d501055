"""Rich tables of a report (reads only the report dict)."""

from __future__ import annotations


from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .cases import SHORT, case_key, case_label
from .report import training_steps


def format_number(x, fmt: str) -> str:
    if x is None:
        return "–"
    if isinstance(x, str):
        return x
    return format(x, fmt)


def _ratio(x) -> str:
    if x is None:
        return "–"
    return f"[green]{x:.2f}×[/]" if x >= 1 else f"{x:.2f}×"


def _mib(x) -> str:
    return "–" if x is None else f"{x / 2**20:.1f}"


def _err(r: dict) -> str:
    e = r.get("max_err")
    if isinstance(e, str):
        return f"[red]{e}[/]"
    return format_number(e, ".1e")


_COMMON_TAIL = [
    ("kernel", lambda r: escape(r["kernel"]), "left"),
    ("ms", lambda r: format_number(r["ms"], ".3f"), "right"),
    ("±%", lambda r: format_number(r["spread_pct"], ".1f"), "right"),
]
_RATIOS = [
    ("×flash", lambda r: _ratio(r.get("speedup_flash")), "right"),
    ("×cudnn", lambda r: _ratio(r.get("speedup_cudnn")), "right"),
]
_EXTRAS = [
    ("cold s", lambda r: format_number(r["cold_s"], ".2f"), "right"),
    ("extra MiB", lambda r: _mib(r.get("extra_bytes")), "right"),
    ("max err", _err, "right"),
]
COLUMNS = {
    "fwd": [("S", lambda r: str(r["seqlen_q"]), "right"),
            ("causal", lambda r: "yes" if r["causal"] else "no", "left"),
            ("B×H", lambda r: f"{r['batch']}×{r['heads_q']}", "right"),
            *_COMMON_TAIL, ("TFLOPs", lambda r: format_number(r["tflops"], ".1f"), "right"),
            *_RATIOS, *_EXTRAS],
    "decode": [("B", lambda r: str(r["batch"]), "right"),
               ("Sk", lambda r: str(r["seqlen_k"]), "right"),
               ("Sq", lambda r: str(r["seqlen_q"]), "right"),
               ("Hq/Hkv", lambda r: f"{r['heads_q']}/{r['heads_kv']}", "right"),
               ("D", lambda r: str(r["head_dim"]), "right"),
               ("cache", lambda r: f"page {r['page']}" if r.get("page") else "contiguous",
                "left"),
               *_COMMON_TAIL, ("KV TB/s", lambda r: format_number(r.get("tbps"), ".2f"), "right"),
               *_RATIOS, *_EXTRAS],
}
COLUMNS["bwd"] = [c for c in COLUMNS["fwd"] if c[0] not in ("extra MiB", "max err")]
TITLES = {"fwd": "forward", "decode": "decode", "bwd": "backward"}


def _group_key(r: dict) -> tuple:
    """Rows of one table: decode rows by dtype, the others by dtype and head dim."""
    if r["kind"] == "decode":
        return r["kind"], r["dtype"]
    return r["kind"], r["dtype"], r["head_dim"]


def render_header(report: dict, console: Console) -> None:
    env = report["env"]
    dev = env["device"]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    commit = env.get("commit") or "unknown"
    if env.get("dirty"):
        commit += " (uncommitted changes)"
    for key, value in (
        ("device", f"{dev['name']} (sm_{dev['compute_capability']}, {dev['sms']} SMs, "
                   f"L2 {dev['l2_bytes'] / 2**20:.0f} MiB)"),
        ("driver", f"{env.get('driver') or '?'} (CUDA {env.get('cuda_driver') or '?'})"),
        ("software", f"CuPy {env.get('cupy')}, NVRTC {env.get('nvrtc')}, "
                     f"torch {env.get('torch') or 'not used'}, cupy_attention "
                     f"{env.get('cupy_attention')}"),
        ("commit", commit), ("date", env.get("date", "?")),
        ("command", env.get("command", "?")),
        ("timing", f"median of {report['method']['rounds']}×{report['method']['reps_per_round']} "
                   "calls, CUDA events; ×flash/×cudnn = torch time / this time (>1 is faster)"),
    ):
        grid.add_row(key, escape(str(value)))
    console.print(grid)


def render_results(rows: list[dict], console: Console) -> None:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if "ms" in r:
            groups.setdefault(_group_key(r), []).append(r)
    for key, group in groups.items():
        kind, dtype = key[0], key[1]
        title = f"{TITLES[kind]} · {dtype}" + (f" · D={key[2]}" if len(key) > 2 else "")
        table = Table(title=title, title_justify="left", header_style="bold")
        for header, _, justify in COLUMNS[kind]:
            table.add_column(header, justify=justify, no_wrap=True)
        for i, r in enumerate(group):
            last = i + 1 == len(group) or case_key(group[i + 1]) != case_key(r)
            table.add_row(*(fmt(r) for _, fmt, _ in COLUMNS[kind]),
                          style="dim" if r["impl"] == "torch" else None, end_section=last)
        console.print(table)
    specs = list(dict.fromkeys(s for r in rows for s in r.get("specs", ())))
    if specs:
        console.print("[bold]instantiations timed:[/] " + escape(", ".join(specs)))
    errors = [r for r in rows if "error" in r]
    for r in errors:
        console.print(f"[red]error[/] {escape(r['kernel'])} on {escape(case_label(r))}: "
                      f"{escape(r['error'])}")
    skipped = sum("skipped" in r for r in rows)
    if skipped:
        console.print(f"{skipped} kernel/case pairs skipped (kernel does not take the case, or an "
                      "O(S^2) baseline above the limit); reasons are in the JSON")


def render_steps(steps: list[dict], console: Console) -> None:
    if not steps:
        return
    table = Table(title="training step (forward + backward) · ms", title_justify="left",
                  header_style="bold")
    for header in ("dtype", "D", "S", "causal", "impl", "fwd", "bwd", "step", "×flash", "×cudnn"):
        table.add_column(header, justify="left" if header in ("dtype", "impl") else "right")
    for s in steps:
        table.add_row(SHORT[s["dtype"]], str(s["head_dim"]), str(s["seqlen_q"]),
                      "yes" if s["causal"] else "no", escape(s["impl"]), f"{s['fwd_ms']:.3f}",
                      f"{s['bwd_ms']:.3f}", f"{s['step_ms']:.3f}",
                      format_number(s.get("speedup_flash"), ".2f"), format_number(s.get("speedup_cudnn"), ".2f"),
                      style="dim" if s["impl"] != "ours" else None)
    console.print(table)


def render_overhead(ov: dict, console: Console) -> None:
    table = Table(title=f"host overhead per hot call · {ov['problem']} · auto → {ov['kernel']} "
                        f"· {ov['calls']} calls, no sync between",
                  title_justify="left", header_style="bold")
    for header in ("call", "host µs/call", "GPU µs/call", "wall µs/call"):
        table.add_column(header, justify="left" if header == "call" else "right")
    for r in ov["rows"]:
        table.add_row(escape(r["what"]), f"{r['host_us']:.1f}", f"{r['gpu_us']:.1f}",
                      f"{r['wall_us']:.1f}")
    console.print(table)
    cold = ov.get("cold", {})
    if "error" in cold:
        console.print(f"[red]cold compile probe failed:[/] {escape(cold['error'])}")
    elif cold:
        console.print(f"cold first call in a new process: {cold['empty_cache_s']:.2f} s with an "
                      f"empty cache (NVRTC compile of {cold['compiled_entries']} instantiation(s): "
                      f"{escape(', '.join(cold['specs']))}), {cold['disk_cache_s'] * 1e3:.0f} ms "
                      f"from the disk cache, {cold['hot_s'] * 1e6:.0f} µs hot")


def render_report(report: dict, console: Console) -> None:
    render_header(report, console)
    for note in report.get("notes", ()):
        console.print(f"[yellow]{escape(note)}[/]")
    render_results(report["results"], console)
    render_steps(training_steps(report["results"]), console)
    if report.get("overhead"):
        render_overhead(report["overhead"], console)
