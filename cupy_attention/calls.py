"""Call plumbing the entry points share (api, backward, varlen, decode): choosing a
backward family for a device, allocating results where CUDA-graph capture allows,
and the signature-keyed hot-call cache.

Nothing here validates: callers pass a validated :class:`~cupy_attention.problem.Problem`.
"""

from __future__ import annotations

from . import device as _device
from . import interop
from .dispatch import BackwardFamily, choose_backward


def backward_family(p, kernel: str, device_id: int) -> BackwardFamily:
    """The backward family that runs ``p`` on ``device_id`` (dispatch.choose_backward
    with the device's compute capability and shared-memory limit)."""
    return choose_backward(p, kernel, _device.compute_capability(device_id),
                           _device.max_shared_per_block(device_id))


def allocator(ctx, q):
    """``alloc(shape, cupy dtype, zero)`` -> a CuPy array on ``ctx``'s device. With torch
    tensors the memory comes from torch's caching allocator (viewed through DLPack),
    which CUDA-graph capture understands; CuPy's pool may call cudaMalloc, which a
    capturing stream refuses."""
    cupy = _device.require_cupy()
    if ctx.kind != "torch":
        return lambda shape, dtype, zero: (cupy.zeros if zero else cupy.empty)(shape, dtype=dtype)
    import torch

    def alloc(shape, dtype, zero):
        tdtype = ctx.torch_dtype if cupy.dtype(dtype).itemsize == 2 else torch.float32
        t = (torch.zeros if zero else torch.empty)(shape, dtype=tdtype, device=q.device)
        return interop.to_cupy(t, "scratch", ctx)
    return alloc


def torch_ptr(x) -> int:
    """The device address of a torch tensor (0 for None), as hot calls pass it."""
    return 0 if x is None else x.data_ptr()


def cupy_ptr(x) -> int:
    """The device address of a CuPy array (0 for None)."""
    return 0 if x is None else x.data.ptr


def hot_io(kind: str, device_id: int, q, out_shape, lse_shape, want_lse: bool):
    """What a hot call (attention, attention_varlen, attention_decode) needs around its
    launch: ``(stream, out, lse, ptr)`` with the caller's stream (torch's current one,
    from its raw handle), fresh ``out`` like q and float32 ``lse`` (None unless
    ``want_lse``) of q's kind, and ``ptr(x)`` the device address of such an array (0
    for None). None when the current device is not ``device_id`` (the general path
    switches devices)."""
    cupy = _device.require_cupy()
    if not on_device(cupy, device_id):
        return None
    if kind == "torch":
        import torch

        lse = q.new_empty(lse_shape, dtype=torch.float32) if want_lse else None
        return interop.torch_stream(device_id), q.new_empty(out_shape), lse, torch_ptr
    lse = cupy.empty(lse_shape, dtype=cupy.float32) if want_lse else None
    return cupy.cuda.get_current_stream(), cupy.empty(out_shape, dtype=q.dtype), lse, cupy_ptr


def on_device(cupy, device_id: int) -> bool:
    """Whether the calling thread's current device is ``device_id`` (a hot call runs
    there only); then also makes the device's primary context current, which the
    driver-API launches need: a thread whose current device was never set through
    the runtime (torch's autograd worker, which skips setting a device that is
    already current) has none yet."""
    if cupy.cuda.runtime.getDevice() != device_id:
        return False
    cupy.cuda.runtime.setDevice(device_id)
    return True


def array_signature(arrays) -> tuple | None:
    """What a hot call's key holds of its arrays: (type, shape, strides, dtype, device)
    of each (None stays None), when they are all CUDA torch tensors or all CuPy arrays;
    None otherwise (host arrays, mixed kinds, other producers: the general path)."""
    kind = next((x for x in arrays if x is not None), None)
    out = []
    if is_torch_type(kind):
        for x in arrays:
            if x is None:
                out.append(None)
                continue
            device = x.get_device() if is_torch_type(x) else -1   # int; -1: the CPU
            if device < 0:
                return None
            out.append((type(x), x.shape, x.stride(), x.dtype, device))
    elif type(kind).__module__.startswith("cupy"):
        for x in arrays:
            if x is None:
                out.append(None)
                continue
            if not type(x).__module__.startswith("cupy"):
                return None
            out.append((type(x), x.shape, x.strides, x.dtype, x.device.id))
    else:
        return None
    return tuple(out)


def is_torch_type(x) -> bool:
    """A torch tensor, by its type's module (torch is never imported to ask)."""
    return type(x).__module__.startswith("torch")


class HotCache:
    """Hot calls by signature: a bounded dict (``limit`` entries, then no more are
    kept; a process that sees more shapes runs them on the general path)."""

    def __init__(self, limit: int = 1024):
        self.entries: dict = {}
        self.limit = limit

    def get(self, key):
        return self.entries.get(key) if key is not None else None

    @property
    def full(self) -> bool:
        """No more entries are kept (callers skip preparing one)."""
        return len(self.entries) >= self.limit

    def put(self, key, hot) -> None:
        if key is not None and not self.full:
            self.entries[key] = hot

    def __len__(self) -> int:
        return len(self.entries)
