"""Same-run A/B timing of two checkouts of this package (a refactor must not slow anything).

    python scripts/ab_bench.py --trees OLD_DIR NEW_DIR --rounds 2 --json out.json [--quick]

Each round runs the grid once per tree, each tree in its own process (two copies of
one package cannot share a process), alternating old, new, old, new, so drift of the
machine hits both alike; the spread of a tree against itself over the rounds is the
noise floor. The grid: the FlashAttention papers' shape (B*S = 16k, H*D = 2048),
forward and backward, bf16 and fp16, D in {64, 128, 256, 72, 80, 96, 160}, S in
{1k, 4k, 16k} (--quick: bf16 forward D in {64, 128, 256, 80, 160}), causal both,
plus decode-like shapes (Sq = 1 against 8k keys). Timing: CUDA events around 20
back-to-back calls after warm-up, median of 5 such batches, in TFLOPs (true D).
Prints the new/old ratio per cell, the median ratio and the old-vs-old spread last.
--dims, --seqs and --causal keep only the cells that match.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import statistics


def grid(quick: bool, seqs=(), extra_dims=()):
    """The cells: S = 1k, 4k, 16k, and any other length of ``seqs`` (B * S = 16k); head
    dims of ``extra_dims`` outside the grid are added, forward and backward."""
    cells = []
    dtypes = ("bfloat16",) if quick else ("bfloat16", "float16")
    dims = (64, 128, 256, 80, 160) if quick else (64, 128, 256, 72, 80, 96, 160)
    extra = tuple(sorted(set(extra_dims) - set(dims)))
    for dtype in dtypes:
        for d in dims + extra:
            for s in sorted({1024, 4096, 16384} | set(seqs)):
                for causal in (False, True):
                    cells.append(dict(dir="fwd", dtype=dtype, d=d, sq=s, sk=s, causal=causal,
                                      b=16384 // s, h=2048 // d))
                    if ((not quick and d in (64, 128, 256, 80, 96, 160) or d in extra)
                            and dtype == "bfloat16"):
                        cells.append(dict(dir="bwd", dtype=dtype, d=d, sq=s, sk=s, causal=causal,
                                          b=16384 // s, h=2048 // d))
    for d in (64, 128):
        for causal in (False, True):
            cells.append(dict(dir="fwd", dtype="bfloat16", d=d, sq=1, sk=8192, causal=causal,
                              b=8, h=32))
    return cells


def _drop(p: float) -> dict:
    """The dropout arguments of every call: p with a fixed stream; none where p is 0."""
    return dict(dropout_p=p, dropout_seed=1234, dropout_offset=0) if p else {}


def run_tree(cells, reps: int, batches: int, kernel: str = "auto", deterministic: bool = False,
             dropout_p: float = 0.0):
    """Runs in the child: time every cell with this tree's package."""
    import cupy
    import ml_dtypes

    import cupy_attention as ca

    out = []
    for c in cells:
        rng = cupy.random.default_rng(0)
        dt = getattr(cupy, c["dtype"]) if c["dtype"] != "bfloat16" else None
        def mk(shape):
            x = rng.standard_normal(shape, dtype=cupy.float32)
            if c["dtype"] == "bfloat16":
                return x.astype(ml_dtypes.bfloat16)
            return x.astype(dt)
        q = mk((c["b"], c["h"], c["sq"], c["d"]))
        k = mk((c["b"], c["h"], c["sk"], c["d"]))
        v = mk((c["b"], c["h"], c["sk"], c["d"]))
        flops = 4.0 * c["b"] * c["h"] * c["sq"] * c["sk"] * c["d"]
        if c["causal"] and c["sq"] == c["sk"]:
            flops /= 2
        drop = _drop(dropout_p)
        if c["dir"] == "fwd":
            fn = lambda: ca.attention(q, k, v, causal=c["causal"], kernel=kernel, **drop)  # noqa: E731
        else:
            o, lse = ca.attention(q, k, v, causal=c["causal"], return_lse=True, kernel=kernel,
                                  **drop)
            do = mk(o.shape)
            flops *= 2.5
            fn = lambda: ca.attention_backward(do, q, k, v, o, lse, causal=c["causal"],  # noqa: E731
                                               kernel=kernel, deterministic=deterministic, **drop)
        try:
            for _ in range(3):
                fn()
            cupy.cuda.get_current_stream().synchronize()
            times = []
            for _ in range(batches):
                e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
                e0.record()
                for _ in range(reps):
                    fn()
                e1.record()
                e1.synchronize()
                times.append(cupy.cuda.get_elapsed_time(e0, e1) / reps)
            ms = statistics.median(times)
            out.append(dict(c, ms=ms, tflops=flops / ms / 1e9))
        except Exception as exc:  # a cell a tree cannot run is reported, not fatal
            out.append(dict(c, error=f"{type(exc).__name__}: {exc}"[:200]))
        q = k = v = None  # the cell's arrays go before the next cell allocates
        cupy.get_default_memory_pool().free_all_blocks()
    return out


def _warm_one(c, kernel="auto", deterministic=False, dropout_p=0.0):
    """Compile (into the disk cache) the kernels of one cell, on a tiny problem."""
    import cupy
    import cupy_attention as ca

    small = dict(c, sq=min(c["sq"], 256), sk=min(c["sk"], 256), b=1, h=2)
    x = cupy.random.default_rng(0).standard_normal((1, 2, small["sq"], c["d"]), dtype=cupy.float32)
    q = x.astype("bfloat16" if c["dtype"] == "bfloat16" else c["dtype"])
    k = cupy.random.default_rng(1).standard_normal((1, 2, small["sk"], c["d"]), dtype=cupy.float32).astype(q.dtype)
    drop = _drop(dropout_p)
    o, lse = ca.attention(q, k, k, causal=c["causal"], return_lse=True, kernel=kernel, **drop)
    if c["dir"] == "bwd":
        ca.attention_backward(o, q, k, k, o, lse, causal=c["causal"], kernel=kernel,
                              deterministic=deterministic, **drop)
    cupy.cuda.get_current_stream().synchronize()
    return True


def prewarm(cells, workers: int = 12, kernel: str = "auto", deterministic: bool = False,
            dropout_p: float = 0.0):
    """Every kernel the grid needs, compiled in parallel before any timing."""
    import concurrent.futures as cf
    import multiprocessing

    uniq = list({(c["dir"], c["dtype"], c["d"], c["causal"], c["sq"] == 1): c for c in cells}.values())
    with cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_warm_one, uniq, [kernel] * len(uniq), [deterministic] * len(uniq),
                      [dropout_p] * len(uniq)))


def key(c):
    return (c["dir"], c["dtype"], c["d"], c["sq"], c["sk"], c["causal"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs=2, metavar=("OLD", "NEW"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--env-new", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable for the NEW tree's processes only")
    ap.add_argument("--only", choices=("fwd", "bwd"), help="one direction only")
    ap.add_argument("--dims", help="comma-separated head dims: only these cells (head dims "
                    "outside the grid are added, with H = 2048 // D)")
    ap.add_argument("--seqs", help="comma-separated sequence lengths: only these cells "
                    "(lengths other than 1k, 4k, 16k are added, B * S = 16k)")
    ap.add_argument("--causal", choices=("0", "1"), help="only causal (1) or non-causal (0) cells")
    ap.add_argument("--kernel", default="auto",
                    help="the kernel argument of every call (flash_mma: the sm_80 path)")
    ap.add_argument("--deterministic", action="store_true",
                    help="backward cells in deterministic mode")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="dropout_p of every call (fixed seed), both directions")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    dims = {int(x) for x in a.dims.split(",")} if a.dims else None
    seqs = {int(x) for x in a.seqs.split(",")} if a.seqs else None
    cells = [c for c in grid(a.quick, seqs or (), dims or ()) if (not a.only or c["dir"] == a.only)
             and (dims is None or c["d"] in dims) and (seqs is None or c["sq"] in seqs)
             and (a.causal is None or c["causal"] == (a.causal == "1"))]
    # What every child process is told: the timing, the kernel and the cell filters.
    child_flags = ([f"--{k}={v}" for k, v in (("dims", a.dims), ("seqs", a.seqs),
                                              ("causal", a.causal), ("only", a.only))
                    if v is not None]
                   + ["--reps", str(a.reps), "--batches", str(a.batches), "--kernel", a.kernel]
                   + ["--quick"] * a.quick + ["--deterministic"] * a.deterministic
                   + ["--dropout", str(a.dropout)])
    if a.child:
        prewarm(cells, kernel=a.kernel, deterministic=a.deterministic, dropout_p=a.dropout)
        json.dump(run_tree(cells, a.reps, a.batches, a.kernel, a.deterministic, a.dropout),
                  open(a.child, "w"))
        return 0
    results = {0: [], 1: []}
    for rnd in range(a.rounds):
        for side, tree in enumerate(a.trees):
            path = f"/tmp/ab_{side}_{rnd}.json"
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree),
                       CUPY_ATTENTION_CACHE_DIR=f"/tmp/ab-cache-{side}")
            if side == 1:
                env.update(kv.split("=", 1) for kv in a.env_new)
            args = [sys.executable, os.path.abspath(__file__), "--child", path] + child_flags
            subprocess.run(args, env=env, check=True, cwd="/tmp")
            results[side].append({key(r): r for r in json.load(open(path))})
            print(f"round {rnd} tree {side} done", flush=True)
    rows, ratios, spreads = [], [], []
    for c in cells:
        k = key(c)
        old = [r[k].get("tflops") for r in results[0]]
        new = [r[k].get("tflops") for r in results[1]]
        if None in old or None in new:
            rows.append(dict(c, error=[r[k].get("error") for r in results[0] + results[1]]))
            continue
        ratio = statistics.median(new) / statistics.median(old)
        spread = max(old) / min(old) - 1 if len(old) > 1 else 0.0
        ratios.append(ratio)
        spreads.append(spread)
        rows.append(dict(c, old=old, new=new, ratio=ratio, old_spread=spread))
    summary = dict(cells=len(rows), median_ratio=statistics.median(ratios) if ratios else None,
                   min_ratio=min(ratios) if ratios else None, max_ratio=max(ratios) if ratios else None,
                   median_old_spread=statistics.median(spreads) if spreads else None,
                   max_old_spread=max(spreads) if spreads else None)
    if a.json:
        json.dump(dict(trees=a.trees, kernel=a.kernel, deterministic=a.deterministic,
                       dropout_p=a.dropout,
                       summary=summary, rows=rows), open(a.json, "w"), indent=1)
    print(f"{'dir':4s} {'dtype':9s} {'D':>4s} {'Sq':>6s} {'Sk':>6s} {'causal':6s} {'old TF':>8s} {'new TF':>8s} {'new/old':>8s}")
    for r in rows:
        if "error" in r:
            print(f"{r['dir']:4s} {r['dtype']:9s} {r['d']:4d} {r['sq']:6d} {r['sk']:6d} {str(r['causal']):6s} ERROR {r['error']}")
            continue
        print(f"{r['dir']:4s} {r['dtype']:9s} {r['d']:4d} {r['sq']:6d} {r['sk']:6d} {str(r['causal']):6s} "
              f"{statistics.median(r['old']):8.1f} {statistics.median(r['new']):8.1f} {r['ratio']:8.3f}")
    print("SUMMARY", json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
