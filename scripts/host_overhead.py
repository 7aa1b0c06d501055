"""Host cost of one call, where the GPU work is too small to hide it: microseconds
per call of our forward, backward and a torch forward + backward step, beside torch
SDPA's, on a tiny problem (B 1, H 4, S 128, D 64, bf16, causal).

    python scripts/host_overhead.py [--json out.json] [--reps 500]

Each figure is the wall time of `reps` back-to-back calls divided by `reps` after a
warm-up (the kernels are microseconds, so the host's issue rate is what is timed),
the median of 5 such runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import cupy_attention as ca
from cupy_attention import torch as cat


def per_call(fn, reps):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t) / reps * 1e6)
    return statistics.median(runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=500)
    ap.add_argument("--json")
    a = ap.parse_args()
    dev, bf = "cuda", torch.bfloat16
    q, k, v = (torch.randn(1, 4, 128, 64, device=dev, dtype=bf) for _ in range(3))
    out, lse = ca.attention(q, k, v, causal=True, return_lse=True)
    dout = torch.randn_like(out)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

    def ours_step():
        cat.attention(qg, kg, vg, causal=True).backward(dout)

    def sdpa_step():
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(dout)

    cases = {
        "ca.attention (forward)": lambda: ca.attention(q, k, v, causal=True),
        "ca.attention_backward": lambda: ca.attention_backward(dout, q, k, v, out, lse,
                                                               causal=True),
        "cat.attention forward + backward": ours_step,
        "sdpa forward": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "sdpa forward + backward": sdpa_step,
    }
    rows = {}
    for name, fn in cases.items():
        rows[name] = per_call(fn, a.reps)
        print(f"{name:36s} {rows[name]:8.1f} us", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           us_per_call=rows), f, indent=1)


if __name__ == "__main__":
    main()
