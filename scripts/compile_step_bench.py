"""A training step of a small Llama-like stack, eager against torch.compile, with our
attention and with torch SDPA (issue: a compiled step with our kernels is no slower
than the eager one).

    python scripts/compile_step_bench.py [--json out.json] [--layers 4] [--seq 2048]

The model: `layers` pre-norm blocks (LayerNorm, causal GQA attention from one fused
qkv projection, a 4x GELU MLP), bf16, `batch` x `seq` tokens, width `dim`. A step is
forward, loss and backward (no optimizer). Four timings: eager and
torch.compile(fullgraph=True), each with our attention (`cupy_attention.torch.attention`
on the bshd views) and with torch SDPA (is_causal, enable_gqa) in the same module.
Timing: CUDA events around `reps` back-to-back steps after warm-up, median of `batches`.
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from event_timing import time_ms

from cupy_attention import torch as cat


class Attention(torch.nn.Module):
    def __init__(self, dim, heads, kv_heads, ours):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, dim // heads
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.d, bias=False)
        self.out = torch.nn.Linear(heads * self.d, dim, bias=False)
        self.ours = ours

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, self.heads + 2 * self.kv_heads, self.d)
        q, k, v = qkv.split((self.heads, self.kv_heads, self.kv_heads), dim=2)
        if self.ours:
            o = cat.attention(q, k, v, causal=True, layout="bshd")
        else:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            o = o.transpose(1, 2)
        return self.out(o.reshape(b, s, -1))


class Block(torch.nn.Module):
    def __init__(self, dim, heads, kv_heads, ours):
        super().__init__()
        self.n1, self.n2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, kv_heads, ours)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for ours in (True, False):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[Block(a.dim, a.heads, a.kv_heads, ours)
                                      for _ in range(a.layers)]).cuda().to(torch.bfloat16)
        x = torch.randn(a.batch, a.seq, a.dim, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True)
        for mode in ("eager", "compile"):
            m = model if mode == "eager" else torch.compile(model, fullgraph=True)

            def step(m=m):
                m(x).float().square().mean().backward()

            ms = time_ms(step, a.reps, a.batches, warmup=3)
            rows.append(dict(attention="ours" if ours else "sdpa", mode=mode, ms=ms))
            print(f"{rows[-1]['attention']:5s} {mode:8s} {ms:8.3f} ms/step", flush=True)
    by = {(r["attention"], r["mode"]): r["ms"] for r in rows}
    summary = {
        "ours compile/eager": by["ours", "compile"] / by["ours", "eager"],
        "sdpa compile/eager": by["sdpa", "compile"] / by["sdpa", "eager"],
        "ours/sdpa eager": by["ours", "eager"] / by["sdpa", "eager"],
        "ours/sdpa compile": by["ours", "compile"] / by["sdpa", "compile"],
    }
    for k, v in summary.items():
        print(f"{k:20s} {v:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(args=vars(a), device=torch.cuda.get_device_name(), rows=rows,
                           summary=summary), f, indent=1)


if __name__ == "__main__":
    main()
