#!/usr/bin/env python3
"""What one Hopper SM's tensor cores, MUFU and FMA pipe sustain, alone and side by side.

The kernels (pipes.cu) use flash_wgmma's building blocks and its D = 80 shapes; the
rates are per SM per clock (clock64 spans, one block per SM, averaged over the SMs).
`h200-wgmma-small-d-limits.md` explains what they say about small head dims.

    python benchmarks/micro/pipes.py                 # needs an sm_90 GPU
    python benchmarks/micro/pipes.py --json pipes.json
    python benchmarks/micro/pipes.py --compile-only  # NVRTC only, no GPU (used by the tests)
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cupy_attention import jit  # noqa: E402

SOURCE = Path(__file__).with_name("pipes.cu")
SMS_FALLBACK = 132
SIDE_OPS = {0: "ex2 (f32)", 1: "FFMA", 2: "softmax per score (FFMA, ex2, FADD)", 3: "ex2.f16x2",
            4: "ex2.bf16x2"}
SIDE_PER_ITER = {0: 1, 1: 1, 2: 1, 3: 2, 4: 2}  # results per instruction (chain step)
WORKS = {0: "Q K^T", 1: "P V (A in registers)", 2: "Q K^T + P V", 3: "Q K^T + P V (A in shared)"}
PRODUCT_FLOPS = 2 * 64 * 112 * 80  # one of Q K^T (K = 80) or P V (K = 112), per warpgroup
WORK_FLOPS = {0: PRODUCT_FLOPS, 1: PRODUCT_FLOPS, 2: 2 * PRODUCT_FLOPS, 3: 2 * PRODUCT_FLOPS}

# (N, k16 steps, kind): Q K^T shapes (kind 0, N = BLOCK_N, K = D rounded to 16) and
# P V shapes (kind 1, N = D, K = BLOCK_N) of the shipped configs.
SHAPES = [(128, 4, 0), (112, 5, 0), (64, 8, 0), (96, 5, 0), (128, 5, 0),
          (64, 8, 1), (72, 7, 1), (80, 7, 1), (96, 6, 1), (112, 6, 1), (128, 4, 1)]
# (MMA warpgroups, side warpgroups, work, side op)
MIXES = ([(0, 1, 0, op) for op in SIDE_OPS] + [(0, 2, 0, 2), (2, 0, 2, 0), (2, 0, 3, 0)]
         + [(m, e, w, op) for w in (0, 1) for op in (0, 1) for m, e in ((2, 1), (2, 2))]
         + [(m, e, w, 2) for w in (2, 3) for m, e in ((2, 1), (3, 1), (2, 2))])


def shape_expr(n, steps, kind, wgs=2):
    return f"mma_shape<{n}, {steps}, {kind}, {wgs}>"


def mix_expr(m, e, work, op):
    return f"side_by_side<{m}, {e}, {work}, {op}>"


def shape_smem(n, steps, kind, wgs=2):
    a = 64 * 128 * -(-16 * steps // 64)
    b = n * 128 * -(-16 * steps // 64) if kind == 0 else 16 * steps * 128 * -(-n // 64)
    return wgs * a + b + 1024


MIX_SMEM = 4 * 64 * 256 + 112 * 256 + 4 * 64 * 256 + 1024


def compile_all(arch="sm_90a"):
    """NVRTC for every instantiation: ({expression: lowered name}, cubin, resources)."""
    exprs = [shape_expr(*s) for s in SHAPES] + [mix_expr(*m) for m in MIXES]
    cubin, names, log = jit.compile_source(SOURCE.read_text(), SOURCE.name, exprs, arch)
    if cubin is None:
        raise RuntimeError(f"{SOURCE.name} does not compile:\n{log}")
    return names, cubin, jit.parse_resources(log)


def run(names, cubin, progress):
    import cupy as cp
    import numpy as np
    from cupy.cuda import driver

    from cupy_attention import device
    from cupy_attention.errors import UnsupportedError

    device.require_device()
    if device.compute_capability(0) != 90:
        raise UnsupportedError(f"the pipe microbenchmarks use wgmma (sm_90a); device 0 is "
                               f"{device.device_name(0)}, compute capability "
                               f"{device.compute_capability(0)}")

    mod = cp.cuda.function.Module()
    mod.load(cubin)
    dev = cp.cuda.Device()
    sms = dev.attributes.get("MultiProcessorCount", SMS_FALLBACK)
    out = cp.zeros(sms * 512, cp.float32)
    clk = cp.zeros(sms * 8, cp.int64)
    iters = cp.zeros(sms * 8, cp.int32)

    def launch(expr, threads, smem, *args):
        fn = mod.get_function(names[expr])
        driver.funcSetAttribute(fn.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
        for _ in range(2):  # the first launch warms up clocks and caches
            fn((sms,), (threads,), (out, clk, iters, *args), shared_mem=smem)
        dev.synchronize()
        return clk.get().reshape(sms, 8).astype(float), iters.get().reshape(sms, 8)

    rows = []
    for n, steps, kind in SHAPES:
        c, it = launch(shape_expr(n, steps, kind), 256, shape_smem(n, steps, kind), np.int32(1000))
        flops = 2 * 64 * n * 16 * steps * it[:, :2]
        rows.append(dict(test="wgmma shape", shape=f"{'Q K^T' if kind == 0 else 'P V'} m64n{n}, K = {16 * steps}",
                         tensor_flops_per_clk=float((flops / c[:, :2]).sum(axis=1).mean())))
        progress()
    for m, e, work, op in MIXES:
        c, it = launch(mix_expr(m, e, work, op), 128 * (m + e), MIX_SMEM, np.int32(600), np.int32(2000))
        row = dict(test="side by side", mma_warpgroups=m, mma_work=WORKS[work] if m else None,
                   side_warpgroups=e, side_op=SIDE_OPS[op] if e else None)
        if m:
            row["tensor_flops_per_clk"] = float((WORK_FLOPS[work] * it[:, :m] / c[:, :m]).sum(axis=1).mean())
        if e:
            per = 128 * 16 * 8 * SIDE_PER_ITER[op]  # threads x reps x chains x results
            row["side_per_clk"] = float((per * it[:, m:m + e] / c[:, m:m + e]).sum(axis=1).mean())
        rows.append(row)
        progress()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the rows and the environment here")
    ap.add_argument("--compile-only", action="store_true", help="compile with NVRTC and report registers")
    args = ap.parse_args(argv)
    names, cubin, res = compile_all()
    if args.compile_only:
        print(f"{len(names)} kernels, at most {res.registers} registers, {res.spill_stores} bytes spilled")
        return 0 if res.spill_stores == 0 else 1
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from cupy_attention import bench

    from cupy_attention.errors import AttentionError

    try:
        with Progress(transient=True) as bar:
            task = bar.add_task("pipes", total=len(SHAPES) + len(MIXES))
            rows = run(names, cubin, lambda: bar.advance(task))
    except AttentionError as exc:
        print(f"pipes: {exc}", file=sys.stderr)
        return 2
    table = Table(title="per SM per clock")
    for col in ("test", "MMA WGs: work", "side WGs: op", "tensor flops/clk", "side results/clk"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["test"] if r["test"] != "wgmma shape" else r["shape"],
                      f"{r['mma_warpgroups']}: {r['mma_work']}" if r.get("mma_warpgroups") else "",
                      f"{r['side_warpgroups']}: {r['side_op']}" if r.get("side_warpgroups") else "",
                      f"{r['tensor_flops_per_clk']:.0f}" if "tensor_flops_per_clk" in r else "",
                      f"{r['side_per_clk']:.2f}" if "side_per_clk" in r else "")
    Console().print(table)
    if args.json:
        env = bench.environment(None, 0)
        Path(args.json).write_text(json.dumps(dict(env=env, source="benchmarks/micro/pipes.cu", rows=rows),
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
