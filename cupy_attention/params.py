"""Python mirror of ``kernels/common/params.cuh`` (``FwdParams``, ``BwdParams``).

The struct travels to the kernel by value as one NumPy structured scalar (CuPy
passes ``numpy.generic`` arguments by their bytes). Field order, types and
alignment follow the C struct exactly; ``tests/test_params.py`` compiles a probe
that checks every offset with NVRTC.
"""

from __future__ import annotations

import struct

import numpy as np

_PTR = np.uint64
_I64 = np.int64
_I32 = np.int32
_F32 = np.float32
_U32 = np.uint32

FWD_FIELDS = [
    ("q", _PTR), ("k", _PTR), ("v", _PTR), ("o", _PTR), ("lse", _PTR), ("mask", _PTR),
    ("scratch", _PTR), ("cu_seqlens_q", _PTR), ("cu_seqlens_k", _PTR),
    ("q_batch_stride", _I64), ("q_head_stride", _I64), ("q_row_stride", _I64),
    ("k_batch_stride", _I64), ("k_head_stride", _I64), ("k_row_stride", _I64),
    ("v_batch_stride", _I64), ("v_head_stride", _I64), ("v_row_stride", _I64),
    ("o_batch_stride", _I64), ("o_head_stride", _I64), ("o_row_stride", _I64),
    ("mask_batch_stride", _I64), ("mask_head_stride", _I64), ("mask_row_stride", _I64),
    ("mask_col_stride", _I64),
    ("lse_batch_stride", _I64), ("lse_head_stride", _I64),
    ("batch", _I32), ("heads_q", _I32), ("heads_kv", _I32), ("group", _I32),
    ("seqlen_q", _I32), ("seqlen_k", _I32), ("head_dim", _I32),
    ("band_lo", _I32), ("band_hi", _I32),
    ("scale", _F32), ("scale_log2", _F32), ("scale_log2_lo", _F32),
    ("softcap_scale", _F32), ("softcap_log2", _F32), ("softcap_exp2", _F32),
    ("softcap_neg2", _F32), ("softcap_rlog2", _F32),
    ("alibi_slopes", _PTR), ("alibi_batch_stride", _I64),
    ("dropout_seed_lo", _U32), ("dropout_seed_hi", _U32), ("dropout_offset", _U32),
    ("dropout_threshold", _U32), ("dropout_scale", _F32),
]

FWD_DTYPE = np.dtype(FWD_FIELDS, align=True)

BWD_FIELDS = [
    ("fwd", FWD_DTYPE),
    ("dout", _PTR), ("dq", _PTR), ("dk", _PTR), ("dv", _PTR), ("dq_accum", _PTR),
    ("delta", _PTR), ("dk_accum", _PTR), ("dv_accum", _PTR),
    ("dout_batch_stride", _I64), ("dout_head_stride", _I64), ("dout_row_stride", _I64),
    ("dq_batch_stride", _I64), ("dq_head_stride", _I64), ("dq_row_stride", _I64),
    ("dk_batch_stride", _I64), ("dk_head_stride", _I64), ("dk_row_stride", _I64),
    ("dv_batch_stride", _I64), ("dv_head_stride", _I64), ("dv_row_stride", _I64),
    ("delta_batch_stride", _I64), ("delta_head_stride", _I64),
    ("kv_splits", _I32), ("dq_turn_rows", _I32), ("dq_store_first", _I32), ("dq_rotate", _I32),
]

BWD_DTYPE = np.dtype(BWD_FIELDS, align=True)


class _Packer:
    """Packs a dict into a structured scalar with one ``struct.pack`` call.

    Setting fields one by one on a NumPy record costs about a microsecond each;
    this runs on every launch, so the byte layout (offsets and padding of the
    aligned dtype) is compiled once into a ``struct`` format. Nested structs
    take their value as a structured scalar.
    """

    _CODES = {"u8": "Q", "i8": "q", "i4": "i", "u4": "I", "f4": "f"}

    def __init__(self, dtype: np.dtype):
        fmt, pos, self.fields = "<", 0, []
        for name, (ftype, offset) in sorted(dtype.fields.items(), key=lambda kv: kv[1][1]):
            fmt += "x" * (offset - pos)
            nested = ftype.names is not None
            fmt += f"{ftype.itemsize}s" if nested else self._CODES[ftype.str[1:]]
            self.fields.append((name, nested))
            pos = offset + ftype.itemsize
        fmt += "x" * (dtype.itemsize - pos)
        self.struct = struct.Struct(fmt)
        self.dtype = dtype
        assert self.struct.size == dtype.itemsize

    def __call__(self, values: dict) -> np.void:
        args = []
        for name, nested in self.fields:
            v = values.get(name)
            if nested:
                args.append(b"" if v is None else v.tobytes())
            else:
                args.append(0 if v is None else v)
        return np.frombuffer(self.struct.pack(*args), self.dtype)[0]


_PACKERS: dict = {}


def make_struct(dtype: np.dtype, values: dict) -> np.void:
    """A structured scalar of ``dtype``; fields not in ``values`` are zero."""
    packer = _PACKERS.get(dtype)
    if packer is None:
        packer = _PACKERS[dtype] = _Packer(dtype)
    return packer(values)
