"""JAX without a GPU: how JAX arrays are recognised and described, the typed errors
they get, kernel="reference" giving JAX arrays back, and cupy_attention.jax's
pieces that need no device: options and trace-time validation, the opaque call
description, result shapes and buffer layout, the custom-call registration and
lowering, and the jax.pure_callback path under jit and grad (reference kernel)."""

from __future__ import annotations

import json

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import cupy_attention as ca  # noqa: E402
import cupy_attention.jax as caj  # noqa: E402
from cupy_attention import interop  # noqa: E402
from cupy_attention.errors import (  # noqa: E402
    AttentionError,
    DeviceMismatchError,
    DTypeError,
    ShapeError,
    UnsupportedError,
)
from cupy_attention.problem import describe  # noqa: E402
from cupy_attention.reference import attention_backward_reference, attention_reference  # noqa: E402


def _arrays(B=1, Hq=4, Hkv=2, Sq=6, Sk=7, D=8, dtype=jnp.float32, layout="bhsd", seed=0):
    rng = np.random.default_rng(seed)
    shape = (lambda h, s: (B, h, s, D)) if layout == "bhsd" else (lambda h, s: (B, s, h, D))
    return tuple(_cpu(rng.standard_normal(shape(h, s)).astype(dtype))
                 for h, s in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk)))


def _cpu(x):
    """A JAX array on the CPU device, also where JAX's default device is a GPU."""
    return jax.device_put(np.asarray(x), jax.devices("cpu")[0])


def _f64(*xs):
    return tuple(np.asarray(x, dtype=np.float64) for x in xs)


@pytest.fixture
def callback_mode(monkeypatch):
    monkeypatch.setenv("CUPY_ATTENTION_JAX_MODE", "callback")


@pytest.fixture
def ffi_mode(monkeypatch):
    if not caj.ffi_available():
        pytest.skip(f"JAX {jax.__version__} has no legacy custom calls through jax.ffi")
    monkeypatch.setenv("CUPY_ATTENTION_JAX_MODE", "ffi")


# eager: recognition, description, errors --------------------------------------

def test_jax_arrays_are_their_own_kind():
    pytest.importorskip("cupy")
    q, _, _ = _arrays()
    assert interop.is_jax(q) and interop.array_kind(q) == "jax"
    assert not interop.is_jax(np.asarray(q))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_describe_jax_array(dtype):
    x = _cpu(np.zeros((2, 3, 5, 8), dtype=jnp.dtype(dtype)))
    info = describe(x, "q")
    assert info.shape == (2, 3, 5, 8) and info.strides == (120, 40, 8, 1)
    assert info.dtype == dtype and info.device == "cpu"
    assert info.itemsize == np.dtype(x.dtype).itemsize


@pytest.mark.parametrize("entry", ["attention", "attention_backward", "attention_decode"])
def test_cpu_jax_array_is_a_typed_error_naming_q(entry):
    q, k, v = _arrays()
    if entry == "attention":
        call = lambda: ca.attention(q, k, v)  # noqa: E731
    elif entry == "attention_backward":
        lse = _cpu(np.zeros((1, 4, 6), np.float32))
        call = lambda: ca.attention_backward(q, q, k, v, q, lse)  # noqa: E731
    else:
        qd, kd, vd = (x.swapaxes(1, 2).astype(jnp.float16) for x in (q[:, :, :1], k, v))
        call = lambda: ca.attention_decode(qd, kd, vd)  # noqa: E731
    with pytest.raises(DeviceMismatchError, match=r"^q is a JAX array on .*cpu.*not on a CUDA GPU"):
        call()


def test_cpu_jax_error_is_catchable_as_the_package_error():
    q, k, v = _arrays()
    with pytest.raises(AttentionError):
        ca.attention(q, k, v, causal=True)
    with pytest.raises(ValueError):
        ca.attention(q, k, v, causal=True)


def test_jax_out_is_refused():
    q, k, v = _arrays()
    with pytest.raises(UnsupportedError, match="out is a JAX array.*immutable"):
        ca.attention(q, k, v, out=_cpu(np.zeros(q.shape, q.dtype)), kernel="reference")


def test_tracer_gets_a_typed_error_pointing_at_the_jax_module():
    q, k, v = _arrays()
    with pytest.raises(UnsupportedError, match="cupy_attention.jax.attention"):
        jax.jit(lambda q: ca.attention(q, k, v))(q)


def test_jax_shape_errors_are_the_usual_ones():
    q, k, v = _arrays()
    with pytest.raises(ShapeError, match="q must have rank 4"):
        ca.attention(q[0], k, v, kernel="reference")
    with pytest.raises(DTypeError, match="share one dtype"):
        ca.attention(q.astype(jnp.float16), k, v, kernel="reference")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reference_kernel_gives_jax_arrays(dtype):
    q, k, v = _arrays(dtype=dtype)
    out, lse = ca.attention(q, k, v, causal=True, return_lse=True, kernel="reference")
    assert isinstance(out, jax.Array) and isinstance(lse, jax.Array)
    assert out.dtype == q.dtype and lse.dtype == jnp.float32 and out.shape == q.shape
    ref, ref_lse = attention_reference(*_f64(q, k, v), causal=True)
    tol = 1e-6 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, atol=tol)
    np.testing.assert_allclose(np.asarray(lse), ref_lse, atol=1e-5)
    grads = ca.attention_backward(out, q, k, v, out, lse, causal=True, kernel="reference")
    assert all(isinstance(g, jax.Array) and g.dtype == q.dtype for g in grads)


# cupy_attention.jax: options, opaque, shapes ------------------------------------

def test_options_are_hashable_and_checked():
    opts = caj._options(True, 0.5, [3, 0], 30, "bshd", "auto", False)
    assert opts == caj.Options(True, 0.5, (3, 0), 30.0, "bshd", "auto", False)
    hash(opts)
    with pytest.raises(UnsupportedError, match="unknown kernel"):
        caj._options(False, None, None, None, "bhsd", "nope", False)
    with pytest.raises(DTypeError, match="deterministic"):
        caj._options(False, None, None, None, "bhsd", "auto", 1)
    with pytest.raises(ShapeError, match="softcap"):
        caj._options(False, None, None, -1.0, "bhsd", "auto", False)
    with pytest.raises(DTypeError, match="window"):
        caj._options(False, None, "wide", None, "bhsd", "auto", False)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_trace_time_validation_and_result_shapes(layout):
    q, k, v = _arrays(layout=layout, dtype=jnp.bfloat16)
    opts = caj._options(False, None, None, None, layout, "auto", False)
    p = caj.problem(q, k, v, opts)
    assert (p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim) == (1, 4, 2, 6, 7, 8)
    o, lse = caj.fwd_result_shapes(q, p)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert lse.shape == (1, 4, 6) and lse.dtype == jnp.float32
    bwd = caj.bwd_result_shapes(q, k, v, p, deterministic=False)
    assert [s.shape for s in bwd] == [q.shape, k.shape, v.shape, (1, 4, 6), (1, 4, 6, 8)]
    assert [s.dtype for s in bwd[:3]] == [q.dtype] * 3
    det = caj.bwd_result_shapes(q, k, v, p, deterministic=True)
    # deterministic: the floats and one turn counter per 64 query rows (ordered dQ)
    assert [s.shape for s in det[3:]] == [(1, 4, 6), (1 * 4 * 6 * 8 + 1 * 4 * 1,)]


def test_trace_time_errors_are_typed_inside_jit(ffi_mode):
    q, k, v = _arrays()
    with pytest.raises(ShapeError, match="multiple of k/v heads"):
        jax.jit(lambda q, k, v: caj.attention(q, k, v))(q[:, :3], k, v)
    with pytest.raises(DTypeError, match="supported dtypes"):
        jax.jit(lambda q, k, v: caj.attention(q, k, v))(*(x.astype(jnp.int32) for x in (q, k, v)))
    with pytest.raises(ShapeError, match="layout"):
        caj.attention(q, k, v, layout="sbhd")


@pytest.mark.parametrize("op", ["fwd", "bwd"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_opaque_round_trip_and_buffer_layout(op, layout):
    q, k, v = _arrays(layout=layout, dtype=jnp.float16)
    opts = caj._options(True, None, (4, 0), 20.0, layout, "auto", False)
    p = caj.problem(q, k, v, opts)
    lse_shape = (1, 4, 6)
    shapes = ((q.shape, k.shape, v.shape) if op == "fwd"
              else (q.shape, q.shape, k.shape, v.shape, q.shape, lse_shape))
    text = caj.encode_opaque(op, p, shapes, opts)
    assert text.isascii()
    spec = caj.decode_opaque(text.encode())
    assert spec == json.loads(text)
    assert spec["op"] == op and spec["dtype"] == "float16" and spec["layout"] == layout
    assert spec["causal"] is True and spec["window"] == [4, 0] and spec["softcap"] == 20.0
    assert spec["scale"] == pytest.approx(1 / np.sqrt(8))
    bufs = caj.buffer_layout(spec)
    f16, f32 = np.dtype(np.float16), np.dtype(np.float32)
    if op == "fwd":
        assert bufs == [(q.shape, f16), (k.shape, f16), (v.shape, f16), (q.shape, f16),
                        (lse_shape, f32)]
    else:
        assert [s for s, _ in bufs] == [q.shape, q.shape, k.shape, v.shape, q.shape, lse_shape,
                                        q.shape, k.shape, v.shape, lse_shape, (1, 4, 6, 8)]
        assert [d for _, d in bufs][5:] == [f32, f16, f16, f16, f32, f32]


def test_opaque_from_elsewhere_is_refused():
    with pytest.raises(ValueError, match="not a cupy_attention custom call"):
        caj.decode_opaque(b'{"op": "gemm"}')


def test_the_callback_never_raises_and_reports_through_check():
    """A failure inside the custom call (here: null buffer pointers) is kept for
    check() instead of escaping into XLA."""
    import ctypes

    caj.check()   # nothing pending
    q, k, v = _arrays()
    opts = caj._options(False, None, None, None, "bhsd", "auto", False)
    opaque = caj.encode_opaque("fwd", caj.problem(q, k, v, opts), (q.shape, k.shape, v.shape),
                               opts).encode()
    buffers = (ctypes.c_void_p * 5)()
    caj._C_CALLBACK(None, buffers, ctypes.c_char_p(opaque), len(opaque), None)
    with pytest.raises(Exception):
        caj.check()
    caj.check()   # forgotten once raised


# cupy_attention.jax: registration and lowering (no device needed) ----------------

def test_registration_is_once_and_lowering_names_our_targets(ffi_mode):
    caj.register()
    caj.register()
    assert caj._registered
    q, k, v = _arrays(dtype=jnp.bfloat16)
    text = jax.jit(lambda q, k, v: caj.attention(q, k, v, causal=True)).lower(q, k, v).as_text()
    assert f"@{caj.FWD_TARGET}(" in text and "api_version = 2" in text
    assert '\\22causal\\22:true' in text
    grad = jax.jit(jax.grad(lambda q, k, v: caj.attention(q, k, v).astype(jnp.float32).sum(),
                            argnums=(0, 1, 2)))
    text = grad.lower(q, k, v).as_text()
    assert f"@{caj.FWD_TARGET}(" in text and f"@{caj.BWD_TARGET}(" in text
    assert "callback" not in text


def test_mode_defaults_to_the_host_callback_without_a_gpu(monkeypatch):
    monkeypatch.delenv("CUPY_ATTENTION_JAX_MODE", raising=False)
    if jax.default_backend() != "gpu":
        assert caj.mode() == "callback"


# cupy_attention.jax through jax.pure_callback (reference kernel, on the host) -------

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_callback_path_forward_under_jit(callback_mode, causal, layout):
    q, k, v = _arrays(layout=layout)
    f = jax.jit(lambda q, k, v: caj.attention(q, k, v, causal=causal, layout=layout,
                                              kernel="reference"))
    out = f(q, k, v)
    ref, _ = attention_reference(*_f64(q, k, v), causal=causal, layout=layout)
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_callback_path_grad_matches_the_reference_backward(callback_mode, causal):
    q, k, v = _arrays(Sq=7, Sk=7)
    w = _cpu(np.random.default_rng(5).standard_normal(q.shape).astype(np.float32))

    def loss(q, k, v):
        return jnp.sum(caj.attention(q, k, v, causal=causal, kernel="reference",
                                     window=(3, 0), softcap=5.0) * w)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    ref = attention_backward_reference(np.asarray(w, np.float64), *_f64(q, k, v), causal=causal,
                                       window=(3, 0), softcap=5.0)
    for g, r in zip(grads, ref):
        assert g.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(g, np.float64), r, atol=2e-6)


def test_callback_path_under_vmap(callback_mode):
    q, k, v = _arrays()
    qs, ks, vs = (jnp.stack([x, x * 0.5]) for x in (q, k, v))
    out = jax.vmap(lambda q, k, v: caj.attention(q, k, v, kernel="reference"))(qs, ks, vs)
    ref, _ = attention_reference(*_f64(q * 0.5, k * 0.5, v * 0.5))
    np.testing.assert_allclose(np.asarray(out[1], np.float64), ref, atol=1e-6)
