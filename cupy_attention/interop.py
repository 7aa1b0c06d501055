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
* other producers go through DLPack or ``__cuda_array_interface__``.

NumPy inputs are copied to the current device and the results copied back:
convenient for scripting, not for speed.
"""

from __future__ import annotations

import dataclasses

from .device import require_cupy
from .errors import DeviceMismatchError, DTypeError

def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "is_cuda")


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

    kind: str          # "cupy" | "torch" | "numpy"
    stream: object     # a cupy Stream / ExternalStream to launch on
    device_id: int
    torch_dtype: object = None  # q's torch dtype (16-bit floats cross DLPack as int16)


def array_kind(x) -> str:
    cupy = require_cupy()
    if isinstance(x, cupy.ndarray):
        return "cupy"
    if _is_torch(x):
        return "torch"
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
        stream = external_stream(torch.cuda.current_stream(dev).cuda_stream, dev)
        return Context("torch", stream, dev, q.dtype)
    if kind == "cupy":
        return Context("cupy", cupy.cuda.get_current_stream(), q.device.id)
    if kind == "numpy":
        dev = cupy.cuda.runtime.getDevice()
        return Context("numpy", cupy.cuda.get_current_stream(), dev)
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
    return arr
