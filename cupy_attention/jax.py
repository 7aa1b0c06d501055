"""JAX integration: attention usable inside ``jax.jit``, differentiable.

    import cupy_attention.jax as caj
    out = jax.jit(lambda q, k, v: caj.attention(q, k, v, causal=True))(q, k, v)
    dq, dk, dv = jax.grad(lambda q, k, v: caj.attention(q, k, v).sum(), (0, 1, 2))(q, k, v)

How it runs (docs/jax.md):

* On a GPU backend the forward and the backward are XLA custom calls, registered
  from Python: a ``ctypes`` callback with XLA's legacy GPU custom-call signature
  (status-returning, ``custom_call_api_version=2``) ``void fn(CUstream stream,
  void** buffers, const char* opaque, size_t opaque_len, XlaCustomCallStatus*)``,
  registered with ``jax.ffi.register_ffi_target(..., platform="CUDA",
  api_version=0)`` and called with ``jax.ffi.ffi_call(...,
  custom_call_api_version=2, legacy_backend_config=<JSON>)``. XLA allocates every
  result (and the backward's scratch) and hands over device pointers and its own
  stream; the callback wraps the pointers as CuPy arrays (no copy) and launches our
  kernels on that stream, writing straight into XLA's buffers. No host round trip
  and no host synchronisation: the callback only enqueues work. The static problem
  (shapes, dtype, causal, scale, window, softcap, layout, kernel) travels in the
  opaque string as JSON.
* Elsewhere (a CPU backend, or a JAX without ``ffi_call(custom_call_api_version=,
  legacy_backend_config=)``), the same functions go through ``jax.pure_callback``:
  the arrays round-trip through the host (NumPy in, our kernels on the GPU, or
  ``kernel="reference"`` on the host). Correct, not fast.

Errors: shapes, dtypes and options are validated while tracing and raise this
package's typed errors then. The legacy custom-call API cannot hand an error back to
XLA from Python (the status setter is not exported to Python), so an error inside a
running custom call (a kernel failing to compile, out of memory) fills the call's
results with NaN, logs the traceback (logger ``cupy_attention.jax``) and is kept
for :func:`check`, which raises it.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import json
import logging
import os
import threading
from typing import NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from .dispatch import check_kernel_name
from .errors import DTypeError
from .problem import Problem, check_softcap, validate

__all__ = ["attention", "check", "ffi_available", "mode"]

FWD_TARGET = "cupy_attention_fwd"
BWD_TARGET = "cupy_attention_bwd"
OPAQUE_VERSION = 2
_API_VERSION = 2   # XLA's API_VERSION_STATUS_RETURNING (1, the original, is deprecated)

_log = logging.getLogger("cupy_attention.jax")


class Options(NamedTuple):
    """The static (non-array) arguments of one attention call, hashable."""

    causal: bool
    scale: Optional[float]
    window: Optional[Tuple[int, int]]
    softcap: Optional[float]
    layout: str
    kernel: str
    deterministic: bool


# ---------------------------------------------------------------------------
# Trace-time checks: shapes and dtypes only


class _Abstract:
    """Shape, dtype and row-major strides of a traced array: what ``validate`` reads."""

    __module__ = "cupy_attention.jax"

    def __init__(self, shape, dtype):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        strides, step = [], self.dtype.itemsize
        for n in reversed(self.shape):
            strides.append(step)
            step *= max(n, 1)
        self.strides = tuple(reversed(strides))


def problem(q, k, v, opts: Options) -> Problem:
    """The validated problem of a call from its arrays' shapes and dtypes (tracers
    are fine); raises the package's typed errors."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise DTypeError(f"{name} must be a JAX array, got {type(x).__name__}")
    return validate(*(_Abstract(x.shape, x.dtype) for x in (q, k, v)), causal=opts.causal,
                    scale=opts.scale, layout=opts.layout, window=opts.window,
                    softcap=opts.softcap)


def _options(causal, scale, window, softcap, layout, kernel, deterministic) -> Options:
    if not isinstance(deterministic, bool):
        raise DTypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    if not isinstance(kernel, str):
        raise DTypeError(f"kernel must be a string, got {type(kernel).__name__}")
    if kernel != "reference":
        check_kernel_name(kernel)
    if window is not None:
        if isinstance(window, (str, bytes)) or not hasattr(window, "__len__"):
            raise DTypeError(f"window must be a pair (left, right) of ints, got {window!r}")
        window = tuple(window)
    softcap = check_softcap(softcap) or None
    if scale is not None:
        try:
            scale = float(scale)
        except (TypeError, ValueError):
            raise DTypeError(f"scale must be a real number, got {type(scale).__name__}") from None
    return Options(bool(causal) if isinstance(causal, (bool, int)) else causal, scale, window,
                   softcap, layout, kernel, deterministic)


def fwd_result_shapes(q, p: Problem):
    """(out like q, lse float32 [B, Hq, Sq])."""
    return (jax.ShapeDtypeStruct(tuple(q.shape), q.dtype),
            jax.ShapeDtypeStruct((p.batch, p.heads_q, p.seqlen_q), jnp.float32))


def bwd_result_shapes(q, k, v, p: Problem, deterministic: bool):
    """(dq, dk, dv, delta, dq_accum): the gradients and the backward's scratch, all
    allocated by XLA (the scratch results are dropped)."""
    shapes = [jax.ShapeDtypeStruct(tuple(x.shape), x.dtype) for x in (q, k, v)]
    shapes.append(jax.ShapeDtypeStruct((p.batch, p.heads_q, p.seqlen_q), jnp.float32))
    shapes.append(jax.ShapeDtypeStruct(dq_accum_shape(p.batch, p.heads_q, p.seqlen_q,
                                                      p.head_dim, deterministic), jnp.float32))
    return tuple(shapes)


def dq_accum_shape(b: int, h: int, s: int, d: int, deterministic: bool) -> tuple:
    """The dq_accum XLA allocates before the family is known (it is chosen on the
    device at run time): [B, Hq, Sq, D], or in deterministic mode room for any
    family's (dispatch.BackwardFamily.dq_accum_shape: the floats and a turn counter
    per 64 query rows, the smallest tile of the ordered dQ)."""
    if not deterministic:
        return (b, h, s, d)
    return (b * h * s * d + b * h * -(-s // 64),)


# ---------------------------------------------------------------------------
# The opaque string: everything static about a call, as JSON


def encode_opaque(op: str, p: Problem, shapes, opts: Options) -> str:
    """JSON for the custom call's ``backend_config``: the operation ("fwd"/"bwd"),
    the operand shapes in order, the dtype and the resolved options."""
    return json.dumps({
        "version": OPAQUE_VERSION, "op": op, "shapes": [list(map(int, s)) for s in shapes],
        "dtype": p.dtype, "causal": p.causal, "scale": p.scale,
        "window": None if p.window is None else list(p.window),
        "softcap": p.softcap or None, "layout": p.layout, "kernel": opts.kernel,
        "deterministic": opts.deterministic,
    }, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=512)
def decode_opaque(data: bytes) -> dict:
    """The dict :func:`encode_opaque` wrote (cached: one parse per distinct call)."""
    spec = json.loads(data.decode())
    if spec.get("version") != OPAQUE_VERSION or spec.get("op") not in ("fwd", "bwd"):
        raise ValueError(f"not a cupy_attention custom call description: {data[:200]!r}")
    return spec


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _call_options(spec: dict) -> dict:
    return dict(causal=spec["causal"], scale=spec["scale"], layout=spec["layout"],
                window=None if spec["window"] is None else tuple(spec["window"]),
                softcap=spec["softcap"])


def buffer_layout(spec: dict):
    """[(shape, dtype)] of every buffer XLA passes, inputs then results, in order."""
    dt = _np_dtype(spec["dtype"])
    f32 = np.dtype(np.float32)
    shapes = [tuple(s) for s in spec["shapes"]]
    if spec["op"] == "fwd":
        q, k, v = shapes
        b, h, s = _bhs(q, spec["layout"])
        return [(q, dt), (k, dt), (v, dt), (q, dt), ((b, h, s), f32)]
    dout, q, k, v, out, lse = shapes
    b, h, s = _bhs(q, spec["layout"])
    bufs = [(dout, dt), (q, dt), (k, dt), (v, dt), (out, dt), (lse, f32), (q, dt), (k, dt),
            (v, dt), ((b, h, s), f32)]
    bufs.append((dq_accum_shape(b, h, s, q[3], spec["deterministic"]), f32))
    return bufs


def _bhs(q_shape, layout):
    b, x, y, _ = q_shape
    return (b, x, y) if layout == "bhsd" else (b, y, x)


# ---------------------------------------------------------------------------
# The custom call (runs inside XLA's execution, on XLA's stream)

_failures: list = []


def check() -> None:
    """Raise (and forget) the first error a running custom call hit since the last
    check: under ``jax.jit`` such errors cannot reach the caller otherwise (the call's
    results were filled with NaN, and the traceback logged)."""
    if _failures:
        exc = _failures[0]
        _failures.clear()
        raise exc


def _wrap(ptr: int, shape, dtype, device_id: int):
    """A CuPy array over XLA's buffer (XLA owns the memory; nothing is copied)."""
    import cupy

    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return cupy.ndarray(shape, dtype)   # nothing to read or write, nothing allocated
    if not ptr:
        raise ValueError(f"XLA passed a null pointer for a buffer of shape {shape}")
    mem = cupy.cuda.UnownedMemory(ptr, nbytes, None, device_id)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(mem, 0))


def _poison(arr) -> None:
    """Fill a result with NaN (float32/float16/bfloat16 bits)."""
    import cupy

    if arr.size == 0:
        return
    bits = {4: (cupy.uint32, 0x7FC00000), 2: (cupy.uint16, 0x7E00 if arr.dtype == np.float16
                                              else 0x7FC0)}.get(arr.dtype.itemsize)
    if bits is not None:
        arr.view(bits[0]).fill(bits[1])


def run_custom_call(stream: int, pointers, spec: dict) -> None:
    """What the registered callback does, given XLA's stream handle, the buffer
    pointers (inputs then results) and the decoded opaque description."""
    import cupy

    from . import interop

    layout = buffer_layout(spec)
    if len(pointers) != len(layout):
        raise ValueError(f"custom call got {len(pointers)} buffers, expected {len(layout)}")
    live = [p for p in pointers if p]
    device_id = (cupy.cuda.runtime.pointerGetAttributes(live[0]).device if live
                 else cupy.cuda.runtime.getDevice())
    with cupy.cuda.Device(device_id):
        arrays = [_wrap(ptr, shape, dt, device_id) for ptr, (shape, dt) in zip(pointers, layout)]
        s = interop.external_stream(int(stream), device_id)
        with s:
            try:
                if spec["op"] == "fwd":
                    _forward(arrays, spec)
                else:
                    _backward(arrays, spec, s, device_id)
            except BaseException:
                for out in arrays[3 if spec["op"] == "fwd" else 6:]:
                    _poison(out)
                raise


def _forward(arrays, spec) -> None:
    from .api import attention as _attention

    q, k, v, out, lse = arrays
    _attention(q, k, v, out=out, lse_out=lse, return_lse=True, kernel=spec["kernel"],
               **_call_options(spec))


def _backward(arrays, spec, stream, device_id) -> None:
    from . import backward as bw
    from .calls import backward_family
    from . import interop

    dout, q, k, v, out, lse, dq, dk, dv, delta = arrays[:10]
    dq_accum = arrays[10]
    opts = _call_options(spec)
    if spec["kernel"] == "reference":
        grads = bw.attention_backward(dout, q, k, v, out, lse, kernel="reference", **opts)
        for dst, g in zip((dq, dk, dv), grads):
            dst[...] = g
        return
    p = validate(q, k, v, out=out, **opts)
    if p.empty or p.seqlen_k == 0:   # rows attend nothing: zero gradients
        for g in (dq, dk, dv):
            if g.size:
                g.fill(0)
        return
    family = backward_family(p, "auto", device_id)   # as cupy_attention.torch: the fastest backward
    ctx = interop.Context("cupy", stream, device_id)
    bw.launch_into(p, ctx, family, dout, q, k, v, out, lse, None, (dq, dk, dv),
                   (delta, dq_accum), spec["deterministic"])


_CALLBACK_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                  ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


def _callback(stream, buffers, opaque, opaque_len, status):
    """XLA's entry point. Never raises (a ctypes callback cannot): see :func:`check`."""
    try:
        spec = decode_opaque(ctypes.string_at(opaque, opaque_len))
        n = len(buffer_layout(spec))
        run_custom_call(stream or 0, [buffers[i] or 0 for i in range(n)], spec)
    except BaseException as exc:  # noqa: BLE001 - reported through check() and the log
        _failures.append(exc)
        _log.error("cupy_attention custom call failed; its results are NaN "
                   "(cupy_attention.jax.check() raises this error)", exc_info=True)


_C_CALLBACK = _CALLBACK_TYPE(_callback)   # kept alive for as long as XLA may call it
_registered = False
_register_lock = threading.Lock()


def _ffi():
    """``jax.ffi`` (or ``jax.extend.ffi`` on older JAX), or None."""
    mod = getattr(jax, "ffi", None)
    if mod is None:
        try:
            from jax.extend import ffi as mod  # type: ignore[no-redef]
        except ImportError:
            return None
    return mod


def ffi_available() -> bool:
    """Whether this JAX can register and call a legacy custom call from Python:
    ``register_ffi_target(..., api_version=0)`` and ``ffi_call(...,
    custom_call_api_version=, legacy_backend_config=)``."""
    mod = _ffi()
    if mod is None or not hasattr(mod, "register_ffi_target") or not hasattr(mod, "ffi_call"):
        return False
    try:
        params = inspect.signature(mod.ffi_call).parameters
    except (TypeError, ValueError):
        return False
    return "custom_call_api_version" in params and "legacy_backend_config" in params


def capsule():
    """A PyCapsule holding the callback's function pointer (what XLA registers)."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    return new(ctypes.cast(_C_CALLBACK, ctypes.c_void_p).value, None, None)


def register() -> None:
    """Register both targets with XLA for CUDA, once per process."""
    global _registered
    with _register_lock:
        if _registered:
            return
        mod = _ffi()
        for name in (FWD_TARGET, BWD_TARGET):
            mod.register_ffi_target(name, capsule(), platform="CUDA", api_version=0)
        _registered = True


def mode() -> str:
    """"ffi" (XLA custom calls, no host round trip) or "callback" (jax.pure_callback
    through the host). ``CUPY_ATTENTION_JAX_MODE`` forces one; otherwise "ffi" when
    the default backend is a GPU and this JAX supports it."""
    forced = os.environ.get("CUPY_ATTENTION_JAX_MODE", "").strip().lower()
    if forced in ("ffi", "callback"):
        return forced
    return "ffi" if ffi_available() and jax.default_backend() == "gpu" else "callback"


# ---------------------------------------------------------------------------
# The two primitives


def _ffi_call(target, result_shapes, opaque, *args):
    register()
    call = _ffi().ffi_call(target, result_shapes, custom_call_api_version=_API_VERSION,
                           legacy_backend_config=opaque, vmap_method="sequential")
    return call(*args)


def _pure_callback(fn, result_shapes, *args):
    try:
        return jax.pure_callback(fn, result_shapes, *args, vmap_method="sequential")
    except TypeError:   # JAX before vmap_method
        return jax.pure_callback(fn, result_shapes, *args)


def _forward_call(q, k, v, opts: Options):
    p = problem(q, k, v, opts)
    shapes = fwd_result_shapes(q, p)
    if mode() == "ffi":
        opaque = encode_opaque("fwd", p, (q.shape, k.shape, v.shape), opts)
        o, lse = _ffi_call(FWD_TARGET, shapes, opaque, q, k, v)
        return o, lse

    def host(qh, kh, vh):
        from .api import attention as _attention

        o, lse = _attention(np.asarray(qh), np.asarray(kh), np.asarray(vh), return_lse=True,
                            kernel=opts.kernel, causal=p.causal, scale=p.scale,
                            layout=p.layout, window=p.window, softcap=p.softcap or None)
        return np.asarray(o, dtype=shapes[0].dtype), np.asarray(lse, dtype=np.float32)

    o, lse = _pure_callback(host, shapes, q, k, v)
    return o, lse


def _backward_call(dout, q, k, v, out, lse, opts: Options):
    p = problem(q, k, v, opts)
    if mode() == "ffi":
        shapes = bwd_result_shapes(q, k, v, p, opts.deterministic)
        opaque = encode_opaque("bwd", p, (dout.shape, q.shape, k.shape, v.shape, out.shape,
                                          lse.shape), opts)
        res = _ffi_call(BWD_TARGET, shapes, opaque, dout, q, k, v, out, lse)
        return tuple(res[:3])
    shapes = tuple(jax.ShapeDtypeStruct(tuple(x.shape), x.dtype) for x in (q, k, v))

    def host(dh, qh, kh, vh, oh, lh):
        from .backward import attention_backward

        grads = attention_backward(*(np.asarray(x) for x in (dh, qh, kh, vh, oh, lh)),
                                   causal=p.causal, scale=p.scale, layout=p.layout,
                                   window=p.window, softcap=p.softcap or None,
                                   deterministic=opts.deterministic,
                                   kernel="reference" if opts.kernel == "reference" else "auto")
        return tuple(np.asarray(g, dtype=s.dtype) for g, s in zip(grads, shapes))

    return tuple(_pure_callback(host, shapes, dout, q, k, v, out, lse))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _attention(q, k, v, opts):
    return _forward_call(q, k, v, opts)[0]


def _attention_fwd(q, k, v, opts):
    o, lse = _forward_call(q, k, v, opts)
    return o, (q, k, v, o, lse)


def _attention_bwd(opts, residuals, dout):
    q, k, v, o, lse = residuals
    return _backward_call(dout.astype(o.dtype), q, k, v, o, lse, opts)


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(q, k, v, *, causal=False, scale=None, window=None, softcap=None, layout="bhsd",
              deterministic=False, kernel="auto"):
    """:func:`cupy_attention.attention` for JAX: usable inside ``jax.jit``, with a
    ``jax.custom_vjp`` whose backward is :func:`cupy_attention.attention_backward`'s
    kernels (the forward keeps the O(S) log-sum-exp, never the S x S probabilities).

    q [B, Hq, Sq, D] (``layout="bhsd"``) or [B, Sq, Hq, D] (``"bshd"``); k, v with Hkv
    heads (Hq a multiple of Hkv); float32, float16 or bfloat16 on one GPU. ``causal``,
    ``scale``, ``window``, ``softcap`` and ``kernel`` as in
    :func:`cupy_attention.attention` (static Python values: they are traced into the
    custom call); ``deterministic`` as in :func:`cupy_attention.attention_backward`.
    No dense ``mask``. Under ``vmap`` the call runs once per mapped element.

    On a GPU backend this is an XLA custom call (no host round trip); otherwise
    ``jax.pure_callback`` through the host (see the module docstring and
    docs/jax.md). Bad shapes, dtypes or options raise the package's typed errors
    while tracing."""
    opts = _options(causal, scale, window, softcap, layout, kernel, deterministic)
    q, k, v = (x if hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, np.ndarray)
               else jnp.asarray(x) for x in (q, k, v))
    problem(q, k, v, opts)   # typed errors now, at trace time
    return _attention(q, k, v, opts)

