"""The backward where (key blocks x KV heads x batch) leaves the GPU short of blocks:
flash_wgmma_bwd with its query tiles split over several blocks per block of keys
(kv_splits, the default) against one block per block of keys, and torch SDPA's
backward (cuDNN, then FA2) on the same problem, in one process.

    python scripts/bwd_split_bench.py [--json out.json]

bf16, bhsd, back-to-back CUDA events around `reps` backward calls after warm-up,
median of 5 batches; TFLOPs count the causal half (2.5x the forward's 4 B H S^2 D).
"""
from __future__ import annotations

import argparse
import json

import cupy
import torch
import torch.nn.functional as F
from event_timing import time_ms

import cupy_attention as ca
from cupy_attention import backward
from cupy_attention.families import flash_wgmma_bwd

SHAPES = [  # B, Hq, Hkv, S, D, causal
    (2, 16, 4, 2048, 128, True),
    (1, 32, 8, 4096, 128, True),
    (1, 32, 8, 2048, 128, True),
    (1, 16, 2, 8192, 128, True),
    (2, 16, 4, 2048, 64, True),
    (1, 8, 8, 2048, 256, True),
    (2, 16, 4, 2048, 128, False),
    (4, 32, 8, 4096, 128, True),   # a full grid: splits stay 1
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args()
    real = flash_wgmma_bwd.kv_splits
    rows = []
    for B, Hq, Hkv, S, D, causal in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
                for _ in range(2))
        dout = torch.randn_like(q)
        out, lse = ca.attention(q, k, v, causal=causal, return_lse=True)
        flops = 2.5 * 4 * B * Hq * S * S * D * (0.5 if causal else 1.0)
        row = dict(B=B, Hq=Hq, Hkv=Hkv, S=S, D=D, causal=causal,
                   splits=real(_problem(q, k, causal), _sms(), False))
        for name, splits in (("split", None), ("one_block", 1)):
            flash_wgmma_bwd.kv_splits = real if splits is None else (lambda p, s, d: 1)
            backward._HOT.entries.clear()
            ms = time_ms(lambda: ca.attention_backward(dout, q, k, v, out, lse, causal=causal))
            row[name] = flops / ms / 1e9
        flash_wgmma_bwd.kv_splits = real
        qs, ks, vs = (x.detach().clone().requires_grad_() for x in (q, k, v))
        for backend, name in ((torch.nn.attention.SDPBackend.CUDNN_ATTENTION, "cudnn"),
                              (torch.nn.attention.SDPBackend.FLASH_ATTENTION, "fa2")):
            try:
                with torch.nn.attention.sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal,
                                                       enable_gqa=Hq != Hkv)
                    ms = time_ms(lambda: torch.autograd.grad(o, (qs, ks, vs), dout,
                                                             retain_graph=True))
                row[name] = flops / ms / 1e9
            except Exception as exc:   # a backend that refuses the shape
                row[name] = None
                row[name + "_error"] = str(exc)[:120]
        rows.append(row)
        print(" ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in row.items() if not k.endswith("_error")), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


def _sms():
    return cupy.cuda.Device().attributes["MultiProcessorCount"]


def _problem(q, k, causal):
    from cupy_attention.problem import validate

    return validate(q, k, k, causal=causal)


if __name__ == "__main__":
    main()
