"""cupy_attention: FlashAttention-class attention kernels compiled at run time.

    >>> import cupy_attention as ca
    >>> out = ca.attention(q, k, v, causal=True)

See :func:`attention` for the arguments, :func:`kernels` for the kernel ladder.
"""

__version__ = "0.1.0"

from .api import attention  # noqa: E402
from .backward import attention_backward  # noqa: E402
from .decode import append_kv, attention_decode  # noqa: E402
from .decode import merge_attention_states, merge_attention_states_many  # noqa: E402
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
from .reference import attention_reference  # noqa: E402
from .varlen import attention_varlen, attention_varlen_backward  # noqa: E402


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
