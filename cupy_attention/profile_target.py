"""The process ``cupy-attention profile`` runs under Nsight Compute.

    python -m cupy_attention.profile_target --shape B,Hq,Hkv,Sq,Sk,D [--dtype bf16]
        [--causal] [--kernel auto] [--repeats 3]

Makes the inputs, runs the problem twice to compile and warm up, then runs it
``--repeats`` times between ``cudaProfilerStart`` and ``cudaProfilerStop`` (ncu
runs with ``--profile-from-start off``, so only those launches are profiled) inside
an NVTX range ``cupy_attention.profile``. Prints nothing on stdout (ncu's CSV goes
there); one JSON line on stderr with the problem it ran.
"""

from __future__ import annotations

import argparse
import json
import sys


def parse(argv=None) -> argparse.Namespace:
    from .tune import add_shape_arguments

    p = argparse.ArgumentParser(prog="python -m cupy_attention.profile_target")
    add_shape_arguments(p, repeat=False)
    p.add_argument("--kernel", default="auto")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    if args.shape is None:
        p.error("--shape is required")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    from . import bench, device
    import cupy_attention as ca

    device.require_device()
    cupy = device.require_cupy()
    b, hq, hkv, sq, sk, d = args.shape
    dtype = args.dtypes[0]
    causal = args.causal in ("on", "both")
    q = bench.cupy_randn(cupy, (b, hq, sq, d), dtype)
    k = bench.cupy_randn(cupy, (b, hkv, sk, d), dtype)
    v = bench.cupy_randn(cupy, (b, hkv, sk, d), dtype)
    out = cupy.empty_like(q)
    for _ in range(2):
        ca.attention(q, k, v, causal=causal, kernel=args.kernel, out=out)
    cupy.cuda.Device().synchronize()
    from cupy.cuda import nvtx, runtime

    runtime.profilerStart()
    nvtx.RangePush("cupy_attention.profile")
    for _ in range(args.repeats):
        ca.attention(q, k, v, causal=causal, kernel=args.kernel, out=out)
    cupy.cuda.Device().synchronize()
    nvtx.RangePop()
    runtime.profilerStop()
    print(json.dumps({"shape": list(args.shape), "dtype": dtype, "causal": causal,
                      "kernel": args.kernel, "repeats": args.repeats}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
