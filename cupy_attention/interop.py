"""Array interop: CuPy, torch, NumPy and other DLPack producers.

:func:`context_for` records what to give back: the same array kind as ``q``, on
the stream the caller is using (torch's current stream for torch inputs, CuPy's
current stream otherwise). Device arrays are never copied:

* CuPy arrays are used as they are;
* the forward reads torch tensors in place through their data pointers
  (:func:`torch_view`) and allocates its results with torch, because a DLPack
  round trip per tensor costs more than the whole launch of a short attention;
  the backward and other entry points go through DLPack (:func:`to_cupy`,
  :func:`from_cupy`), zero-copy as well;
* JAX arrays (on a GPU) cross through DLPack both ways (:func:`to_cupy`,
  :func:`from_cupy`), zero-copy, on the stream JAX names for exchanges
  (:func:`jax_stream`): see "JAX" below;
* other producers go through DLPack or ``__cuda_array_interface__``.

JAX: the inputs are produced on JAX's own streams. We run on the stream that the
input's device reports from ``get_stream_for_external_ready_events()`` (CuPy's
current stream where JAX has none) and pass it to JAX's ``__dlpack__(stream=...)``
(``cupy.from_dlpack`` does that with CuPy's current stream): JAX makes that stream
wait for the array to be ready, without blocking the host. Results go back through
``jax.dlpack.from_dlpack``, which asks CuPy's ``__dlpack__`` to order itself with
JAX's stream: we call it inside our stream's context, so CuPy records nothing more
and JAX records its ready event after our kernels on that same stream; JAX never
sees a result before our kernel has finished writing it, and the host never waits.
The CuPy views of the inputs are kept (and with them JAX's buffers) until an event
recorded after the launch has passed (:func:`hold_until_done`), so an input JAX
frees right after the call cannot be reused while the kernel still reads it.
JAX arrays are immutable: they cannot be ``out=`` or an in-place cache.

NumPy inputs are copied to the current device and the results copied back:
convenient for scripting, not for speed.
"""

from __future__ import annotations

import dataclasses

from .device import require_cupy
from .errors import DeviceMismatchError, DTypeError, UnsupportedError

def is_torch(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "is_cuda")


def is_jax(x) -> bool:
    """A concrete ``jax.Array`` (jaxlib's ArrayImpl), not a tracer."""
    return (type(x).__module__.split(".")[0] in ("jax", "jaxlib") and hasattr(x, "devices")
            and not is_jax_tracer(x))


def is_jax_tracer(x) -> bool:
    """A JAX tracer (an argument of a function under ``jax.jit``, ``grad``...)."""
    if not type(x).__module__.startswith("jax"):
        return False
    import jax

    return isinstance(x, jax.core.Tracer)


def jax_device(x, name: str):
    """The one JAX device of ``x``; a typed error for sharded arrays."""
    devices = x.devices()
    if len(devices) != 1:
        raise UnsupportedError(
            f"{name} is a JAX array sharded over {len(devices)} devices; pass single-device "
            "arrays (inside shard_map each shard is one)")
    return next(iter(devices))


def jax_device_id(x, name: str):
    """CUDA ordinal of a JAX GPU array, or "cpu" for any other platform."""
    dev = jax_device(x, name)
    if dev.platform in ("gpu", "cuda"):
        return int(dev.local_hardware_id)
    return "cpu"


def check_jax_call(q, device, **user_arrays) -> None:
    """Before any device work, for JAX ``q``: a typed error for arrays on the CPU
    (``device`` is the validated problem's) and for JAX arrays where we would write
    (``out=``, ``lse_out=``, a cache: JAX arrays are immutable)."""
    if not is_jax(q):
        return
    if device == "cpu":   # None: the caller runs on the host (kernel="reference")
        require_jax_gpu(q, "q")
    for name, x in user_arrays.items():
        if x is not None and is_jax(x):
            raise UnsupportedError(
                f"{name} is a JAX array, and JAX arrays are immutable: nothing can be written "
                f"into one (pass no {name}: results come back as new JAX arrays)")


def _is_numpy(x) -> bool:
    import numpy as np

    return isinstance(x, np.ndarray) or isinstance(x, np.generic)


class DeviceView:
    """Pointer, shape and byte strides of a device tensor read in place (no copy).

    Quacks like the parts of a CuPy array the kernel launchers read
    (``.data.ptr``, ``.shape``, ``.strides``, ``.itemsize``).
    """

    __slots__ = ("ptr", "shape", "strides", "itemsize")

    def __init__(self, ptr: int, shape: tuple, strides: tuple, itemsize: int):
        self.ptr, self.shape, self.strides, self.itemsize = ptr, shape, strides, itemsize

    @property
    def data(self):
        return self


def torch_view(t, name: str, ctx) -> DeviceView:
    """A torch CUDA tensor as a :class:`DeviceView` (its memory, read in place)."""
    if not t.is_cuda:
        raise DeviceMismatchError(f"{name} is a CPU torch tensor while q is on a CUDA device; "
                                  f"move it with {name}.cuda()")
    if t.device.index != ctx.device_id:
        raise DeviceMismatchError(f"{name} is on device {t.device.index} but q is on device "
                                  f"{ctx.device_id}; move all tensors to one device")
    size = t.element_size()
    return DeviceView(t.data_ptr(), tuple(t.shape), tuple(x * size for x in t.stride()), size)


_external_streams: dict = {}


def torch_stream(device_id: int):
    """torch's current stream on ``device_id`` as a CuPy stream (one wrapper per
    handle). The raw handle comes from torch's private ``_cuda_getCurrentRawStream``
    where it exists (a plain int, ~4 us cheaper than building the Stream object that
    ``torch.cuda.current_stream`` returns), else from the public call."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    ptr = raw(device_id) if raw is not None else torch.cuda.current_stream(device_id).cuda_stream
    return external_stream(ptr, device_id)


def external_stream(ptr: int, device_id: int):
    """One CuPy wrapper per foreign stream handle (creating one per call costs ~10 us)."""
    key = (ptr, device_id)
    stream = _external_streams.get(key)
    if stream is None:
        import warnings

        cupy = require_cupy()
        with warnings.catch_warnings():
            # CuPy 14 prefers Stream.from_external(obj with __cuda_stream__); a raw
            # handle works on every version this package supports.
            warnings.simplefilter("ignore", DeprecationWarning)
            stream = _external_streams[key] = cupy.cuda.ExternalStream(ptr, device_id)
    return stream


@dataclasses.dataclass
class Context:
    """How to hand results back to the caller."""

    kind: str          # "cupy" | "torch" | "numpy" | "jax"
    stream: object     # a cupy Stream / ExternalStream to launch on
    device_id: int
    torch_dtype: object = None  # q's torch dtype (16-bit floats cross DLPack as int16)
    keep: list = dataclasses.field(default_factory=list)  # JAX inputs' views (hold_until_done)


def array_kind(x) -> str:
    cupy = require_cupy()
    if isinstance(x, cupy.ndarray):
        return "cupy"
    if is_torch(x):
        return "torch"
    if is_jax(x):
        return "jax"
    if is_jax_tracer(x):
        raise UnsupportedError(
            "got a JAX tracer (an array inside jax.jit, grad or vmap): use "
            "cupy_attention.jax.attention there; cupy_attention.attention takes concrete arrays")
    if _is_numpy(x):
        return "numpy"
    if hasattr(x, "__dlpack__") or hasattr(x, "__cuda_array_interface__"):
        return "dlpack"
    raise DTypeError(
        f"unsupported array type {type(x).__name__}; pass a CuPy array, a torch tensor, "
        "a NumPy array or any DLPack / __cuda_array_interface__ producer"
    )


def context_for(q) -> Context:
    """The result context implied by ``q`` (the first tensor argument)."""
    cupy = require_cupy()
    kind = array_kind(q)
    if kind == "torch":
        import torch

        if not q.is_cuda:
            raise DeviceMismatchError(
                "q is a CPU torch tensor; move the inputs to a CUDA device (q.cuda()) "
                "or pass NumPy arrays"
            )
        dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
        return Context("torch", torch_stream(dev), dev, q.dtype)
    if kind == "cupy":
        return Context("cupy", cupy.cuda.get_current_stream(), q.device.id)
    if kind == "numpy":
        dev = cupy.cuda.runtime.getDevice()
        return Context("numpy", cupy.cuda.get_current_stream(), dev)
    if kind == "jax":
        dev = require_jax_gpu(q, "q")
        return Context("jax", jax_stream(q, dev), dev)
    # Other producers: convert once to learn the device.
    arr = _from_producer(q)
    return Context("cupy", cupy.cuda.get_current_stream(), arr.device.id)


def _from_producer(x):
    cupy = require_cupy()
    if hasattr(x, "__dlpack__"):
        return cupy.from_dlpack(x)
    return cupy.asarray(x)  # __cuda_array_interface__: a view, no copy


def to_cupy(x, name: str, ctx: Context):
    """A CuPy view of ``x`` on ``ctx``'s device (a copy only for NumPy input)."""
    if x is None:
        return None
    cupy = require_cupy()
    kind = array_kind(x)
    if kind == "cupy":
        arr = x
    elif kind == "torch":
        if not x.is_cuda:
            raise DeviceMismatchError(
                f"{name} is a CPU torch tensor while q is on a CUDA device; move it with "
                f"{name}.cuda()"
            )
        x = x.detach()
        if x.element_size() == 2 and x.is_floating_point():
            # The kernels read raw bits: an int16 view crosses DLPack on every CuPy
            # version, bfloat16 only on those built with ml_dtypes support.
            import torch

            x = x.view(torch.int16)
        with ctx.stream:
            arr = cupy.from_dlpack(x)
    elif kind == "numpy":
        with cupy.cuda.Device(ctx.device_id), ctx.stream:
            arr = cupy.asarray(x)
    elif kind == "jax":
        arr = _from_jax(x, name, ctx)
    else:
        with ctx.stream:
            arr = _from_producer(x)
    if arr.device.id != ctx.device_id:
        raise DeviceMismatchError(
            f"{name} is on device {arr.device.id} but q is on device {ctx.device_id}; "
            "move all tensors to one device"
        )
    return arr


def from_cupy(arr, ctx: Context):
    """Hand a CuPy result back as the caller's array kind."""
    if arr is None:
        return None
    if ctx.kind == "torch":
        import torch

        t = torch.from_dlpack(arr)
        if arr.dtype.itemsize == 2 and arr.dtype.kind == "i":
            t = t.view(ctx.torch_dtype)
        return t
    if ctx.kind == "numpy":
        cupy = require_cupy()
        with ctx.stream:
            return cupy.asnumpy(arr, stream=ctx.stream)
    if ctx.kind == "jax":
        return _to_jax(arr, ctx)
    return arr


# ---------------------------------------------------------------------------
# JAX (see the module docstring for the stream protocol)

def require_jax_gpu(x, name: str) -> int:
    """The CUDA ordinal of a JAX array on a GPU, or a typed error naming ``name``."""
    dev = jax_device_id(x, name)
    if dev == "cpu":
        raise DeviceMismatchError(
            f"{name} is a JAX array on {jax_device(x, name)}, not on a CUDA GPU; put it on one "
            f"(jax.device_put({name}, jax.devices('gpu')[0])) or pass kernel='reference'")
    return dev


def jax_stream(x, device_id: int):
    """The CuPy stream to run JAX inputs on: the one JAX's device names for external
    ready events (what ``jax.dlpack.from_dlpack`` hands to producers), else CuPy's
    current stream. DLPack orders the exchange either way."""
    cupy = require_cupy()
    try:
        ptr = jax_device(x, "q").get_stream_for_external_ready_events()
    except Exception:  # older jaxlib, or a platform that has none
        ptr = None
    if not ptr:
        return cupy.cuda.get_current_stream()
    return external_stream(int(ptr), device_id)


def _from_jax(x, name: str, ctx: Context):
    """A zero-copy CuPy view of a JAX GPU array; ``ctx.stream`` waits for it."""
    cupy = require_cupy()
    dev = require_jax_gpu(x, name)
    if dev != ctx.device_id:
        raise DeviceMismatchError(f"{name} is on device {dev} but q is on device "
                                  f"{ctx.device_id}; move all arrays to one device")
    try:
        with cupy.cuda.Device(ctx.device_id), ctx.stream:
            arr = cupy.from_dlpack(x)   # calls x.__dlpack__(stream=<ctx.stream>)
    except (NotImplementedError, BufferError, TypeError) as exc:
        raise UnsupportedError(
            f"{name}: this CuPy ({cupy.__version__}) cannot take a {x.dtype} JAX array through "
            f"DLPack ({exc}); bfloat16 needs CuPy 14 or newer") from exc
    ctx.keep.append(arr)
    return arr


def _to_jax(arr, ctx: Context):
    """A CuPy result as a JAX array (zero-copy); JAX sees it after our kernels."""
    import jax

    cupy = require_cupy()
    with cupy.cuda.Device(ctx.device_id), ctx.stream:
        if ctx.keep:
            hold_until_done(ctx.keep, ctx.stream)
            ctx.keep = []
        try:
            # JAX passes its stream to arr.__dlpack__; CuPy orders it after its current
            # stream, ctx.stream, where the kernels ran (nothing to do when they match)
            return jax.dlpack.from_dlpack(arr)
        except (NotImplementedError, BufferError, TypeError) as exc:
            raise UnsupportedError(
                f"this CuPy ({cupy.__version__}) cannot hand a {arr.dtype} result to JAX through "
                f"DLPack ({exc}); bfloat16 needs CuPy 14 or newer") from exc


_held: list = []


def hold_until_done(objs, stream) -> None:
    """Keep ``objs`` alive until ``stream`` passes an event recorded now: what JAX
    frees is then not reused while our kernels still read it. Finished entries are
    dropped at every call (an event query each, no waiting)."""
    while _held and _held[0][0].done:
        _held.pop(0)
    _held.append((stream.record(), list(objs)))
