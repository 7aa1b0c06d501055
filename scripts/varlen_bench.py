"""Packed sequences (attention_varlen) beside torch's varlen path, on one GPU.

    python scripts/varlen_bench.py [--json out.json] [--quick]

Lengths are drawn from a long-tailed (log-normal) distribution with mean 1k or 4k
tokens, clipped to [16, 16k], until 16k tokens are packed. For each (D, mean length,
causal): ours (``attention_varlen``, forward, and forward + backward) and torch SDPA
on a jagged nested tensor (which runs FlashAttention-2's varlen kernel), plus ours
on the same tokens padded to the longest sequence (what a dense kernel would do).
TFLOPs count the real work of each sequence (causal halves it, per sequence).
Timing: CUDA events around back-to-back calls after warm-up, median of 5 batches.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from event_timing import time_ms  # noqa: E402  (a sibling script module)


def lengths(mean: int, total: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    sigma = 1.0
    mu = np.log(mean) - sigma ** 2 / 2
    out = []
    while sum(out) < total:
        out.append(int(np.clip(rng.lognormal(mu, sigma), 16, 16384)))
    out[-1] -= sum(out) - total
    return [x for x in out if x > 0]


def flops(lens, heads, d, causal, backward=False):
    f = sum(4.0 * n * n * heads * d * (0.5 if causal else 1.0) for n in lens)
    return f * (3.5 if backward else 1.0)  # forward + backward = 1 + 2.5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    import cupy_attention as ca
    import cupy_attention.torch as cat

    rows = []
    dims = (64, 128) if not args.quick else (128,)
    for d in dims:
        heads = 2048 // d
        for mean in (1024, 4096):
            lens = lengths(mean, 16384, seed=mean + d)
            cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32,
                              device="cuda")
            total = sum(lens)
            for causal in (False, True):
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn(total, heads, d, device="cuda", dtype=torch.bfloat16,
                                       generator=g) for _ in range(3))
                row = dict(d=d, mean=mean, causal=causal, sequences=len(lens), total=total,
                           longest=max(lens))
                ours = time_ms(lambda: ca.attention_varlen(q, k, v, cu, cu, causal=causal,
                                                           check=False))
                row["ours_fwd_tflops"] = flops(lens, heads, d, causal) / ours / 1e9
                qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
                dout = torch.randn_like(q)

                def fwd_bwd():
                    o = cat.attention_varlen(qg, kg, vg, cu, cu, causal=causal, check=False)
                    o.backward(dout)
                t = time_ms(fwd_bwd, reps=5)
                row["ours_fwdbwd_tflops"] = flops(lens, heads, d, causal, True) / t / 1e9
                # padded to the longest: what a dense kernel computes
                B, S = len(lens), max(lens)
                qp = torch.zeros(B, S, heads, d, device="cuda", dtype=torch.bfloat16)
                t = time_ms(lambda: ca.attention(qp, qp, qp, causal=causal, layout="bshd"))
                row["ours_padded_fwd_tflops"] = flops(lens, heads, d, causal) / t / 1e9
                try:
                    offsets = cu.to(torch.int64)
                    nq, nk, nv = (torch.nested.nested_tensor_from_jagged(x, offsets)
                                  .transpose(1, 2) for x in (q, k, v))
                    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                        t = time_ms(lambda: F.scaled_dot_product_attention(nq, nk, nv,
                                                                           is_causal=causal))
                    row["torch_njt_flash_fwd_tflops"] = flops(lens, heads, d, causal) / t / 1e9
                except Exception as exc:  # noqa: BLE001 - a peer that cannot run is recorded
                    row["torch_njt_flash_fwd_error"] = f"{type(exc).__name__}: {exc}"[:200]
                rows.append(row)
                print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()},
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    print(f"{'D':>4} {'mean':>5} {'causal':>6} {'ours fwd':>9} {'torch NJT':>9} {'padded':>7} "
          f"{'ours f+b':>8}")
    for r in rows:
        print(f"{r['d']:>4} {r['mean']:>5} {str(r['causal']):>6} {r['ours_fwd_tflops']:>9.0f} "
              f"{r.get('torch_njt_flash_fwd_tflops', float('nan')):>9.0f} "
              f"{r['ours_padded_fwd_tflops']:>7.0f} {r['ours_fwdbwd_tflops']:>8.0f}")


if __name__ == "__main__":
    main()
