"""Host overhead per call on a tiny problem, and cold compile in fresh processes."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cupy_attention as ca

from .. import device, dispatch, jit
from .cases import Case, OVERHEAD_CALLS, OVERHEAD_WARMUP, SPIN_MAX_S, case_label
from .timing import first_line, cupy_randn, recording_specs


class OverheadProbe:
    """The overhead section of :class:`Runner` (host time per hot call beside GPU time)."""

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
