"""``cupy-attention profile``: one problem under Nsight Compute, beside the roofline.

The command runs ``ncu --csv --print-units base --profile-from-start off --metrics
... python -m cupy_attention.profile_target <problem>``: the target profiles only
the launches of ``--repeats`` calls (between cudaProfilerStart and Stop, after two
warm-up calls). :func:`parse_csv` turns ncu's CSV (the "details" page, one row per
kernel launch and metric) into per-launch records, :func:`summarize` into one call's
figures, and :func:`roofline` sets them beside the device's peaks (:data:`DEVICES`).
Parsing, summary, roofline and rendering are pure and tested on the CPU.

Metrics (names as ``ncu --query-metrics`` lists them):

``gpu__time_duration.sum``                  kernel duration
``dram__bytes_read.sum``, ``dram__bytes_write.sum``, ``dram__bytes.sum.per_second``
                                            DRAM traffic and throughput
``sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active``
                                            tensor pipes busy, % of active cycles
plus, on sm_90, ``sm__pipe_tensor_op_gmma_cycles_active...`` (wgmma) and on sm_80-89
``sm__pipe_tensor_op_hmma_cycles_active...`` (mma.sync).

Achieved FLOP/s is the problem's algorithmic count (4*B*Hq*Sq*Sk*D, halved for
causal with Sq == Sk) over the summed kernel time, the figure the benchmarks report.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

SCHEMA = "cupy-attention-profile/1"

TIME = "gpu__time_duration.sum"
DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
DRAM_RATE = "dram__bytes.sum.per_second"
TENSOR = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
TENSOR_GMMA = "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
TENSOR_HMMA = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
BASE_METRICS = (TIME, DRAM_READ, DRAM_WRITE, DRAM_RATE, TENSOR)


def metrics_for(cc: int | None) -> tuple[str, ...]:
    """The metrics to ask ncu for on a device of compute capability ``cc``."""
    if cc == 90:
        return BASE_METRICS + (TENSOR_GMMA,)
    if cc is not None and 80 <= cc < 90:
        return BASE_METRICS + (TENSOR_HMMA,)
    return BASE_METRICS


# Peaks per device, vendor data sheets (dense, no sparsity): (substring of the CUDA
# device name, label, 16-bit tensor FLOP/s with fp32 accumulation, fp32 CUDA-core
# FLOP/s, DRAM bytes/s). The first row whose substring the name contains wins.
DEVICES = (
    ("H200 NVL", "H200 NVL", 835e12, 60e12, 4.8e12),
    ("H200", "H200 SXM", 989e12, 67e12, 4.8e12),
    ("H100 NVL", "H100 NVL", 835e12, 60e12, 3.9e12),
    ("H100 PCIe", "H100 PCIe", 756e12, 51e12, 2.0e12),
    ("H100", "H100 SXM", 989e12, 67e12, 3.35e12),
    ("A100-SXM4-80GB", "A100 SXM 80GB", 312e12, 19.5e12, 2.039e12),
    ("A100 80GB PCIe", "A100 PCIe 80GB", 312e12, 19.5e12, 1.935e12),
    ("A100", "A100 40GB", 312e12, 19.5e12, 1.555e12),
    ("L40S", "L40S", 362e12, 91.6e12, 0.864e12),
)


@dataclasses.dataclass(frozen=True)
class Peak:
    label: str
    flops: float       # FLOP/s for the dtype
    dram_bps: float    # bytes/s

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline turns flat."""
        return self.flops / self.dram_bps


def device_peak(name: str, dtype: str) -> Peak | None:
    """The roofline of the device called ``name`` for ``dtype`` (16-bit: tensor cores;
    float32: CUDA cores); None for a device not in :data:`DEVICES`."""
    low = name.lower()
    for needle, label, tensor, fp32, bw in DEVICES:
        if needle.lower() in low:
            return Peak(label, fp32 if dtype == "float32" else tensor, bw)
    return None


class ProfileError(RuntimeError):
    """The profile could not be taken; ``exit_code`` is the command's exit status."""
    exit_code = 1


class NcuNotFoundError(ProfileError):
    """Nsight Compute's ``ncu`` is not on PATH."""
    exit_code = 3


class NcuPermissionError(ProfileError):
    """ncu may not read the GPU's performance counters (ERR_NVGPUCTRPERM)."""
    exit_code = 4


# ---------------------------------------------------------------------------
# ncu's CSV (pure)

@dataclasses.dataclass
class Launch:
    """One profiled kernel launch: ncu's ID, the kernel's name, metric -> base value."""
    id: int
    kernel: str
    metrics: dict

    def get(self, name: str):
        return self.metrics.get(name)


_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_TIME = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0,
         "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def to_base(value: str, unit: str) -> float | None:
    """ncu's value text in base units: seconds, bytes, bytes/second, percent, or the
    number itself; None for "n/a" and other text. Handles thousands separators and
    scaled units (usecond, Gbyte, Tbyte/second) in case --print-units base is lost."""
    text = value.strip().replace(",", "")
    try:
        x = float(text)
    except ValueError:
        return None
    u = unit.strip()
    if u in _TIME:
        return x * _TIME[u]
    for suffix in ("byte/second", "byte/s", "byte"):
        if u.endswith(suffix):
            prefix = u[:-len(suffix)].lower()
            if prefix in _SCALE:
                return x * _SCALE[prefix]
    return x


REQUIRED_COLUMNS = ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")


def parse_csv(text: str) -> list[Launch]:
    """The launches in ncu's ``--csv`` output (details page), in ID order. Lines
    before the header (``==PROF==`` notes, the target's output) are skipped. Raises
    ValueError when there is no header or a required column is missing."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no CSV header (a line starting with \"ID\") in ncu's output")
    body = [lines[start]] + [line for line in lines[start + 1:] if line.startswith('"')]
    reader = csv.DictReader(io.StringIO("\n".join(body)))
    missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise ValueError(f"ncu's CSV lacks the column(s) {', '.join(missing)}")
    launches: dict[int, Launch] = {}
    for row in reader:
        try:
            lid = int(row["ID"])
        except (TypeError, ValueError):
            continue
        launch = launches.setdefault(lid, Launch(lid, row["Kernel Name"], {}))
        launch.metrics[row["Metric Name"]] = to_base(row["Metric Value"] or "",
                                                     row["Metric Unit"] or "")
    return [launches[k] for k in sorted(launches)]


def summarize(launches: list[Launch], repeats: int, flops: float) -> dict:
    """One call's figures from the launches of ``repeats`` calls: kernel time (s),
    DRAM bytes and bytes/s, FLOP/s (``flops`` per call over the time), arithmetic
    intensity, and tensor pipe utilization weighted by each launch's time."""
    if not launches:
        raise ValueError("ncu profiled no kernel launch")
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    times = [launch.get(TIME) for launch in launches]
    if any(t is None for t in times):
        raise ValueError(f"a launch has no {TIME}")
    total = sum(times)
    out = {"launches": len(launches), "repeats": repeats, "time_s": total / repeats,
           "flops": flops}
    out["flops_per_s"] = flops / out["time_s"] if out["time_s"] > 0 else None
    reads = [launch.get(DRAM_READ) for launch in launches]
    writes = [launch.get(DRAM_WRITE) for launch in launches]
    if all(x is not None for x in reads + writes):
        out["dram_bytes"] = (sum(reads) + sum(writes)) / repeats
    else:
        rates = [launch.get(DRAM_RATE) for launch in launches]
        out["dram_bytes"] = (sum(r * t for r, t in zip(rates, times)) / repeats
                             if all(r is not None for r in rates) else None)
    out["dram_bps"] = (out["dram_bytes"] / out["time_s"]
                       if out["dram_bytes"] is not None and out["time_s"] > 0 else None)
    out["intensity"] = (flops / out["dram_bytes"] if out["dram_bytes"] else None)
    for key, metric in (("tensor_pct", TENSOR), ("tensor_gmma_pct", TENSOR_GMMA),
                        ("tensor_hmma_pct", TENSOR_HMMA)):
        values = [launch.get(metric) for launch in launches]
        if all(v is not None for v in values) and total > 0:
            out[key] = sum(v * t for v, t in zip(values, times)) / total
    kernels: dict[str, dict] = {}
    for launch, t in zip(launches, times):
        k = kernels.setdefault(launch.kernel, {"kernel": launch.kernel, "launches": 0, "time_s": 0.0})
        k["launches"] += 1
        k["time_s"] += t
    out["kernels"] = list(kernels.values())
    return out


def roofline(summary: dict, peak: Peak | None) -> dict:
    """The summary beside ``peak``: attainable FLOP/s at its arithmetic intensity
    (min(peak, AI x bandwidth)), the share of it achieved, which roof bounds it, and
    the achieved share of each peak. Empty without a peak."""
    if peak is None:
        return {}
    out = {"device": peak.label, "peak_flops": peak.flops, "peak_dram_bps": peak.dram_bps,
           "ridge": peak.ridge}
    ai, achieved = summary.get("intensity"), summary.get("flops_per_s")
    if achieved is not None:
        out["flops_pct_of_peak"] = 100 * achieved / peak.flops
    if summary.get("dram_bps") is not None:
        out["dram_pct_of_peak"] = 100 * summary["dram_bps"] / peak.dram_bps
    if ai is not None:
        attainable = min(peak.flops, ai * peak.dram_bps)
        out["attainable_flops"] = attainable
        out["bound"] = "memory" if ai < peak.ridge else "compute"
        if achieved is not None:
            out["pct_of_roof"] = 100 * achieved / attainable
    return out


# ---------------------------------------------------------------------------
# Rendering (pure)

def _fmt(x, scale: float, fmt: str) -> str:
    return "–" if x is None else format(x / scale, fmt)


def render(report: dict, console: Console) -> None:
    s, r = report["summary"], report["roofline"]
    title = f"{report['problem']} · {report['device']}"
    table = Table(title=escape(title), title_justify="left", header_style="bold")
    for col in ("metric", "measured", "device peak", "% of peak"):
        table.add_column(col, justify="left" if col == "metric" else "right")

    def pct(key):
        return _fmt(r.get(key), 1, ".1f")

    table.add_row("kernel time per call (ms)", _fmt(s["time_s"], 1e-3, ".4f"), "", "")
    table.add_row("achieved TFLOP/s", _fmt(s.get("flops_per_s"), 1e12, ".1f"),
                  _fmt(r.get("peak_flops"), 1e12, ".0f"), pct("flops_pct_of_peak"))
    table.add_row("DRAM throughput (TB/s)", _fmt(s.get("dram_bps"), 1e12, ".3f"),
                  _fmt(r.get("peak_dram_bps"), 1e12, ".2f"), pct("dram_pct_of_peak"))
    table.add_row("DRAM bytes per call (MB)", _fmt(s.get("dram_bytes"), 1e6, ".1f"), "", "")
    table.add_row("arithmetic intensity (FLOP/B)", _fmt(s.get("intensity"), 1, ".1f"),
                  _fmt(r.get("ridge"), 1, ".1f") + (" (ridge)" if r else ""), "")
    table.add_row("roofline: attainable TFLOP/s", "", _fmt(r.get("attainable_flops"), 1e12, ".0f"),
                  pct("pct_of_roof") + (f" ({r['bound']}-bound)" if r.get("bound") else ""))
    for key, label in (("tensor_pct", "tensor pipes active (% of active cycles)"),
                       ("tensor_gmma_pct", "  wgmma (gmma) pipe"),
                       ("tensor_hmma_pct", "  mma.sync (hmma) pipe")):
        if key in s:
            table.add_row(label, f"{s[key]:.1f}", "100", "")
    console.print(table)
    if not r:
        console.print(f"[yellow]{escape(report['device'])} is not in the roofline table "
                      "(cupy_attention/profile.py DEVICES): peaks not shown[/]")
    kernels = Table(title="kernels", title_justify="left", header_style="bold")
    for col in ("kernel", "launches", "ms per call"):
        kernels.add_column(col, justify="left" if col == "kernel" else "right")
    for k in s["kernels"]:
        name = k["kernel"] if len(k["kernel"]) <= 100 else k["kernel"][:97] + "..."
        kernels.add_row(escape(name), str(k["launches"]),
                        f"{k['time_s'] / s['repeats'] * 1e3:.4f}")
    console.print(kernels)


def write_plot(report: dict, path: Path) -> Path:
    """A log-log roofline PNG with the measured point. Raises ModuleNotFoundError
    without matplotlib, ValueError without a peak or an arithmetic intensity."""
    s, r = report["summary"], report["roofline"]
    if not r or s.get("intensity") is None or s.get("flops_per_s") is None:
        raise ValueError("no roofline to draw (unknown device or no DRAM traffic measured)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ai = s["intensity"]
    lo = min(ai, r["ridge"]) / 10
    hi = max(ai, r["ridge"]) * 10
    xs = [lo, r["ridge"], hi]
    ys = [min(r["peak_flops"], x * r["peak_dram_bps"]) / 1e12 for x in xs]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.plot(xs, ys, color="black", label=f"{r['device']} roofline")
    ax.plot([ai], [s["flops_per_s"] / 1e12], marker="o", color="tab:red", linestyle="",
            label=f"measured: {s['flops_per_s'] / 1e12:.0f} TFLOP/s at {ai:.0f} FLOP/B")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / DRAM byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{report['problem']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------
# The command

def add_arguments(p) -> None:
    from .tune import add_shape_arguments

    add_shape_arguments(p, repeat=False)
    p.add_argument("--kernel", default="auto", help="kernel family (default: auto)")
    p.add_argument("--repeats", type=int, default=3, metavar="N",
                   help="calls profiled, after two warm-up calls (default 3)")
    p.add_argument("--locked-clocks", action="store_true",
                   help="let ncu lock the clocks to base (its default); without it the GPU "
                        "runs at its own clocks (--clock-control none), as the roofline's "
                        "peaks assume")
    p.add_argument("--ncu", default=None, metavar="PATH",
                   help="the ncu executable (default: ncu on PATH)")
    p.add_argument("--timeout", type=int, default=600, metavar="S",
                   help="seconds ncu may take (default 600)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the figures as JSON")
    p.add_argument("--plot", type=Path, metavar="FILE.png",
                   help="write a roofline chart (needs matplotlib: the plot extra)")


def finish_arguments(p, args) -> None:
    if args.shape is None:
        p.error("profile needs --shape B,Hq,Hkv,Sq,Sk,D")
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    if len(args.dtypes) != 1:
        p.error("profile takes one --dtype")
    if args.causal == "both":
        p.error("profile takes one problem: --causal or not")


def find_ncu(explicit: str | None = None) -> str:
    path = explicit if explicit and os.path.isfile(explicit) else shutil.which(explicit or "ncu")
    if path is None:
        raise NcuNotFoundError(
            f"Nsight Compute's ncu is not {'at ' + explicit if explicit else 'on PATH'}: install "
            "Nsight Compute (it ships with the CUDA toolkit, e.g. /usr/local/cuda/bin/ncu) and "
            "add it to PATH, or pass --ncu PATH")
    return path


def ncu_command(ncu: str, args, cc: int | None) -> list[str]:
    b, hq, hkv, sq, sk, d = args.shape
    cmd = [ncu, "--csv", "--print-units", "base", "--profile-from-start", "off",
           "--target-processes", "all", "--metrics", ",".join(metrics_for(cc))]
    if not args.locked_clocks:
        cmd += ["--clock-control", "none"]
    cmd += [sys.executable, "-m", "cupy_attention.profile_target",
            "--shape", f"{b},{hq},{hkv},{sq},{sk},{d}", "--dtype", args.dtypes[0],
            "--kernel", args.kernel, "--repeats", str(args.repeats)]
    if args.causal == "on":
        cmd.append("--causal")
    return cmd


def explain_failure(returncode: int, output: str) -> ProfileError:
    """A typed error for a failed ncu run, from its exit status and output (pure)."""
    if "ERR_NVGPUCTRPERM" in output:
        return NcuPermissionError(
            "ncu may not read the GPU performance counters (ERR_NVGPUCTRPERM): run as an "
            "administrator, or allow profiling for all users (NVreg_RestrictProfilingToAdminUsers=0; "
            "see https://developer.nvidia.com/ERR_NVGPUCTRPERM)")
    tail = [line for line in output.strip().splitlines() if line.strip()][-6:]
    return ProfileError(f"ncu failed (exit status {returncode}): " + " | ".join(tail))


def run(args, console: Console) -> int:
    from . import bench, device

    device.require_device()
    ncu = find_ncu(args.ncu)
    dev = 0
    cc = device.compute_capability(dev)
    name = device.device_name(dev)
    b, hq, hkv, sq, sk, d = args.shape
    dtype = args.dtypes[0]
    causal = args.causal == "on"
    case = bench.Case("fwd", b, hq, hkv, sq, sk, d, dtype, causal)
    cmd = ncu_command(ncu, args, cc)
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))
    console.print(f"[dim]{escape(' '.join(cmd))}[/]")
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        raise ProfileError(f"ncu took longer than {args.timeout} s (--timeout)") from None
    output = res.stdout + "\n" + res.stderr
    try:
        launches = parse_csv(res.stdout)
    except ValueError:
        launches = []
    if res.returncode != 0 or not launches:
        raise explain_failure(res.returncode, output)
    problem = case.problem(dev)
    summary = summarize(launches, args.repeats, problem.flops())
    report = {"schema": SCHEMA, "device": name, "compute_capability": cc,
              "problem": f"{case.label()} Hkv={hkv} Sk={sk} kernel={args.kernel}",
              "shape": list(args.shape), "dtype": dtype, "causal": causal,
              "kernel": args.kernel, "metrics": list(metrics_for(cc)), "ncu_command": cmd,
              "summary": summary, "roofline": roofline(summary, device_peak(name, dtype)),
              "launches": [dataclasses.asdict(x) for x in launches]}
    render(report, console)
    if args.json:
        bench.write_json(report, args.json)
        console.print(f"wrote {escape(str(args.json))}")
    if args.plot:
        try:
            console.print(f"wrote {escape(str(write_plot(report, args.plot)))}")
        except ModuleNotFoundError:
            console.print("[yellow]matplotlib is not importable: no chart written "
                          "(pip install 'cupy-attention[plot]')[/]")
        except ValueError as exc:
            console.print(f"[yellow]{escape(str(exc))}[/]")
    return 0
