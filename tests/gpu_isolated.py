"""GPU checks that could leave the CUDA context unusable if a kernel is wrong, run in
a child process by test_gpu_edges.py::test_isolated (a fault here costs these
checks, not the rest of the session).

    python tests/gpu_isolated.py FAMILY [FAMILY ...]

prints one JSON line per (family, check): {"family", "check", "status": "ok" |
"fail" | "skip", "detail"}.

misaligned  q, k, v and out whose base pointers are one element past a 16-byte boundary
            and whose rows are an odd number of elements apart (TESTING.md 7: never a
            misaligned-address fault).
offsets64   q, k, v and out as strided views of one 4.3 GB float16 allocation, placed
            so that batch, head or row offsets exceed 2^31 elements (TESTING.md 8:
            64-bit offsets, never silent wrap-around). Everything outside the views
            is NaN, so a wrapped offset reads NaN into the result.
"""

from __future__ import annotations

import json
import sys
import traceback

import numpy as np


def _run_checked(name, q, k, v, out, dtype, causal):
    import cupy

    import cupy_attention as ca
    from helpers import as_float, check_attention, plain_attention

    lse = cupy.full(out.shape[:3], np.nan, dtype=cupy.float32)
    res, res_lse = ca.attention(q, k, v, causal=causal, out=out, lse_out=lse, return_lse=True,
                                kernel=name)
    assert res is out
    cupy.cuda.Device().synchronize()
    qc, kc, vc = (x.copy() for x in (q, k, v))
    ref, ref_lse = plain_attention(qc, kc, vc, causal=causal)
    same, same_lse = plain_attention(qc, kc, vc, causal=causal, precision=dtype)
    check_attention(as_float(out), ref, same, dtype, lse=res_lse.astype(cupy.float64),
                    ref_lse=ref_lse, same_lse=same_lse)


def check_misaligned(name):
    import cupy

    from cupy_attention.dispatch import FAMILIES
    from helpers import fill, nan_array, normal, problem_for

    family = FAMILIES[name]
    dtype = "float16" if "float16" in family.dtypes else family.dtypes[0]
    for D, causal in ((64, False), (59, True)):
        B, Hq, Hkv, Sq, Sk = 2, 4, 2, 77, 130
        p = problem_for(batch=B, heads_q=Hq, heads_kv=Hkv, seqlen_q=Sq, seqlen_k=Sk,
                        head_dim=D, dtype=dtype, causal=causal)
        reason = family.check(p, None)
        if reason:
            return "skip", reason
        views = []
        for h, s in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk), (Hq, Sq)):
            base = nan_array((B, h, s, D + 2), dtype, cupy)
            view = base[..., 1:D + 1]                     # one element in, odd row stride
            assert view.data.ptr % 16 != 0
            views.append(view)
        q, k, v, out = views
        for i, x in enumerate((q, k, v)):
            fill(x, normal(cupy, 70 + 3 * D + i, x.shape), dtype)
        _run_checked(name, q, k, v, out, dtype, causal)
    return "ok", "D=64 and D=59 with base pointers one element off 16-byte alignment"


def check_offsets64(name, big=2**31):
    import cupy
    from cupy.lib.stride_tricks import as_strided

    from cupy_attention.dispatch import FAMILIES
    from helpers import fill, nan_array, normal, problem_for

    family = FAMILIES[name]
    if "float16" not in family.dtypes:
        return "skip", f"{name} takes no float16"
    B, Hq, Hkv, Sq, Sk, D = 2, 2, 1, 40, 33, 64
    p = problem_for(batch=B, heads_q=Hq, heads_kv=Hkv, seqlen_q=Sq, seqlen_k=Sk, head_dim=D,
                    dtype="float16")
    reason = family.check(p, None)
    if reason:
        return "skip", reason
    n = big + 2**22
    need = 2 * n + 2**28
    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < need:
        return "skip", f"needs {need / 2**30:.1f} GiB free, device has {free / 2**30:.1f}"
    buf = nan_array((n,), "float16", cupy)
    e = buf.itemsize

    def view(offset, heads, rows, strides):
        """A [B, heads, rows, D] view at element ``offset`` with element ``strides``."""
        x = as_strided(buf[offset:], shape=(B, heads, rows, D), strides=tuple(s * e for s in strides))
        last = offset + sum((d - 1) * st for d, st in zip(x.shape, strides))
        return x, last

    # (batch, head, row, col) strides in elements. Everything but k's rows 1..31 lies
    # below 2^17 or just past `big`; k's rows are big/32 apart, so nothing overlaps.
    q, q_end = view(0, Hq, Sq, (big, 2**12, D, 1))                  # q[1] starts at big
    k, k_end = view(2**14, Hkv, Sk, (2**13, 2**12, big // 32, 1))   # k row 32 past big
    v, v_end = view(2**15 + 2**14, Hkv, Sk, (big, 2**12, D, 1))    # v[1] past big
    out, o_end = view(2**16, Hq, Sq, (big, 2**12, D, 1))            # out[1] past big
    top = max(q_end, k_end, v_end, o_end)
    assert big < min(q_end, k_end, v_end, o_end) and top < n and big // 32 > 2**17
    for i, x in enumerate((q, k, v)):
        fill(x, normal(cupy, 80 + i, x.shape), "float16")
    _run_checked(name, q, k, v, out, "float16", causal=False)
    return "ok", f"q/k/v/out element offsets up to {top} (2^31 = {2**31})"


CHECKS = {"misaligned": check_misaligned, "offsets64": check_offsets64}


def main(names):
    for name in names:
        for check, fn in CHECKS.items():
            try:
                status, detail = fn(name)
            except Exception as exc:  # report and go on: the next check may still run
                status = "fail"
                detail = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
            print(json.dumps(dict(family=name, check=check, status=status, detail=detail)),
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
