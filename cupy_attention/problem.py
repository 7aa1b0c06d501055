"""Input validation: the caller's arrays -> one frozen :class:`Problem`.

Validation reads only shapes, strides and dtypes, so it runs (and raises the same
typed errors) on a machine with no GPU. Shapes in the notation used everywhere:

    layout "bhsd": q [B, Hq, Sq, D]   k, v [B, Hkv, Sk, D]   out like q
    layout "bshd": q [B, Sq, Hq, D]   k, v [B, Sk, Hkv, D]   out like q
    lse  [B, Hq, Sq] float32         mask broadcastable to [B, Hq, Sq, Sk]
    layout "thd" (packed sequences, attention_varlen): q [total_q, Hq, D],
         k, v [total_k, Hkv, D], lse [Hq, total_q]; Problem.batch is the number of
         sequences, seqlen_q / seqlen_k the totals (varlen.py)
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from .errors import DeviceMismatchError, DTypeError, LayoutError, ShapeError, UnsupportedError
from .interop import is_jax_tracer, jax_device_id
from .variant import Variant

DTYPES = ("float32", "float16", "bfloat16")
LAYOUTS = ("bhsd", "bshd")
_FLOAT_MASK_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    shape: tuple
    strides: tuple      # in elements
    dtype: str
    device: object      # int device id, or "cpu"
    itemsize: int


_DTYPE_NAMES: dict = {}


def _dtype_name(dt) -> str:
    """Canonical dtype name of a NumPy/CuPy/torch dtype (memoized: str() of a NumPy
    dtype costs microseconds, and this runs for every argument of every call)."""
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = str(dt)
        if name.startswith("torch."):
            name = name[len("torch."):]
        name = {"half": "float16", "float": "float32", "double": "float64",
                "bool_": "bool"}.get(name, name)
        _DTYPE_NAMES[dt] = name
    return name


def describe(x, name: str) -> TensorInfo:
    """Shape/stride/dtype/device of any supported array, without touching its data."""
    kind = type(x).__module__.split(".")[0]
    if kind == "torch":
        dev = x.device.index if x.is_cuda else "cpu"
        if x.is_cuda and dev is None:
            dev = 0
        return TensorInfo(tuple(x.shape), tuple(x.stride()), _dtype_name(x.dtype), dev, x.element_size())
    if kind == "jax" and is_jax_tracer(x):
        raise UnsupportedError(
            f"{name} is a JAX tracer (an array inside jax.jit, grad or vmap): use "
            "cupy_attention.jax.attention there; cupy_attention.attention takes concrete arrays")
    if kind in ("jax", "jaxlib") and hasattr(x, "devices") and hasattr(x, "dtype"):
        # a jax.Array: dense, row-major (XLA's default layout), no strides attribute
        shape = tuple(x.shape)
        strides, step = [], 1
        for n in reversed(shape):
            strides.append(step)
            step *= max(int(n), 1)
        return TensorInfo(shape, tuple(reversed(strides)), _dtype_name(x.dtype),
                          jax_device_id(x, name), x.dtype.itemsize)
    if hasattr(x, "shape") and hasattr(x, "strides") and hasattr(x, "dtype"):
        itemsize = x.dtype.itemsize
        if any(s % itemsize for s in x.strides):
            raise LayoutError(f"{name} has strides {x.strides} (bytes) that are not whole elements")
        dev = x.device.id if kind == "cupy" else "cpu"
        return TensorInfo(tuple(x.shape), tuple(s // itemsize for s in x.strides),
                          _dtype_name(x.dtype), dev, itemsize)
    raise DTypeError(
        f"{name} has unsupported type {type(x).__name__}; pass a CuPy array, a torch tensor, "
        "a JAX array or a NumPy array"
    )


@dataclasses.dataclass(frozen=True)
class Problem:
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str
    layout: str
    causal: bool
    mask_kind: str        # "none" | "bool" | "add"
    scale: float
    device: object
    window: tuple | None = None   # (left, right), -1 = unbounded (variant.py)
    softcap: float = 0.0          # 0 = off
    varlen: bool = False          # packed sequences (layout "thd")
    max_seqlen_q: int = 0         # varlen: the longest sequence (0: not given)
    max_seqlen_k: int = 0
    alibi: bool = False           # ALiBi slopes given (variant dense "alibi")
    # attention dropout: drop probability (0 = off) and its Philox stream (dropout.py)
    dropout_p: float = 0.0
    dropout_seed: int = 0
    dropout_offset: int = 0

    @property
    def variant(self) -> Variant:
        dense = "alibi" if self.alibi else self.mask_kind
        return Variant(self.causal, self.window, self.softcap, dense, self.varlen,
                       dropout=self.dropout_p > 0)

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def empty(self) -> bool:
        return self.batch == 0 or self.heads_q == 0 or self.seqlen_q == 0

    def flops(self) -> float:
        """Forward FLOPs: 4*B*Hq*Sq*Sk*D, halved for causal with Sq == Sk (true D)."""
        if self.varlen:  # not known without the lengths: an upper bound, max_seqlen wide
            return 4.0 * self.heads_q * self.seqlen_q * max(self.max_seqlen_k, 1) * self.head_dim
        f = 4.0 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * self.head_dim
        if self.causal and self.seqlen_q == self.seqlen_k:
            f /= 2
        return f

    def describe(self) -> str:
        extra = f" window={self.window}" if self.window is not None else ""
        extra += f" softcap={self.softcap:g}" if self.softcap else ""
        extra += f" dropout={self.dropout_p:g}" if self.dropout_p else ""
        if self.varlen:
            return (f"varlen B={self.batch} Hq={self.heads_q} Hkv={self.heads_kv} "
                    f"total_q={self.seqlen_q} total_k={self.seqlen_k} D={self.head_dim} "
                    f"{self.dtype}{self.variant.suffix()}{extra}")
        return (f"B={self.batch} Hq={self.heads_q} Hkv={self.heads_kv} Sq={self.seqlen_q} "
                f"Sk={self.seqlen_k} D={self.head_dim} {self.dtype}{self.variant.suffix()}{extra}")


def unit_last_stride(info: TensorInfo) -> bool:
    """Unit stride in the last axis; vacuous for an empty tensor (NumPy gives those
    all-zero strides) or a last axis of length 1."""
    return info.strides[-1] == 1 or info.shape[-1] <= 1 or 0 in info.shape


def check_like(x, name: str, qi: TensorInfo, shape: tuple, dtype: str, *, shape_note="",
               dtype_rule=None, layout_hint="") -> None:
    """An array the caller hands in beside q (a preallocated result, dout, lse):
    exact shape and dtype, q's device, unit stride in the last axis."""
    info = describe(x, name)
    if info.shape != shape:
        raise ShapeError(f"{name} must have shape {shape}{shape_note}, got {info.shape}")
    if info.dtype != dtype:
        raise DTypeError(f"{name} must {dtype_rule or 'be ' + dtype}, got {info.dtype}")
    if info.device != qi.device:
        raise DeviceMismatchError(f"{name} is on device {info.device} but q is on {qi.device}")
    if not unit_last_stride(info):
        raise LayoutError(f"{name} must have unit stride in its last axis, got strides "
                          f"{info.strides}{layout_hint}")


def _bhsd(info: TensorInfo, layout: str):
    """(B, H, S, D) of a rank-4 tensor in the given layout."""
    b, x, y, d = info.shape
    return (b, x, y, d) if layout == "bhsd" else (b, y, x, d)


def out_shape(batch, heads, seqlen, dim, layout):
    return (batch, heads, seqlen, dim) if layout == "bhsd" else (batch, seqlen, heads, dim)


def check_heads(heads_q: int, heads_kv: int, head_dim: int) -> None:
    """A head dim of at least 1, and q heads a multiple of the k/v heads (GQA/MQA)."""
    if head_dim == 0:
        raise ShapeError("head dim D must be at least 1, got 0")
    if heads_kv == 0 or heads_q % heads_kv:
        raise ShapeError(f"q heads ({heads_q}) must be a multiple of k/v heads ({heads_kv}) "
                         "for grouped-query attention")


def check_window(window, causal: bool, seqlen_q: int, seqlen_k: int):
    """The ``window`` argument as the Problem keeps it: ``(left, right)`` ints with
    ``-1`` for an unbounded side, ``right`` 0 under causal, a side that bounds no row
    (``left >= Sk - 1``, ``right >= Sq - 1``) made -1, and None when no side is left."""
    if window is None:
        return None
    if isinstance(window, (str, bytes)) or not hasattr(window, "__len__") or len(window) != 2:
        raise DTypeError(f"window must be a pair (left, right) of ints, -1 for unbounded, got "
                         f"{window!r}")
    sides = []
    for name, x in zip(("left", "right"), window):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise DTypeError(f"window {name} must be an int (-1 for unbounded), got "
                             f"{type(x).__name__} {x!r}")
        if x < -1:
            raise ShapeError(f"window {name} must be -1 (unbounded) or >= 0, got {int(x)}")
        sides.append(int(x))
    left, right = sides
    if causal:
        right = 0 if right >= 0 else -1   # causal keeps j <= i + Sk - Sq already
    if left >= seqlen_k - 1:
        left = -1
    if right >= seqlen_q - 1:
        right = -1
    if left < 0 and (right < 0 or causal):
        return None
    return left, right


def check_softcap(softcap) -> float:
    """``softcap`` as the Problem keeps it: 0.0 for None, else a finite float > 0."""
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise DTypeError(f"softcap must be a positive real number or None, got "
                         f"{type(softcap).__name__} {softcap!r}")
    c = float(softcap)
    if not (math.isfinite(c) and c > 0):
        raise ShapeError(f"softcap must be finite and > 0 (None for no softcap), got {c}")
    return c


# ALiBi's distance |i + Sk - Sq - j| is formed in the kernels' fp32 mantissa
# (AlibiBias, mask.cuh): exact below 2^22.
ALIBI_MAX_SEQLEN = 1 << 22


def check_alibi(alibi_slopes, qi: TensorInfo, batch: int, heads_q: int,
                mask_kind: str = "none") -> bool:
    """Whether ALiBi is on: ``alibi_slopes`` float32 ``[Hq]`` or ``[B, Hq]`` on q's
    device, unit stride in its last axis; refused beside a dense mask. The caller
    checks the sequences' lengths (:func:`check_alibi_length`)."""
    if alibi_slopes is None:
        return False
    info = describe(alibi_slopes, "alibi_slopes")
    if info.dtype != "float32":
        raise DTypeError(f"alibi_slopes must be float32 (one slope per query head), got "
                         f"{info.dtype}")
    if info.shape not in ((heads_q,), (batch, heads_q)):
        raise ShapeError(f"alibi_slopes must have shape [Hq] = ({heads_q},) or [B, Hq] = "
                         f"({batch}, {heads_q}), got {info.shape}")
    if info.device != qi.device:
        raise DeviceMismatchError(f"alibi_slopes is on device {info.device} but q is on "
                                  f"{qi.device}")
    if not unit_last_stride(info):
        raise LayoutError(f"alibi_slopes must have unit stride in its last axis, got strides "
                          f"{info.strides}")
    if mask_kind != "none":
        raise UnsupportedError("alibi_slopes does not combine with mask: add the ALiBi bias "
                               "to the floating mask instead, or drop the mask")
    return True


def check_alibi_length(alibi: bool, seqlen_q: int, seqlen_k: int) -> None:
    """ALiBi's sequences (one of them, when packed) shorter than ALIBI_MAX_SEQLEN."""
    if alibi and max(seqlen_q, seqlen_k) >= ALIBI_MAX_SEQLEN:
        raise ShapeError(f"alibi_slopes takes sequences shorter than {ALIBI_MAX_SEQLEN} "
                         f"tokens, got Sq={seqlen_q}, Sk={seqlen_k}")


def check_scale(scale, head_dim: int) -> float:
    """``scale`` as a finite float; ``1 / sqrt(D)`` for None."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        raise DTypeError(f"scale must be a real number, got {type(scale).__name__}") from None
    if not math.isfinite(scale):
        raise ShapeError(f"scale must be finite, got {scale}")
    return scale


def validate(q, k, v, *, causal=False, scale=None, mask=None, layout="bhsd", out=None,
             lse_out=None, window=None, softcap=None, alibi_slopes=None, dropout_p=0.0,
             dropout_seed=None, dropout_offset=None, need_seed=False) -> Problem:
    """Check every argument; raise a typed error naming the argument and the fix."""
    if layout not in LAYOUTS:
        raise ShapeError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not isinstance(causal, (bool, int)) or isinstance(causal, float):
        raise DTypeError(f"causal must be a bool, got {type(causal).__name__}")
    qi, ki, vi = describe(q, "q"), describe(k, "k"), describe(v, "v")
    for name, info in (("q", qi), ("k", ki), ("v", vi)):
        if len(info.shape) != 4:
            want = "[B, H, S, D]" if layout == "bhsd" else "[B, S, H, D]"
            raise ShapeError(f"{name} must have rank 4 ({want} for layout={layout!r}), "
                             f"got shape {info.shape}")
    if not (qi.dtype == ki.dtype == vi.dtype):
        raise DTypeError(f"q, k and v must share one dtype, got {qi.dtype}, {ki.dtype}, {vi.dtype}")
    if qi.dtype not in DTYPES:
        raise DTypeError(f"q has dtype {qi.dtype}; supported dtypes are {', '.join(DTYPES)}")
    if not (qi.device == ki.device == vi.device):
        raise DeviceMismatchError(
            f"q, k and v are on different devices ({qi.device}, {ki.device}, {vi.device}); "
            "move them to one device")

    B, Hq, Sq, D = _bhsd(qi, layout)
    Bk, Hkv, Sk, Dk = _bhsd(ki, layout)
    Bv, Hv, Sv, Dv = _bhsd(vi, layout)
    if Bk != B or Bv != B:
        raise ShapeError(f"batch sizes differ: q has {B}, k has {Bk}, v has {Bv}")
    if (Hv, Sv) != (Hkv, Sk):
        raise ShapeError(f"k and v must have the same heads and sequence length, got "
                         f"k {ki.shape} and v {vi.shape} (layout={layout!r})")
    if Dk != D or Dv != D:
        raise ShapeError(f"head dims differ: q has D={D}, k has D={Dk}, v has D={Dv}; "
                         "q, k and v must share one head dim")
    check_heads(Hq, Hkv, D)
    for name, info in (("q", qi), ("k", ki), ("v", vi)):
        if not unit_last_stride(info):
            raise LayoutError(f"{name} must have unit stride in its last (head-dim) axis, got "
                              f"strides {info.strides}; pass {name}.contiguous() or a view of "
                              "a packed tensor sliced along the other axes")

    window = check_window(window, bool(causal), Sq, Sk)
    softcap = check_softcap(softcap)
    scale = check_scale(scale, D)

    mask_kind = "none"
    if mask is not None:
        mi = describe(mask, "mask")
        if mi.dtype == "bool":
            mask_kind = "bool"
        elif mi.dtype in _FLOAT_MASK_DTYPES:
            mask_kind = "add"
        else:
            raise DTypeError(f"mask must be boolean (True = attend) or floating (added to the "
                             f"scores), got dtype {mi.dtype}")
        if mi.device != qi.device:
            raise DeviceMismatchError(f"mask is on device {mi.device} but q is on {qi.device}")
        target = (B, Hq, Sq, Sk)
        if len(mi.shape) > 4 or any(
                m not in (1, t) for m, t in zip(reversed(mi.shape), reversed(target))):
            raise ShapeError(f"mask of shape {mi.shape} is not broadcastable to "
                             f"[B, Hq, Sq, Sk] = {list(target)}")

    if out is not None:
        check_like(out, "out", qi, out_shape(B, Hq, Sq, D, layout), qi.dtype,
                   shape_note=" (like q)", dtype_rule=f"have dtype {qi.dtype} (like q)")
    if lse_out is not None:
        check_like(lse_out, "lse_out", qi, (B, Hq, Sq), "float32")

    alibi = check_alibi(alibi_slopes, qi, B, Hq, mask_kind)
    check_alibi_length(alibi, Sq, Sk)

    drop = check_dropout(dropout_p, dropout_seed, dropout_offset, need_seed)
    return Problem(B, Hq, Hkv, Sq, Sk, D, qi.dtype, layout, bool(causal), mask_kind, scale,
                   qi.device, window, softcap, alibi=alibi, **drop)


def check_dropout(p, seed, offset, need_seed: bool = False) -> dict:
    """Problem's dropout fields: typed errors for bad arguments (dropout.check_args);
    with p > 0 and no seed, (seed, offset) from the default generator (a call that
    needs the forward's stream, the backward, must pass them)."""
    from . import dropout

    dropout.check_args(p, seed, offset, need_seed=need_seed)
    if not p:
        return {}
    if seed is None:
        seed, offset = dropout.default_generator.next()
    return {"dropout_p": float(p), "dropout_seed": int(seed), "dropout_offset": int(offset or 0)}
