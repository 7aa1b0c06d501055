"""Benchmark harness: our kernel families beside torch SDPA (protocol: BENCHMARKS.md).

One case is (B, Hq, Hkv, Sq, Sk, D, dtype, causal) in layout bhsd. For every
kernel family that accepts it, and every torch SDPA backend that accepts it:

1. Inputs: random normal q, k, v made once per case on the device: torch
   tensors when torch is used (our API takes them zero-copy, on torch's current
   stream), CuPy arrays otherwise. Several input sets rotate when one set is
   smaller than twice the L2 cache, so repeated launches do not read a warm cache.
2. Cold first call: wall time of the first call (for our kernels NVRTC compile
   or disk-cache load plus module load; for cuDNN its plan), then two warm-up
   calls per input set.
3. Time: CUDA events on the launch stream around each call, ``reps`` calls per
   round, two rounds. A spin kernel holds the stream for longer than the host
   needs to enqueue a round, so the events time GPU work, not Python's launch
   overhead (the ``overhead`` section measures that). Reported: the median of
   all calls and the spread, |median1 - median2| / min in percent: a difference
   between two rows smaller than their spread is noise.
4. FLOPs: ``4*B*Hq*Sq*Sk*D``, halved for causal with Sq == Sk, true D; forward
   a backward row (``--backward``: attention_backward alone, out and LSE made
   beforehand; torch: autograd.grad through a retained graph) counts 2.5x.
   Decode rows add K/V bytes read per second.
5. Extra memory: peak device memory a call allocates beyond its output. Ours:
   bytes held from CuPy's memory pool during one call (a pool hook) minus the
   output; torch: ``torch.cuda.max_memory_allocated`` over one call minus the
   memory allocated before it and the output.
6. Error: max |out - ref| over the last 128 query rows of batch 0, head 0,
   against float64 attention on the host (the last rows see the most keys).

Rendering (tables, JSON, plots) reads only the report dict, so a saved JSON
renders again anywhere (``cupy-attention report results.json --plot DIR``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table

import cupy_attention as ca

from . import device, dispatch, jit
from .arrays import host64
from .errors import NoDeviceError, UnsupportedError
from .interop import is_torch
from .problem import Problem
from .reference import attention_reference

SCHEMA = "cupy-attention-bench/1"

# BENCHMARKS.md's grid: B*S tokens and H*D hidden size held fixed.
TOKENS = 16384
HIDDEN = 2048
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128, 256, 72, 80, 96, 160)
DTYPES = ("bfloat16", "float16")

# --quick: the GPU suite's few-minute subset, plus one fp32 case for the CUDA-core ladder.
QUICK_SEQLENS = (1024, 4096)
QUICK_HEAD_DIMS = (64, 128)
QUICK_DTYPES = ("bfloat16",)
QUICK_FP32 = (2048, 64)          # (S, D)
QUICK_REPS = 20
QUICK_QUADRATIC_MAX = 2048

# Decode: one query token, GQA 32 query heads over 8 KV heads, D=128, bf16: (B, Sk).
DECODE_SHAPES = ((1, 32768), (8, 8192), (64, 4096))
DECODE_HEADS = (32, 8)
DECODE_HEAD_DIM = 128

TORCH_BACKENDS = ("flash", "cudnn", "efficient", "math")
ANCHORS = ("torch:flash", "torch:cudnn")
# Families whose ``memory`` says O(S^2), and torch's math backend, hold the whole
# score matrix: skipped above --quadratic-max-seqlen unless named.
QUADRATIC_MAX = 4096

MIN_REPS = 20
DEFAULT_REPS = 30
ROUNDS = 2
ERR_ROWS = 128
MAX_INPUT_SETS = 16
SPIN_MAX_S = 0.2
BWD_FACTOR = 2.5
OVERHEAD_CALLS = 1000
OVERHEAD_WARMUP = 20

DTYPE_ALIASES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "f16": "float16", "half": "float16", "float16": "float16",
    "fp32": "float32", "f32": "float32", "float": "float32", "float32": "float32",
}
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


# ---------------------------------------------------------------------------
# Cases

@dataclasses.dataclass(frozen=True)
class Case:
    kind: str          # "fwd" | "decode" | "bwd"
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str
    causal: bool

    def problem(self, device_id: int = 0) -> Problem:
        return Problem(self.batch, self.heads_q, self.heads_kv, self.seqlen_q, self.seqlen_k,
                       self.head_dim, self.dtype, "bhsd", self.causal, "none",
                       1.0 / math.sqrt(self.head_dim), device_id)

    def flops(self) -> float:
        f = self.problem().flops()
        return f * BWD_FACTOR if self.kind == "bwd" else f

    def kv_bytes(self) -> int:
        return 2 * self.batch * self.heads_kv * self.seqlen_k * self.head_dim * ITEMSIZE[self.dtype]

    def shapes(self) -> tuple[tuple, tuple]:
        return ((self.batch, self.heads_q, self.seqlen_q, self.head_dim),
                (self.batch, self.heads_kv, self.seqlen_k, self.head_dim))

    def label(self) -> str:
        return case_label(dataclasses.asdict(self))


def case_label(r: dict) -> str:
    """A one-line name of the case a row (or a Case as a dict) belongs to."""
    dt = SHORT[r["dtype"]]
    if r["kind"] == "decode":
        return (f"decode {dt} B={r['batch']} Sk={r['seqlen_k']} Hq={r['heads_q']}/"
                f"Hkv={r['heads_kv']} D={r['head_dim']}")
    prefix = "bwd " if r["kind"] == "bwd" else ""
    return (f"{prefix}{dt} D={r['head_dim']} S={r['seqlen_q']} B={r['batch']} H={r['heads_q']}"
            f"{' causal' if r['causal'] else ''}")


CASE_FIELDS = tuple(f.name for f in dataclasses.fields(Case))


def case_key(r: dict) -> tuple:
    return tuple(r[f] for f in CASE_FIELDS)


def grid_case(seqlen: int, head_dim: int, dtype: str, causal: bool) -> Case:
    """BENCHMARKS.md's shape for (S, D): B = 16384 // S, H = 2048 // D."""
    b, h = max(1, TOKENS // seqlen), max(1, HIDDEN // head_dim)
    return Case("fwd", b, h, h, seqlen, seqlen, head_dim, dtype, causal)


def decode_cases() -> list[Case]:
    hq, hkv = DECODE_HEADS
    return [Case("decode", b, hq, hkv, 1, sk, DECODE_HEAD_DIM, "bfloat16", False)
            for b, sk in DECODE_SHAPES]


def make_row(case: Case, kernel: str, impl: str, **fields) -> dict:
    """One result: the case's fields, the kernel, and either figures (``ms`` and what
    follows from it), ``skipped`` (a reason) or ``error`` (a message)."""
    row = dataclasses.asdict(case)
    row.update(kernel=kernel, impl=impl, **fields)
    if "ms" in row:
        row["tflops"] = case.flops() / (row["ms"] * 1e-3) / 1e12
        if case.kind == "decode":
            row["tbps"] = case.kv_bytes() / (row["ms"] * 1e-3) / 1e12
    return row


def backward_available() -> bool:
    return hasattr(ca, "attention_backward")


def build_cases(args) -> tuple[list[Case], list[str]]:
    """The cases ``args`` asks for, in table order, and notes to show the user."""
    notes = []
    causals = {"off": (False,), "on": (True,), "both": (False, True)}[args.causal]
    fwd: list[Case] = []
    if args.quick:
        for dtype in QUICK_DTYPES:
            for d in QUICK_HEAD_DIMS:
                for s in QUICK_SEQLENS:
                    fwd.extend(grid_case(s, d, dtype, c) for c in causals)
        s, d = QUICK_FP32
        fwd.append(grid_case(s, d, "float32", False))
    elif args.shape:
        for dtype in args.dtypes:
            for b, h, s, d in args.shape:
                fwd.extend(Case("fwd", b, h, h, s, s, d, dtype, c) for c in causals)
    elif not args.no_grid:
        for dtype in args.dtypes:
            for d in args.head_dims:
                for s in args.seqlens:
                    fwd.extend(grid_case(s, d, dtype, c) for c in causals)
    cases = list(fwd)
    if args.backward:
        if backward_available():
            cases.extend(dataclasses.replace(c, kind="bwd") for c in fwd)
        else:
            notes.append("backward benchmarks: not implemented yet "
                         "(cupy_attention has no attention_backward)")
    if args.decode:
        cases.extend(decode_cases())
    return cases, notes


# ---------------------------------------------------------------------------
# Arguments

def int_list(text: str) -> tuple[int, ...]:
    """Parse "512,1k,16k" into (512, 1024, 16384)."""
    out = []
    for item in text.split(","):
        item = item.strip().lower()
        try:
            out.append(int(item[:-1]) * 1024 if item.endswith("k") else int(item))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{item!r} is not an integer (e.g. 512,1k,16k)") from None
        if out[-1] <= 0:
            raise argparse.ArgumentTypeError(f"{item!r} must be positive")
    return tuple(out)


def dtype_list(text: str) -> tuple[str, ...]:
    out = []
    for item in text.split(","):
        name = DTYPE_ALIASES.get(item.strip().lower())
        if name is None:
            raise argparse.ArgumentTypeError(
                f"unknown dtype {item!r}; use bf16, fp16 or fp32 (or their full names)")
        out.append(name)
    return tuple(dict.fromkeys(out))


def _shape(text: str) -> tuple[int, int, int, int]:
    dims = int_list(text)
    if len(dims) != 4:
        raise argparse.ArgumentTypeError(f"--shape takes B,H,S,D (four integers), got {text!r}")
    return dims


def name_list(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))


def add_arguments(p: argparse.ArgumentParser) -> None:
    grid = p.add_argument_group("cases (default: BENCHMARKS.md's grid, B*S=16384, H*D=2048)")
    grid.add_argument("--quick", action="store_true",
                      help="the GPU suite's subset: bf16, S in {1024, 4096}, D in {64, 128}, "
                           "causal off/on, one fp32 case (S=2048, D=64), plus --overhead; "
                           f"{QUICK_REPS} reps")
    grid.add_argument("--seqlens", type=int_list, default=SEQLENS, metavar="S,...",
                      help="sequence lengths (default: 512,1k,2k,4k,8k,16k)")
    grid.add_argument("--head-dims", type=int_list, default=HEAD_DIMS, metavar="D,...",
                      help="head dims (default: 64,128,256,72,80,96,160)")
    grid.add_argument("--dtypes", "--dtype", type=dtype_list, default=DTYPES, metavar="DT,...",
                      help="bf16, fp16, fp32 (default: bf16,fp16; fp32 suits the CUDA-core "
                           "kernels)")
    grid.add_argument("--causal", choices=("on", "off", "both"), default="both")
    grid.add_argument("--shape", type=_shape, action="append", metavar="B,H,S,D",
                      help="one shape instead of the grid (repeatable)")
    grid.add_argument("--no-grid", action="store_true",
                      help="skip the forward grid: run only --overhead / --decode")
    grid.add_argument("--decode", action="store_true",
                      help="add decode shapes: one query token, Hq=32, Hkv=8, D=128, bf16, "
                           "B=1 Sk=32k, B=8 Sk=8k, B=64 Sk=4k (K/V TB/s)")
    grid.add_argument("--backward", action="store_true",
                      help="add backward timing: our backward kernels beside torch SDPA's "
                           "(needs cupy_attention.attention_backward)")
    grid.add_argument("--overhead", action="store_true",
                      help="add host overhead per call on a tiny problem and the cold compile time")

    who = p.add_argument_group("kernels")
    who.add_argument("--kernels", type=name_list, metavar="NAME,...",
                     help="our families to time (default: every family that accepts each case); "
                          "named ones run even above --quadratic-max-seqlen")
    who.add_argument("--torch", action=argparse.BooleanOptionalAction, default=None,
                     help="time torch SDPA beside ours (default: when torch with CUDA is "
                          "importable)")
    who.add_argument("--torch-backends", type=name_list, metavar="NAME,...",
                     help=f"torch SDPA backends (default: {','.join(TORCH_BACKENDS)}; each only "
                          "where it accepts the case)")
    who.add_argument("--quadratic-max-seqlen", type=int, metavar="S",
                     help="skip O(S^2)-memory kernels (our naive/tiled-like families, torch "
                          "math) when Sq*Sk > S^2 unless named "
                          f"(default: {QUADRATIC_MAX}; --quick: {QUICK_QUADRATIC_MAX})")

    out = p.add_argument_group("measurement and output")
    out.add_argument("--reps", type=int, metavar="N",
                     help=f"timed calls per round, two rounds (default: {DEFAULT_REPS}; "
                          f"--quick: {QUICK_REPS}; at least {MIN_REPS})")
    out.add_argument("--json", type=Path, metavar="FILE",
                     help="write every figure and the environment (rewritten after each case)")
    out.add_argument("--plot", type=Path, metavar="DIR",
                     help="write PNG charts (needs matplotlib)")


def finish_arguments(p: argparse.ArgumentParser, args) -> None:
    """Defaults that depend on other flags, and cross-checks; errors exit with code 2."""
    if args.quick:
        chosen = [flag for flag, value, default in (
            ("--seqlens", args.seqlens, SEQLENS), ("--head-dims", args.head_dims, HEAD_DIMS),
            ("--dtypes", args.dtypes, DTYPES), ("--shape", args.shape, None),
            ("--no-grid", args.no_grid, False)) if value != default]
        if chosen:
            p.error(f"--quick picks its own cases; drop {', '.join(chosen)}")
        args.overhead = True
    if args.shape and args.no_grid:
        p.error("--shape and --no-grid contradict each other")
    if args.reps is None:
        args.reps = QUICK_REPS if args.quick else DEFAULT_REPS
    if args.reps < MIN_REPS:
        p.error(f"--reps must be at least {MIN_REPS} (BENCHMARKS.md), got {args.reps}")
    if args.quadratic_max_seqlen is None:
        args.quadratic_max_seqlen = QUICK_QUADRATIC_MAX if args.quick else QUADRATIC_MAX
    if args.kernels is not None:
        unknown = [k for k in args.kernels if k not in dispatch.FAMILIES]
        if unknown:
            p.error(f"unknown kernel family {', '.join(unknown)}; families: "
                    f"{', '.join(dispatch.FAMILIES)}")
    if args.torch_backends is not None:
        unknown = [b for b in args.torch_backends if b not in TORCH_BACKENDS]
        if unknown:
            p.error(f"unknown torch backend {', '.join(unknown)}; backends: "
                    f"{', '.join(TORCH_BACKENDS)}")
    if args.torch is False and args.torch_backends:
        p.error("--torch-backends needs torch; drop --no-torch")
    if args.no_grid and not (args.decode or args.overhead):
        p.error("--no-grid leaves nothing to run; add --decode or --overhead")


# ---------------------------------------------------------------------------
# Environment

def _version(v: int) -> str | None:
    """CUDA's integer version (12090) as text ("12.9"); None for 0 (no driver)."""
    return f"{v // 1000}.{(v % 1000) // 10}" if v else None


def _nvidia_smi_driver() -> str | None:
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = res.stdout.split()
    return lines[0] if res.returncode == 0 and lines else None


def system_info() -> dict:
    """What this machine offers, gathered without failing where there is no GPU.

    ``devices`` lists each CUDA device; ``no_device`` says why there is none.
    """
    info = {"cupy_attention": ca.__version__, "python": platform.python_version(),
            "cupy": None, "cuda_runtime": None, "cuda_driver": None, "driver": None,
            "nvrtc": None, "devices": [], "no_device": None,
            "cache_dir": str(jit.cache_dir()), "cache_entries": 0, "cache_bytes": 0}
    info["cache_entries"], info["cache_bytes"] = jit.cache_size()
    try:
        cupy = device.require_cupy()
    except NoDeviceError as exc:
        info["no_device"] = str(exc)
        return info
    info["cupy"] = cupy.__version__
    rt = cupy.cuda.runtime
    info["cuda_runtime"] = _version(rt.runtimeGetVersion())
    try:
        info["cuda_driver"] = _version(rt.driverGetVersion())
    except Exception:  # no driver library at all
        pass
    try:
        info["nvrtc"] = ".".join(map(str, jit.nvrtc_version()))
    except NoDeviceError as exc:
        info["nvrtc"] = None
        info["nvrtc_error"] = str(exc)
    n = device.device_count()
    if n == 0:
        info["no_device"] = "no CUDA device (no NVIDIA GPU or driver found)"
        return info
    info["driver"] = _nvidia_smi_driver()
    for i in range(n):
        props = rt.getDeviceProperties(i)
        info["devices"].append({
            "id": i, "name": device.device_name(i),
            "compute_capability": device.compute_capability(i),
            "arch": device.device_arch(i), "sms": device.multiprocessor_count(i),
            "memory_bytes": int(props["totalGlobalMem"]), "l2_bytes": int(props["l2CacheSize"]),
        })
    return info


def _git_commit() -> tuple[str | None, bool | None]:
    root = Path(ca.__file__).resolve().parent.parent
    if (root / ".git").exists():
        try:
            sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                 text=True, timeout=10)
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                   cwd=root, capture_output=True, text=True, timeout=10)
            if sha.returncode == 0:
                return sha.stdout.strip(), bool(dirty.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    return os.environ.get("CUPY_ATTENTION_COMMIT"), None


def environment(torch_mod, device_id: int) -> dict:
    env = system_info()
    env["device"] = next(d for d in env.pop("devices") if d["id"] == device_id)
    env["commit"], env["dirty"] = _git_commit()
    env["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    env["command"] = shlex.join(sys.argv)
    env["torch"] = torch_mod.__version__ if torch_mod else None
    if torch_mod:
        env["torch_cuda"] = torch_mod.version.cuda
        env["cudnn"] = torch_mod.backends.cudnn.version()
    return env


# ---------------------------------------------------------------------------
# Measurement (GPU)

_SPIN_SOURCE = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""


class BenchError(RuntimeError):
    """The bench cannot run as asked (e.g. --torch without a usable torch)."""


class Unsupported(Exception):
    """A torch backend declined the case ("No available kernel")."""


@contextlib.contextmanager
def recording_specs():
    """Collect the names of the instantiations our families load while active.

    Families fetch kernels through ``jit.get_function`` (an attribute looked up at
    call time), so a temporary wrapper sees every spec; the bench is single-threaded.
    """
    names: list[str] = []
    original = jit.get_function

    def recording(spec, arch, device_id):
        names.append(spec.name)
        return original(spec, arch, device_id)

    jit.get_function = recording
    try:
        yield names
    finally:
        jit.get_function = original


def cupy_randn(cupy, shape, dtype: str):
    """Random normal CuPy array; bf16 made from fp32 bits (round to nearest even)."""
    x = cupy.random.standard_normal(shape, dtype=cupy.float32)
    if dtype != "bfloat16":
        return x.astype(dtype)
    import ml_dtypes

    bits = x.view(cupy.uint32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return bits.astype(cupy.uint16).view(ml_dtypes.bfloat16)


def nbytes(x) -> int:
    return x.numel() * x.element_size() if is_torch(x) else int(x.nbytes)


def _pool_peak_hook(cupy):
    class PoolPeak(cupy.cuda.MemoryHook):
        """Peak of the bytes held from CuPy's memory pool while the hook is active."""

        name = "PoolPeak"

        def __init__(self):
            self.held = 0
            self.peak = 0

        def malloc_postprocess(self, **kw):
            self.held += kw["mem_size"]
            self.peak = max(self.peak, self.held)

        def free_postprocess(self, **kw):
            self.held -= kw["mem_size"]

    return PoolPeak()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _finite(x: float):
    """JSON has no NaN/Inf: keep those as text."""
    return x if math.isfinite(x) else str(x)


class Runner:
    """Times one case at a time on the current device (see the module docstring)."""

    def __init__(self, args, torch_mod):
        self.cupy = device.require_cupy()
        self.torch = torch_mod
        self.device_id = self.cupy.cuda.runtime.getDevice()
        self.cc = device.compute_capability(self.device_id)
        self.reps = args.reps
        self.kernels = args.kernels
        self.backends = (args.torch_backends or TORCH_BACKENDS) if torch_mod else ()
        self.named = set(args.kernels or ()) | {f"torch:{b}" for b in args.torch_backends or ()}
        self.quadratic_max = args.quadratic_max_seqlen
        props = self.cupy.cuda.runtime.getDeviceProperties(self.device_id)
        self.l2_bytes = int(props["l2CacheSize"])
        if torch_mod:
            torch_mod.manual_seed(0)
            ptr = torch_mod.cuda.current_stream(self.device_id).cuda_stream
            self.stream = self.cupy.cuda.ExternalStream(ptr, self.device_id)
        else:
            self.cupy.random.seed(0)
            self.stream = self.cupy.cuda.get_current_stream()
        self.spin, self.spin_error = self._load_spin()

    def method(self) -> dict:
        return {
            "timing": "CUDA events around each call on the launch stream; median of all "
                      "calls of two rounds; spread = |median1 - median2| / min",
            "reps_per_round": self.reps, "rounds": ROUNDS,
            "spin": ("a spin kernel holds the stream while each round is enqueued"
                     if self.spin else f"unavailable ({self.spin_error}): times may include "
                                       "host launch overhead"),
            "flops": "4*B*Hq*Sq*Sk*D, halved for causal with Sq == Sk, true D; "
                     f"backward x{BWD_FACTOR}",
            "extra_memory": "peak bytes held from CuPy's pool plus torch's max_memory_allocated "
                            "delta during one call, minus the output",
            "error": f"max |out - float64 reference| over the last {ERR_ROWS} query rows of "
                     "batch 0, head 0",
            "inputs": "random normal, layout bhsd; input sets rotate until they exceed 2x L2",
            "quadratic_max_seqlen": self.quadratic_max,
            "l2_bytes": self.l2_bytes,
            "arrays": "torch tensors" if self.torch else "cupy arrays",
        }

    # -- plumbing --------------------------------------------------------
    def _load_spin(self):
        try:
            kernel = self.cupy.RawKernel(_SPIN_SOURCE, "spin")
            with self.stream:
                kernel((1,), (1,), (np.uint64(1000),))
            self.stream.synchronize()
            return kernel, None
        except Exception as exc:
            return None, first_line(exc)

    def sync(self) -> None:
        self.stream.synchronize()

    def free_memory(self) -> None:
        self.sync()
        self.cupy.get_default_memory_pool().free_all_blocks()
        if self.torch:
            self.torch.cuda.empty_cache()

    def randn(self, shape, dtype: str):
        if self.torch:
            return self.torch.randn(shape, device=f"cuda:{self.device_id}",
                                    dtype=getattr(self.torch, dtype))
        return cupy_randn(self.cupy, shape, dtype)

    def input_sets(self, case: Case, with_dout: bool = False) -> list[tuple]:
        """Enough (q, k, v[, dout]) sets that together they exceed twice the L2 cache."""
        q_shape, kv_shape = case.shapes()
        per_set = (math.prod(q_shape) * (2 if with_dout else 1) + 2 * math.prod(kv_shape)) \
            * ITEMSIZE[case.dtype]
        n = min(MAX_INPUT_SETS, max(1, math.ceil(2 * self.l2_bytes / per_set)))
        sets = []
        for _ in range(n):
            arrays = (self.randn(q_shape, case.dtype), self.randn(kv_shape, case.dtype),
                      self.randn(kv_shape, case.dtype))
            if with_dout:
                arrays += (self.randn(q_shape, case.dtype),)
            sets.append(arrays)
        return sets

    def _round(self, fn, sets, hold_s: float) -> list[float]:
        cupy = self.cupy
        starts = [cupy.cuda.Event() for _ in range(self.reps)]
        ends = [cupy.cuda.Event() for _ in range(self.reps)]
        if self.spin is not None:
            with self.stream:
                self.spin((1,), (1,), (np.uint64(int(hold_s * 1e9)),))
        for i in range(self.reps):
            starts[i].record(self.stream)
            fn(*sets[i % len(sets)])
            ends[i].record(self.stream)
        ends[-1].synchronize()
        return [cupy.cuda.get_elapsed_time(a, b) for a, b in zip(starts, ends)]

    def time_calls(self, fn, sets) -> tuple[dict, object]:
        """Cold call, warm-up, two timed rounds: (figures, the cold call's output)."""
        with recording_specs() as specs:
            t0 = time.perf_counter()
            out = fn(*sets[0])
            self.sync()
            cold = time.perf_counter() - t0
        for s in sets:
            fn(*s)
        self.sync()
        # A second pass, with the memory pools warm, tells how long a round takes to enqueue.
        t0 = time.perf_counter()
        for s in sets:
            fn(*s)
        host = (time.perf_counter() - t0) / len(sets)
        self.sync()
        hold = min(SPIN_MAX_S, 2 * host * self.reps + 1e-3)
        rounds = [self._round(fn, sets, hold) for _ in range(ROUNDS)]
        medians = [statistics.median(r) for r in rounds]
        figures = {
            "ms": statistics.median([t for r in rounds for t in r]),
            "ms_rounds": medians,
            "spread_pct": 100 * abs(medians[0] - medians[1]) / min(medians),
            "cold_s": cold, "host_enqueue_us": host * 1e6,
            "reps": self.reps, "input_sets": len(sets),
        }
        if specs:
            figures["specs"] = list(dict.fromkeys(specs))
        return figures, out

    def extra_memory(self, fn, args) -> int:
        """Peak device bytes a call allocates beyond its output: from CuPy's pool
        (our kernels' scratch) and, when torch is present, from torch's allocator
        (outputs of torch inputs, and torch's own backends)."""
        self.sync()
        torch = self.torch
        if torch is not None:
            torch.cuda.synchronize(self.device_id)
            torch.cuda.reset_peak_memory_stats(self.device_id)
            base = torch.cuda.memory_allocated(self.device_id)
        hook = _pool_peak_hook(self.cupy)
        with hook:
            out = fn(*args)
            self.sync()
        peak = hook.peak
        if torch is not None:
            torch.cuda.synchronize(self.device_id)
            peak += torch.cuda.max_memory_allocated(self.device_id) - base
        return peak - nbytes(out)

    # -- one case ----------------------------------------------------------
    def _policy_skip(self, name: str, quadratic: bool, case: Case) -> str | None:
        if quadratic and name not in self.named and \
                case.seqlen_q * case.seqlen_k > self.quadratic_max ** 2:
            return (f"O(S^2) baseline skipped above S={self.quadratic_max} "
                    "(name it in --kernels/--torch-backends to run it)")
        return None

    def _measure(self, case, kernel, impl, fn, sets, ref) -> dict:
        """One row; a declined torch backend gives a skipped row, a failure an error row."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                figures, out = self.time_calls(fn, sets)
                if ref is not None:
                    got = host64(out[0:1, 0:1, -ref.shape[2]:, :])
                    figures["max_err"] = _finite(float(np.max(np.abs(got - ref))))
                    del out
                    figures["extra_bytes"] = self.extra_memory(fn, sets[0])
            return make_row(case, kernel, impl, **figures)
        except Unsupported as exc:
            return make_row(case, kernel, impl, skipped=str(exc))
        except Exception as exc:  # keep going: one broken kernel must not end the run
            return make_row(case, kernel, impl, error=first_line(exc))
        finally:
            self.free_memory()

    def _reference(self, case: Case, q, k, v) -> np.ndarray:
        """float64 output of the last rows of batch 0, query head 0 (KV head 0)."""
        rows = min(ERR_ROWS, case.seqlen_q)
        out, _ = attention_reference(host64(q[0:1, 0:1, -rows:, :]), host64(k[0:1, 0:1]),
                                     host64(v[0:1, 0:1]), causal=case.causal)
        return out

    def _torch_sdpa(self, backend: str, case: Case):
        """torch SDPA forced onto one backend; Unsupported where it declines the case."""
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]
        gqa = {"enable_gqa": True} if case.heads_q != case.heads_kv else {}
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def fn(q, k, v):
            try:
                with sdpa_kernel(which):
                    return sdpa(q, k, v, is_causal=case.causal, **gqa)
            except RuntimeError as exc:
                if "No available kernel" in str(exc):
                    raise Unsupported(f"torch {backend} does not take this case") from None
                raise

        return fn

    def _torch_forward(self, backend: str, case: Case):
        sdpa = self._torch_sdpa(backend, case)

        def fn(q, k, v):
            with self.torch.no_grad():
                return sdpa(q, k, v)

        return fn

    def run_case(self, case: Case) -> list[dict]:
        if case.kind == "bwd":
            return self._run_backward(case)
        sets = self.input_sets(case)
        ref = self._reference(case, *sets[0])
        problem = case.problem(self.device_id)
        rows = []
        for name, family in dispatch.FAMILIES.items():
            if self.kernels is not None and name not in self.kernels:
                continue
            reason = (family.check(problem, self.cc)
                      or self._policy_skip(name, "S^2" in family.memory, case))
            if reason:
                rows.append(make_row(case, name, "ours", skipped=reason))
                continue

            def ours(q, k, v, name=name):
                return ca.attention(q, k, v, causal=case.causal, kernel=name)

            rows.append(self._measure(case, name, "ours", ours, sets, ref))
        for backend in self.backends:
            label = f"torch:{backend}"
            reason = self._policy_skip(label, backend == "math", case)
            if reason:
                rows.append(make_row(case, label, "torch", skipped=reason))
                continue
            rows.append(self._measure(case, label, "torch", self._torch_forward(backend, case),
                                      sets, ref))
        del sets
        self.free_memory()
        return rows

    def _run_backward(self, case: Case) -> list[dict]:
        """The backward alone. Ours: out and LSE come from one forward per input set,
        made before the timed calls, and each backward kernel that takes the case is
        timed. torch: one forward per input set with its autograd graph retained, and
        the timed call is ``autograd.grad`` through it."""
        from .backward import BACKWARD_KERNELS
        from .calls import backward_family

        sets = self.input_sets(case, with_dout=True)
        problem = case.problem(self.device_id)
        rows, with_fwd = [], None
        for name in BACKWARD_KERNELS:
            if name in ("auto", "reference") or (self.kernels is not None and
                                                 name not in self.kernels):
                continue
            try:
                backward_family(problem, name, self.device_id)
            except UnsupportedError as exc:
                rows.append(make_row(case, name, "ours", skipped=str(exc)))
                continue
            if with_fwd is None:
                with_fwd = [(q, k, v, dout) + tuple(ca.attention(q, k, v, causal=case.causal,
                                                                 return_lse=True))
                            for q, k, v, dout in sets]

            def ours(q, k, v, dout, out, lse, name=name):
                return ca.attention_backward(dout, q, k, v, out, lse, causal=case.causal,
                                             kernel=name)

            rows.append(self._measure(case, name, "ours", ours, with_fwd, None))
        del with_fwd
        torch = self.torch
        for backend in self.backends:
            label = f"torch:{backend}"
            reason = self._policy_skip(label, backend == "math", case)
            if reason:
                rows.append(make_row(case, label, "torch", skipped=reason))
                continue
            sdpa = self._torch_sdpa(backend, case)
            try:
                graphs = []
                for s in sets:
                    leaves = tuple(x.detach().requires_grad_() for x in s[:3])
                    with torch.enable_grad():
                        graphs.append((sdpa(*leaves),) + leaves + (s[3],))
            except Unsupported as exc:
                rows.append(make_row(case, label, "torch", skipped=str(exc)))
                continue

            def theirs(out, q, k, v, dout):
                return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

            rows.append(self._measure(case, label, "torch", theirs, graphs, None))
            del graphs
        del sets
        self.free_memory()
        return rows

    # -- host overhead -----------------------------------------------------
    def _overhead_row(self, what: str, fn, args) -> dict:
        for _ in range(OVERHEAD_WARMUP):
            fn(*args)
        self.sync()
        t0 = time.perf_counter()
        for _ in range(OVERHEAD_CALLS):
            fn(*args)
        t1 = time.perf_counter()
        self.sync()
        t2 = time.perf_counter()
        gpu_ms = statistics.median(self._round(fn, [args], SPIN_MAX_S / 4))
        return {"what": what, "host_us": (t1 - t0) / OVERHEAD_CALLS * 1e6,
                "wall_us": (t2 - t0) / OVERHEAD_CALLS * 1e6, "gpu_us": gpu_ms * 1e3}

    def overhead(self) -> dict:
        """Host time per hot call on a tiny problem, beside its GPU time; cold compile."""
        case = OVERHEAD_CASE
        q_shape, kv_shape = case.shapes()
        kernel = dispatch.choose(case.problem(self.device_id), "auto", self.cc).name
        result = {"problem": case_label(dataclasses.asdict(case)), "calls": OVERHEAD_CALLS,
                  "kernel": kernel, "rows": []}
        arrays = {"cupy arrays": tuple(cupy_randn(self.cupy, s, case.dtype)
                                       for s in (q_shape, kv_shape, kv_shape))}
        if self.torch:
            arrays["torch tensors"] = tuple(self.randn(s, case.dtype)
                                            for s in (q_shape, kv_shape, kv_shape))
        for label, args in arrays.items():
            result["rows"].append(self._overhead_row(f"attention() on {label}", ca.attention, args))
        if self.torch:
            sdpa = self.torch.nn.functional.scaled_dot_product_attention
            result["rows"].append(self._overhead_row("torch SDPA (its own dispatch)", sdpa,
                                                     arrays["torch tensors"]))
        del arrays
        self.free_memory()
        result["cold"] = cold_compile()
        return result


OVERHEAD_CASE = Case("fwd", 1, 1, 1, 128, 128, 64, "bfloat16", False)


def _probe(cache_dir: str) -> dict:
    root = str(Path(ca.__file__).resolve().parent.parent)
    env = dict(os.environ, CUPY_ATTENTION_CACHE_DIR=cache_dir)
    env.pop("CUPY_ATTENTION_NO_CACHE", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))
    res = subprocess.run([sys.executable, "-c",
                          "from cupy_attention.bench import cold_probe; cold_probe()"],
                         env=env, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError((res.stderr.strip().splitlines() or ["no output"])[-1])
    return json.loads(res.stdout.strip().splitlines()[-1])


def cold_compile() -> dict:
    """First call in a fresh process with an empty cache, then with a warm disk cache."""
    with tempfile.TemporaryDirectory(prefix="cupy-attention-cold-") as tmp:
        try:
            empty = _probe(tmp)
            warm = _probe(tmp)
        except (RuntimeError, subprocess.SubprocessError, ValueError) as exc:
            return {"error": first_line(exc)}
    return {"specs": empty["specs"], "compiled_entries": empty["entries"],
            "empty_cache_s": empty["first_s"], "disk_cache_s": warm["first_s"],
            "hot_s": warm["second_s"]}


def cold_probe() -> None:
    """Child process of :func:`cold_compile`: time the first and second call of the
    overhead problem (CUDA context and inputs made beforehand); print one JSON line."""
    cupy = device.require_cupy()
    q_shape, kv_shape = OVERHEAD_CASE.shapes()
    q, k, v = (cupy_randn(cupy, s, OVERHEAD_CASE.dtype) for s in (q_shape, kv_shape, kv_shape))
    dev = cupy.cuda.Device()
    dev.synchronize()
    with recording_specs() as specs:
        t0 = time.perf_counter()
        ca.attention(q, k, v)
        dev.synchronize()
        t1 = time.perf_counter()
    ca.attention(q, k, v)
    dev.synchronize()
    t2 = time.perf_counter()
    print(json.dumps({"first_s": t1 - t0, "second_s": t2 - t1, "specs": specs,
                      "entries": jit.cache_size()[0]}))


# ---------------------------------------------------------------------------
# Report: ratios, tables, JSON, plots (no GPU needed)

def add_ratios(rows: list[dict]) -> None:
    """speedup_flash / speedup_cudnn: the anchor's time over the row's (>1 = faster)."""
    anchors: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r["kernel"] in ANCHORS and "ms" in r:
            anchors.setdefault(case_key(r), {})[r["kernel"]] = r["ms"]
    for r in rows:
        if "ms" not in r:
            continue
        found = anchors.get(case_key(r), {})
        for anchor in ANCHORS:
            if anchor in found:
                r[f"speedup_{anchor.split(':')[1]}"] = found[anchor] / r["ms"]


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
               ("Hq/Hkv", lambda r: f"{r['heads_q']}/{r['heads_kv']}", "right"),
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


# ---------------------------------------------------------------------------
# Driver

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
            add_ratios(rows)
            report["results"].extend(rows)
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

