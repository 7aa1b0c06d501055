"""Array plumbing the forward and backward entry points share: the dense mask and
the ALiBi slopes as the kernels read them, and the float64 host copies and casts of
``kernel="reference"``."""

from __future__ import annotations

import numpy as np

from . import device as _device
from .problem import Problem


def device_mask(mc, p: Problem):
    """The user mask as the kernels read it: uint8 or float32, broadcast (stride 0)."""
    if mc is None:
        return None
    cupy = _device.require_cupy()
    if p.mask_kind == "bool":
        mc = mc.view(cupy.uint8)
    elif mc.dtype != cupy.float32:
        mc = mc.astype(cupy.float32)
    return cupy.broadcast_to(mc, (p.batch, p.heads_q, p.seqlen_q, p.seqlen_k))


def slopes_view(alibi_slopes, ctx):
    """ALiBi slopes as the kernels read them (a view with ``data.ptr``, ``strides``,
    ``ndim``), or None; validated already (problem.check_alibi)."""
    if alibi_slopes is None:
        return None
    from . import interop

    if interop.array_kind(alibi_slopes) == "torch":
        return interop.torch_view(alibi_slopes, "alibi_slopes", ctx)
    return interop.to_cupy(alibi_slopes, "alibi_slopes", ctx)


def host64(x):
    """A float64 NumPy copy of any supported array."""
    if x is None:
        return None
    if type(x).__module__.startswith("torch"):
        x = x.detach()
        return (x.cpu().numpy() if str(x.dtype) == "torch.bool"
                else x.to(dtype=__import__("torch").float64).cpu().numpy())
    if type(x).__module__.startswith("cupy"):
        x = x.get()
    x = np.asarray(x)
    return x if x.dtype == np.bool_ else x.astype(np.float64)


def like(x64, proto, kind, float32=False):
    """Cast a float64 host result to ``proto``'s dtype and array kind."""
    if kind == "torch":
        import torch

        t = torch.from_numpy(np.ascontiguousarray(x64))
        dtype = torch.float32 if float32 else proto.dtype
        return t.to(device=proto.device, dtype=dtype)
    dtype = np.float32 if float32 else proto.dtype
    if kind == "jax":
        import jax

        from .interop import jax_device

        return jax.device_put(x64.astype(dtype), jax_device(proto, "q"))
    if kind == "cupy":
        cupy = _device.require_cupy()
        return cupy.asarray(x64.astype(dtype))
    return x64.astype(dtype)
