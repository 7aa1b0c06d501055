"""``cupy-attention tune``: time tile configurations on this GPU, keep the winners.

For each problem (``--shape B,Hq,Hkv,Sq,Sk,D``, repeatable, or ``--preset NAME``:
a few (Hq, Hkv, D) of a model family at S = 1k, 4k, 8k with B*S = 16k tokens) and
each family to tune (default: the one ``kernel="auto"`` picks), every configuration
of ``Family.candidates(problem)`` runs under the bench's timing (``bench.Runner.
time_calls``: CUDA events, two rounds, the spread between them), its output checked
against float64 attention on the host. A candidate replaces the table's choice only
when ``tuning.decide`` says it is faster by more than ``--min-gain`` and by more
than the noise; the choice is stored per problem in the tuned table of this device,
driver, NVRTC and package version (``tuning.py``, docs/tuning.md), which
``kernel="auto"`` then uses.

``--show`` and ``--clear`` read or empty the stored tables (no GPU needed); ``--list``
prints the candidates without timing anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import types
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table

from . import bench, device, dispatch, tuning
from .arrays import host64
from .families.base import HOPPER_SMEM, Tensors

SCHEMA = "cupy-attention-tune/1"

# (Hq, Hkv, D) of common models; every preset runs at PRESET_SEQLENS, B = TOKENS // S.
PRESETS = {
    "llama": ((32, 8, 128), (64, 8, 128)),          # Llama 3 8B, 70B
    "mistral": ((32, 8, 128),),                      # Mistral 7B
    "qwen": ((28, 4, 128), (64, 8, 128)),           # Qwen2.5 7B, 72B
    "gemma": ((16, 8, 256), (32, 16, 128)),         # Gemma 2 9B, 27B
    "mha": ((12, 12, 64), (32, 32, 128)),           # GPT-2 small, Llama 1/2 7B (no GQA)
}
PRESET_SEQLENS = (1024, 4096, 8192)
TOKENS = 16384
DEFAULT_REPS = 30

# A candidate's output must be as close to float64 as the table's: within twice the
# table config's error plus the dtype's rounding floor.
ERR_FLOOR = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -20}


def _shape6(text: str) -> tuple[int, ...]:
    dims = bench.int_list(text)
    if len(dims) != 6:
        raise argparse.ArgumentTypeError(
            f"--shape takes B,Hq,Hkv,Sq,Sk,D (six integers), got {text!r}")
    b, hq, hkv, _sq, _sk, _d = dims
    if hq % hkv:
        raise argparse.ArgumentTypeError(f"Hq={hq} must be a multiple of Hkv={hkv} in {text!r}")
    return dims


def add_shape_arguments(p: argparse.ArgumentParser, repeat: bool) -> None:
    """--shape, --dtype, --causal: shared by ``tune`` and ``profile``."""
    p.add_argument("--shape", type=_shape6, action="append" if repeat else "store",
                   metavar="B,Hq,Hkv,Sq,Sk,D",
                   help="a problem (1k = 1024)" + (" (repeatable)" if repeat else ""))
    p.add_argument("--dtype", "--dtypes", dest="dtypes", type=bench.dtype_list,
                   default=("bfloat16",), metavar="DT[,DT]",
                   help="bf16, fp16 or fp32 (default: bf16)")
    p.add_argument("--causal", nargs="?", const="on", choices=("on", "off", "both"), default=None,
                   help="--causal alone: causal; 'both': each problem twice "
                        "(default: off for --shape, on for --preset)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_shape_arguments(p, repeat=True)
    p.add_argument("--preset", choices=sorted(PRESETS),
                   help="common model shapes at S = 1k, 4k, 8k (B*S = 16k): "
                        + "; ".join(f"{k}: " + ", ".join(f"{hq}/{hkv}/D{d}" for hq, hkv, d in v)
                                    for k, v in PRESETS.items()))
    p.add_argument("--kernels", type=bench.name_list, metavar="NAME,...",
                   help="families to tune (default: the one kernel='auto' picks)")
    p.add_argument("--reps", type=int, default=DEFAULT_REPS, metavar="N",
                   help=f"timed calls per round, two rounds (default {DEFAULT_REPS}, at least "
                        f"{bench.MIN_REPS})")
    p.add_argument("--min-gain", type=float, default=100 * tuning.MIN_GAIN, metavar="PCT",
                   help="a candidate must beat the table's config by more than this many "
                        f"percent, and by more than the spread of the rounds (default "
                        f"{100 * tuning.MIN_GAIN:g})")
    p.add_argument("--json", type=Path, metavar="FILE", help="write every timing and decision")
    p.add_argument("--list", action="store_true", help="print the candidates, time nothing")
    p.add_argument("--show", action="store_true", help="print the stored tuned tables")
    p.add_argument("--clear", action="store_true", help="remove the stored tuned tables")


def finish_arguments(p: argparse.ArgumentParser, args) -> None:
    if args.show or args.clear:
        if args.show and args.clear:
            p.error("--show and --clear: choose one")
        if args.shape or args.preset:
            p.error("--show/--clear take no problems; drop --shape/--preset")
        return
    if bool(args.shape) == bool(args.preset):
        p.error("give --shape B,Hq,Hkv,Sq,Sk,D (repeatable) or --preset NAME")
    if args.reps < bench.MIN_REPS:
        p.error(f"--reps must be at least {bench.MIN_REPS}, got {args.reps}")
    if args.min_gain < 0:
        p.error(f"--min-gain must be at least 0, got {args.min_gain}")
    if args.kernels:
        unknown = [k for k in args.kernels if k not in dispatch.FAMILIES]
        if unknown:
            p.error(f"unknown kernel family {', '.join(unknown)}; families: "
                    f"{', '.join(dispatch.FAMILIES)}")
    if args.causal is None:
        args.causal = "on" if args.preset else "off"


def build_cases(args) -> list[bench.Case]:
    causals = {"off": (False,), "on": (True,), "both": (False, True)}[args.causal]
    shapes = list(args.shape or ())
    if args.preset:
        for hq, hkv, d in PRESETS[args.preset]:
            for s in PRESET_SEQLENS:
                shapes.append((max(1, TOKENS // s), hq, hkv, s, s, d))
    cases = []
    for dtype in args.dtypes:
        for b, hq, hkv, sq, sk, d in shapes:
            cases.extend(bench.Case("fwd", b, hq, hkv, sq, sk, d, dtype, c) for c in causals)
    return list(dict.fromkeys(cases))


def families_for(case: bench.Case, kernels, cc: int | None, smem: int, device_id: int = 0):
    """[(family, candidates)] to time for ``case``: the named families that run it, or
    the one ``auto`` picks; families with a single candidate have nothing to tune."""
    p = case.problem(device_id)
    if kernels:
        chosen = [dispatch.FAMILIES[k] for k in kernels if dispatch.FAMILIES[k].check(p, cc) is None]
    else:
        try:
            chosen = [dispatch.choose(p, "auto", cc)]
        except Exception:
            chosen = []
    out = []
    for family in chosen:
        cands = family.candidates(p, smem)
        if len(cands) > 1:
            out.append((family, cands))
    return out


def cfg_text(cfg) -> str:
    return ",".join(map(str, cfg))


# ---------------------------------------------------------------------------
# Stored tables (no GPU)

def show(console: Console) -> int:
    files = tuning.tuning_files()
    if not files:
        console.print(f"no tuned tables in {escape(str(tuning.jit.cache_dir()))}")
        return 0
    for path in files:
        data = tuning.read_table(path)
        if data is None:
            console.print(f"[yellow]{escape(str(path))}: not a trusted tuned table, ignored[/]")
            continue
        key = data.get("key", {})
        table = Table(title=(f"{escape(str(key.get('device')))} · driver {escape(str(key.get('driver')))}"
                             f" · NVRTC {escape(str(key.get('nvrtc')))} · cupy_attention "
                             f"{escape(str(key.get('version')))} · {escape(path.name)}"),
                      title_justify="left", header_style="bold")
        for col in ("problem", "config", "table's", "source", "ms", "table ms", "why"):
            table.add_column(col, no_wrap=col != "why")
        for name, e in data["entries"].items():
            table.add_row(escape(name), escape(cfg_text(e.get("config", ()))),
                          escape(cfg_text(e.get("table", ()))), escape(str(e.get("source"))),
                          bench.format_number(e.get("ms"), ".4f"), bench.format_number(e.get("table_ms"), ".4f"),
                          escape(str(e.get("reason", ""))))
        console.print(table)
    return 0


def list_candidates(cases, kernels, console: Console) -> int:
    cc = smem = None
    try:
        if device.device_count() > 0:
            cc, smem = device.compute_capability(0), device.max_shared_per_block(0)
    except Exception:
        pass
    table = Table(title="candidates (the table's first)" + ("" if cc else
                  ": no GPU, assuming a Hopper-sized shared memory"),
                  title_justify="left", header_style="bold")
    for col in ("problem", "family", "candidates"):
        table.add_column(col)
    for case in cases:
        fams = families_for(case, kernels, cc, smem or HOPPER_SMEM)
        if not fams:
            table.add_row(escape(case.label()), "–", "nothing to tune")
        for family, cands in fams:
            table.add_row(escape(case.label()), family.name,
                          escape("  ".join(f"({cfg_text(c)})" for c in cands)))
    console.print(table)
    return 0


# ---------------------------------------------------------------------------
# Timing (GPU)

def _time_family(runner, case, family, cands, sets, ref, arch, progress, task) -> list[dict]:
    dev = runner.device_id
    p = case.problem(dev)
    stream = runner.stream
    rows = []

    def fn(q, k, v, o):
        family.launch(p, Tensors(q, k, v, o), stream, dev, arch)

    for i, cfg in enumerate(cands):
        progress.update(task, description=escape(f"{case.label()} · {family.name} ({cfg_text(cfg)})"))
        row = {"family": family.name, "config": list(cfg), "table": i == 0}
        try:
            with tuning.forced(family.name, cfg):
                figures, _ = runner.time_calls(fn, sets)
                fn(*sets[0])
                runner.sync()
            out = sets[0][3]
            got = host64(out[0:1, 0:1, -ref.shape[2]:, :])
            row.update(figures, max_err=float(abs(got - ref).max()),
                       tflops=case.flops() / (figures["ms"] * 1e-3) / 1e12)
        except Exception as exc:  # a candidate that fails to compile or run is skipped
            row["error"] = bench.first_line(exc)
        rows.append(row)
        progress.advance(task)
    table_err = rows[0].get("max_err")
    for row in rows[1:]:
        if "max_err" in row and table_err is not None and \
                not row["max_err"] <= 2 * table_err + ERR_FLOOR[case.dtype]:
            row["error"] = (f"max error {row['max_err']:.3g} against float64, table config "
                            f"{table_err:.3g}: rejected")
    return rows


def choose(rows: list[dict], min_gain: float) -> tuple[dict, str]:
    """(the row to keep, why): the fastest valid candidate if ``tuning.decide`` lets it
    replace the table's row, else the table's. Pure; rows as ``_time_family`` makes."""
    table = rows[0]
    if "ms" not in table or "error" in table:
        raise ValueError(f"the table's config failed: {table.get('error', 'no timing')}")
    others = [r for r in rows[1:] if "ms" in r and "error" not in r]
    if not others:
        return table, "no other candidate ran"
    best = min(others, key=lambda r: r["ms"])
    win, why = tuning.decide(table, best, min_gain)
    return (best, why) if win else (table, f"best other ({cfg_text(best['config'])}) {why}")


def run(args, console: Console) -> int:
    if args.clear:
        n = tuning.clear()
        console.print(f"removed {n} tuned table(s) from {escape(str(tuning.jit.cache_dir()))}")
        return 0
    if args.show:
        return show(console)
    cases = build_cases(args)
    if args.list:
        return list_candidates(cases, args.kernels, console)
    device.require_device()
    runner = bench.Runner(types.SimpleNamespace(reps=args.reps, kernels=None, torch_backends=None,
                                                quadratic_max_seqlen=bench.QUADRATIC_MAX), None)
    dev = runner.device_id
    cc, smem, arch = runner.cc, device.max_shared_per_block(dev), device.device_arch(dev)
    key = tuning.current_key(dev)
    plan = [(case, families_for(case, args.kernels, cc, smem, dev)) for case in cases]
    total = sum(len(c) for _, fams in plan for _, c in fams)
    console.print(f"tuning on {escape(key['device'])} (driver {escape(key['driver'])}, NVRTC "
                  f"{escape(key['nvrtc'])}): {len(cases)} problem(s), {total} candidate(s)")
    report = {"schema": SCHEMA, "key": key, "env": bench.environment(None, dev),
              "method": runner.method(), "min_gain_pct": args.min_gain, "results": [],
              "entries": {}}
    entries: dict[str, dict] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn())
    failed = False
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("", total=total)
        for case, fams in plan:
            if not fams:
                progress.console.print(f"{escape(case.label())}: nothing to tune")
                continue
            raw = runner.input_sets(case)
            sets = [s + (runner.cupy.empty(case.shapes()[0], dtype=s[0].dtype),) for s in raw]
            ref = runner._reference(case, *raw[0])
            p = case.problem(dev)
            for family, cands in fams:
                rows = _time_family(runner, case, family, cands, sets, ref, arch, progress, task)
                result = {"case": dataclasses.asdict(case), "family": family.name, "rows": rows}
                try:
                    kept, why = choose(rows, args.min_gain / 100)
                except ValueError as exc:
                    failed = True
                    result["error"] = str(exc)
                    progress.console.print(f"[red]{escape(case.label())} · {family.name}: "
                                           f"{escape(str(exc))}[/]")
                    report["results"].append(result)
                    continue
                entry = {"family": family.name, "config": kept["config"],
                         "table": rows[0]["config"],
                         "source": "table" if kept is rows[0] else "tuned",
                         "ms": kept["ms"], "table_ms": rows[0]["ms"], "reason": why,
                         "shape": [case.batch, case.heads_q, case.heads_kv, case.seqlen_q,
                                   case.seqlen_k, case.head_dim],
                         "date": datetime.datetime.now(datetime.timezone.utc)
                         .isoformat(timespec="seconds")}
                entries[tuning.problem_key(family.name, p)] = entry
                result["kept"] = entry
                report["results"].append(result)
                render_rows(case, family.name, rows, kept, why, progress.console)
            del raw, sets
            runner.free_memory()
    report["entries"] = entries
    if args.json:
        bench.write_json(report, args.json)
        console.print(f"wrote {escape(str(args.json))}")
    if entries:
        try:
            path = tuning.save(key, entries)
        except (tuning.TuningError, OSError) as exc:
            console.print(f"[red]{escape(str(exc))}[/]")
            return 1
        tuned = sum(e["source"] == "tuned" for e in entries.values())
        console.print(f"wrote {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} "
                      f"({tuned} replacing the table's config) to {escape(str(path))}")
    return 1 if failed else 0


def render_rows(case, family: str, rows, kept, why: str, console: Console) -> None:
    table = Table(title=f"{escape(case.label())} Hkv={case.heads_kv} · {family}",
                  title_justify="left", header_style="bold")
    for col in ("config", "ms", "TFLOPs", "spread %", "vs table", "max err", ""):
        table.add_column(col, justify="left" if col in ("config", "") else "right")
    base = rows[0].get("ms")
    for r in rows:
        mark = "kept" if r is kept else ("table" if r["table"] else "")
        if "error" in r:
            table.add_row(escape(cfg_text(r["config"])), "–", "–", "–", "–",
                          bench.format_number(r.get("max_err"), ".2e"), f"[red]{escape(r['error'])}[/]")
            continue
        ratio = f"{base / r['ms']:.3f}x" if base else "–"
        table.add_row(escape(cfg_text(r["config"])), f"{r['ms']:.4f}", f"{r['tflops']:.1f}",
                      f"{r['spread_pct']:.1f}", ratio, f"{r['max_err']:.2e}", mark)
    console.print(table)
    console.print(f"  kept ({escape(cfg_text(kept['config']))}): {escape(why)}")
