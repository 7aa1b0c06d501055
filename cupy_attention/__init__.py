"""cupy_attention: FlashAttention-class attention kernels compiled at run time.

    >>> import cupy_attention as ca
    >>> out = ca.attention(q, k, v, causal=True)

See :func:`attention` for the arguments, :func:`kernels` for the kernel ladder.
"""

__version__ = "0.1.0"

from .api import attention  # noqa: E402
from .errors import (  # noqa: E402
    AttentionError,
    CompileError,
    DeviceMismatchError,
    DriverError,
    DTypeError,
    LayoutError,
    NoDeviceError,
    OutOfMemoryError,
    ShapeError,
    UnsupportedError,
)

# The other entry points load on first use (PEP 562): ``import cupy_attention`` and a
# first ``attention`` call import nothing of the backward, decode, varlen or reference
# code (start-up time, docs/reliability.md).
_LAZY = {
    "attention_backward": "backward",
    "append_kv": "decode",
    "attention_decode": "decode",
    "merge_attention_states": "decode",
    "merge_attention_states_many": "decode",
    "attention_reference": "reference",
    "attention_varlen": "varlen",
    "attention_varlen_backward": "varlen",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def kernels() -> dict:
    """Kernel name -> (summary, head-dim range, dtypes, extra memory)."""
    from .dispatch import FAMILIES

    table = {name: (f.summary, f.head_dim_range(), f.dtypes, f.memory) for name, f in FAMILIES.items()}
    table["reference"] = ("float64 NumPy on the host (the CPU baseline)", "any",
                          ("float32", "float16", "bfloat16"), "O(S^2) host")
    return table


__all__ = [
    "append_kv", "attention", "attention_backward", "attention_decode", "attention_varlen",
    "attention_varlen_backward", "merge_attention_states",
    "merge_attention_states_many", "attention_reference", "kernels", "AttentionError", "OutOfMemoryError",
    "CompileError", "DeviceMismatchError", "DriverError", "DTypeError", "LayoutError", "NoDeviceError",
    "ShapeError", "UnsupportedError", "__version__",
]
