"""Python mirror of ``kernels/common/params.cuh`` (``FwdParams``, ``BwdParams``).

The struct travels to the kernel by value as one NumPy structured scalar (CuPy
passes ``numpy.generic`` arguments by their bytes). Field order, types and
alignment follow the C struct exactly; ``tests/test_params.py`` compiles a probe
that checks every offset with NVRTC.
"""

from __future__ import annotations

import numpy as np

_PTR = np.uint64
_I64 = np.int64
_I32 = np.int32
_F32 = np.float32

FWD_FIELDS = [
    ("q", _PTR), ("k", _PTR), ("v", _PTR), ("o", _PTR), ("lse", _PTR), ("mask", _PTR),
    ("scratch", _PTR),
    ("q_batch_stride", _I64), ("q_head_stride", _I64), ("q_row_stride", _I64),
    ("k_batch_stride", _I64), ("k_head_stride", _I64), ("k_row_stride", _I64),
    ("v_batch_stride", _I64), ("v_head_stride", _I64), ("v_row_stride", _I64),
    ("o_batch_stride", _I64), ("o_head_stride", _I64), ("o_row_stride", _I64),
    ("mask_batch_stride", _I64), ("mask_head_stride", _I64), ("mask_row_stride", _I64),
    ("mask_col_stride", _I64),
    ("lse_batch_stride", _I64), ("lse_head_stride", _I64),
    ("batch", _I32), ("heads_q", _I32), ("heads_kv", _I32), ("group", _I32),
    ("seqlen_q", _I32), ("seqlen_k", _I32), ("head_dim", _I32),
    ("causal_offset", _I32),
    ("scale", _F32), ("scale_log2", _F32),
]

FWD_DTYPE = np.dtype(FWD_FIELDS, align=True)

BWD_FIELDS = [
    ("fwd", FWD_DTYPE),
    ("dout", _PTR), ("dq", _PTR), ("dk", _PTR), ("dv", _PTR), ("dq_accum", _PTR),
    ("delta", _PTR),
    ("dout_batch_stride", _I64), ("dout_head_stride", _I64), ("dout_row_stride", _I64),
    ("dq_batch_stride", _I64), ("dq_head_stride", _I64), ("dq_row_stride", _I64),
    ("dk_batch_stride", _I64), ("dk_head_stride", _I64), ("dk_row_stride", _I64),
    ("dv_batch_stride", _I64), ("dv_head_stride", _I64), ("dv_row_stride", _I64),
]

BWD_DTYPE = np.dtype(BWD_FIELDS, align=True)


def make_struct(dtype: np.dtype, values: dict) -> np.void:
    """A structured scalar of ``dtype``; fields not in ``values`` are zero."""
    rec = np.zeros((), dtype=dtype)
    for key, val in values.items():
        rec[key] = val
    return rec[()]
