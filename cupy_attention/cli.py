"""The ``cupy-attention`` command line.

    cupy-attention info                  GPU, versions, JIT cache and the kernel table
    cupy-attention cache [clear]         show (or empty) the JIT disk cache
    cupy-attention bench [options]       our kernels beside torch SDPA (BENCHMARKS.md)
    cupy-attention report FILE [--plot DIR]
                                         render a saved bench JSON again (no GPU needed)
    cupy-attention tune (--shape B,Hq,Hkv,Sq,Sk,D ... | --preset NAME) [--show|--clear]
                                         time tile configs, keep the winners (tune.py)
    cupy-attention profile --shape B,Hq,Hkv,Sq,Sk,D
                                         one problem under Nsight Compute, beside the
                                         roofline (profile.py)

``info``, ``cache``, ``report``, ``tune --show/--clear/--list`` work on a machine
without a GPU. Exit status: 0 done, 1 failed (no GPU included), 2 bad arguments,
3 ``ncu`` not found, 4 ncu may not read the performance counters.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import bench, jit, profile, tune
from .errors import NoDeviceError


def _size(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"


def _cache_line(entries: int, size: int) -> str:
    return f"{jit.cache_dir()} ({entries} entries, {_size(size)})"


def cmd_info(args, console: Console) -> int:
    import cupy_attention as ca

    info = bench.system_info()
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows = [
        ("cupy_attention", info["cupy_attention"]),
        ("python", info["python"]),
        ("CuPy", info["cupy"] or "not installed"),
        ("CUDA runtime", info["cuda_runtime"] or "–"),
        ("CUDA driver", " ".join(filter(None, (info["driver"], info["cuda_driver"] and
                                               f"(CUDA {info['cuda_driver']})"))) or "none"),
        ("NVRTC", info["nvrtc"] or info.get("nvrtc_error", "–")),
        ("JIT cache", _cache_line(info["cache_entries"], info["cache_bytes"])),
    ]
    for dev in info["devices"]:
        rows.append((f"GPU {dev['id']}",
                     f"{dev['name']}, compute capability {dev['compute_capability'] / 10:.1f}, "
                     f"NVRTC arch {dev['arch']}, {dev['sms']} SMs, "
                     f"{_size(dev['memory_bytes'])}, L2 {_size(dev['l2_bytes'])}"))
    if info["no_device"]:
        rows.append(("GPU", f"[yellow]{escape(info['no_device'])}[/]"))
    for key, value in rows:
        grid.add_row(key, value if key == "GPU" else escape(str(value)))
    console.print(grid)

    table = Table(title="kernels", title_justify="left", header_style="bold")
    for header in ("name", "summary", "head dims", "dtypes", "memory"):
        table.add_column(header, no_wrap=header != "summary")
    for name, (summary, dims, dtypes, memory) in ca.kernels().items():
        table.add_row(escape(name), escape(summary), escape(str(dims)),
                      escape(", ".join(bench.SHORT.get(d, d) for d in dtypes)), escape(memory))
    console.print(table)
    return 0


def cmd_cache(args, console: Console) -> int:
    if args.action == "clear":
        n = jit.clear_cache()
        console.print(f"removed {n} cache entries from {escape(str(jit.cache_dir()))}")
    else:
        console.print(escape(_cache_line(*jit.cache_size())))
    return 0


def cmd_report(args, console: Console) -> int:
    try:
        report = bench.load_report(args.file)
    except (OSError, ValueError) as exc:
        console.print(f"[red]cannot read {escape(str(args.file))}: {escape(str(exc))}[/]")
        return 1
    bench.render_report(report, console)
    if args.plot:
        bench.plot_or_say(report, args.plot, console)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cupy-attention", description="Attention kernels compiled at run time with NVRTC.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("info", help="GPU, versions, JIT cache and the kernel table")
    p.set_defaults(handler=cmd_info)

    p = sub.add_parser("cache", help="show or clear the JIT disk cache")
    p.add_argument("action", nargs="?", choices=("show", "clear"), default="show")
    p.set_defaults(handler=cmd_cache)

    p = sub.add_parser("bench", help="benchmark our kernels beside torch SDPA",
                       description=bench.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_arguments(p)
    p.set_defaults(handler=bench.run, finish=bench.finish_arguments, subparser=p)

    p = sub.add_parser("report", help="render a saved bench JSON again (tables, --plot)")
    p.add_argument("file", type=Path, help="JSON written by bench --json")
    p.add_argument("--plot", type=Path, metavar="DIR", help="write PNG charts (needs matplotlib)")
    p.set_defaults(handler=cmd_report)

    p = sub.add_parser("tune", help="time tile configurations on this GPU and keep the winners",
                       description=tune.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    tune.add_arguments(p)
    p.set_defaults(handler=tune.run, finish=tune.finish_arguments, subparser=p)

    p = sub.add_parser("profile", help="one problem under Nsight Compute, beside the roofline",
                       description=profile.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    profile.add_arguments(p)
    p.set_defaults(handler=profile.run, finish=profile.finish_arguments, subparser=p)
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    """Parse and cross-check; bad arguments exit with code 2 and a usage message."""
    args = build_parser().parse_args(argv)
    if hasattr(args, "finish"):
        args.finish(args.subparser, args)
    return args


# Logs of non-interactive runs (the GPU suite) get room for the wide tables.
LOG_WIDTH = 160


def main(argv=None) -> int:
    args = parse_args(argv)
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = LOG_WIDTH
    try:
        return args.handler(args, console)
    except (NoDeviceError, bench.BenchError) as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        return 1
    except profile.ProfileError as exc:
        console.print(f"[red]{escape(type(exc).__name__)}: {escape(str(exc))}[/]")
        return exc.exit_code
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
