"""Attention variants against the plain kernel, on one GPU, in one process.

    python scripts/variant_bench.py [--json out.json] [--quick] [--no-flex] [--part P]
                                    [--variants dropout,softcap] [--dims 64,128]

1. Score transforms: softcap (c = 30), ALiBi (the standard slopes 2^(-8h/H)) and both,
   and dropout (p = 0.1, a fixed seed), forward and backward, beside the plain kernel at the same shape (B*S = 16k,
   H*D = 2048, bf16, D in {64, 128, 256}, S in {4k, 16k}, causal and not). TFLOPs on the
   true D (backward: 2.5x the forward's FLOPs); the ratio to plain is the figure the
   variant issue sets targets for (>= 0.9x; dropout >= 0.85x).
2. Sliding windows: causal with window (1023, 0), B = 1, H = 2048 / D, S in {16k,
   64k}: the time against the time the same attended scores would take at our dense
   causal rate at that S (target <= 1.15x), and FlexAttention's sliding-window block
   mask (torch.compile) beside it where this torch compiles it.
With --fa4, FlashAttention-4 (flash_attn.cute, ../shared/tools/peers.md) beside both
parts: its plain and softcap kernels (it has no ALiBi or dropout), its dense causal
rate and its window (1023, 0) against that rate.
Timing: CUDA events around back-to-back calls after warm-up, median of 5 batches.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from event_timing import time_ms  # noqa: E402  (a sibling script module)
from peer_bench import fa4_calls  # noqa: E402


def alibi_slopes(heads: int):
    """The ALiBi paper's slopes for a power-of-two head count: 2^(-8 h / H), h = 1..H."""
    import torch

    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)],
                        dtype=torch.float32, device="cuda")


TRANSFORMS = ("softcap", "alibi", "softcap+alibi", "dropout")


def transforms(dims, seqs, rows, variants=frozenset(), fa4=False):
    import torch

    import cupy_attention as ca

    for d in dims:
        heads = 2048 // d
        for s in seqs:
            b = 16384 // s
            g = torch.Generator(device="cuda").manual_seed(d + s)
            q, k, v, do = (torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16,
                                       generator=g) for _ in range(4))
            slopes = alibi_slopes(heads)
            for causal in (False, True):
                flops = 4.0 * b * heads * s * s * d * (0.5 if causal else 1.0)
                plain = {}
                for name, kw in (("plain", {}), ("softcap", dict(softcap=30.0)),
                                 ("alibi", dict(alibi_slopes=slopes)),
                                 ("softcap+alibi", dict(softcap=30.0, alibi_slopes=slopes)),
                                 ("dropout", dict(dropout_p=0.1, dropout_seed=7,
                                                  dropout_offset=0))):
                    if name != "plain" and variants and name not in variants:
                        continue
                    row = dict(part="transform", variant=name, d=d, s=s, b=b, h=heads,
                               causal=causal)
                    fwd = time_ms(lambda: ca.attention(q, k, v, causal=causal, **kw))
                    o, lse = ca.attention(q, k, v, causal=causal, return_lse=True, **kw)
                    bwd = time_ms(lambda: ca.attention_backward(do, q, k, v, o, lse,
                                                                causal=causal, **kw), reps=5)
                    row.update(fwd_tflops=flops / fwd / 1e9, bwd_tflops=2.5 * flops / bwd / 1e9)
                    if name == "plain":
                        plain = row
                    row.update(fwd_ratio=row["fwd_tflops"] / plain["fwd_tflops"],
                               bwd_ratio=row["bwd_tflops"] / plain["bwd_tflops"])
                    if fa4 and name in ("plain", "softcap"):
                        f_fwd, f_bwd = fa4_calls(q, k, v, do, causal,
                                                 **{x: kw[x] for x in ("softcap",) if x in kw})
                        row.update(fa4_fwd_tflops=flops / time_ms(f_fwd) / 1e9,
                                   fa4_bwd_tflops=2.5 * flops / time_ms(f_bwd, reps=5) / 1e9)
                        row.update(fa4_fwd_ratio=row["fa4_fwd_tflops"] / plain["fa4_fwd_tflops"],
                                   fa4_bwd_ratio=row["fa4_bwd_tflops"] / plain["fa4_bwd_tflops"])
                    rows.append(row)
                    print({k_: (round(x, 3) if isinstance(x, float) else x)
                           for k_, x in row.items()}, flush=True)


def attended(s: int, left: int) -> int:
    """Attended scores of a causal window (left, 0) over S rows: row i sees min(i, left) + 1."""
    full = min(s, left + 1)
    return full * (full + 1) // 2 + (s - full) * (left + 1)


def windows(dims, seqs, rows, flex: bool, fa4: bool = False):
    import torch

    import cupy_attention as ca

    left = 1023
    for d in dims:
        heads = 2048 // d
        for s in seqs:
            g = torch.Generator(device="cuda").manual_seed(s)
            q, k, v = (torch.randn(1, heads, s, d, device="cuda", dtype=torch.bfloat16,
                                   generator=g) for _ in range(3))
            dense_ms = time_ms(lambda: ca.attention(q, k, v, causal=True), reps=3)
            dense_rate = 4.0 * heads * d * (s * (s + 1) / 2) / dense_ms  # flops per ms
            win_flops = 4.0 * heads * d * attended(s, left)
            win_ms = time_ms(lambda: ca.attention(q, k, v, causal=True, window=(left, 0)))
            row = dict(part="window", d=d, s=s, window=left, dense_causal_tflops=dense_rate / 1e9,
                       window_ms=win_ms, window_tflops=win_flops / win_ms / 1e9,
                       vs_dense_rate=win_ms / (win_flops / dense_rate))
            if fa4:
                dout = torch.zeros_like(q)   # forwards only: the backward is not timed
                f_dense = fa4_calls(q, k, v, dout, True)[0]
                f_win = fa4_calls(q, k, v, dout, True, window_size=(left, 0))[0]
                fa4_rate = 4.0 * heads * d * (s * (s + 1) / 2) / time_ms(f_dense, reps=3)
                row["fa4_dense_causal_tflops"] = fa4_rate / 1e9
                row["fa4_window_ms"] = time_ms(f_win)
                row["fa4_window_tflops"] = win_flops / row["fa4_window_ms"] / 1e9
                row["fa4_vs_dense_rate"] = row["fa4_window_ms"] / (win_flops / fa4_rate)
            if flex:
                try:
                    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

                    def sliding(b, h, qi, ki):
                        return (qi >= ki) & (qi - ki <= left)

                    mask = create_block_mask(sliding, None, None, s, s, device="cuda")
                    fa = torch.compile(flex_attention)
                    row["flex_ms"] = time_ms(lambda: fa(q, k, v, block_mask=mask))
                    row["flex_tflops"] = win_flops / row["flex_ms"] / 1e9
                except Exception as exc:  # noqa: BLE001 - a peer that cannot run is recorded
                    row["flex_error"] = f"{type(exc).__name__}: {exc}"[:200]
            rows.append(row)
            print({k_: (round(x, 3) if isinstance(x, float) else x) for k_, x in row.items()},
                  flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--part", choices=("transform", "window"), help="one part only")
    ap.add_argument("--variants", help="comma-separated transforms to time beside plain "
                    "(softcap, alibi, softcap+alibi, dropout; default all)")
    ap.add_argument("--dims", default="64,128,256", help="head dims of the transforms")
    ap.add_argument("--fa4", action="store_true", help="FlashAttention-4 beside ours")
    args = ap.parse_args()
    variants = set(args.variants.split(",")) if args.variants else set()
    if variants - set(TRANSFORMS):
        ap.error(f"--variants: unknown {sorted(variants - set(TRANSFORMS))}; "
                 f"choose from {', '.join(TRANSFORMS)}")
    import torch

    rows: list = []
    if args.part in (None, "transform"):
        transforms(tuple(int(x) for x in args.dims.split(",")),
                   (4096,) if args.quick else (4096, 16384), rows, variants, args.fa4)
    if args.part in (None, "window"):
        windows((128,) if args.quick else (64, 128), (16384, 65536), rows, not args.no_flex,
                args.fa4)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    nan = math.nan
    print(f"{'variant':14s} {'D':>4} {'S':>6} {'causal':>6} {'fwd TF':>7} {'x plain':>7} "
          f"{'bwd TF':>7} {'x plain':>7} {'FA4 fwd':>7} {'x plain':>7} {'FA4 bwd':>7} {'x plain':>7}")
    for r in rows:
        if r["part"] == "transform":
            print(f"{r['variant']:14s} {r['d']:>4} {r['s']:>6} {str(r['causal']):>6} "
                  f"{r['fwd_tflops']:>7.0f} {r['fwd_ratio']:>7.2f} {r['bwd_tflops']:>7.0f} "
                  f"{r['bwd_ratio']:>7.2f} {r.get('fa4_fwd_tflops', nan):>7.0f} "
                  f"{r.get('fa4_fwd_ratio', nan):>7.2f} {r.get('fa4_bwd_tflops', nan):>7.0f} "
                  f"{r.get('fa4_bwd_ratio', nan):>7.2f}")
    print(f"{'window':>7} {'D':>4} {'S':>6} {'dense TF':>8} {'win TF':>7} {'x dense':>7} "
          f"{'flex TF':>7} {'FA4 dense':>9} {'FA4 win':>7} {'x dense':>7}")
    for r in rows:
        if r["part"] == "window":
            print(f"{r['window']:>7} {r['d']:>4} {r['s']:>6} {r['dense_causal_tflops']:>8.0f} "
                  f"{r['window_tflops']:>7.0f} {r['vs_dense_rate']:>7.2f} "
                  f"{r.get('flex_tflops', nan):>7.0f} {r.get('fa4_dense_causal_tflops', nan):>9.0f} "
                  f"{r.get('fa4_window_tflops', nan):>7.0f} {r.get('fa4_vs_dense_rate', nan):>7.2f}")


if __name__ == "__main__":
    main()
