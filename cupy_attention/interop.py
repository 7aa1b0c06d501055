"""Array interop: CuPy, torch (zero-copy through DLPack), NumPy, other producers.

:func:`adapt` turns the caller's arrays into CuPy views (no copies for device
arrays) and records what to give back: the same array kind as ``q``, on the
stream the caller is using (torch's current stream for torch inputs, CuPy's
current stream otherwise). NumPy inputs are copied to the current device and the
results copied back: convenient for scripting, not for speed.
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
        ptr = torch.cuda.current_stream(dev).cuda_stream
        stream = cupy.cuda.ExternalStream(ptr, dev)
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
