"""Attention dropout's random stream, on the host: Philox4x32-10 and the keep mask.

The kernels (kernels/common/dropout.cuh) and this module must draw the same
bits, so tests can rebuild a kernel's mask here. Element (b, h, i, j) (b the batch or
packed-sequence index, h the query head, i the query row, j the key) is kept iff its
16-bit value u >= T, T = round(p * 65536): p is quantized to 1/65536 and the kept
values are scaled by 1 / keep, keep = 1 - T / 65536 exactly.

Counter mapping, in the 16x16 block (i // 16, j // 16), ri = i % 16, rj = j % 16:
    counter = ((j // 16) * 32 + (ri % 8) * 4 + (rj % 8) // 2, i // 16, b * Hq + h, offset)
    key     = (seed & 0xffffffff, seed >> 32)
the 4 output words give 8 halves (word w: low half = index 2w, high half = 2w + 1) and
the element takes half (ri // 8) * 4 + (rj // 8) * 2 + rj % 2. One call then serves the
8 elements an mma C fragment's thread holds in one 16x16 block (rows g, g + 8; columns
2t, 2t + 1, 8 + 2t, 9 + 2t).
"""

from __future__ import annotations

import numbers
import os

import numpy as np

from .errors import DTypeError, ShapeError

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(counter, key):
    """Philox4x32-10 on arrays: counter a 4-tuple, key a 2-tuple of uint32-valued arrays
    (broadcast together). Returns 4 uint32 arrays. uint64 arithmetic holds each 32x32
    product exactly."""
    c = [np.asarray(x, dtype=np.uint64) & _MASK32 for x in counter]
    k0, k1 = (np.asarray(x, dtype=np.uint64) & _MASK32 for x in key)
    for r in range(10):
        if r:
            k0 = (k0 + _W0) & _MASK32
            k1 = (k1 + _W1) & _MASK32
        p0 = _M0 * c[0]
        p1 = _M1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _MASK32,
             (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _MASK32]
    return [x.astype(np.uint32) for x in c]


def threshold(p: float) -> int:
    """T: an element is dropped iff its 16-bit value is below T."""
    return int(round(p * 65536))


def keep_scale(p: float) -> float:
    """1 / keep for the quantized p."""
    return 65536.0 / (65536 - threshold(p))


def keep_mask(seed: int, offset: int, B: int, Hq: int, Sq: int, Sk: int, p: float,
              first_batch: int = 0):
    """bool [B, Hq, Sq, Sk]: True where the kernels keep the element (batch entries, or
    packed sequences, ``first_batch`` .. ``first_batch + B - 1``)."""
    b, h, i, j = np.ix_(np.arange(first_batch, first_batch + B, dtype=np.uint64),
                        np.arange(Hq, dtype=np.uint64),
                        np.arange(Sq, dtype=np.uint64), np.arange(Sk, dtype=np.uint64))
    ri, rj = i % np.uint64(16), j % np.uint64(16)
    counter = ((j // np.uint64(16)) * np.uint64(32) + (ri % np.uint64(8)) * np.uint64(4)
               + (rj % np.uint64(8)) // np.uint64(2),
               i // np.uint64(16), b * np.uint64(Hq) + h, np.uint64(offset & 0xFFFFFFFF))
    words = philox4x32_10(counter, (seed & 0xFFFFFFFF, seed >> 32))
    eight, two = np.uint64(8), np.uint64(2)
    half = (ri // eight) * np.uint64(4) + (rj // eight) * two + rj % two
    word = np.choose((half // np.uint64(2)).astype(np.intp),
                     [np.broadcast_to(w, np.broadcast_shapes(*(x.shape for x in words), half.shape))
                      for w in words])
    u = (word >> ((half % np.uint64(2)) * np.uint64(16)).astype(np.uint32)) & np.uint32(0xFFFF)
    return u >= threshold(p)


def check_args(p, seed, offset, *, need_seed: bool = False) -> None:
    """Typed errors for dropout_p, dropout_seed, dropout_offset (the backward passes
    need_seed: it must redraw the forward's mask)."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise DTypeError(f"dropout_p must be a real number, got {type(p).__name__}")
    if not 0.0 <= float(p) < 1.0:
        raise ShapeError(f"dropout_p must be in [0, 1), got {p}")
    if threshold(p) > 0xFFFF:
        raise ShapeError(f"dropout_p must be below 1 - 2^-17 (it is quantized to 1/65536 and "
                         f"would drop everything), got {p}")
    if p > 0 and need_seed and seed is None:
        raise ShapeError("dropout_p > 0 needs the dropout_seed and dropout_offset the forward used")
    for name, value, bound in (("dropout_seed", seed, 1 << 64),
                               ("dropout_offset", offset, 1 << 32)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise DTypeError(f"{name} must be an int, got {type(value).__name__}")
        if not 0 <= value < bound:
            raise ShapeError(f"{name} must be in [0, 2^{bound.bit_length() - 1}), got {value}")


class Generator:
    """The library's source of (seed, offset) when the caller gives no seed: seeded from
    os.urandom; the offset advances by one each call, so calls never share a stream."""

    def __init__(self):
        self.manual_seed(int.from_bytes(os.urandom(8), "little"))

    def manual_seed(self, seed: int) -> None:
        self.seed = seed % (1 << 64)
        self.offset = 0

    def next(self) -> tuple:
        state = (self.seed, self.offset)
        self.offset = (self.offset + 1) % (1 << 32)
        return state


default_generator = Generator()
manual_seed = default_generator.manual_seed
