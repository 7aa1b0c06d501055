"""Start-up and host-overhead benchmark (issue #26 items 6 and 7b), on one GPU.

    python scripts/startup_bench.py --out startup.json [--runs 10] [--calls 10000]
                                    [--kinds cupy,torch] [--profile]

1. Cold: one process in an empty cache directory (``CUPY_ATTENTION_CACHE_DIR`` is
   a fresh temporary directory unless ``--cache-dir`` is given) times
   ``import cupy_attention`` + the first ``attention(q, k, v)``: NVRTC compiles.
2. Warm start: ``--runs`` fresh processes (``python -c ...``) with that cache. Each
   imports CuPy (and torch), makes its arrays and synchronizes first: what the
   caller pays for anyway. Then it times ``import cupy_attention`` and the first
   call up to a synchronize; the target is 50 ms for the two. The modules of
   cupy_attention loaded by then and whether rich/torch/jax came with the import
   are recorded too.
3. Hot call: in one more process, ``--calls`` back-to-back calls with the same
   signature, no synchronize between them, ``time.perf_counter`` around the loop
   divided by the count (host time per call; the problem is tiny so the GPU keeps
   up and the launch queue never fills), for ``attention`` and for
   ``attention_varlen`` with ``check=False`` (the fast path) and ``check=True``
   (a device-to-host copy of cu_seqlens, which waits for the stream, per call).

Bytecode: an installed package has its ``.pyc`` files; a checkout run with
``PYTHONDONTWRITEBYTECODE=1`` recompiles every module of the package in every
process (about 40 ms for cupy_attention on a slow CPU). The children therefore run
without that variable (the warm-up process writes ``__pycache__``, which git ignores)
unless ``--no-bytecode`` keeps it, to measure that case.

``--profile`` adds a cProfile of one warm start (top functions by cumulative
time) to the JSON. Prints a table; writes everything to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
kind, mode, calls, profile = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
import cupy
if kind == "torch":
    import torch
    dev = torch.device("cuda")
    mk = lambda shape: torch.randn(*shape, device=dev, dtype=torch.float16)
    cu = lambda lens: torch.tensor(lens, device=dev, dtype=torch.int32)
    sync = torch.cuda.synchronize
else:
    mk = lambda shape: cupy.random.standard_normal(shape, dtype=cupy.float32).astype(cupy.float16)
    cu = lambda lens: cupy.asarray(lens, dtype=cupy.int32)
    sync = cupy.cuda.Device().synchronize
shape = (1, 16, 1024, 128) if mode != "hot" else (1, 1, 64, 64)
q, k, v = mk(shape), mk(shape), mk(shape)
sync()
res = {"kind": kind, "mode": mode}
before = set(sys.modules)
prof = None
if profile:
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
t0 = time.perf_counter()
import cupy_attention as ca
t1 = time.perf_counter()
out = ca.attention(q, k, v, causal=True)
sync()
t2 = time.perf_counter()
if prof is not None:
    prof.disable()
    import io, pstats
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(40)
    res["profile"] = s.getvalue()
res.update(import_ms=1e3 * (t1 - t0), first_call_ms=1e3 * (t2 - t1), total_ms=1e3 * (t2 - t0),
           modules=sorted(m for m in sys.modules if m.startswith("cupy_attention")),
           heavy=[m for m in ("rich", "torch", "jax", "matplotlib", "ml_dtypes")
                  if m in sys.modules and m not in before])
if mode == "hot":
    def per_call(fn, n):
        fn(); fn(); sync()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t
        sync()
        return 1e6 * t / n
    res["hot_us"] = per_call(lambda: ca.attention(q, k, v, causal=True), calls)
    # packed: 4 sequences of 16 tokens, 1 head, D = 64 (tiny: host-bound)
    lens = [0, 16, 32, 48, 64]
    qv, kv, vv = mk((64, 1, 64)), mk((64, 1, 64)), mk((64, 1, 64))
    cq = cu(lens)
    try:
        ca.attention_varlen(qv, kv, vv, cq, cq, causal=True)
        res["varlen_hot_us_check_false"] = per_call(
            lambda: ca.attention_varlen(qv, kv, vv, cq, cq, causal=True, check=False), calls)
        res["varlen_hot_us_check_true"] = per_call(
            lambda: ca.attention_varlen(qv, kv, vv, cq, cq, causal=True), max(calls // 10, 100))
    except Exception as exc:   # no tensor-core varlen kernel on this GPU
        res["varlen_error"] = f"{type(exc).__name__}: {exc}"
print("RESULT " + json.dumps(res))
"""


def child(kind: str, mode: str, calls: int, env: dict, profile: bool = False) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, kind, mode, str(calls),
                           "1" if profile else "0"],
                          env=env, capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"child {kind}/{mode} failed (rc {proc.returncode}):\n"
                       f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--runs", type=int, default=10, help="warm-start processes per array kind")
    ap.add_argument("--calls", type=int, default=10000, help="calls in the hot loop")
    ap.add_argument("--kinds", default=None,
                    help="comma-separated: cupy,torch (default: cupy, and torch if importable)")
    ap.add_argument("--cache-dir", default=None, help="kernel cache (default: a fresh temp dir)")
    ap.add_argument("--profile", action="store_true", help="cProfile one warm start")
    ap.add_argument("--no-bytecode", action="store_true",
                    help="keep PYTHONDONTWRITEBYTECODE from the environment (no .pyc caching)")
    args = ap.parse_args()

    if args.kinds:
        kinds = args.kinds.split(",")
    else:
        import importlib.util

        kinds = ["cupy"] + (["torch"] if importlib.util.find_spec("torch") else [])
    cache = args.cache_dir or tempfile.mkdtemp(prefix="ca-startup-")
    env = dict(os.environ, CUPY_ATTENTION_CACHE_DIR=cache)
    env.pop("CUPY_ATTENTION_NO_CACHE", None)
    if not args.no_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)

    report = {"python": sys.version.split()[0], "cache_dir": cache, "runs": args.runs,
              "bytecode_cached": "PYTHONDONTWRITEBYTECODE" not in env,
              "calls": args.calls, "kinds": {}}
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        report["device"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    except Exception as exc:
        report["device"] = f"unknown ({exc})"

    rows = []
    for kind in kinds:
        cold = child(kind, "warm", 0, env)                      # populates the cache
        hot = child(kind, "hot", args.calls, env)               # tiny shape: compiles it
        hot = child(kind, "hot", args.calls, env)               # measured with a warm cache
        warm = [child(kind, "warm", 0, env) for _ in range(args.runs)]
        entry = {
            "cold": {k: cold[k] for k in ("import_ms", "first_call_ms", "total_ms")},
            "warm": [{k: w[k] for k in ("import_ms", "first_call_ms", "total_ms")} for w in warm],
            "warm_median": {k: statistics.median(w[k] for w in warm)
                            for k in ("import_ms", "first_call_ms", "total_ms")},
            "modules_after_first_call": warm[0]["modules"],
            "heavy_modules_loaded_by_us": warm[0]["heavy"],
            "hot": {k: v for k, v in hot.items() if k.startswith(("hot_", "varlen_"))},
        }
        if args.profile:
            entry["profile"] = child(kind, "warm", 0, env, profile=True)["profile"]
        report["kinds"][kind] = entry
        m = entry["warm_median"]
        rows.append((kind, cold["total_ms"], m["import_ms"], m["first_call_ms"], m["total_ms"],
                     entry["hot"].get("hot_us"), entry["hot"].get("varlen_hot_us_check_false"),
                     entry["hot"].get("varlen_hot_us_check_true")))

    fmt = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    print(f"device: {report['device']}   cache: {cache}   warm runs: {args.runs}   "
          f".pyc cached: {report['bytecode_cached']}")
    print(f"{'kind':6} {'cold ms':>8} {'import ms':>10} {'1st call ms':>12} {'warm total':>11} "
          f"{'hot us':>7} {'varlen us':>10} {'varlen chk':>11}")
    for r in rows:
        print(f"{r[0]:6} {fmt(r[1]):>8} {fmt(r[2]):>10} {fmt(r[3]):>12} {fmt(r[4]):>11} "
              f"{fmt(r[5]):>7} {fmt(r[6]):>10} {fmt(r[7]):>11}")
    for kind, entry in report["kinds"].items():
        if entry["heavy_modules_loaded_by_us"]:
            print(f"{kind}: heavy modules loaded by cupy_attention: "
                  f"{entry['heavy_modules_loaded_by_us']}")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
