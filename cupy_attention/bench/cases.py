"""Cases: the grid, decode shapes, --shape/--decode parsing and the bench CLI arguments."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
from pathlib import Path

import cupy_attention as ca

from .. import dispatch
from ..problem import Problem


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

# Decode (--decode): issue 35's anchor shapes, GQA 32 query heads over 8 KV heads,
# D=128, bf16: (B, Sk, Sq), each on a contiguous cache and on paged ones (page sizes;
# 0 = contiguous). Paged caches run through attention_decode with shuffled page
# tables; their x-ratios are against torch on the contiguous cache of the same shape.
DECODE_SHAPES = ((1, 32768, 1), (8, 8192, 1), (64, 4096, 1), (128, 2048, 1), (8, 8192, 4))
DECODE_HEADS = (32, 8)
DECODE_HEAD_DIM = 128
DECODE_PAGES = (0, 16, 1)
# --decode-grid: B x Sk (and 128k at B = 1) x heads x D x Sq x page sizes; shapes whose
# K and V exceed DECODE_MAX_BYTES are left out (a note says so).
DECODE_GRID = dict(batch=(1, 8, 64, 256), seqlen_k=(1024, 8192, 32768),
                   heads=((32, 8), (32, 32)), head_dim=(64, 128, 256), seqlen_q=(1, 4, 16),
                   pages=(0, 1, 16, 64))
DECODE_MAX_BYTES = 8 << 30
# What the grid times unless --kernels / --torch-backends name more: the decode family
# beside torch's two fastest backends. H200, 2026-11-29: the grid's D = 64 third with
# every family (tiled, naive and flash included) took 317 s, its D = 128 and 256 thirds
# with these alone (--reps 20) 66 and 97 s.
DECODE_GRID_TIMED = ("decode", "torch:cudnn", "torch:flash")

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
    page: int = 0      # decode: the paged cache's page size, 0 = contiguous

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
        page = r.get("page", 0)
        return (f"decode {dt} B={r['batch']} Sk={r['seqlen_k']} Sq={r['seqlen_q']} "
                f"Hq={r['heads_q']}/Hkv={r['heads_kv']} D={r['head_dim']}"
                f"{f' page={page}' if page else ''}")
    prefix = "bwd " if r["kind"] == "bwd" else ""
    return (f"{prefix}{dt} D={r['head_dim']} S={r['seqlen_q']} B={r['batch']} H={r['heads_q']}"
            f"{' causal' if r['causal'] else ''}")


CASE_FIELDS = tuple(f.name for f in dataclasses.fields(Case))


def case_key(r: dict, *, page: bool = True) -> tuple:
    """The case a row belongs to (rows written before ``page`` existed are contiguous);
    ``page=False`` maps a paged decode case to the contiguous one of its shape."""
    return tuple((r.get(f, 0) if page else 0) if f == "page" else r[f] for f in CASE_FIELDS)


def grid_case(seqlen: int, head_dim: int, dtype: str, causal: bool) -> Case:
    """BENCHMARKS.md's shape for (S, D): B = 16384 // S, H = 2048 // D."""
    b, h = max(1, TOKENS // seqlen), max(1, HIDDEN // head_dim)
    return Case("fwd", b, h, h, seqlen, seqlen, head_dim, dtype, causal)


def decode_cases(grid: bool = False) -> list[Case]:
    """--decode's anchor cases, or (``grid``) issue 35's grid within DECODE_MAX_BYTES."""
    if not grid:
        hq, hkv = DECODE_HEADS
        return [Case("decode", b, hq, hkv, sq, sk, DECODE_HEAD_DIM, "bfloat16", False, page)
                for b, sk, sq in DECODE_SHAPES for page in DECODE_PAGES]
    g = DECODE_GRID
    shapes = [(b, sk) for b in g["batch"] for sk in g["seqlen_k"]] + [(1, 131072)]
    out = []
    for (b, sk), (hq, hkv), d, sq in itertools.product(shapes, g["heads"], g["head_dim"],
                                                       g["seqlen_q"]):
        for page in g["pages"]:
            c = Case("decode", b, hq, hkv, sq, sk, d, "bfloat16", False, page)
            if c.kv_bytes() <= DECODE_MAX_BYTES:
                out.append(c)
    return out


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
    if args.decode or args.decode_grid:
        cases.extend(decode_cases(grid=args.decode_grid))
        if args.decode_grid:
            notes.append(f"decode grid: shapes whose K and V exceed "
                         f"{DECODE_MAX_BYTES >> 30} GiB are left out")
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
                      help="add decode shapes (K/V TB/s): Hq=32, Hkv=8, D=128, bf16, B=1 "
                           "Sk=32k, B=8 Sk=8k, B=64 Sk=4k, B=128 Sk=2k (Sq=1), B=8 Sk=8k "
                           "Sq=4; contiguous caches and pages of 16 and 1")
    grid.add_argument("--decode-grid", action="store_true",
                      help="add the full decode grid: B 1,8,64,256 x Sk 1k,8k,32k (+128k at "
                           "B=1) x Hq/Hkv 32/8, 32/32 x D 64,128,256 x Sq 1,4,16 x "
                           "contiguous and pages of 1, 16, 64 (long); the decode kernel "
                           "beside torch's cudnn and flash unless --kernels/--torch-backends "
                           "name others")
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
    if args.no_grid and not (args.decode or args.decode_grid or args.overhead):
        p.error("--no-grid leaves nothing to run; add --decode, --decode-grid or --overhead")
