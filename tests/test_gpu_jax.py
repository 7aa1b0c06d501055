"""JAX on the device: JAX arrays in and out of cupy_attention.attention /
attention_backward / attention_decode (zero-copy DLPack, ordered with JAX's
streams), and cupy_attention.jax.attention inside jax.jit and jax.grad (XLA custom
calls), checked against the float64 plain attention with TESTING.md's rule.

Run: python -m pytest -q -m gpu tests/test_gpu_jax.py
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave memory to CuPy too

import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import cupy_attention as ca  # noqa: E402
from cupy_attention.errors import UnsupportedError  # noqa: E402

from helpers import (  # noqa: E402
    as_float,
    check_attention,
    make_qkv,
    plain_attention,
    seed_for,
    to_bhsd,
    tolerance,
)

pytestmark = pytest.mark.gpu

DTYPES = ("bfloat16", "float16")


def _gpu():
    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        devices = []
    if not devices:
        pytest.skip("JAX sees no GPU (install jax[cuda12] or jax[cuda13])")
    return devices[0]


def _inputs(dtype, *, B=2, Hq=4, Hkv=2, Sq=150, Sk=200, D=64, layout="bhsd", seed=0):
    """q, k, v as CuPy arrays (the helpers' deterministic values) and as JAX arrays
    on the GPU holding the same bits."""
    import cupy

    qc, kc, vc, _ = make_qkv(cupy, seed, batch=B, heads_q=Hq, heads_kv=Hkv, seqlen_q=Sq,
                             seqlen_k=Sk, head_dim=D, dtype=dtype, layout=layout)
    dev = _gpu()
    qj, kj, vj = (jax.device_put(cupy.asnumpy(x), dev) for x in (qc, kc, vc))
    return (qc, kc, vc), (qj, kj, vj)


def _cupy(x):
    """A JAX GPU array's values as a CuPy array (through the host: independent of the
    DLPack path under test)."""
    import cupy

    return cupy.asarray(np.asarray(x))


def _check_out(out_j, lse_j, qc, kc, vc, dtype, *, causal, layout):
    ref, ref_lse = plain_attention(qc, kc, vc, causal=causal, layout=layout)
    same, same_lse = plain_attention(qc, kc, vc, causal=causal, layout=layout, precision=dtype)
    out = to_bhsd(as_float(_cupy(out_j)), layout)
    lse = None if lse_j is None else _cupy(lse_j).astype(np.float64)
    check_attention(out, ref, same, dtype, lse=lse, ref_lse=ref_lse, same_lse=same_lse)


def _check_grads(grads_j, dout_c, qc, kc, vc, dtype, *, causal, layout):
    """TESTING.md's rule for gradients (factor 3, plus the dS cancellation floor), as
    tests/test_backward.py applies it, against its independent plain backward."""
    from test_backward import plain_backward

    ref = plain_backward(dout_c, qc, kc, vc, causal=causal, layout=layout)
    same = plain_backward(dout_c, qc, kc, vc, causal=causal, layout=layout, precision=dtype)
    d = qc.shape[-1]
    dp_size = d * float(abs(as_float(dout_c)).max()) * float(abs(as_float(vc)).max())
    cancel = 4 * 2.0 ** -23 * dp_size * float(abs(as_float(kc)).max()) / math.sqrt(d)
    for name, g, r, s in zip(("dq", "dk", "dv"), grads_j, ref, same):
        got = to_bhsd(as_float(_cupy(g)), layout)
        tolerance(got, r, s, dtype, name, factor=3.0, extra=cancel)


# eager: JAX arrays in, JAX arrays out ---------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_eager_forward_jax_in_jax_out(dtype, causal, layout):
    (qc, kc, vc), (q, k, v) = _inputs(dtype, layout=layout,
                                      seed=seed_for("jax-eager", dtype, causal, layout))
    out, lse = ca.attention(q, k, v, causal=causal, layout=layout, return_lse=True)
    assert isinstance(out, jax.Array) and isinstance(lse, jax.Array)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == jnp.float32 and lse.shape == (2, 4, 150)
    assert out.devices() == q.devices()
    _check_out(out, lse, qc, kc, vc, dtype, causal=causal, layout=layout)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_eager_backward_jax_in_jax_out(dtype, causal):
    (qc, kc, vc), (q, k, v) = _inputs(dtype, Sq=130, Sk=130,
                                      seed=seed_for("jax-eager-bwd", dtype, causal))
    out, lse = ca.attention(q, k, v, causal=causal, return_lse=True)
    import cupy

    dout_c, _, _, _ = make_qkv(cupy, seed_for("dout", dtype, causal), batch=2, heads_q=4,
                               heads_kv=4, seqlen_q=130, seqlen_k=130, head_dim=64, dtype=dtype)
    dout = jax.device_put(cupy.asnumpy(dout_c), _gpu())
    grads = ca.attention_backward(dout, q, k, v, out, lse, causal=causal)
    assert all(isinstance(g, jax.Array) for g in grads)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert all(g.dtype == q.dtype for g in grads)
    _check_grads(grads, dout_c, qc, kc, vc, dtype, causal=causal, layout="bhsd")


def test_eager_results_follow_jax_work_without_sync():
    """Inputs made by a JAX computation just before (still running on JAX's stream)
    and results consumed by JAX right after: DLPack's stream exchange orders both
    sides, and an input JAX frees right after the call is not reused under the kernel."""
    dtype = "float16"
    (qc, kc, vc), (q, k, v) = _inputs(dtype, seed=seed_for("jax-order"))
    big = jnp.ones((4096, 4096), jnp.float32)
    for _ in range(3):
        big = big @ big / 4096.0            # queue work ahead of q2 on JAX's stream
    q2 = q + (big[0, 0] - 1.0).astype(q.dtype)   # == q, ready only after the matmuls
    out = ca.attention(q2, k, v)
    del q2
    junk = [jnp.full((2, 4, 150, 64), jnp.nan, q.dtype) for _ in range(4)]  # reuse pressure
    total = (out.astype(jnp.float32) * 2.0).block_until_ready()
    del junk
    _check_out(total / 2.0, None, qc, kc, vc, dtype, causal=False, layout="bhsd")


def test_eager_decode_jax():
    dtype = "bfloat16"
    import cupy

    dev = _gpu()
    qc, kc, vc, _ = make_qkv(cupy, seed_for("jax-decode"), batch=3, heads_q=8, heads_kv=2,
                             seqlen_q=1, seqlen_k=300, head_dim=128, dtype=dtype, layout="bshd")
    q, k, v = (jax.device_put(cupy.asnumpy(x), dev) for x in (qc, kc, vc))
    out = ca.attention_decode(q, k, v, causal=True)
    assert isinstance(out, jax.Array) and out.shape == q.shape and out.dtype == q.dtype
    _check_out(out, None, qc, kc, vc, dtype, causal=True, layout="bshd")
    with pytest.raises(UnsupportedError, match="k_cache is a JAX array"):
        ca.append_kv(k, v, k[:, :1], v[:, :1], cache_seqlens=jnp.zeros(3, jnp.int32))


def test_eager_jax_out_is_refused():
    (_, _, _), (q, k, v) = _inputs("float16", seed=1)
    with pytest.raises(UnsupportedError, match="out is a JAX array"):
        ca.attention(q, k, v, out=jnp.zeros_like(q))


# inside jax.jit ------------------------------------------------------------------

def _caj():
    import cupy_attention.jax as caj

    if caj.mode() != "ffi":
        pytest.skip(f"cupy_attention.jax runs through {caj.mode()!r} here, not XLA custom calls "
                    f"(JAX {jax.__version__}, backend {jax.default_backend()})")
    return caj


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_jit_forward(dtype, causal):
    caj = _caj()
    (qc, kc, vc), (q, k, v) = _inputs(dtype, seed=seed_for("jax-jit", dtype, causal))
    f = jax.jit(lambda q, k, v: caj.attention(q, k, v, causal=causal) * 1.0)
    out = f(q, k, v)
    assert out.dtype == q.dtype and out.shape == q.shape
    caj.check()
    _check_out(out, None, qc, kc, vc, dtype, causal=causal, layout="bhsd")
    again = f(q, k, v)                      # the compiled call, run again
    assert bool(jnp.all(again == out))


def test_jit_forward_lowers_to_our_custom_call():
    caj = _caj()
    (_, _, _), (q, k, v) = _inputs("bfloat16", seed=2)
    text = jax.jit(lambda q, k, v: caj.attention(q, k, v)).lower(q, k, v).as_text()
    assert caj.FWD_TARGET in text and "pure_callback" not in text


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_jit_grad(dtype, causal, deterministic):
    caj = _caj()
    import cupy

    (qc, kc, vc), (q, k, v) = _inputs(dtype, Sq=130, Sk=130, Hkv=2,
                                      seed=seed_for("jax-grad", dtype, causal))
    dout_c, _, _, _ = make_qkv(cupy, seed_for("jax-grad-dout", dtype, causal), batch=2,
                               heads_q=4, heads_kv=4, seqlen_q=130, seqlen_k=130, head_dim=64,
                               dtype=dtype)
    dout = jax.device_put(cupy.asnumpy(dout_c), _gpu())

    def loss(q, k, v):   # d loss / d out == dout
        o = caj.attention(q, k, v, causal=causal, deterministic=deterministic)
        return jnp.sum(o.astype(jnp.float32) * dout.astype(jnp.float32))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    caj.check()
    assert [g.dtype for g in grads] == [q.dtype] * 3
    _check_grads(grads, dout_c, qc, kc, vc, dtype, causal=causal, layout="bhsd")
    if deterministic:
        again = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
        assert all(bool(jnp.all(a == b)) for a, b in zip(grads, again))


def test_jit_matches_eager_bitwise():
    """The custom call and the eager DLPack path run the same kernel on the same bits."""
    caj = _caj()
    (_, _, _), (q, k, v) = _inputs("bfloat16", seed=seed_for("jax-same"))
    eager = ca.attention(q, k, v, causal=True, window=(64, 0), softcap=30.0)
    jitted = jax.jit(lambda q, k, v: caj.attention(q, k, v, causal=True, window=(64, 0),
                                                   softcap=30.0))(q, k, v)
    assert bool(jnp.all(eager == jitted))


def test_jit_bshd_and_value_and_grad():
    caj = _caj()
    (qc, kc, vc), (q, k, v) = _inputs("float16", layout="bshd", Sq=96, Sk=96,
                                      seed=seed_for("jax-bshd"))
    f = jax.jit(jax.value_and_grad(
        lambda q: caj.attention(q, k, v, layout="bshd").astype(jnp.float32).sum()))
    val, dq = f(q)
    caj.check()
    assert dq.shape == q.shape and bool(jnp.isfinite(dq.astype(jnp.float32)).all())
    out = ca.attention(q, k, v, layout="bshd")
    np.testing.assert_allclose(float(val), float(out.astype(jnp.float32).sum()), rtol=1e-3)
