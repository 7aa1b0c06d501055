#!/usr/bin/env python3
"""Where a backward's time goes: each kernel of ``attention_backward``, default and
deterministic mode, timed by torch.profiler (CUPTI sees CuPy's launches too).

BENCHMARKS.md's shapes (B*S = 16k, H*D = 2048, MHA, bf16), causal off and on. Per
case: the whole call by CUDA events around back-to-back calls behind a spin kernel
(``decode_bench.time_calls``), TFLOPs at 2.5x the forward's FLOPs, then each kernel's
device time per call, averaged over 10 profiled calls.

    python scripts/bwd_kernel_times.py --dims 192,256 --seqs 4096,16384 --json times.json
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cupy_attention as ca  # noqa: E402
from cupy_attention import device  # noqa: E402
from cupy_attention.interop import external_stream  # noqa: E402

from decode_bench import time_calls  # noqa: E402  (scripts/ is sys.path[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--json")
    a = ap.parse_args()

    import torch

    cupy = device.require_cupy()
    stream = external_stream(torch.cuda.current_stream().cuda_stream, cupy.cuda.Device().id)
    from cupy_attention.bench import _git_commit

    commit, dirty = _git_commit()
    report = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now(
        datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit, "dirty": dirty,
        "method": "call: CUDA events around back-to-back calls behind a spin kernel; kernels: "
                  "torch.profiler device time per call over 10 calls", "rows": []}
    for d in (int(x) for x in a.dims.split(",")):
        for s in (int(x) for x in a.seqs.split(",")):
            for causal in (False, True):
                b, h = 16384 // s, 2048 // d
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16,
                                           generator=g) for _ in range(4))
                out, lse = ca.attention(q, k, v, causal=causal, return_lse=True)
                flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0) * 2.5
                for det in (False, True):
                    def fn():
                        ca.attention_backward(do, q, k, v, out, lse, causal=causal,
                                              deterministic=det)
                    sec, _ = time_calls(cupy, fn, [()], 10, stream)
                    with torch.profiler.profile(
                            activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                        for _ in range(10):
                            fn()
                        torch.cuda.synchronize()
                    kernels = collections.defaultdict(float)
                    for e in prof.events():
                        if e.device_type == torch.autograd.DeviceType.CUDA:
                            kernels[e.name.split("<", 1)[0].replace("void ", "")] += \
                                e.device_time_total / 10
                    row = dict(d=d, s=s, causal=causal, deterministic=det, us=sec * 1e6,
                               tflops=flops / sec / 1e12,
                               kernels_us={n: round(t, 1) for n, t in kernels.items()})
                    report["rows"].append(row)
                    print(f"D={d} S={s} causal={causal} det={det}: {sec * 1e6:.0f} us, "
                          f"{row['tflops']:.0f} TFLOPs  " + "  ".join(
                              f"{n}={t:.0f}" for n, t in sorted(kernels.items(),
                                                                key=lambda x: -x[1])), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
