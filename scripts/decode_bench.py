#!/usr/bin/env python3
"""Decode throughput: TB/s of K and V read by ``attention_decode``, contiguous and
paged, beside torch SDPA (``cudnn``, ``flash``) on contiguous caches of the same
shapes (the "Decode" anchors of BENCHMARKS.md).

Protocol (BENCHMARKS.md): bf16 by default; inputs random normal; several cache
sets rotate until together they exceed twice the L2 cache, so no call reads a warm
cache; each call's keys and values are counted once (B x cache_seqlens x Hkv x D x
2 bytes x 2); CUDA events around ``--reps`` back-to-back calls on one stream, two
rounds: reported is the time per call of the faster round and the spread
|round1 - round2| / min in percent (a difference smaller than the spread is noise).
Paged caches hold each sequence's pages in shuffled order (``--page-order ordered``:
page i of sequence b at page b x pages_per_seq + i, memory in the contiguous cache's
order, to tell the cost of scattered pages from that of the page lookups). torch's
SDPA runs with ``enable_gqa`` and ``is_causal=False`` (Sq = 1 needs no mask; at Sq > 1 its causal
mask would be aligned top-left, so the row is a timing anchor only) on head-major
[B, Hkv, Sk, D] caches; ours read [B, Sk, Hkv, D] (``--layouts hnd`` adds head-major
views of the same shapes: H100, 2026-11-25, within 3% of the token-major figures;
``--layouts kv`` views of one [pages, 2, page_size, Hkv, D] array, K and V of a page
side by side, the layout FlashInfer's paged decode reads).

    python scripts/decode_bench.py                       # the issue's anchor shapes
    python scripts/decode_bench.py --grid --json decode.json
    python scripts/decode_bench.py --shape 1,32,8,1,32768,128 --pages 0,1,16,64
    python scripts/decode_bench.py --layouts nhd,hnd --no-torch
    python scripts/decode_bench.py --peers fa4,flashinfer --json decode-peers.json
    python scripts/decode_bench.py --prefill --pages 0,16,1 --peers fa4,flashinfer --no-torch

``--prefill``: the chunked-prefill shapes of the README (many query rows against a cached
prefix, causal bottom-right); every row then also reads TFLOPs of the attended scores.

``--peers``: FlashAttention-4's Hopper kernels (``flash_attn.cute``: ``flash_attn_func``
on contiguous [B, Sk, Hkv, D] caches, ``flash_attn_varlen_func`` with ``page_table`` and
``seqused_k`` on paged ones; its split heuristic, ``num_splits=0``, except on sm_90, where
it asserts "SplitKV not supported on SM 9.0" and runs one split) and FlashInfer
(``BatchDecodeWithPagedKVCacheWrapper``, tensor cores, NHD pages [pages, 2, page, Hkv, D];
at Sq > 1 ``BatchPrefillWithPagedKVCacheWrapper``, causal; its plan is made once, outside
the timing; paged only), where installed
(``../shared/tools/peers.md``). Their rows read the same bytes as ours, from caches
allocated the same way; a peer that declines a shape records its error.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cupy_attention as ca  # noqa: E402
from cupy_attention import device  # noqa: E402
from cupy_attention.interop import external_stream  # noqa: E402

# (B, Hq, Hkv, Sq, Sk, D): the shapes of issue 35's anchor table.
ANCHORS = ((1, 32, 8, 1, 32768, 128), (8, 32, 8, 1, 8192, 128), (64, 32, 8, 1, 4096, 128),
           (128, 32, 8, 1, 2048, 128), (8, 32, 8, 4, 8192, 128))
# (B, Hq, Hkv, Sq, Sk, D): chunked prefill, Sq new queries against Sk keys in all (the
# README's table: B x Sq tokens of prompt over caches of 4k-16k keys).
PREFILL = ((4, 32, 8, 256, 4096, 128), (4, 32, 8, 1024, 4096, 128), (1, 32, 8, 2048, 16384, 128),
           (8, 32, 8, 128, 8192, 128), (4, 32, 8, 512, 8192, 64))
MAX_SETS = 8


def grid_shapes():
    out = []
    for b, sk, (hq, hkv), d, sq in itertools.product((1, 8, 64, 256), (1024, 8192, 32768),
                                                     ((32, 8), (32, 32)), (64, 128, 256),
                                                     (1, 4, 16)):
        out.append((b, hq, hkv, sq, sk, d))
    out += [(1, 32, 8, sq, 131072, d) for d in (64, 128, 256) for sq in (1, 4, 16)]
    return out


ORDERED_PAGES = False   # --page-order ordered: every paged table in memory order


def kv_bytes(b, hkv, sk, d) -> int:
    return b * sk * hkv * d * 2 * 2


def causal_flops(b, hq, sq, sk, d) -> int:
    """FLOPs of the attended scores (4 D each: Q K^T and P V) under the causal mask
    aligned bottom-right, query row i seeing keys 0 .. Sk - Sq + i."""
    seen = sum(min(sk, max(0, sk - sq + i + 1)) for i in range(sq))
    return 4 * d * b * hq * seen


def make_set(cupy, rng, shape, page, dtype, layout="nhd"):
    """(q, k_cache, v_cache, block_table, cache_seqlens) for one input set. The caches
    are [B, Sk, Hkv, D] / [pages, page_size, Hkv, D] arrays; with layout "hnd" they
    are views of head-major memory ([B, Hkv, Sk, D], as torch SDPA and Hugging Face
    caches hold it; [pages, Hkv, page_size, D], FlashInfer's HND); with "kv" the two
    halves of one [n, 2, rows, Hkv, D] array (FlashInfer's paged NHD cache)."""
    b, hq, hkv, sq, sk, d = shape
    dt = cupy.float16 if dtype == "float16" else None
    q = _randn(cupy, (b, sq, hq, d), dtype, dt)
    lens = cupy.full((b,), sk, dtype=cupy.int32)
    per = -(-sk // page) if page else 0
    n0, n1 = (b, sk) if page == 0 else (b * per, page)

    def cache():
        if layout == "hnd":
            return _randn(cupy, (n0, hkv, n1, d), dtype, dt).transpose(0, 2, 1, 3)
        return _randn(cupy, (n0, n1, hkv, d), dtype, dt)

    if layout == "kv":
        kv = _randn(cupy, (n0, 2, n1, hkv, d), dtype, dt)
        k, v = kv[:, 0], kv[:, 1]
    else:
        k, v = cache(), cache()
    if page == 0:
        return q, k, v, None, lens
    table = np.arange(b * per) if ORDERED_PAGES else rng.permutation(b * per)
    return q, k, v, cupy.asarray(table.astype(np.int32).reshape(b, per)), lens


def _torch_pages(torch, n):
    """The peers' page ids: shuffled, or in order under --page-order ordered."""
    if ORDERED_PAGES:
        return torch.arange(n, device="cuda", dtype=torch.int32)
    return torch.randperm(n, device="cuda", dtype=torch.int64).to(torch.int32)


def _randn(cupy, shape, dtype, dt):
    x = cupy.random.standard_normal(shape, dtype=cupy.float32)
    if dt is not None:
        return x.astype(dt)
    u = x.view(cupy.uint32)
    bits = ((u + cupy.uint32(0x7FFF) + ((u >> 16) & cupy.uint32(1))) >> 16).astype(cupy.uint16)
    import ml_dtypes

    return bits.view(np.dtype(ml_dtypes.bfloat16))


def time_calls(cupy, fn, sets, reps, stream=None):
    """(seconds per call of the faster round, spread %) of back-to-back calls. A spin
    kernel holds the stream while a round is enqueued, so the events time GPU work,
    not the host's launch overhead."""
    from cupy_attention.bench import _SPIN_SOURCE

    spin = cupy.RawKernel(_SPIN_SOURCE, "spin")
    stream = stream or cupy.cuda.get_current_stream()
    for s in sets:   # warm-up (compiles, plans)
        fn(*s)
    stream.synchronize()
    t0 = time.perf_counter()
    for s in sets:
        fn(*s)
    stream.synchronize()
    host = (time.perf_counter() - t0) / len(sets)   # upper bound per call
    rounds = []
    for _ in range(2):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        spin((1,), (1,), (np.uint64(int(2 * host * reps * 1e9) + 1000),), stream=stream)
        start.record(stream)
        for i in range(reps):
            fn(*sets[i % len(sets)])
        end.record(stream)
        end.synchronize()
        rounds.append(cupy.cuda.get_elapsed_time(start, end) / 1e3 / reps)
    best = min(rounds)
    return best, 100.0 * abs(rounds[0] - rounds[1]) / best


def n_sets(per_set: int, l2: int) -> int:
    """Rotating input sets: enough that together they exceed twice the L2 cache."""
    return min(MAX_SETS, max(1, math.ceil(2 * l2 / per_set)))


def time_torch(torch, fn, sets, reps, per_set):
    """time_calls on torch's current stream, as a result row."""
    cupy = device.require_cupy()
    stream = external_stream(torch.cuda.current_stream().cuda_stream, cupy.cuda.Device().id)
    secs, spread = time_calls(cupy, fn, sets, reps, stream)
    return {"seconds": secs, "spread_pct": spread, "tbps": per_set / secs / 1e12,
            "sets": len(sets)}


def bench_ours(cupy, shape, page, dtype, reps, l2, splits, layout="nhd"):
    b, hq, hkv, sq, sk, d = shape
    rng = np.random.default_rng(0)
    per_set = kv_bytes(b, hkv, sk, d)
    sets = [make_set(cupy, rng, shape, page, dtype, layout) for _ in range(n_sets(per_set, l2))]

    def call(q, k, v, table, lens):
        ca.attention_decode(q, k, v, cache_seqlens=lens, block_table=table, causal=True,
                            num_splits=splits)

    secs, spread = time_calls(cupy, call, sets, reps)
    return {"seconds": secs, "spread_pct": spread, "tbps": per_set / secs / 1e12,
            "sets": len(sets)}


def bench_torch(torch, shape, backend, dtype, reps, l2):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    b, hq, hkv, sq, sk, d = shape
    tdt = getattr(torch, dtype)
    per_set = kv_bytes(b, hkv, sk, d)
    sets = [(torch.randn(b, hq, sq, d, device="cuda", dtype=tdt),
             torch.randn(b, hkv, sk, d, device="cuda", dtype=tdt),
             torch.randn(b, hkv, sk, d, device="cuda", dtype=tdt))
            for _ in range(n_sets(per_set, l2))]
    which = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    with sdpa_kernel(which):
        return time_torch(torch, lambda q, k, v: sdpa(q, k, v, enable_gqa=hq != hkv), sets, reps,
                          per_set)


def _peer_set(torch, shape, page, tdt):
    """(q [B, Sq, Hq, D], k, v, table or None, lens) as torch tensors: [B, Sk, Hkv, D]
    caches, or [pages, page, Hkv, D] with a shuffled page table [B, pages per seq]."""
    b, hq, hkv, sq, sk, d = shape
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=tdt)
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    if not page:
        return (q, torch.randn(b, sk, hkv, d, device="cuda", dtype=tdt),
                torch.randn(b, sk, hkv, d, device="cuda", dtype=tdt), None, lens)
    per = -(-sk // page)
    table = _torch_pages(torch, b * per)
    return (q, torch.randn(b * per, page, hkv, d, device="cuda", dtype=tdt),
            torch.randn(b * per, page, hkv, d, device="cuda", dtype=tdt),
            table.reshape(b, per), lens)


def bench_fa4(torch, shape, page, dtype, reps, l2):
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    b, hq, hkv, sq, sk, d = shape
    per_set = kv_bytes(b, hkv, sk, d)
    sets = [_peer_set(torch, shape, page, getattr(torch, dtype))
            for _ in range(n_sets(per_set, l2))]

    splits = 1 if torch.cuda.get_device_capability()[0] == 9 else 0

    def call(q, k, v, table, lens):
        if table is None:
            return flash_attn_func(q, k, v, causal=True, num_splits=splits)
        return flash_attn_varlen_func(q, k, v, page_table=table, seqused_k=lens,
                                      max_seqlen_q=sq, max_seqlen_k=sk, causal=True,
                                      num_splits=splits)

    with torch.no_grad():
        return time_torch(torch, call, sets, reps, per_set)


def bench_flashinfer(torch, shape, page, dtype, reps, l2):
    import flashinfer

    b, hq, hkv, sq, sk, d = shape
    if not page:
        raise ValueError("FlashInfer's wrappers here read paged caches only")
    tdt = getattr(torch, dtype)
    per_set = kv_bytes(b, hkv, sk, d)
    per = -(-sk // page)
    table = _torch_pages(torch, b * per)
    sets = [(torch.randn(b * sq, hq, d, device="cuda", dtype=tdt),
             torch.randn(b * per, 2, page, hkv, d, device="cuda", dtype=tdt))
            for _ in range(n_sets(per_set, l2))]
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    indptr = torch.arange(0, b * per + 1, per, dtype=torch.int32, device="cuda")
    last = torch.full((b,), sk - (per - 1) * page, dtype=torch.int32, device="cuda")
    if sq == 1:
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                                use_tensor_cores=True)
        wrapper.plan(indptr, table, last, hq, hkv, d, page, q_data_type=tdt,
                     kv_data_type=tdt)
    else:   # chunked prefill: Sq queries a sequence, causal bottom-right
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        qo_indptr = torch.arange(0, b * sq + 1, sq, dtype=torch.int32, device="cuda")
        wrapper.plan(qo_indptr, indptr, table, last, hq, hkv, d, page, causal=True,
                     q_data_type=tdt, kv_data_type=tdt)
    return time_torch(torch, lambda q, cache: wrapper.run(q, cache), sets, reps, per_set)


PEERS = ("fa4", "flashinfer")


def choice_list(choices):
    """An argparse ``type``: a comma-separated list of names from ``choices``."""
    def parse(text: str) -> list:
        names = [x for x in text.split(",") if x]
        unknown = [x for x in names if x not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {list(choices)}")
        return names
    return parse


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", action="store_true", help="the issue's full grid (long)")
    ap.add_argument("--prefill", action="store_true",
                    help="the chunked-prefill shapes (PREFILL) instead of the decode anchors")
    ap.add_argument("--shape", action="append", default=[],
                    help="B,Hq,Hkv,Sq,Sk,D (repeatable)")
    ap.add_argument("--pages", default="0,16,1", help="page sizes, 0 = contiguous")
    ap.add_argument("--layouts", default="nhd",
                    help="cache memory layouts of ours: nhd ([.., Sk, Hkv, D]), hnd "
                         "(head-major views, torch SDPA's own layout), kv (K and V of a "
                         "page side by side, FlashInfer's paged layout)")
    ap.add_argument("--page-order", default="shuffled", choices=("shuffled", "ordered"),
                    help="pages of a sequence in shuffled order (default) or in memory order")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--splits", type=int, default=None, help="force the split count")
    ap.add_argument("--max-gib", type=float, default=24.0,
                    help="skip shapes whose K+V (all rotating sets) exceed this")
    ap.add_argument("--no-torch", action="store_true",
                    help="no torch SDPA rows (the --peers still run through torch)")
    ap.add_argument("--no-tma", action="store_true",
                    help="contiguous caches by cp.async, not tensor maps (the A/B of use_tma)")
    ap.add_argument("--no-wide", action="store_true",
                    help="one-block-per-SM plans keep the two-block tiles (the A/B of "
                         "KEY_WARPS_WIDE)")
    ap.add_argument("--no-wgmma", action="store_true",
                    help="more than 32 packed rows keep the mma.sync tiles (the A/B of "
                         "use_wgmma)")
    ap.add_argument("--no-pdl", action="store_true",
                    help="ordinary launches for the decode and its split merge, not "
                         "programmatic dependents (the A/B of those launches)")
    ap.add_argument("--peers", default="", type=choice_list(PEERS),
                    help="comma-separated: fa4, flashinfer (installed separately; see the "
                         "module docstring)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    global ORDERED_PAGES
    ORDERED_PAGES = a.page_order == "ordered"

    from cupy_attention import jit
    from cupy_attention.families import decode as decode_family

    if a.no_tma:
        decode_family.use_tma = lambda *args: False
    if a.no_wide:
        narrow = decode_family.tile
        decode_family.tile = lambda *args, wide=False, **kw: narrow(*args, **kw)
    if a.no_wgmma:
        decode_family.use_wgmma = lambda *args: False
    if a.no_pdl:
        jit._launch_ex_fn[:] = [None]   # every dependent launch falls back to cuLaunchKernel
    cupy = device.require_cupy()
    dev = cupy.cuda.runtime.getDevice()
    props = cupy.cuda.runtime.getDeviceProperties(dev)
    l2 = int(props["l2CacheSize"])
    torch = None
    if not a.no_torch or a.peers:
        try:
            import torch
        except ImportError:
            torch = None
    shapes = ([tuple(int(x) for x in s.split(",")) for s in a.shape]
              or (grid_shapes() if a.grid else list(PREFILL) if a.prefill else list(ANCHORS)))
    pages = [int(x) for x in a.pages.split(",")]
    from cupy_attention.bench import _git_commit

    commit, dirty = _git_commit()
    report = {"device": device.device_name(dev), "date": datetime.datetime.now(
        datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit, "dirty": dirty,
        "dtype": a.dtype, "reps": a.reps, "l2_bytes": l2, "pdl": not a.no_pdl,
        "page_order": a.page_order,
        "tma": not a.no_tma, "wide": not a.no_wide, "wgmma": not a.no_wgmma,
        "method": "CUDA events around reps back-to-back calls, faster of two rounds; "
                  "K+V bytes read once per call; rotating input sets > 2x L2",
        "rows": []}
    print(f"{report['device']}  commit {commit}{'+dirty' if dirty else ''}  {a.dtype}  "
          f"{report['date']}")
    print(f"{'B':>4} {'Hq':>3} {'Hkv':>3} {'Sq':>3} {'Sk':>7} {'D':>4} {'impl':>18} "
          f"{'TB/s':>6} {'TFLOPs':>7} {'us':>9} {'spread':>7}")
    for shape in shapes:
        b, hq, hkv, sq, sk, d = shape
        if 2 * kv_bytes(b, hkv, sk, d) > a.max_gib * 2**30:
            print(f"{shape}: skipped (K+V over --max-gib)")
            continue
        layouts = a.layouts.split(",")
        impls = [((f"ours page={p}" if p else "ours contig")
                  + ("" if lay == "nhd" else f" {lay}"), "ours", p, lay)
                 for lay in layouts for p in pages]
        if torch is not None:
            if not a.no_torch:
                impls += [(f"torch {bk}", bk, None, "hnd") for bk in ("cudnn", "flash")]
            impls += [((f"{peer} page={p}" if p else f"{peer} contig"), peer, p, "nhd")
                      for peer in a.peers for p in pages]
        for label, impl, page, layout in impls:
            try:
                if impl == "ours":
                    r = bench_ours(cupy, shape, page, a.dtype, a.reps, l2, a.splits, layout)
                elif impl == "fa4":
                    r = bench_fa4(torch, shape, page, a.dtype, a.reps, l2)
                elif impl == "flashinfer":
                    r = bench_flashinfer(torch, shape, page, a.dtype, a.reps, l2)
                else:
                    r = bench_torch(torch, shape, impl, a.dtype, a.reps, l2)
            except Exception as exc:  # an unsupported shape in one backend
                r = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
            if "seconds" in r and impl in ("ours", "fa4", "flashinfer"):
                # (torch's rows run without the mask at Sq > 1: no causal FLOPs)
                r["tflops"] = causal_flops(b, hq, sq, sk, d) / r["seconds"] / 1e12
            row = dict(B=b, Hq=hq, Hkv=hkv, Sq=sq, Sk=sk, D=d, impl=impl, page=page,
                       layout=layout, **r)
            report["rows"].append(row)
            if a.json:  # after every row: a peer's sticky CUDA error ends the process
                Path(a.json).write_text(json.dumps(report, indent=1))
            if "error" in r:
                print(f"{b:>4} {hq:>3} {hkv:>3} {sq:>3} {sk:>7} {d:>4} {label:>18}  {r['error']}")
            else:
                print(f"{b:>4} {hq:>3} {hkv:>3} {sq:>3} {sk:>7} {d:>4} {label:>18} "
                      f"{r['tbps']:6.2f} {r.get('tflops', float('nan')):7.1f} "
                      f"{r['seconds'] * 1e6:9.1f} {r['spread_pct']:6.1f}%")
            cupy.get_default_memory_pool().free_all_blocks()
            if torch is not None:
                torch.cuda.empty_cache()
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
