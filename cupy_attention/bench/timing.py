"""Timing on the GPU: input sets, CUDA events behind a spin kernel, extra memory."""

from __future__ import annotations

import contextlib
import math
import statistics
import time

import numpy as np

from .. import device, jit
from ..interop import external_stream, is_torch
from .cases import (BWD_FACTOR, ERR_ROWS, Case, ITEMSIZE, MAX_INPUT_SETS, ROUNDS, SPIN_MAX_S,
                    TORCH_BACKENDS)


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




class Timing:
    """The measuring half of :class:`Runner`: device, streams, inputs, events, memory."""

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
        self.decode_grid = bool(getattr(args, "decode_grid", False))
        props = self.cupy.cuda.runtime.getDeviceProperties(self.device_id)
        self.l2_bytes = int(props["l2CacheSize"])
        if torch_mod:
            torch_mod.manual_seed(0)
            ptr = torch_mod.cuda.current_stream(self.device_id).cuda_stream
            self.stream = external_stream(ptr, self.device_id)
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
