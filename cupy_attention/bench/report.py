"""The report dict: ratios, training steps, the one-line case summary, JSON read and write."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from rich.markup import escape

from .cases import ANCHORS, CASE_FIELDS, Case, SCHEMA, case_key


def add_ratios(rows: list[dict]) -> None:
    """speedup_flash / speedup_cudnn: the anchor's time over the row's (>1 = faster).
    A paged decode row compares with torch on the contiguous cache of its shape."""
    anchors: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r["kernel"] in ANCHORS and "ms" in r:
            anchors.setdefault(case_key(r, page=False), {})[r["kernel"]] = r["ms"]
    for r in rows:
        if "ms" not in r:
            continue
        found = anchors.get(case_key(r, page=False), {})
        for anchor in ANCHORS:
            if anchor in found:
                r[f"speedup_{anchor.split(':')[1]}"] = found[anchor] / r["ms"]


def training_steps(rows: list[dict]) -> list[dict]:
    """Forward + backward time per case and implementation, from the fwd and bwd rows
    of ``--backward`` runs: ours is our fastest forward plus our fastest backward
    (what ``auto`` picks on that device), torch:X is backend X's forward plus its
    backward."""
    timed: dict[tuple, dict[str, dict[str, float]]] = {}
    for r in rows:
        if r["kind"] in ("fwd", "bwd") and "ms" in r:
            key = case_key({**r, "kind": "fwd"})
            impl = "ours" if r["impl"] == "ours" else r["kernel"]
            best = timed.setdefault(key, {}).setdefault(impl, {})
            best[r["kind"]] = min(best.get(r["kind"], math.inf), r["ms"])
    steps = []
    for key, impls in timed.items():
        full = {impl: t for impl, t in impls.items() if "fwd" in t and "bwd" in t}
        for impl, t in full.items():
            step = {**dict(zip(CASE_FIELDS, key)), "impl": impl, "fwd_ms": t["fwd"],
                    "bwd_ms": t["bwd"], "step_ms": t["fwd"] + t["bwd"]}
            for anchor in ("flash", "cudnn"):
                other = full.get(f"torch:{anchor}")
                if other and impl == "ours":
                    step[f"speedup_{anchor}"] = (other["fwd"] + other["bwd"]) / step["step_ms"]
            steps.append(step)
    return steps


def case_line(case: Case, rows: list[dict]) -> str:
    """A one-line summary of a finished case for the running log."""
    unit, key = ("KV TB/s", "tbps") if case.kind == "decode" else ("TFLOPs", "tflops")
    fmt = ".2f" if case.kind == "decode" else ".1f"
    parts = []
    for r in rows:
        if "ms" in r:
            parts.append(f"{escape(r['kernel'])} {r[key]:{fmt}}")
        elif "error" in r:
            parts.append(f"{escape(r['kernel'])} [red]error[/]")
    return f"{escape(case.label())}: " + (" · ".join(parts) + f" {unit}" if parts
                                          else "nothing ran")


def write_json(report: dict, path: Path) -> None:
    """Atomically (re)write the report."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


def load_report(path: Path) -> dict:
    report = json.loads(Path(path).read_text())
    if report.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a cupy-attention bench report (schema {SCHEMA})")
    return report
