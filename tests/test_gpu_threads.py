"""Eight threads calling attention and attention_backward at once, each on its own
stream and all on one shared stream, with different shapes and dtypes: every result
equals the one computed alone (bitwise; the backward in deterministic mode), so the
hot-call cache, the tensor-map cache, the kernel table and the per-stream work
counters hold under concurrent use."""
from __future__ import annotations

import concurrent.futures as cf

import numpy as np
import pytest

import cupy_attention as ca

pytestmark = pytest.mark.gpu

CASES = [  # (B, Hq, Hkv, Sq, Sk, D, dtype, causal)
    (2, 4, 2, 300, 300, 64, "float16", True),
    (1, 8, 8, 257, 511, 128, "bfloat16", False),
    (2, 4, 1, 128, 128, 80, "float16", True),
    (1, 2, 2, 1000, 1000, 256, "bfloat16", True),
    (3, 4, 4, 64, 200, 72, "float16", False),
    (1, 16, 4, 1, 777, 128, "bfloat16", True),
    (2, 2, 2, 513, 513, 96, "float32", True),
    (1, 4, 2, 2048, 2048, 128, "float16", True),
]


def _inputs(cupy, case, seed):
    B, Hq, Hkv, Sq, Sk, D, dtype, _ = case
    rng = cupy.random.default_rng(seed)
    def mk(*shape):
        return rng.standard_normal(shape, dtype=cupy.float32).astype(dtype)
    return mk(B, Hq, Sq, D), mk(B, Hkv, Sk, D), mk(B, Hkv, Sk, D), mk(B, Hq, Sq, D)


def _work(cupy, case, seed, stream, reps=3):
    causal = case[-1]
    with stream:
        q, k, v, dout = _inputs(cupy, case, seed)
        results = []
        for _ in range(reps):
            out, lse = ca.attention(q, k, v, causal=causal, return_lse=True)
            grads = ca.attention_backward(dout, q, k, v, out, lse, causal=causal,
                                          deterministic=True)
            results.append([x.get() for x in (out, lse, *grads)])
        stream.synchronize()
    return results


@pytest.mark.parametrize("shared", [False, True], ids=["own-streams", "shared-stream"])
def test_eight_threads_agree_with_serial_runs(shared):
    import cupy

    alone = [_work(cupy, c, i, cupy.cuda.Stream(non_blocking=True), reps=1)[0]
             for i, c in enumerate(CASES)]
    one = cupy.cuda.Stream(non_blocking=True)
    streams = [one if shared else cupy.cuda.Stream(non_blocking=True) for _ in CASES]
    with cf.ThreadPoolExecutor(len(CASES)) as pool:
        futures = [pool.submit(_work, cupy, c, i, s) for i, (c, s) in enumerate(zip(CASES, streams))]
        together = [f.result() for f in futures]
    for case, ref, runs in zip(CASES, alone, together):
        for run in runs:
            for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), run, ref):
                assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), (case, name)


@pytest.mark.parametrize("kind", ["cupy", "torch"])
def test_hot_calls_from_a_fresh_thread(kind):
    """A thread that made no CUDA call yet (torch's autograd worker is one) takes the
    hot paths of the forward and the backward: the launch finds its device's context
    current, and the results equal the calling thread's."""
    import threading

    import cupy

    torch = pytest.importorskip("torch") if kind == "torch" else None
    rng = np.random.default_rng(3)

    def arr(h):
        a = rng.standard_normal((1, h, 64, 64)).astype(np.float16)
        return torch.from_numpy(a).cuda() if torch is not None else cupy.asarray(a)

    q, k, v, dout = arr(4), arr(2), arr(2), arr(4)

    def step():
        out, lse = ca.attention(q, k, v, causal=True, return_lse=True)
        grads = ca.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
        if torch is not None:
            torch.cuda.synchronize()
            return [x.cpu().numpy() for x in (out, *grads)]
        return [x.get() for x in (out, *grads)]

    want = step()
    step()                                   # the hot entries exist now
    got, errors = [], []

    def worker():
        try:
            got.extend(step())
        except Exception as exc:            # reported below, with its type
            errors.append(exc)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert not errors, errors
    for a, b in zip(got, want):
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16))
