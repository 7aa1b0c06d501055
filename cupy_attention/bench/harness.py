"""The bench command: cases through the Runner, live progress, tables, JSON and plots."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from .. import device
from .cases import SCHEMA, build_cases
from .plots import plot_or_say
from .render import render_header, render_overhead, render_results
from .report import add_ratios, case_line, write_json
from .runner import Runner
from .system import environment
from .timing import BenchError, first_line


def import_torch(want: bool | None, notes: list[str]):
    """torch when wanted and usable; None with a note when it is optional and absent."""
    if want is False:
        return None
    try:
        import torch
    except ImportError:
        if want:
            raise BenchError("--torch was given but torch is not importable") from None
        notes.append("torch is not importable: torch SDPA rows skipped")
        return None
    if not torch.cuda.is_available():
        if want:
            raise BenchError("--torch was given but torch sees no CUDA device")
        notes.append("torch sees no CUDA device: torch SDPA rows skipped")
        return None
    return torch


def run(args, console: Console) -> int:
    cases, notes = build_cases(args)
    device.require_device()
    torch_mod = import_torch(args.torch, notes)
    runner = Runner(args, torch_mod)
    if runner.spin is None:
        notes.append(f"spin kernel unavailable ({runner.spin_error}): GPU times may include "
                     "host launch overhead")
    report = {"schema": SCHEMA, "env": environment(torch_mod, runner.device_id),
              "method": runner.method(), "notes": notes, "results": [], "overhead": None}
    render_header(report, console)
    for note in notes:
        console.print(f"[yellow]{escape(note)}[/]")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("", total=len(cases) + bool(args.overhead))
        for case in cases:
            progress.update(task, description=escape(case.label()))
            rows = runner.run_case(case)
            report["results"].extend(rows)
            # over every row so far: a paged decode case compares with the torch rows
            # of the contiguous case of its shape, which ran before it
            add_ratios(report["results"])
            progress.console.print(case_line(case, rows))
            if args.json:
                write_json(report, args.json)
            progress.advance(task)
        if args.overhead:
            progress.update(task, description="host overhead and cold compile")
            try:
                report["overhead"] = runner.overhead()
            except Exception as exc:  # the tables above are still worth printing
                report["notes"].append(f"overhead section failed: {first_line(exc)}")
                progress.console.print(f"[red]{escape(report['notes'][-1])}[/]")
            progress.advance(task)
    render_results(report["results"], console)
    if report["overhead"]:
        render_overhead(report["overhead"], console)
    if args.json:
        write_json(report, args.json)
        console.print(f"wrote {escape(str(args.json))}")
    if args.plot:
        plot_or_say(report, args.plot, console)
    # Our kernels failing fails the run; a torch backend failing is only reported.
    failed = any("error" in r and r["impl"] == "ours" for r in report["results"])
    return 1 if failed or (args.overhead and not report["overhead"]) else 0
