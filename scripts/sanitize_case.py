"""Small launches of every device kernel family, for compute-sanitizer.

    compute-sanitizer --tool memcheck  python3 scripts/sanitize_case.py --no-pool
    compute-sanitizer --tool racecheck python3 scripts/sanitize_case.py

Per forward family: a few small problems that reach the edge paths (a head dim that is not
a multiple of 8, lengths off every tile, causal with Sq > Sk and Sq < Sk, GQA, a
dense mask where the family takes one, a 16-byte-aligned case for the vector
path; for flash_wgmma three consumer warpgroups at D = 64, 72 and 160, two at
128 under the causal mask and at 256, the backward's 80-query tiles at D = 96 without a
mask, its 128-query tiles at D = 64 and its producer warpgroup under a causal mask
with Sq > Sk, and whole query tiles, whose dQ it adds in its own order; keys whose
scores climb steadily or leap, for
flash_wgmma's max-free softmax and the two ways it recovers; and, for flash_wgmma
alone, problems with a few work tiles per block, whose Q rows and work tile
slots change hands between its warpgroups). Inputs come from the
host (NumPy), so nothing but our kernels and CuPy's copies runs on the device. Each
result is checked against the float64 reference; the exit status is 1 if any
result is wrong. Then each backward kernel
(flash_mma, flash), both dQ modes, on the unmasked cases, against the float64
reference backward.

--decode runs attention_decode instead: contiguous caches (on sm_90 through tensor maps),
paged ones, lengths off every tile, forced split counts (the merge), GQA with Sq > 1,
and chunked prefill over gathered pages.

--dropout P runs every case with attention dropout (seed 7, offset 3) on the families
that take it (flash_wgmma, flash_mma; no dense masks), forward and backward, against the
reference with the same mask.

--no-pool turns CuPy's memory pool off (cupy.cuda.set_allocator(None)), so
memcheck sees every allocation's real bounds. --dims 64,256 keeps the cases of those
head dims only (forward and backward), for a quicker run on the kernels a change touched.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

# (B, Hq, Hkv, Sq, Sk, D, causal, mask)
CASES = (
    (1, 2, 1, 67, 131, 59, True, None),
    (2, 4, 2, 130, 67, 64, True, None),
    (1, 2, 2, 33, 200, 128, False, "bool"),
    (1, 3, 1, 17, 45, 8, False, "add"),
    (1, 4, 2, 77, 190, 128, True, None),
    (1, 3, 1, 250, 300, 72, True, None),
    (1, 2, 2, 70, 250, 160, False, None),
    (1, 3, 1, 250, 700, 72, False, "keys-rise"),
    (1, 3, 1, 250, 700, 72, True, "keys-jump"),
    (1, 2, 1, 90, 150, 256, True, None),
    (1, 3, 1, 170, 230, 96, False, None),
    (1, 2, 1, 150, 170, 64, False, None),
    # causal Sq > Sk on the backward's producer warpgroup (64-query tiles, atomic dQ):
    # rows 0..62 attend nothing (racecheck reported this one: notes-bwd-loops.md §20)
    (2, 4, 2, 130, 67, 128, True, None),
    # whole query tiles: the backward's dQ in its own order (flat_dq) at D = 128 and 96
    # under the causal mask (64-query tiles) and at D = 64 (128-query tiles)
    (1, 4, 2, 128, 200, 128, True, None),
    (2, 2, 1, 256, 256, 64, False, None),
    (1, 2, 1, 128, 160, 96, True, None),
    # ... with the query tiles of a block of keys split over 4 blocks (kv_splits)
    (1, 2, 1, 512, 384, 96, False, None),
    (1, 2, 1, 512, 512, 128, True, None),
)
# flash_wgmma is persistent: these give each of up to 132 blocks about three work tiles
PERSISTENT_CASES = (
    (3, 40, 8, 450, 450, 64, True, None),
    (3, 40, 8, 300, 300, 128, False, None),
)
BACKWARD_KERNELS = ("flash_wgmma", "flash_mma", "flash")
DROPOUT_FAMILIES = ("flash_wgmma", "flash_mma")   # the families that take dropout


def dropout_args(p: float):
    """(the kernels' keyword arguments, the reference's ``dropout``) for dropout p with
    --dropout's stream (seed 7, offset 3); nothing where p is 0."""
    if not p:
        return {}, None
    return dict(dropout_p=p, dropout_seed=7, dropout_offset=3), (p, 7, 3)
# attention_decode: (B, Hq, Hkv, Sq, capacity, D, lengths, page size or 0, splits)
DECODE_CASES = (
    (3, 8, 2, 1, 300, 128, (1, 77, 300), 0, None),
    (2, 8, 2, 4, 520, 128, (519, 130), 0, 3),
    (2, 4, 1, 2, 400, 64, (400, 33), 0, 2),
    (1, 4, 4, 1, 700, 256, (650,), 0, 4),
    (2, 8, 2, 1, 300, 128, (299, 64), 16, 2),
    # more than 32 packed rows: the warpgroup tile on sm_90a (use_wgmma)
    (2, 16, 2, 8, 520, 128, (519, 130), 0, 3),
    (2, 32, 8, 16, 300, 64, (299, 64), 16, 2),
    (2, 24, 2, 4, 400, 72, (400, 33), 48, None),
    (2, 16, 2, 8, 400, 128, (400, 33), 16, 2),   # (the producer warpgroup at D = 128)
    # pages of 64 rows: 64-row boxes (page_box), mma.sync and producer tiles
    (2, 8, 2, 1, 300, 128, (299, 64), 64, 2),
    (2, 16, 2, 8, 400, 128, (400, 33), 64, None),
    # ... gathered by cp.async where no tensor map takes the pages (GATHER traits)
    (2, 32, 8, 16, 300, 64, (299, 64), 1, 2),
    (2, 16, 2, 8, 400, 128, (400, 33), 8, None),   # (one block of 128-key tiles)
    # ... by chunk columns (D = 96, 192: chunks that do not divide a warp)
    (2, 16, 2, 8, 400, 96, (400, 33), 1, 2),
    (2, 16, 2, 8, 300, 192, (299, 64), 8, None),
    # ... and rows of 256 bytes without maps: per-row bulk copies, or cp.async in short
    # blocks (row_copies)
    (2, 8, 2, 1, 300, 128, (299, 64), 1, 2),
    (1, 8, 2, 1, 3000, 128, (3000,), 1, 1),
    # chunked prefill (Sq >= 96, a work tile an SM) on flash_wgmma, rows gathered: lanes
    # zero-filling a block's unused chunks (D = 104), lanes past the tile's blocks (D =
    # 136, two consumers of 112 keys, as at D = 160)
    (2, 64, 8, 256, 700, 104, (700, 300), 8, None),
    (2, 64, 8, 256, 700, 136, (700, 300), 1, None),
    (2, 64, 8, 256, 700, 160, (700, 300), 8, None),
)


def host_inputs(rng, dtype, B, Hq, Hkv, Sq, Sk, D):
    import ml_dtypes

    npdt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    q = rng.standard_normal((B, Hq, Sq, D)).astype(npdt)
    k = rng.standard_normal((B, Hkv, Sk, D)).astype(npdt)
    v = rng.standard_normal((B, Hkv, Sk, D)).astype(npdt)
    return q, k, v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-pool", action="store_true", help="disable CuPy's memory pool")
    ap.add_argument("--families", nargs="*", help="default: every family in dispatch.FAMILIES")
    ap.add_argument("--no-backward", action="store_true", help="skip the backward kernels")
    ap.add_argument("--decode", action="store_true", help="attention_decode cases only")
    ap.add_argument("--backward-kernels", nargs="*", default=list(BACKWARD_KERNELS),
                    help=f"default: {' '.join(BACKWARD_KERNELS)}")
    ap.add_argument("--dims", type=lambda s: {int(x) for x in s.split(",")},
                    help="comma-separated head dims: only their cases (default: all)")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="dropout_p of every case, on the families that take it")
    args = ap.parse_args(argv)
    drop, ref_drop = dropout_args(args.dropout)

    import cupy

    if args.no_pool:
        cupy.cuda.set_allocator(None)
        cupy.cuda.set_pinned_memory_allocator(None)

    import cupy_attention as ca
    from cupy_attention import device
    from cupy_attention.dispatch import FAMILIES
    from cupy_attention.problem import validate

    cc = device.compute_capability(cupy.cuda.runtime.getDevice())
    rng = np.random.default_rng(0)
    if args.decode:
        bad = decode_cases(cupy, ca, rng)
        print(f"sanitize_case: {'all results correct' if not bad else f'{bad} wrong results'}")
        return 1 if bad else 0
    bad = 0
    for name in args.families or list(FAMILIES):
        if drop and name not in DROPOUT_FAMILIES:
            continue
        family = FAMILIES[name]
        dtype = "float16" if "float16" in family.dtypes else family.dtypes[0]
        cases = CASES + (PERSISTENT_CASES if name == "flash_wgmma" else ())
        for B, Hq, Hkv, Sq, Sk, D, causal, mask_kind in cases:
            if (args.dims and D not in args.dims) or (drop and mask_kind in ("bool", "add")):
                continue
            q, k, v = host_inputs(rng, dtype, B, Hq, Hkv, Sq, Sk, D)
            mask = None
            if mask_kind == "bool":
                mask = rng.random((B, 1, Sq, Sk)) > 0.3
            elif mask_kind == "add":
                mask = rng.standard_normal((Sq, Sk)).astype(np.float32)
            elif mask_kind == "keys-rise":  # x1 to x16 in steps every 37 keys
                k = (k * (1 + np.arange(Sk) // 37 * 15 / (Sk // 37))[:, None]).astype(k.dtype)
            elif mask_kind == "keys-jump":  # scores leap past the exp2 range
                k[:, :, 300:] *= 60
            label = f"{name} B={B} Hq={Hq} Hkv={Hkv} Sq={Sq} Sk={Sk} D={D} {dtype}" \
                    f"{' causal' if causal else ''}" \
                    f"{' ' + mask_kind + ('-mask' if mask is not None else '') if mask_kind else ''}"
            reason = family.check(validate(q, k, v, causal=causal, mask=mask), cc)
            if reason:
                print(f"skip  {label}: {reason}", flush=True)
                continue
            t0 = time.perf_counter()
            dq, dk, dv = (cupy.asarray(x) for x in (q, k, v))
            dm = None if mask is None else cupy.asarray(mask)
            out, lse = ca.attention(dq, dk, dv, causal=causal, mask=dm, return_lse=True,
                                    kernel=name, **drop)
            cupy.cuda.Device().synchronize()
            ref, ref_lse = ca.attention_reference(q, k, v, causal=causal, mask=mask,
                                                  dropout=ref_drop)
            got = cupy.asnumpy(out).astype(np.float64)
            err = float(np.abs(got - ref).max()) if got.size else 0.0
            ok = bool(np.isfinite(got).all()) and err < (2e-2 if dtype != "float32" else 1e-4)
            lse_fin = np.isfinite(ref_lse)
            got_lse = cupy.asnumpy(lse)
            ok = ok and np.array_equal(np.isfinite(got_lse), lse_fin) and (
                not lse_fin.any() or float(np.abs(got_lse[lse_fin] - ref_lse[lse_fin]).max()) < 1e-3)
            bad += not ok
            print(f"{'ok   ' if ok else 'WRONG'} {label}: max err {err:.2e} "
                  f"({time.perf_counter() - t0:.1f}s)", flush=True)
    if not args.no_backward:
        bad += backward_cases(cupy, ca, rng, args.backward_kernels, args.dims, args.dropout)
    print(f"sanitize_case: {'all results correct' if not bad else f'{bad} wrong results'}")
    return 1 if bad else 0


def decode_cases(cupy, ca, rng) -> int:
    """attention_decode on DECODE_CASES (bf16) against the float64 reference; cache
    rows past each length hold NaN, so a read of one shows; returns the wrong count."""
    from cupy_attention.reference import attention_decode_reference

    bad = 0
    for B, Hq, Hkv, Sq, cap, D, lengths, page, splits in DECODE_CASES:
        q, k, v = (x.transpose(0, 2, 1, 3) for x in host_inputs(rng, "bfloat16", B, Hq, Hkv,
                                                                 Sq, cap, D))
        k, v = np.ascontiguousarray(k), np.ascontiguousarray(v)   # [B, cap, Hkv, D]
        for b, n in enumerate(lengths):
            k[b, n:] = np.nan
            v[b, n:] = np.nan
        lens = np.asarray(lengths, dtype=np.int32)
        table = None
        kc, vc = k, v
        if page:   # pages in reverse order
            per = -(-cap // page)
            table = (B * per - 1 - np.arange(B * per, dtype=np.int32)).reshape(B, per)
            kc = np.empty((B * per, page, Hkv, D), k.dtype)
            vc = np.empty_like(kc)
            for b in range(B):
                for j in range(per):
                    rows = slice(j * page, min((j + 1) * page, cap))
                    n = rows.stop - rows.start
                    kc[table[b, j], :n], vc[table[b, j], :n] = k[b, rows], v[b, rows]
                    kc[table[b, j], n:] = vc[table[b, j], n:] = np.nan
        label = (f"decode B={B} Hq={Hq} Hkv={Hkv} Sq={Sq} D={D} lengths={lengths} "
                 f"{'page ' + str(page) if page else 'contiguous'} splits={splits}")
        t0 = time.perf_counter()
        out, lse = ca.attention_decode(
            cupy.asarray(np.ascontiguousarray(q)), cupy.asarray(kc), cupy.asarray(vc),
            cache_seqlens=cupy.asarray(lens), return_lse=True, num_splits=splits,
            block_table=None if table is None else cupy.asarray(table))
        cupy.cuda.Device().synchronize()
        ref, ref_lse = attention_decode_reference(
            q, kc, vc, cache_seqlens=lens, block_table=table)
        got = cupy.asnumpy(out).astype(np.float64)
        err = float(np.abs(got - ref).max())
        fin = np.isfinite(ref_lse)
        got_lse = cupy.asnumpy(lse)
        ok = (bool(np.isfinite(got).all()) and err < 2e-2
              and np.array_equal(np.isfinite(got_lse), fin)
              and float(np.abs(got_lse[fin] - ref_lse[fin]).max()) < 1e-3)
        bad += not ok
        print(f"{'ok   ' if ok else 'WRONG'} {label}: max err {err:.2e} "
              f"({time.perf_counter() - t0:.1f}s)", flush=True)
    return bad


def backward_cases(cupy, ca, rng, kernels=BACKWARD_KERNELS, dims=None, dropout=0.0) -> int:
    """Each backward kernel and dQ mode on the unmasked CASES (of head dims `dims` where
    given; with dropout `dropout` where nonzero, on the kernels that take it); returns
    the wrong count."""
    from cupy_attention.errors import UnsupportedError
    from cupy_attention.reference import attention_backward_reference

    drop, ref_drop = dropout_args(dropout)
    bad = 0
    for B, Hq, Hkv, Sq, Sk, D, causal, mask_kind in CASES:
        if mask_kind or (dims and D not in dims):
            continue
        q, k, v = host_inputs(rng, "float16", B, Hq, Hkv, Sq, Sk, D)
        dout = rng.standard_normal(q.shape).astype(q.dtype)
        ref = attention_backward_reference(dout, q, k, v, causal=causal, dropout=ref_drop)
        dq, dk, dv, dd = (cupy.asarray(x) for x in (q, k, v, dout))
        out, lse = ca.attention(dq, dk, dv, causal=causal, return_lse=True, **drop)
        for kernel in kernels:
            for deterministic in (False, True):
                label = (f"backward {kernel}{' deterministic' if deterministic else ''} B={B} "
                         f"Hq={Hq} Hkv={Hkv} Sq={Sq} Sk={Sk} D={D}{' causal' if causal else ''}")
                try:
                    grads = ca.attention_backward(dd, dq, dk, dv, out, lse, causal=causal,
                                                  deterministic=deterministic, kernel=kernel,
                                                  **drop)
                except UnsupportedError as exc:
                    print(f"skip  {label}: {exc}", flush=True)
                    continue
                cupy.cuda.Device().synchronize()
                errs = [float(np.abs(cupy.asnumpy(g).astype(np.float64) - r).max()) / max(1.0, float(np.abs(r).max()))
                        for g, r in zip(grads, ref)]
                ok = all(np.isfinite(cupy.asnumpy(g).astype(np.float64)).all() for g in grads) and \
                    max(errs) < 3e-2
                bad += not ok
                print(f"{'ok   ' if ok else 'WRONG'} {label}: max relative err {max(errs):.2e}",
                      flush=True)
    return bad


if __name__ == "__main__":
    sys.exit(main())
