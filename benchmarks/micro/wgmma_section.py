"""flash_wgmma's causal forward under several tile orders, timed in one process.

    python benchmarks/micro/wgmma_section.py --json out.json [--sections 0,lpt,4,8,16]

The order is the TileScheduler's ``section`` (``CUPY_ATTENTION_WGMMA_SECTION``: 0 =
head after head, heaviest query blocks first; G > 0 = sections of G (head, batch)
pairs, block by block inside; ``lpt`` = the largest G whose K and V fit in L2). Every
order runs on the same inputs, interleaved over rounds, so drift hits all alike.
bf16, B*S = 16k, H*D = 2048; CUDA events around back-to-back calls, median of the
rounds, TFLOPs with the causal half counted.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="0,lpt,2,4,8,16")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    import cupy
    import cupy_attention as ca
    from cupy_attention import api

    def use(section: str) -> None:
        """Switch the order: the hot-call cache holds the launch with its section."""
        os.environ["CUPY_ATTENTION_WGMMA_SECTION"] = section
        api._HOT.clear()

    sections = a.sections.split(",")
    rows = []
    for d in map(int, a.dims.split(",")):
        for s in map(int, a.seqs.split(",")):
            b, h = 16384 // s, 2048 // d
            rng = cupy.random.default_rng(0)
            q, k, v = (rng.standard_normal((b, h, s, d), dtype=cupy.float32).astype("bfloat16")
                       for _ in range(3))
            flops = 4.0 * b * h * s * s * d / 2
            times = {sec: [] for sec in sections}
            for sec in sections:  # warm-up (and compile) under every order
                use(sec)
                for _ in range(3):
                    ca.attention(q, k, v, causal=True)
            cupy.cuda.get_current_stream().synchronize()
            for _ in range(a.rounds):
                for sec in sections:
                    use(sec)
                    ca.attention(q, k, v, causal=True)  # the hot path, prepared again
                    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
                    e0.record()
                    for _ in range(a.reps):
                        ca.attention(q, k, v, causal=True)
                    e1.record()
                    e1.synchronize()
                    times[sec].append(cupy.cuda.get_elapsed_time(e0, e1) / a.reps)
            row = dict(d=d, s=s, b=b, h=h)
            for sec in sections:
                ms = statistics.median(times[sec])
                row[sec] = dict(ms=ms, tflops=flops / ms / 1e9,
                                spread=max(times[sec]) / min(times[sec]) - 1)
            rows.append(row)
            best = max(sections, key=lambda x: row[x]["tflops"])
            print(f"D={d:3d} S={s:5d} " + " ".join(f"{x}:{row[x]['tflops']:6.1f}" for x in sections)
                  + f"  best {best} ({row[best]['tflops'] / row['0']['tflops'] if '0' in row else 1:.3f}x)",
                  flush=True)
            del q, k, v
            cupy.get_default_memory_pool().free_all_blocks()
    os.environ.pop("CUPY_ATTENTION_WGMMA_SECTION", None)
    if a.json:
        json.dump(dict(sections=sections, rows=rows), open(a.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
