"""Cycles a query tile spends in each step of flash_wgmma_bwd_dkdv's consumer loop.

A diagnostic, not a benchmark: it copies the package to a scratch tree, stamps
`clock64()` at the loop's step boundaries there (thread 0 of each MMA warpgroup stores
the delta since the last stamp, one 32-bit store per step and tile, into a module
global), runs the backward once per case from that tree and prints the mean cycles a
tile per step and warpgroup. The stamps add about 5% to the kernel; ptxas may move a
stamp across a neighbouring wait, so adjacent steps can trade cycles (the tile's total
is exact). The step boundaries are found by the loop's own statements: an edit that
changes them makes `patch` stop with the statement it did not find.

    python scripts/bwd_phase_trace.py patch /tmp/trace_tree      # here (no GPU needed)
    PYTHONPATH=/tmp/trace_tree python scripts/bwd_phase_trace.py run --json out.json

Results and what they showed: benchmarks/results/notes-bwd-loops.md section 44.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil

STEPS = ["wait full", "fix + issue S^T, dP^T", "wait S^T", "P^T", "wait dP^T", "dS^T",
         "dV issue + pack dS^T", "sdS free (barrier)", "store dS^T + fence", "kBarDs meeting",
         "issue dQ, dK", "wait dQ", "wait sdQ buffer", "retire (wait dK, release)",
         "stage dQ", "(unused)", "DsFree arrive"]
SLOTS = 32          # per warpgroup and tile: the steps, then spin counts; the last: 1
MAX_BLOCKS, MAX_TILES = 4096, 128
# (statement that ends a step, step index) in the order they run
BOUNDS = [
    ("mbarrier_wait(st.full(stage), read.phase());", 0),
    ("issue_transposed<KT>(dp, st.v(), 64 * wg, o_tile);", 1),
    ("wgmma_wait<1>();\n    fence_regs(s);", 2),
    ("p_from_s<KT, VT, LSE2>(s, f, st.lse(stage), hd, m0, sched.n0 + key0, lane);\n    }();", 3),
    ("wgmma_wait<LATE_DV ? 0 : 1>();\n    fence_regs(dp);", 4),
    ("else ds_from_dp<KT, false>(dp, s, st.delta(stage), t);", 5),
    ("if constexpr (!KV_SS) pack_a<typename KT::T>(da, dp);", 6),
    ("else if constexpr (PWG) warpgroup_barrier(wg);", 7),
    ("fence_proxy_async();  // also publishes sdQ of tile it - 1 (staged below)", 8),
    ("else named_barrier_sync(kBarDs, KT::CONSUMERS);", 9),
    ("else if constexpr (DQ_FIRST) issue_accumulate<KT>(dk, da, q_tile);", 10),
    ("    else retire();", 11),
    ("if (it + 1 < sched.end) named_barrier_arrive(kBarDsFree0 + 1 - wg, KT::CONSUMERS);", 16),
    ("if (rel >= B) mbarrier_wait(st.dq_empty(buf), ((rel / B) - 1) & 1);", 12),
    ("if (lane == 0) mbarrier_arrive(st.dq_full(buf));", 14),
    ("if constexpr (DQ_FIRST) retire();", 13),
]
PRELUDE = f"""__device__ unsigned ca_trace[{MAX_BLOCKS}u * {MAX_TILES}u * 2u * {SLOTS}u];
__device__ __forceinline__ unsigned ca_trace_wait(u32 bar, int parity) {{  // failed polls
  unsigned n = 0;
  for (;;) {{
    u32 done;
    asm volatile("{{.reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;"
                 " selp.u32 %0, 1, 0, p;}}" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    if (done) return n;
    ++n;
  }}
}}
#define CA_STAMP(i) do {{ const long long now_ = clock64(); \\
  if ((threadIdx.x & 127) == 0) ca_trace[slot_ + (i)] = unsigned(now_ - last_); last_ = now_; }} while (0)
"""


def patch(tree: str) -> None:
    """Copy this checkout's package and kernels to `tree` and stamp its loop."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for part in ("cupy_attention", "kernels"):
        shutil.copytree(os.path.join(root, part), os.path.join(tree, part), dirs_exist_ok=True)
    path = os.path.join(tree, "kernels", "flash_wgmma_bwd.cu")
    src = open(path).read()
    start = src.index("flash_wgmma_bwd_dkdv(const BwdParams args")
    end = src.index("convert_flat_tile", start)
    body = src[start:end]

    def after(statement: str, text: str) -> str:
        if body.count(statement) != 1:
            raise SystemExit(f"patch: {statement!r} found {body.count(statement)} times "
                             "in flash_wgmma_bwd_dkdv (the loop changed: update BOUNDS)")
        pos = body.index("\n", body.index(statement) + len(statement)) + 1
        return body[:pos] + text + "\n" + body[pos:]

    body = after("PipelineState<KT::kStages> read;  // the stage of the tile consumed",
                 "long long last_ = clock64();")
    for statement, step in BOUNDS:
        body = after(statement, f"CA_STAMP({step});")
    slot = (f"const unsigned slot_ = (((blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * "
            f"blockIdx.z)) * {MAX_TILES}u + unsigned(it - sched.begin)) * 2u + wg) * {SLOTS}u;")
    waits = {  # polls of the stage's and the sdQ buffer's waits, in slots 17 and 18
        "mbarrier_wait(st.full(stage), read.phase());":
            slot + "\n    { const unsigned n_ = ca_trace_wait(st.full(stage), read.phase()); "
            "if ((threadIdx.x & 127) == 0) ca_trace[slot_ + 17] = n_; }",
        "if (rel >= B) mbarrier_wait(st.dq_empty(buf), ((rel / B) - 1) & 1);":
            "if (rel >= B) { const unsigned n_ = ca_trace_wait(st.dq_empty(buf), "
            "((rel / B) - 1) & 1); if ((threadIdx.x & 127) == 0) ca_trace[slot_ + 18] = n_; }",
    }
    for old, new in waits.items():
        body = body.replace(old, new, 1)
    body = body.replace("CA_STAMP(13);", f"CA_STAMP(13); if ((threadIdx.x & 127) == 0) "
                        f"ca_trace[slot_ + {SLOTS - 1}] = 1u;", 1)
    kernel = src.index("template <class KT, class VT, int DQ, bool SPLIT, bool FLAT = false>\n"
                       "__global__")
    open(path, "w").write(src[:kernel] + PRELUDE + src[kernel:start] + body + src[end:])
    print(f"stamped {path}; run with PYTHONPATH={tree}")


def run(cases, json_path: str | None) -> None:
    import cupy
    import ml_dtypes

    import cupy_attention as ca
    from cupy_attention import jit

    out = []
    for d, s, causal in cases:
        b, h = 16384 // s, 2048 // d
        # the trace's slots: one per (block, tile); 128-key blocks, 64 or more queries a tile
        if b * h * -(-s // 128) > MAX_BLOCKS or -(-s // 64) > MAX_TILES:
            raise SystemExit(f"D={d} S={s}: more blocks or tiles a block than the trace "
                             f"holds ({MAX_BLOCKS} blocks, {MAX_TILES} tiles)")
        rng = cupy.random.default_rng(0)

        def mk():
            return rng.standard_normal((b, h, s, d), dtype=cupy.float32).astype(ml_dtypes.bfloat16)
        q, k, v, do = mk(), mk(), mk(), mk()
        o, lse = ca.attention(q, k, v, causal=causal, return_lse=True)

        def step():
            return ca.attention_backward(do, q, k, v, o, lse, causal=causal)
        for _ in range(3):
            step()
        cupy.cuda.Device().synchronize()
        loaded = [lk for key, lk in jit._loaded.items()
                  if key[0].name.startswith("flash_wgmma_bwd_dkdv[") and f"D={d}," in key[0].name
                  and (",causal" in key[0].name) == causal]
        if len(loaded) != 1:
            raise SystemExit(f"D={d}: expected one stamped dK/dV kernel, found {len(loaded)}")
        module = loaded[0].module
        ptr = module.get_global_var("ca_trace")
        ptr = ptr[0] if isinstance(ptr, tuple) else int(ptr)
        n = MAX_BLOCKS * MAX_TILES * 2 * SLOTS
        mem = cupy.cuda.UnownedMemory(ptr, n * 4, owner=module)
        rec = cupy.ndarray((MAX_BLOCKS * MAX_TILES, 2, SLOTS), dtype=cupy.uint32,
                           memptr=cupy.cuda.MemoryPointer(mem, 0))
        rec[...] = 0
        step()
        cupy.cuda.Device().synchronize()
        r = rec.astype(cupy.float64)
        row = dict(d=d, s=s, causal=causal, kernel=loaded[0].compiled.spec.name, steps={})
        for w in range(2):
            live = r[:, w, SLOTS - 1] > 0
            tiles = int(live.sum())
            mean = (r[live, w, :].sum(axis=0) / max(tiles, 1)).get()
            for i, name in enumerate(STEPS):
                if name != "(unused)":
                    row["steps"].setdefault(name, []).append(float(mean[i]))
            row.setdefault("tiles", []).append(tiles)
            row.setdefault("cycles_a_tile", []).append(float(mean[:17].sum()))
            row.setdefault("failed_polls_full_dq_empty", []).append(
                [float(mean[17]), float(mean[18])])
        out.append(row)
        print(f"\nD={d} S={s} causal={causal} {row['kernel']}: {row['tiles'][0]} tiles")
        for name, (w0, w1) in row["steps"].items():
            print(f"  {name:28s} {w0:8.1f} {w1:8.1f}")
        print(f"  {'a tile':28s} {row['cycles_a_tile'][0]:8.1f} {row['cycles_a_tile'][1]:8.1f}",
              flush=True)
        q = k = v = do = o = lse = None
        cupy.get_default_memory_pool().free_all_blocks()
    if json_path:
        json.dump(out, open(json_path, "w"), indent=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("patch").add_argument("tree")
    r = sub.add_parser("run")
    r.add_argument("--json")
    r.add_argument("--cases", default="128:8192:1,128:2048:1,96:8192:1,128:8192:0",
                   help="D:S:causal,... (bf16, B*S = 16k, H*D = 2048)")
    a = ap.parse_args()
    if a.cmd == "patch":
        patch(a.tree)
    else:
        run([(int(d), int(s), c == "1") for d, s, c in (x.split(":") for x in a.cases.split(","))],
            a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
