"""CUDA-graph capture and replay with CuPy arrays, every forward family
(``dispatch.FAMILIES``) and every backward family (``dispatch.BACKWARD_FAMILIES``).

Each test: a warm call on a non-default stream (compiles, fills the hot-call cache,
creates flash_wgmma's tile counter for the stream, leaves CuPy's pool blocks for
that stream), then ``stream.begin_capture()`` / one call / ``end_capture()``, then
two rounds of: new input values copied into the same buffers (device-to-device
copies: nothing is allocated on the capture stream after the capture, so no later
allocation can be handed a block the graph writes), the results poisoned with NaN,
the graph replayed, and the same call made without a graph (into NaN-poisoned
``out=`` buffers) on the same stream. Forward results, and the deterministic
backward's, must be bitwise equal; the atomic backward's gradients within four units
of the dtype's rounding at the gradient's scale (dQ is summed with atomics, and dK
and dV where flash_wgmma's backward splits a block of keys). The forward is also checked against the float64 reference with
TESTING.md's rule.

flash_wgmma is persistent: its blocks claim work tiles from a per-stream counter that
the last claim sets back to 0. Replays interleaved with plain calls on the same
stream (which share the counter), several replays in a row, a long causal problem
(the L2-section tile order), and a capture on a stream that has no counter yet (the
kernel's fixed tile order) check that the counter is reset across replays: a tile
skipped or done twice would leave NaN or differ.

A family that declines a problem on this device is skipped with its reason.
"""
from __future__ import annotations

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention.dispatch import BACKWARD_FAMILIES, FAMILIES

from helpers import (as_float, check_attention, dtype_name, make_out, make_qkv, plain_attention,
                     prewarm_calls, problem_for, seed_for, to_bhsd)

pytestmark = pytest.mark.gpu

FWD_NAMES = list(FAMILIES)
BWD_NAMES = list(BACKWARD_FAMILIES)
D = 128          # one head dim: one instantiation per (family, dtype, causal)
_NAN_BITS = {"float32": 0x7FC00000, "float16": 0x7E00, "bfloat16": 0x7FC0}
_BITS = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16}
_UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def fwd_shape(name):
    """Decode takes a few query rows (GQA packs them); the others a few hundred."""
    if name == "decode":
        return dict(batch=2, heads_q=8, heads_kv=2, seqlen_q=3, seqlen_k=300, head_dim=D,
                    dtype="bfloat16")
    dtype = ("bfloat16" if "bfloat16" in FAMILIES[name].dtypes and name.startswith("flash_")
             else "float32" if name == "flash" else "float16")
    return dict(batch=2, heads_q=4, heads_kv=2, seqlen_q=200, seqlen_k=260, head_dim=D,
                dtype=dtype)


BWD_SHAPE = dict(batch=2, heads_q=4, heads_kv=2, seqlen_q=200, seqlen_k=260, head_dim=D,
                 dtype="bfloat16")
WGMMA_LONG = dict(batch=1, heads_q=8, heads_kv=2, seqlen_q=2048, seqlen_k=2048, head_dim=D,
                  dtype="bfloat16")


def _cc():
    import cupy

    from cupy_attention import device

    return device.compute_capability(cupy.cuda.runtime.getDevice())


def skip_unless_forward(name, shape, causal):
    reason = FAMILIES[name].check(problem_for(causal=causal, **shape), _cc())
    if reason is not None:
        pytest.skip(f"{name}: {reason}")


def skip_unless_backward(name, shape, causal):
    import cupy

    from cupy_attention import device

    smem = device.max_shared_per_block(cupy.cuda.runtime.getDevice())
    reason = BACKWARD_FAMILIES[name].check(problem_for(causal=causal, **shape), _cc(), smem)
    if reason is not None:
        pytest.skip(f"{name} backward: {reason}")


def poison(x) -> None:
    """Fill a result with NaN (a kernel, no allocation)."""
    name = dtype_name(x)
    x.view(_BITS[name]).fill(_NAN_BITS[name])


def copy_into(dst, src, stream) -> None:
    """Device-to-device copy of a contiguous array of the same size (no allocation)."""
    assert dst.nbytes == src.nbytes and dst.flags.c_contiguous and src.flags.c_contiguous
    dst.data.copy_from_device_async(src.data, dst.nbytes, stream)


def bits(x):
    h = x.get()
    return h.view(np.uint8) if h.dtype != np.float32 else h.view(np.uint32)


def assert_bitwise(got, want, what):
    a, b = bits(got), bits(want)
    assert a.shape == b.shape and np.array_equal(a, b), (
        f"{what}: the graph replay differs from the plain call "
        f"({int((a != b).sum())} of {a.size} bytes/words)")


def rounds(shape, tag, n=3):
    """n sets of fresh q, k, v values (contiguous), made before any capture."""
    import cupy

    return [make_qkv(cupy, seed_for("graph", tag, r), **shape)[:3] for r in range(n)]


def _forward_calls():
    """What the module launches, for the parallel prewarm (NaN inputs, out= given)."""
    import cupy

    for name in FWD_NAMES:
        shape = fwd_shape(name)
        for causal in (False, True):
            q, k, v, _ = make_qkv(cupy, 0, values=False, **shape)
            o, l_ = make_out(cupy, batch=shape["batch"], heads_q=shape["heads_q"],
                             seqlen_q=shape["seqlen_q"], head_dim=D, dtype=shape["dtype"],
                             layout="bhsd")
            try:
                ca.attention(q, k, v, causal=causal, out=o.view, lse_out=l_.view, kernel=name)
            except Exception:
                pass
    for causal in (False, True):
        q, k, v, _ = make_qkv(cupy, 0, values=False, **BWD_SHAPE)
        lse = cupy.zeros((2, 4, 200), dtype=cupy.float32)
        for name in BWD_NAMES:
            for det in (False, True):
                try:
                    ca.attention_backward(q, q, k, v, q, lse, causal=causal, kernel=name,
                                          deterministic=det)
                except Exception:
                    pass


@pytest.fixture(scope="module", autouse=True)
def _prewarm():
    prewarm_calls(_forward_calls)


def capture(stream, call):
    """``call()`` captured on ``stream``: (graph, what the call returned)."""
    stream.begin_capture()
    try:
        result = call()
    finally:
        graph = stream.end_capture()
    return graph, result


def forward_graph_rounds(name, shape, causal, stream, *, replays_per_round=1, check_ref=True,
                         warm=True, n_rounds=3):
    """The forward protocol of the module docstring; returns nothing, asserts."""
    import cupy

    dtype = shape["dtype"]
    with stream:
        sets = rounds(shape, (name, causal, shape["seqlen_q"]), n_rounds)
        q, k, v = sets[0]
        eager_out, eager_lse = make_out(cupy, batch=shape["batch"], heads_q=shape["heads_q"],
                                        seqlen_q=shape["seqlen_q"], head_dim=shape["head_dim"],
                                        dtype=dtype, layout="bhsd")

        def call():
            return ca.attention(q, k, v, causal=causal, return_lse=True, kernel=name)

        if warm:
            call()
            stream.synchronize()
        graph, (g_out, g_lse) = capture(stream, call)
        for r in range(1, n_rounds):
            for dst, src in zip((q, k, v), sets[r]):
                copy_into(dst, src, stream)
            for _ in range(replays_per_round):
                poison(g_out)
                poison(g_lse)
                graph.launch(stream)
            poison(eager_out.view)
            poison(eager_lse.view)
            ca.attention(q, k, v, causal=causal, return_lse=True, kernel=name,
                         out=eager_out.view, lse_out=eager_lse.view)
            assert_bitwise(g_out, eager_out.view, f"{name} out, round {r}")
            assert_bitwise(g_lse, eager_lse.view, f"{name} lse, round {r}")
            if check_ref:
                ref, ref_lse = plain_attention(q, k, v, causal=causal)
                same, same_lse = plain_attention(q, k, v, causal=causal, precision=dtype)
                check_attention(as_float(g_out), ref, same, dtype,
                                lse=g_lse.astype(cupy.float64), ref_lse=ref_lse,
                                same_lse=same_lse)
        stream.synchronize()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", FWD_NAMES)
def test_forward_capture_and_replay(name, causal):
    import cupy

    shape = fwd_shape(name)
    skip_unless_forward(name, shape, causal)
    forward_graph_rounds(name, shape, causal, cupy.cuda.Stream(non_blocking=True))


def test_wgmma_counter_survives_many_replays_and_long_causal():
    """Five replays in a row per round, plain calls on the same stream in between,
    at S = 2048 causal (the L2-section tile order)."""
    import cupy

    skip_unless_forward("flash_wgmma", WGMMA_LONG, True)
    forward_graph_rounds("flash_wgmma", WGMMA_LONG, True, cupy.cuda.Stream(non_blocking=True),
                         replays_per_round=5)


def test_wgmma_capture_on_a_stream_without_counter():
    """No call ran on the capture stream before (the kernel was compiled and the hot
    call cached on another stream): the captured launch gets no tile counter and
    takes its tiles in a fixed order; replays equal plain calls bitwise."""
    import cupy

    shape = fwd_shape("flash_wgmma")
    skip_unless_forward("flash_wgmma", shape, True)
    with cupy.cuda.Stream(non_blocking=True) as other:
        q, k, v, _ = make_qkv(cupy, 1, **shape)
        ca.attention(q, k, v, causal=True, return_lse=True, kernel="flash_wgmma")
        other.synchronize()
    forward_graph_rounds("flash_wgmma", shape, True, cupy.cuda.Stream(non_blocking=True),
                         warm=False, check_ref=False)


def _close_in_dtype(got, want, dtype, what):
    """Four units of the dtype's rounding at the result's scale: how far two fp32 sums
    in different orders, each rounded to the dtype, may land apart."""
    g, w = as_float(got), as_float(want)
    assert bool(np.isfinite(g.get()).all()), f"{what}: NaN/Inf in the graph replay"
    scale = float(abs(w).max())
    err = float(abs(g - w).max())
    bound = 4 * _UNIT_ROUNDOFF[dtype] * scale
    assert err <= bound, f"{what}: max|graph - plain| = {err:.3e} > {bound:.3e}"


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic-dq"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", BWD_NAMES)
def test_backward_capture_and_replay(name, causal, deterministic):
    import cupy

    shape = BWD_SHAPE
    skip_unless_backward(name, shape, causal)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        # Every round's inputs, the forward's out and lse included, exist before the
        # capture (a plain forward; this test is about the backward's graph).
        sets = []
        for r, (q_, k_, v_) in enumerate(rounds(shape, ("bwd", name, causal), 3)):
            out_, lse_ = ca.attention(q_, k_, v_, causal=causal, return_lse=True)
            dout_ = make_qkv(cupy, seed_for("graph-dout", name, r), **shape)[0]
            sets.append((q_, k_, v_, out_, lse_, dout_))
        q, k, v, out, lse, dout = (cupy.array(x) for x in sets[0])

        def call():
            return ca.attention_backward(dout, q, k, v, out, lse, causal=causal, kernel=name,
                                         deterministic=deterministic)

        first = call()
        stream.synchronize()
        del first
        graph, grads = capture(stream, call)
        for r in (1, 2):
            for dst, src in zip((q, k, v, out, lse, dout), sets[r]):
                copy_into(dst, src, stream)
            for g in grads:
                poison(g)
            graph.launch(stream)
            plain = call()
            for what, g, p in zip(("dq", "dk", "dv"), grads, plain):
                if deterministic:
                    assert_bitwise(g, p, f"{name} backward {what}, round {r}")
                else:   # dQ summed with atomics; dK, dV too where flash_wgmma splits
                    _close_in_dtype(g, p, shape["dtype"], f"{name} backward {what}, round {r}")
            del plain
        stream.synchronize()


def test_capture_then_replay_on_another_stream():
    """A graph captured on one stream replays on another (ordered after copies made
    there), for the family auto picks on this device."""
    import cupy

    shape = fwd_shape("flash")
    shape = dict(shape, dtype="float16")
    cap, run = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    with cap:
        sets = rounds(shape, "other-stream", 2)
        q, k, v = sets[0]
        ca.attention(q, k, v, causal=True)
        cap.synchronize()
        graph, g_out = capture(cap, lambda: ca.attention(q, k, v, causal=True))
        cap.synchronize()
    with run:
        for dst, src in zip((q, k, v), sets[1]):
            copy_into(dst, src, run)
        poison(g_out)
        graph.launch(run)
        want = ca.attention(q, k, v, causal=True)
        assert_bitwise(g_out, want, "auto out on another stream")
        run.synchronize()
    ref, _ = plain_attention(q, k, v, causal=True)
    same, _ = plain_attention(q, k, v, causal=True, precision="float16")
    check_attention(as_float(to_bhsd(g_out, "bhsd")), ref, same, "float16")
