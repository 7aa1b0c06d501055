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

# Every name the one-module bench.py had stays importable from cupy_attention.bench
# (cli, tune, profile, scripts and tests use them); each lives in the module of its concern:
# cases (grid, arguments), system (environment), timing (events, memory), peers (torch SDPA),
# overhead (host overhead, cold compile), runner (one case), report (ratios, JSON),
# render (tables), plots (PNG), harness (the command).
from .cases import (
    SCHEMA,
    TOKENS,
    HIDDEN,
    SEQLENS,
    HEAD_DIMS,
    DTYPES,
    QUICK_SEQLENS,
    QUICK_HEAD_DIMS,
    QUICK_DTYPES,
    QUICK_FP32,
    QUICK_REPS,
    QUICK_QUADRATIC_MAX,
    DECODE_SHAPES,
    DECODE_HEADS,
    DECODE_HEAD_DIM,
    DECODE_PAGES,
    DECODE_GRID,
    DECODE_MAX_BYTES,
    DECODE_GRID_TIMED,
    TORCH_BACKENDS,
    ANCHORS,
    QUADRATIC_MAX,
    MIN_REPS,
    DEFAULT_REPS,
    ROUNDS,
    ERR_ROWS,
    MAX_INPUT_SETS,
    SPIN_MAX_S,
    BWD_FACTOR,
    OVERHEAD_CALLS,
    OVERHEAD_WARMUP,
    DTYPE_ALIASES,
    SHORT,
    ITEMSIZE,
    Case,
    case_label,
    CASE_FIELDS,
    case_key,
    grid_case,
    decode_cases,
    make_row,
    backward_available,
    build_cases,
    int_list,
    dtype_list,
    _shape,
    name_list,
    add_arguments,
    finish_arguments,
)
from .system import (
    _version,
    _nvidia_smi_driver,
    system_info,
    _git_commit,
    environment,
)
from .timing import (
    _SPIN_SOURCE,
    BenchError,
    Unsupported,
    recording_specs,
    cupy_randn,
    nbytes,
    _pool_peak_hook,
    first_line,
    _finite,
    Timing,
)
from .peers import (
    TorchPeers,
)
from .runner import (
    Runner,
)
from .overhead import (
    OverheadProbe,
    OVERHEAD_CASE,
    _probe,
    cold_compile,
    cold_probe,
)
from .report import (
    add_ratios,
    training_steps,
    case_line,
    write_json,
    load_report,
)
from .render import (
    format_number,
    _ratio,
    _mib,
    _err,
    _COMMON_TAIL,
    _RATIOS,
    _EXTRAS,
    COLUMNS,
    TITLES,
    _group_key,
    render_header,
    render_results,
    render_steps,
    render_overhead,
    render_report,
)
from .plots import (
    write_plots,
    plot_or_say,
)
from .harness import (
    import_torch,
    run,
)

__all__ = [
    "SCHEMA",
    "TOKENS",
    "HIDDEN",
    "SEQLENS",
    "HEAD_DIMS",
    "DTYPES",
    "QUICK_SEQLENS",
    "QUICK_HEAD_DIMS",
    "QUICK_DTYPES",
    "QUICK_FP32",
    "QUICK_REPS",
    "QUICK_QUADRATIC_MAX",
    "DECODE_SHAPES",
    "DECODE_HEADS",
    "DECODE_HEAD_DIM",
    "DECODE_PAGES",
    "DECODE_GRID",
    "DECODE_MAX_BYTES",
    "DECODE_GRID_TIMED",
    "TORCH_BACKENDS",
    "ANCHORS",
    "QUADRATIC_MAX",
    "MIN_REPS",
    "DEFAULT_REPS",
    "ROUNDS",
    "ERR_ROWS",
    "MAX_INPUT_SETS",
    "SPIN_MAX_S",
    "BWD_FACTOR",
    "OVERHEAD_CALLS",
    "OVERHEAD_WARMUP",
    "DTYPE_ALIASES",
    "SHORT",
    "ITEMSIZE",
    "Case",
    "case_label",
    "CASE_FIELDS",
    "case_key",
    "grid_case",
    "decode_cases",
    "make_row",
    "backward_available",
    "build_cases",
    "int_list",
    "dtype_list",
    "_shape",
    "name_list",
    "add_arguments",
    "finish_arguments",
    "_version",
    "_nvidia_smi_driver",
    "system_info",
    "_git_commit",
    "environment",
    "_SPIN_SOURCE",
    "BenchError",
    "Unsupported",
    "recording_specs",
    "cupy_randn",
    "nbytes",
    "_pool_peak_hook",
    "first_line",
    "_finite",
    "Timing",
    "TorchPeers",
    "Runner",
    "OverheadProbe",
    "OVERHEAD_CASE",
    "_probe",
    "cold_compile",
    "cold_probe",
    "add_ratios",
    "training_steps",
    "case_line",
    "write_json",
    "load_report",
    "format_number",
    "_ratio",
    "_mib",
    "_err",
    "_COMMON_TAIL",
    "_RATIOS",
    "_EXTRAS",
    "COLUMNS",
    "TITLES",
    "_group_key",
    "render_header",
    "render_results",
    "render_steps",
    "render_overhead",
    "render_report",
    "write_plots",
    "plot_or_say",
    "import_torch",
    "run",
]
