#!/usr/bin/env python3
"""Training attention beside the strongest peers, in one process on one GPU: our
forward and backward against torch SDPA's cuDNN and FlashAttention-2 backends and
FlashAttention-4's Hopper kernels (``flash_attn.cute``, the FlashAttention-3 design),
the last where installed (``../shared/tools/peers.md``: the wheels travel in parts).

BENCHMARKS.md's grid and protocol: B*S = 16k tokens, H*D = 2048 (MHA; ``--gqa 4``
gives Hq / Hkv = 4), bf16 by default, causal off and on; TFLOPs on the true D
(backward: 2.5x the forward's FLOPs). Each implementation takes its own layout: ours
and SDPA [B, H, S, D], FA4 [B, S, H, D]. Timing: CUDA events around ``--reps``
back-to-back calls on torch's stream behind a spin kernel (scripts/decode_bench.py's
``time_calls``), the faster of two rounds, the spread beside it. Backwards: ours is
``attention_backward`` itself; SDPA's and FA4's are ``torch.autograd.grad`` through
one retained forward graph (their own backward kernels, no forward).

    python scripts/peer_bench.py --json peers-train.json
    python scripts/peer_bench.py --dims 64,128 --seqs 4096,16384 --impls ours,cudnn,flash2
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cupy_attention as ca  # noqa: E402
from cupy_attention import device  # noqa: E402
from cupy_attention.interop import external_stream  # noqa: E402

from decode_bench import choice_list, time_calls  # noqa: E402  (scripts/ is sys.path[0])

def _inputs(torch, b, hq, hkv, s, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=g)
                   for h in (hq, hkv, hkv, hq))
    return q, k, v, do


def _ours(q, k, v, do, causal, dropout_p=0.0, kernel="auto", deterministic=False):
    drop = dict(dropout_p=dropout_p, dropout_seed=1234, dropout_offset=0) if dropout_p else {}
    out, lse = ca.attention(q, k, v, causal=causal, return_lse=True, kernel=kernel, **drop)
    return (lambda: ca.attention(q, k, v, causal=causal, kernel=kernel, **drop),
            lambda: ca.attention_backward(do, q, k, v, out, lse, causal=causal, kernel=kernel,
                                          deterministic=deterministic, **drop))


def _sdpa(backend, q, k, v, do, causal, dropout_p=0.0):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    which = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash2": SDPBackend.FLASH_ATTENTION}[backend]
    gqa = q.shape[1] != k.shape[1]
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

    def fwd():
        with sdpa_kernel(which), torch.no_grad():
            return sdpa(q, k, v, is_causal=causal, enable_gqa=gqa, dropout_p=dropout_p)

    with sdpa_kernel(which):
        out = sdpa(qg, kg, vg, is_causal=causal, enable_gqa=gqa, dropout_p=dropout_p)

    def bwd():
        return torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)

    return fwd, bwd


def fa4_calls(q, k, v, do, causal, dropout_p=0.0, **kw):
    """FA4's forward and backward closures; ``kw`` goes to flash_attn_func (softcap,
    window_size)."""
    import torch
    from flash_attn.cute import flash_attn_func

    if dropout_p:
        raise NotImplementedError("FlashAttention-4 has no dropout")

    qs, ks, vs, dos = (x.transpose(1, 2).contiguous() for x in (q, k, v, do))
    qg, kg, vg = (x.detach().requires_grad_() for x in (qs, ks, vs))

    def fwd():
        with torch.no_grad():
            return flash_attn_func(qs, ks, vs, causal=causal, **kw)

    out = flash_attn_func(qg, kg, vg, causal=causal, **kw)[0]

    def bwd():
        return torch.autograd.grad(out, (qg, kg, vg), dos, retain_graph=True)

    return fwd, bwd


# name -> (q, k, v, dout, causal, dropout_p) -> (forward, backward) closures over those
# inputs
IMPLS = {"ours": _ours,
         "ours_det": lambda *a: _ours(*a, deterministic=True),   # bitwise reproducible dQ
         "ours_mma": lambda *a: _ours(*a, kernel="flash_mma"),   # the sm_80 path (vs flash2)
         "cudnn": lambda *a: _sdpa("cudnn", *a),
         "flash2": lambda *a: _sdpa("flash2", *a),
         "fa4": fa4_calls}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    ap.add_argument("--causal", default="0,1", help="comma-separated: 0 (off), 1 (on)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--gqa", type=int, default=1, help="Hq / Hkv")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="dropout_p for every implementation that has dropout (FA4 has none)")
    ap.add_argument("--impls", default="ours,cudnn,flash2,fa4", type=choice_list(IMPLS),
                    help="comma-separated, from " + ", ".join(IMPLS))
    ap.add_argument("--json")
    a = ap.parse_args()

    import torch

    cupy = device.require_cupy()
    stream = external_stream(torch.cuda.current_stream().cuda_stream, cupy.cuda.Device().id)
    dtype = getattr(torch, a.dtype)
    from cupy_attention.bench import _git_commit

    commit, dirty = _git_commit()
    report = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now(
        datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit, "dirty": dirty,
        "dtype": a.dtype, "gqa": a.gqa, "dropout_p": a.dropout, "reps": a.reps, "torch": torch.__version__,
        "method": "CUDA events around reps back-to-back calls behind a spin kernel, faster of "
                  "two rounds; backward 2.5x the forward FLOPs", "rows": []}
    print(f"{report['device']}  commit {commit}{'+dirty' if dirty else ''}  {a.dtype}  "
          f"Hq/Hkv {a.gqa}  dropout {a.dropout}  {report['date']}")
    print(f"{'D':>4} {'S':>6} {'causal':>6} {'impl':>7} {'fwd TF':>7} {'bwd TF':>7} {'spread':>7}")
    for d in (int(x) for x in a.dims.split(",")):
        hq = 2048 // d
        hkv = max(1, hq // a.gqa)
        for s in (int(x) for x in a.seqs.split(",")):
            b = max(1, 16384 // s)
            q, k, v, do = _inputs(torch, b, hq, hkv, s, d, dtype, d + s)
            for causal in (bool(int(x)) for x in a.causal.split(",")):
                flops = 4.0 * b * hq * s * s * d * (0.5 if causal else 1.0)
                for impl in a.impls:
                    row = dict(D=d, S=s, B=b, Hq=hq, Hkv=hkv, causal=causal, impl=impl)
                    try:
                        fwd, bwd = IMPLS[impl](q, k, v, do, causal, a.dropout)
                        f_s, f_spread = time_calls(cupy, fwd, [()], a.reps, stream)
                        b_s, b_spread = time_calls(cupy, bwd, [()], max(5, a.reps // 2), stream)
                        row.update(fwd_tflops=flops / f_s / 1e12,
                                   bwd_tflops=2.5 * flops / b_s / 1e12,
                                   spread_pct=max(f_spread, b_spread))
                        print(f"{d:>4} {s:>6} {causal!s:>6} {impl:>7} {row['fwd_tflops']:7.0f}"
                              f" {row['bwd_tflops']:7.0f} {row['spread_pct']:6.1f}%", flush=True)
                    except Exception as exc:  # noqa: BLE001 - a peer that cannot run is recorded
                        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                        print(f"{d:>4} {s:>6} {causal!s:>6} {impl:>7}  {row['error']}", flush=True)
                    report["rows"].append(row)
                    if a.json:   # after every row: a run cut off by a time limit keeps its rows
                        Path(a.json).write_text(json.dumps(report, indent=1))
                    torch.cuda.empty_cache()
            del q, k, v, do
            cupy.get_default_memory_pool().free_all_blocks()
    _summary(report["rows"])
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


def _summary(rows) -> None:
    """Per cell: ours over the faster peer (the training issue's targets), and where
    timed, the sm_80 path over FA2 and the deterministic backward over the atomic one."""
    cells = {}
    for r in rows:
        if "error" not in r:
            cells.setdefault((r["D"], r["S"], r["causal"]), {})[r["impl"]] = r

    def ratio(a, b, key):
        return f"{a[key] / b[key]:.2f}" if a and b else "-"

    print(f"\n{'D':>4} {'S':>6} {'causal':>6} {'fwd x best peer':>16} {'bwd x best peer':>16}"
          f" {'mma/FA2 fwd':>12} {'mma/FA2 bwd':>12} {'det/atomic':>11}")
    for (d, s, causal), got in cells.items():
        ours = got.get("ours")
        peers = [r for name, r in got.items() if not name.startswith("ours")]
        best = {k: max(peers, key=lambda r: r[k]) for k in ("fwd_tflops", "bwd_tflops")} \
            if peers else {}
        mma, fa2 = got.get("ours_mma"), got.get("flash2")
        print(f"{d:>4} {s:>6} {causal!s:>6} {ratio(ours, best.get('fwd_tflops'), 'fwd_tflops'):>16}"
              f" {ratio(ours, best.get('bwd_tflops'), 'bwd_tflops'):>16}"
              f" {ratio(mma, fa2, 'fwd_tflops'):>12} {ratio(mma, fa2, 'bwd_tflops'):>12}"
              f" {ratio(got.get('ours_det'), ours, 'bwd_tflops'):>11}")


if __name__ == "__main__":
    sys.exit(main())
