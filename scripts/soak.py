#!/usr/bin/env python3
"""Soak test: many mixed attention calls for a while, watching memory, caches,
errors and drift.

    python scripts/soak.py --minutes 3 --out $OUT/soak.json
    python scripts/soak.py --calls 10000 --minutes 30 --check-every 50 --out soak.json

Runs up to ``--calls`` calls (default 10,000) or for ``--minutes`` of wall clock,
whichever ends first: forward and backward, every family ``auto`` picks and a few
named ones, fp16/bf16/fp32, GQA, causal, windows, softcap, both layouts, CuPy arrays
and (when torch imports) torch tensors. A warm-up pass first makes every call
template once at every length it uses, so every kernel the run needs is compiled
before the watch starts; then calls are drawn at random (seeded), plus a "churn"
template whose key length changes every call (it fills the hot-call cache and the
tensor-map cache up to their bounds).

Every ``--check-every``-th call is compared with the float64 reference
(``cupy_attention.reference``). Every ``--sample-every`` calls it records CuPy's
memory pool (used, total bytes), ``cudaMemGetInfo`` (free, total), the host RSS
(/proc/self/status, else getrusage) and the sizes of the library's caches.

At the end it asserts, and exits 1 listing the violations otherwise:

- no call raised, and every checked result was within tolerance;
- no growth after the warm-up beyond the slack (``--pool-slack-mib``,
  ``--device-slack-mib``, ``--rss-slack-mib``): the memory pool's total, the
  device memory in use, the host RSS;
- every cache within its documented bound at every sample: hot calls
  (``api._HOT_LIMIT``), tensor-map encoders (``tma.tile_maps``, 64, each
  remembering at most ``TileMaps`` keep = 8 maps), flash_wgmma's causal query
  shifts (256), decode plans (4096); the compiled-kernel table (``jit._loaded``,
  one entry per instantiation, unbounded by design) does not grow after the
  warm-up;
- no drift: a fixed probe call (forward and deterministic backward) gives bitwise
  the same results at the start and at the end.

The JSON (``--out``) holds the arguments, the device, every sample, the cache sizes
and bounds, the errors (first 20), the probe digests and the verdict.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import resource
import sys
import time

import numpy as np

MiB = 1 << 20
TOL = {"float16": 1e-2, "bfloat16": 6e-2, "float32": 1e-4}   # x max(1, max|ref|)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10_000, help="most calls to make (10000)")
    ap.add_argument("--minutes", type=float, default=10.0,
                    help="wall-clock limit in minutes (10); the run ends at whichever comes first")
    ap.add_argument("--check-every", type=int, default=50,
                    help="compare every k-th call with the float64 reference (50)")
    ap.add_argument("--sample-every", type=int, default=100,
                    help="record memory and cache sizes every n calls (100)")
    ap.add_argument("--pool-slack-mib", type=float, default=256.0)
    ap.add_argument("--device-slack-mib", type=float, default=256.0)
    ap.add_argument("--rss-slack-mib", type=float, default=256.0)
    ap.add_argument("--max-errors", type=int, default=20, help="stop after this many errors")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-torch", action="store_true", help="CuPy arrays only")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--out", default=None, help="write the JSON record here")
    args = ap.parse_args(argv)
    for name in ("calls", "check_every", "sample_every", "max_errors"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.minutes <= 0:
        ap.error("--minutes must be positive")
    return args


def rss_bytes() -> int:
    """The host resident set size now (/proc/self/status), else the peak (getrusage)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


# ---------------------------------------------------------------------------
# The verdict (no GPU needed: tests/test_soak.py runs it with a fake runner)

def summarize(samples: list, warm_index: int, errors: list, checks_failed: list,
              probe_start: str, probe_end: str, bounds: dict, args) -> dict:
    """The violations of a finished run. ``samples``: dicts with pool_total, device_used,
    rss and one entry per cache of ``bounds`` (plus compiled_kernels); ``warm_index``:
    the first sample taken after the warm-up."""
    violations = []
    if errors:
        violations.append(f"{len(errors)} calls raised; first: {errors[0]['error']}")
    if checks_failed:
        violations.append(f"{len(checks_failed)} checked results out of tolerance; first: "
                          f"{checks_failed[0]}")
    if probe_start != probe_end:
        violations.append(f"drift: the probe call's results changed ({probe_start[:16]} at the "
                          f"start, {probe_end[:16]} at the end)")
    growth = {}
    if samples:
        warm = samples[min(warm_index, len(samples) - 1)]
        after = samples[min(warm_index, len(samples) - 1):]
        for key, slack in (("pool_total", args.pool_slack_mib), ("device_used",
                           args.device_slack_mib), ("rss", args.rss_slack_mib)):
            grew = max(s[key] for s in after) - warm[key]
            growth[key] = grew
            if grew > slack * MiB:
                violations.append(f"{key} grew by {grew / MiB:.1f} MiB after the warm-up "
                                  f"(slack {slack:g} MiB)")
        for key, bound in bounds.items():
            worst = max(s.get(key, 0) for s in samples)
            if worst > bound:
                violations.append(f"cache {key} reached {worst}, above its bound {bound}")
        grew = max(s["compiled_kernels"] for s in after) - warm["compiled_kernels"]
        growth["compiled_kernels"] = grew
        if grew > 0:
            violations.append(f"the compiled-kernel table grew by {grew} after the warm-up")
    return {"ok": not violations, "violations": violations, "growth_after_warmup": growth}


def soak(runner, args, *, clock=time.monotonic, progress=None) -> dict:
    """Drive ``runner`` (``warmup_calls()``, ``call(i, check)`` -> None or a failed-check
    message, ``probe()`` -> digest, ``sample()`` -> dict, ``bounds()`` -> dict,
    ``describe()`` -> dict) and return the JSON record."""
    t0 = clock()
    deadline = t0 + args.minutes * 60
    errors, checks_failed, samples = [], [], []
    probe_start = runner.probe()
    warm = list(runner.warmup_calls())
    total = args.calls
    done = 0

    def record_sample(i):
        s = dict(runner.sample())
        s.update(call=i, t=round(clock() - t0, 3))
        samples.append(s)

    def one(i, spec):
        nonlocal done
        try:
            failed = runner.call(i, (i % args.check_every) == 0, spec)
            if failed:
                checks_failed.append(failed)
        except Exception as exc:  # every error is recorded, the run goes on
            errors.append({"call": i, "error": f"{type(exc).__name__}: {exc}"[:500]})
        done += 1
        if progress is not None:
            progress(done, total)

    for i, spec in enumerate(warm):
        if done >= args.calls or clock() > deadline or len(errors) >= args.max_errors:
            break
        one(i, spec)
    record_sample(done)
    warm_index = 0
    i = done
    while done < args.calls and clock() < deadline and len(errors) < args.max_errors:
        one(i, None)
        i += 1
        if done % args.sample_every == 0:
            record_sample(done)
    record_sample(done)
    probe_end = runner.probe()
    bounds = runner.bounds()
    verdict = summarize(samples, warm_index, errors, checks_failed, probe_start, probe_end,
                        bounds, args)
    return {"args": vars(args), "device": runner.describe(), "calls": done,
            "warmup_calls": len(warm), "seconds": round(clock() - t0, 1),
            "probe": {"start": probe_start, "end": probe_end}, "bounds": bounds,
            "errors": errors[:20], "checks_failed": checks_failed[:20],
            "samples": samples, **verdict}


# ---------------------------------------------------------------------------
# The real runner

@dataclasses.dataclass(frozen=True)
class Template:
    name: str
    lib: str                   # "cupy" or "torch"
    family: str                # "auto" or a family name
    dtype: str
    B: int
    Hq: int
    Hkv: int
    seqs: tuple                # (Sq, Sk) pairs
    D: int
    causal: bool = False
    window: tuple | None = None
    softcap: float | None = None
    layout: str = "bhsd"
    backward: bool = False
    deterministic: bool = False
    churn: bool = False        # Sk drawn anew every call (after the warm-up)


def templates(torch_ok: bool) -> list:
    t = [
        Template("fwd-auto-bf16-causal", "cupy", "auto", "bfloat16", 2, 8, 2,
                 ((512, 512), (300, 700)), 128, causal=True),
        Template("fwd-auto-fp16-d64", "cupy", "auto", "float16", 4, 4, 4, ((256, 256), (77, 130)), 64),
        Template("fwd-window-softcap", "cupy", "auto", "bfloat16", 1, 8, 4, ((400, 400),), 128,
                 window=(64, 0), softcap=30.0, causal=True),
        Template("fwd-bshd", "cupy", "auto", "float16", 2, 6, 2, ((200, 333),), 96, layout="bshd"),
        Template("fwd-fp32-flash", "cupy", "flash", "float32", 1, 4, 2, ((150, 150),), 64, causal=True),
        Template("fwd-flash-mma", "cupy", "flash_mma", "bfloat16", 2, 4, 1, ((129, 257),), 80),
        Template("decode", "cupy", "auto", "bfloat16", 4, 16, 4, ((1, 1000), (4, 2048)), 128,
                 causal=True),
        Template("bwd-auto", "cupy", "auto", "bfloat16", 2, 4, 2, ((256, 256),), 128, causal=True,
                 backward=True),
        Template("bwd-deterministic", "cupy", "auto", "float16", 1, 4, 4, ((300, 200),), 64,
                 backward=True, deterministic=True),
        Template("bwd-flash-fp32", "cupy", "flash", "float32", 1, 2, 2, ((100, 100),), 64,
                 backward=True),
        Template("churn", "cupy", "auto", "float16", 1, 4, 2, ((64, 64),), 64, churn=True),
    ]
    if torch_ok:
        t += [
            Template("torch-fwd", "torch", "auto", "bfloat16", 2, 8, 2, ((256, 256),), 128,
                     causal=True),
            Template("torch-bwd", "torch", "auto", "float16", 1, 4, 2, ((200, 200),), 64,
                     backward=True),
        ]
    return t


class GpuRunner:
    def __init__(self, args):
        import cupy

        import cupy_attention as ca

        self.cupy, self.ca, self.args = cupy, ca, args
        self.torch = None
        if not args.no_torch:
            try:
                import torch

                if torch.cuda.is_available():
                    self.torch = torch
            except ImportError:
                pass
        self.templates = templates(self.torch is not None)
        self.rng = np.random.default_rng(args.seed)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.pool = cupy.get_default_memory_pool()

    # inputs -------------------------------------------------------------
    def _randn(self, shape, dtype, seed):
        cupy = self.cupy
        x = cupy.random.default_rng(seed).standard_normal(shape, dtype=cupy.float32)
        if dtype == "bfloat16":
            import ml_dtypes

            bits = ((x.view(cupy.uint32) + cupy.uint32(0x8000)) >> 16).astype(cupy.uint16)
            return bits.view(np.dtype(ml_dtypes.bfloat16))
        return x.astype(dtype)

    def _inputs(self, t: Template, sq, sk, seed):
        def shape(h, s):
            return (t.B, h, s, t.D) if t.layout == "bhsd" else (t.B, s, h, t.D)
        arrays = [self._randn(shape(t.Hq, sq), t.dtype, seed), self._randn(shape(t.Hkv, sk), t.dtype,
                  seed + 1), self._randn(shape(t.Hkv, sk), t.dtype, seed + 2),
                  self._randn(shape(t.Hq, sq), t.dtype, seed + 3)]
        if t.lib == "torch":
            arrays = [self.torch.from_dlpack(a.view(self.cupy.uint16) if t.dtype == "bfloat16" else a)
                      for a in arrays]
            if t.dtype == "bfloat16":
                arrays = [a.view(self.torch.bfloat16) for a in arrays]
        return arrays

    # the runner interface -------------------------------------------------
    def warmup_calls(self):
        for t in self.templates:
            for sq, sk in t.seqs:
                yield (t, sq, sk)

    def _draw(self):
        t = self.templates[int(self.rng.integers(len(self.templates)))]
        sq, sk = t.seqs[int(self.rng.integers(len(t.seqs)))]
        if t.churn:
            sk = int(self.rng.integers(1, 2049))
        return t, sq, sk

    def call(self, i, check, spec=None):
        t, sq, sk = spec or self._draw()
        ca = self.ca
        opts = dict(causal=t.causal, window=t.window, softcap=t.softcap, layout=t.layout)
        ctx = self.stream if t.lib == "cupy" else _nullcontext()
        with ctx:
            q, k, v, dout = self._inputs(t, sq, sk, seed=self.args.seed * 100_003 + i * 5)
            out, lse = ca.attention(q, k, v, return_lse=True, kernel=t.family, **opts)
            grads = None
            if t.backward:
                grads = ca.attention_backward(dout, q, k, v, out, lse, kernel=t.family,
                                              deterministic=t.deterministic, **opts)
            if not check:
                return None
            from cupy_attention.arrays import host64
            from cupy_attention.reference import (attention_backward_reference,
                                                  attention_reference)

            hq, hk, hv, hd = (host64(x) for x in (q, k, v, dout))
            ref, _ = attention_reference(hq, hk, hv, **opts)
            pairs = [("out", host64(out), ref)]
            if grads is not None:
                refs = attention_backward_reference(hd, hq, hk, hv, **opts)
                pairs += [(n, host64(g), r) for n, g, r in zip(("dq", "dk", "dv"), grads, refs)]
            for name, got, want in pairs:
                factor = 1.0 if name == "out" else 3.0
                tol = factor * TOL[t.dtype] * max(1.0, float(np.abs(want).max()))
                err = float(np.abs(got - want).max()) if want.size else 0.0
                if not np.isfinite(got).all() or err > tol:
                    return (f"call {i} ({t.name}, Sq={sq}, Sk={sk}) {name}: max err {err:.3e} > "
                            f"{tol:.3e}")
        return None

    def probe(self) -> str:
        cupy, ca = self.cupy, self.ca
        with self.stream:
            rng = cupy.random.default_rng(12345)
            q, k, v, dout = (rng.standard_normal((2, 8, 333, 128), dtype=cupy.float32)
                             .astype(cupy.float16) for _ in range(4))
            k, v = k[:, :2].copy(), v[:, :2].copy()
            out, lse = ca.attention(q, k, v, causal=True, return_lse=True)
            grads = ca.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
            h = hashlib.sha256()
            for x in (out, lse, *grads):
                h.update(x.get().tobytes())
            self.stream.synchronize()
        return h.hexdigest()

    def sample(self) -> dict:
        from cupy_attention import api, jit, tma
        from cupy_attention.families import decode, flash_wgmma

        self.cupy.cuda.runtime.deviceSynchronize()
        free, total = self.cupy.cuda.runtime.memGetInfo()
        return {
            "pool_used": self.pool.used_bytes(), "pool_total": self.pool.total_bytes(),
            "device_free": free, "device_total": total, "device_used": total - free,
            "rss": rss_bytes(),
            "hot_calls": len(api._HOT),
            "tensor_map_encoders": tma.tile_maps.cache_info().currsize,
            "query_shifts": flash_wgmma.query_shift.cache_info().currsize,
            "decode_plans": decode.plan.cache_info().currsize,
            "compiled_kernels": len(jit._loaded),
        }

    def bounds(self) -> dict:
        from cupy_attention import api, tma
        from cupy_attention.families import decode, flash_wgmma

        return {"hot_calls": api._HOT_LIMIT,
                "tensor_map_encoders": tma.tile_maps.cache_info().maxsize,
                "query_shifts": flash_wgmma.query_shift.cache_info().maxsize,
                "decode_plans": decode.plan.cache_info().maxsize}

    def describe(self) -> dict:
        from cupy_attention import device

        dev = self.cupy.cuda.runtime.getDevice()
        return {"name": device.device_name(dev), "arch": device.device_arch(dev),
                "cupy": self.cupy.__version__, "python": platform.python_version(),
                "torch": None if self.torch is None else self.torch.__version__,
                "templates": [t.name for t in self.templates]}


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv=None, runner_factory=GpuRunner) -> int:
    args = parse_args(argv)
    runner = runner_factory(args)
    if args.no_progress:
        record = soak(runner, args)
    else:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        with Progress(TextColumn("soak"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn()) as bar:
            task = bar.add_task("soak", total=args.calls)
            record = soak(runner, args,
                          progress=lambda done, total: bar.update(task, completed=done,
                                                                  total=total))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(record, fh, indent=1, default=str)
    last = record["samples"][-1] if record["samples"] else {}
    print(f"soak: {record['calls']} calls in {record['seconds']} s, "
          f"{len(record['errors'])} errors; pool {last.get('pool_total', 0) / MiB:.0f} MiB, "
          f"RSS {last.get('rss', 0) / MiB:.0f} MiB, hot calls {last.get('hot_calls')}, "
          f"compiled kernels {last.get('compiled_kernels')}")
    if record["ok"]:
        print("soak: PASS")
        return 0
    for v in record["violations"]:
        print(f"soak: VIOLATION: {v}")
    return 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    sys.exit(main())
