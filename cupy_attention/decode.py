"""Decoding against a KV cache: :func:`attention_decode`, and merging attention
states: :func:`merge_attention_states`, :func:`merge_attention_states_many`.

Shapes (the conventions of FlashAttention's ``flash_attn_with_kvcache`` and of
vLLM / FlashInfer paged caches):

    q         [B, Sq, Hq, D]                 a few new query tokens per sequence
    k_cache   [B, Sk_max, Hkv, D]            contiguous: one row of the cache per sequence
              [num_pages, page_size, Hkv, D] paged, with block_table
    v_cache   like k_cache
    block_table   int32 [B, max_pages]       page ids of each sequence, in order
    cache_seqlens int32 [B]                  keys each sequence holds (new tokens included)
    out       [B, Sq, Hq, D], lse float32 [B, Hq, Sq] (natural log)

The cache already holds the new tokens' keys and values: query ``i`` of sequence
``b`` is token ``cache_seqlens[b] - Sq + i``, and causal attention is aligned
bottom-right against each sequence's own length.
"""

from __future__ import annotations

import math

import numpy as np

from . import device as _device
from . import interop
from .calls import HotCache, array_signature, hot_io
from .errors import (DeviceMismatchError, DTypeError, LayoutError, ShapeError, UnsupportedError,
                     translate_oom)
from .families import decode as fam
from .families import flash_wgmma as wgmma_fam
from .problem import check_scale, describe
from .variant import Variant

DTYPES = ("float16", "bfloat16")
MERGE_DTYPES = ("float32", "float16", "bfloat16")


def _host_ints(x):
    """A NumPy view of a host array or list (None for device arrays)."""
    if isinstance(x, (list, tuple)):
        return np.asarray(x, dtype=np.int32)
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("torch") and not x.is_cuda:
        return x.numpy()
    return None


def _check_index(x, name: str, shape: tuple, q_device) -> np.ndarray | None:
    """An int32 block table or length vector: dtype, rank and shape, device. Returns
    its host values when it is on the host."""
    host = _host_ints(x)
    info = describe(host if host is not None else x, name)
    if info.dtype != "int32":
        raise DTypeError(f"{name} must have dtype int32, got {info.dtype}")
    if len(info.shape) != len(shape) or any(w is not None and w != g
                                            for w, g in zip(shape, info.shape)):
        want = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
        raise ShapeError(f"{name} must have shape {want}, got {info.shape}")
    if host is None and info.device != q_device:
        raise DeviceMismatchError(f"{name} is on device {info.device} but q is on {q_device}")
    if info.shape and info.shape[-1] > 1 and info.strides[-1] != 1:
        raise LayoutError(f"{name} must have unit stride in its last axis, got strides "
                          f"{info.strides}; pass a contiguous array")
    return host


def _check_new(k_new, v_new, ki, batch) -> int:
    """k_new, v_new [B, S_new, Hkv, D] like the cache: returns S_new."""
    if k_new is None or v_new is None:
        raise ShapeError("pass both k_new and v_new, or neither")
    kn, vn = describe(k_new, "k_new"), describe(v_new, "v_new")
    want = (batch, None, ki.shape[2], ki.shape[3])
    for name, info in (("k_new", kn), ("v_new", vn)):
        if len(info.shape) != 4 or any(w is not None and w != g
                                       for w, g in zip(want, info.shape)):
            raise ShapeError(f"{name} must have shape [B={batch}, S_new, Hkv={ki.shape[2]}, "
                             f"D={ki.shape[3]}], got {info.shape}")
        if info.dtype != ki.dtype:
            raise DTypeError(f"{name} must have the cache's dtype {ki.dtype}, got {info.dtype}")
        if info.device != ki.device:
            raise DeviceMismatchError(f"{name} is on device {info.device} but the cache is on "
                                      f"{ki.device}")
        if info.strides[-1] != 1 and info.shape[-1] > 1 and 0 not in info.shape:
            raise LayoutError(f"{name} must have unit stride in its last axis, got strides "
                              f"{info.strides}")
    if kn.shape != vn.shape:
        raise ShapeError(f"k_new and v_new must have the same shape, got {kn.shape} and "
                         f"{vn.shape}")
    return kn.shape[1]


def validate_cache(ki, vi, B, device, *, cache_seqlens, block_table, k_new, v_new):
    """The cache, its block table, lengths and appended tokens for a batch of B
    (``ki``, ``vi``: described rank-4 caches of one shape). Returns (capacity,
    page_size, the longest sequence once appended or None where the lengths are on
    the device)."""
    n0, n1 = ki.shape[:2]
    if ki.device != vi.device:
        raise DeviceMismatchError(f"k_cache and v_cache are on different devices ({ki.device}, "
                                  f"{vi.device})")
    paged = block_table is not None
    if paged:
        page_size, num_pages = n1, n0
        if page_size == 0:
            raise ShapeError(f"a paged k_cache needs pages of at least one row, got shape "
                             f"{ki.shape}")
        table = _check_index(block_table, "block_table", (B, None), device)
        max_pages = describe(block_table if table is None else table, "block_table").shape[1]
        capacity = max_pages * page_size
        if cache_seqlens is None:
            raise ShapeError("cache_seqlens is required with block_table (the keys each "
                             "sequence holds)")
    else:
        if n0 != B:
            raise ShapeError(f"a contiguous k_cache must have shape [B={B}, Sk, Hkv, D], got "
                             f"{ki.shape}; pass block_table for a paged cache")
        page_size, capacity, table = 0, n1, None
    appended = _check_new(k_new, v_new, ki, B) if k_new is not None or v_new is not None \
        else 0
    if appended and cache_seqlens is None:
        raise ShapeError("cache_seqlens is required with k_new and v_new (where they go)")
    lengths = None
    if cache_seqlens is not None:
        lengths = _check_index(cache_seqlens, "cache_seqlens", (B,), device)
    if lengths is not None and appended:
        lengths = lengths + appended   # what the cache holds once the new tokens are in
    if lengths is not None and len(lengths):
        lo, hi = int(lengths.min()) - appended, int(lengths.max())
        if lo < 0:
            raise ShapeError(f"cache_seqlens must be >= 0, got {lo} at index "
                             f"{int(np.argmin(lengths))}")
        if hi > capacity:
            where = int(np.argmax(lengths))
            room = (f"block_table holds {capacity // max(page_size, 1)} pages of {page_size}"
                    if paged else f"k_cache holds {capacity} rows per sequence")
            plus = f" + {appended} appended" if appended else ""
            raise ShapeError(f"cache_seqlens[{where}]{plus} = {hi} exceeds the cache's "
                             f"capacity {capacity} ({room})")
    if paged and table is not None and lengths is not None and table.size:
        used = np.arange(table.shape[1])[None, :] < -(-lengths[:, None] // page_size)
        bad = used & ((table < 0) | (table >= num_pages))
        if bad.any():
            b, slot = (int(x) for x in np.argwhere(bad)[0])
            raise ShapeError(f"block_table[{b}] holds page id {int(table[b, slot])} outside "
                             f"[0, {num_pages}) among the pages of its {int(lengths[b])} keys")
    longest = None if lengths is None else int(lengths.max(initial=0))
    return capacity, page_size, longest


def validate_decode(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None,
                    causal=True, scale=None, window=None, softcap=0.0, k_new=None, v_new=None,
                    max_seqlen=None):
    """Check every argument on the host (no GPU needed); returns (DecodeShape, scale,
    page_size). Typed errors name the argument. With ``k_new``/``v_new`` the lengths
    are those before the append, and the appended tokens must fit."""
    qi, ki, vi = describe(q, "q"), describe(k_cache, "k_cache"), describe(v_cache, "v_cache")
    for name, info, want in (("q", qi, "[B, Sq, Hq, D]"),
                             ("k_cache", ki, "[B, Sk, Hkv, D] or [pages, page_size, Hkv, D]"),
                             ("v_cache", vi, "like k_cache")):
        if len(info.shape) != 4:
            raise ShapeError(f"{name} must have rank 4 ({want}), got shape {info.shape}")
    if ki.shape != vi.shape:
        raise ShapeError(f"k_cache and v_cache must have the same shape, got {ki.shape} and "
                         f"{vi.shape}")
    if qi.dtype not in DTYPES:
        raise DTypeError(f"q has dtype {qi.dtype}; attention_decode takes {', '.join(DTYPES)}")
    if not (qi.dtype == ki.dtype == vi.dtype):
        raise DTypeError(f"q, k_cache and v_cache must share one dtype, got {qi.dtype}, "
                         f"{ki.dtype}, {vi.dtype}")
    if not (qi.device == ki.device == vi.device):
        raise DeviceMismatchError(f"q, k_cache and v_cache are on different devices "
                                  f"({qi.device}, {ki.device}, {vi.device})")
    B, Sq, Hq, D = qi.shape
    Hkv, Dk = ki.shape[2:]
    if Dk != D:
        raise ShapeError(f"head dims differ: q has D={D}, k_cache has D={Dk}")
    if not 1 <= D <= 256:
        raise UnsupportedError(f"attention_decode takes head dims 1..256, not {D}")
    if Hkv == 0 or Hq % Hkv:
        raise ShapeError(f"q heads ({Hq}) must be a multiple of the cache's heads ({Hkv})")
    for name, info in (("q", qi), ("k_cache", ki), ("v_cache", vi)):
        if info.strides[-1] != 1 and info.shape[-1] > 1 and 0 not in info.shape:
            raise LayoutError(f"{name} must have unit stride in its last (head-dim) axis, got "
                              f"strides {info.strides}")
    if B > 65535 or Hkv > 65535:
        raise UnsupportedError(f"B={B} and Hkv={Hkv} must each be at most 65535 (grid limits)")

    capacity, page_size, longest = validate_cache(
        ki, vi, B, qi.device, cache_seqlens=cache_seqlens, block_table=block_table, k_new=k_new,
        v_new=v_new)
    if max_seqlen is not None:
        if not isinstance(max_seqlen, (int, np.integer)) or max_seqlen < 0:
            raise ShapeError(f"max_seqlen must be an integer >= 0, got {max_seqlen!r}")
        longest = int(max_seqlen) if longest is None else min(longest, int(max_seqlen))
    # the split plan is made for the longest sequence where it is known (a shorter
    # guess costs speed only: the last split runs to each sequence's end)
    planned = capacity if longest is None or cache_seqlens is None else min(capacity, longest)
    paged = block_table is not None
    scale = check_scale(scale, D)
    if window is not None:
        if (not isinstance(window, (tuple, list)) or len(window) != 2
                or not all(isinstance(w, (int, np.integer)) and w >= -1 for w in window)):
            raise ShapeError(f"window must be (left, right) with integers >= -1, got {window!r}")
        window = (int(window[0]), int(window[1]))
    try:
        softcap = float(softcap)
    except (TypeError, ValueError):
        raise DTypeError(f"softcap must be a real number, got {type(softcap).__name__}") from None
    if not (math.isfinite(softcap) and softcap >= 0):
        raise ShapeError(f"softcap must be >= 0 (0 = off), got {softcap}")
    variant = Variant(bool(causal), window, softcap)
    shape = fam.DecodeShape(B, Hq, Hkv, Sq, planned, D, qi.dtype, variant, paged)
    return shape, scale, page_size


@translate_oom
def attention_decode(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, causal=True,
                     scale=None, window=None, softcap=0.0, return_lse=False, num_splits=None,
                     k_new=None, v_new=None, max_seqlen=None):
    """Attention of a few new query tokens per sequence against a KV cache.

    Parameters
    ----------
    q : array [B, Sq, Hq, D], float16 or bfloat16. Sq = 1 is plain decoding, Sq > 1
        speculative decoding, multi-token prediction or chunked prefill (any Sq; on
        Hopper, Sq >= 96 runs flash_wgmma over the cache at any page size: tensor-map
        boxes, or rows gathered one by one on small pages, see docs/decode.md).
    k_cache, v_cache : arrays [B, Sk_max, Hkv, D] (contiguous), or
        [num_pages, page_size, Hkv, D] with ``block_table`` (paged; any page size).
        Hq must be a multiple of Hkv (GQA / MQA): the query heads of a group share
        every K/V read.
    cache_seqlens : int32 [B], optional
        Keys each sequence holds, the Sq new tokens included. Required with
        ``block_table``; without it every sequence holds Sk_max keys. A length of 0
        gives output 0 and LSE -inf. With ``k_new``: the lengths before the append.
    block_table : int32 [B, max_pages], optional
        Page ids of each sequence's keys in order (page ``j // page_size`` holds key
        ``j``). Entries past a sequence's last page are never read. Where the table
        and the lengths are on the host (NumPy, lists, CPU tensors) page ids and
        lengths are checked here; on the device they are trusted: an id out of
        range reads out of bounds.
    causal : bool
        Query ``i`` sees key ``j`` iff ``j <= i + cache_seqlens[b] - Sq``
        (bottom-right, per sequence). Default True, as decoding needs.
    scale : float, optional (default ``1 / sqrt(D)``)
    window : (left, right), optional
        Sliding window in the FlashAttention convention (-1 = unbounded).
    softcap : float
        Logit softcapping ``c * tanh(s / c)`` (0 = off).
    return_lse : bool
        Also return the LSE, float32 [B, Hq, Sq], natural log.
    num_splits : int, optional
        Force the number of key splits per sequence (default: the heuristic of
        ``cupy_attention/families/decode.py``); results agree up to rounding.
    k_new, v_new : arrays [B, S_new, Hkv, D], optional
        New tokens written into the cache first, at positions ``cache_seqlens[b] +
        t`` (as :func:`append_kv`; their pages must be in ``block_table``); the call
        then attends over ``cache_seqlens[b] + S_new`` keys, as FlashAttention's
        ``flash_attn_with_kvcache`` does. ``cache_seqlens`` itself is not changed:
        advance it by S_new for the next step.
    max_seqlen : int, optional
        The longest a sequence is in this call (new tokens included), for planning
        the key splits when ``cache_seqlens`` is on the device (host lengths are
        read directly). Default: the cache's capacity, which over-splits caches
        sized far beyond their contents. A value too small costs speed, never
        correctness.

    Arrays may be CuPy arrays, torch CUDA tensors (results are torch tensors, on
    torch's current stream), JAX GPU arrays (results are JAX arrays; not with
    ``k_new``/``v_new``, which write into the cache) or NumPy arrays (copied to the
    current device, results returned as NumPy).

    Returns
    -------
    out [B, Sq, Hq, D] like q, or ``(out, lse)``.
    """
    hot_key = None
    if k_new is None and v_new is None:
        hot_key = _signature(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale,
                             window, softcap, return_lse, num_splits, max_seqlen)
        hot = _HOT.get(hot_key)
        if hot is not None:
            result = hot(q, k_cache, v_cache, block_table, cache_seqlens, return_lse)
            if result is not None:
                return result
    s, scale, page_size = validate_decode(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                          block_table=block_table, causal=causal, scale=scale,
                                          window=window, softcap=softcap, k_new=k_new,
                                          v_new=v_new, max_seqlen=max_seqlen)
    appended = 0 if k_new is None else describe(k_new, "k_new").shape[1]
    if num_splits is not None and (not isinstance(num_splits, (int, np.integer))
                                   or num_splits < 1):
        raise ShapeError(f"num_splits must be a positive integer, got {num_splits!r}")
    interop.check_jax_call(q, describe(q, "q").device,
                           **({"k_cache": k_cache, "v_cache": v_cache} if appended else {}))
    _device.require_device()
    cupy = _device.require_cupy()
    ctx = interop.context_for(q)
    cc = _device.compute_capability(ctx.device_id)
    if cc < fam.Decode.min_cc:
        raise UnsupportedError(f"attention_decode needs compute capability 8.0+, device has "
                               f"{cc / 10:.1f}")
    with cupy.cuda.Device(ctx.device_id), ctx.stream:
        view = _viewer(ctx)
        qv, kv, vv = view(q, "q"), view(k_cache, "k_cache"), view(v_cache, "v_cache")
        out, lse, ov, lv = _results(ctx, q, qv, s, return_lse)
        arch = _device.device_arch(ctx.device_id)
        table = None if block_table is None else view(_as_int32(block_table), "block_table")
        lengths = (None if cache_seqlens is None
                   else view(_as_int32(cache_seqlens), "cache_seqlens"))
        if appended:
            fam.launch_append(kv, vv, view(k_new, "k_new"), view(v_new, "v_new"),
                              seqlens=lengths, block_table=table, page_size=page_size,
                              dtype=s.dtype, stream=ctx.stream, device_id=ctx.device_id,
                              arch=arch)
            lengths = interop.to_cupy(_as_int32(cache_seqlens), "cache_seqlens", ctx) \
                + np.int32(appended)
        if s.batch and s.seqlen_q and s.heads_q:
            vec = fam.vectorizable_arrays(s.head_dim, (qv, kv, vv, ov))
            sms = _device.multiprocessor_count(ctx.device_id)
            bsd = lambda x: _strides(x, (0, 2, 1))  # noqa: E731  [B, S, H, D] -> (b, h, s)
            cache = lambda x: _strides(x, (0, 2, 1))  # noqa: E731  [page, row, H, D]
            tma = fam.use_tma(s, vec, arch, kv.shape[:2], cache(kv), cache(vv))
            gather = wgmma_fam.can_gather(s, vec, kv.shape[:2], cache(kv), cache(vv))
            if num_splits is None and wgmma_fam.takes_cache(s, tma, arch, sms, bsd(qv),
                                                            gather):
                # many query rows (chunked prefill): flash_wgmma over the cache
                launch = wgmma_fam.CacheLaunch(
                    s, scale, q_strides=bsd(qv), o_strides=bsd(ov),
                    lse_strides=(0, 0) if lv is None else _strides(lv, (0, 1)),
                    k_strides=cache(kv), v_strides=cache(vv), kv_dims=kv.shape[:2],
                    block_table=table, seqlens=lengths, page_size=page_size,
                    device_id=ctx.device_id, arch=arch,
                    gather=gather and wgmma_fam.cache_gathers(s, page_size, tma))
                launch.run(qv.data.ptr, kv.data.ptr, vv.data.ptr, ov.data.ptr,
                           0 if lv is None else lv.data.ptr, ctx.stream)
            else:
                pl = fam.plan(s, vec, sms, None if num_splits is None else int(num_splits),
                              _device.max_shared_per_block(ctx.device_id), tma,
                              fam.use_wgmma(s, tma, arch, vec), page_size or 16,
                              _device.arch_cc(arch) >= 90)
                launch = fam.launch_decode(s, scale, pl, ov, lv, bsd(ov), ctx.stream,
                                           ctx.device_id, arch, kv.shape[:2], q=qv, k=kv,
                                           v=vv, q_strides=bsd(qv), k_strides=cache(kv),
                                           v_strides=cache(vv), block_table=table,
                                           seqlens=lengths, page_size=page_size)
            if hot_key is not None and ctx.kind in ("torch", "cupy"):
                _HOT.put(hot_key, _HotDecode(ctx.kind, ctx.device_id, s, launch))
        out = _give(out, ctx)
        return (out, _give(lse, ctx)) if return_lse else out


# ---------------------------------------------------------------------------
# Hot path: a decode step whose arrays match an earlier call's shapes, strides,
# dtypes and devices, with its block table and lengths on the device (values the
# host never reads), repeats that call's launch on new pointers: no validation, no
# planning, no packing. A decoding loop calls this once per layer and step.

_HOT = HotCache(1024)


def _signature(q, k, v, lengths, table, causal, scale, window, softcap, return_lse,
               num_splits, max_seqlen):
    """What a decode launch depends on, hashable; None where there is no hot path
    (host arrays, host lengths or table, unhashable arguments)."""
    try:
        arrays = array_signature((q, k, v, lengths, table))
        if arrays is None:
            return None
        key = (bool(causal), scale, None if window is None else tuple((type(w), w) for w in window),
               type(softcap), softcap, bool(return_lse), num_splits, max_seqlen, arrays)
        hash(key)
        return key
    except (AttributeError, TypeError):   # NumPy, lists, JAX and other producers
        return None


class _HotDecode:
    def __init__(self, kind: str, device_id: int, s, launch):
        self.kind, self.device_id, self.s, self.launch = kind, device_id, s, launch

    def __call__(self, q, k, v, table, lengths, return_lse):
        s = self.s
        io = hot_io(self.kind, self.device_id, q, (s.batch, s.seqlen_q, s.heads_q, s.head_dim),
                    (s.batch, s.heads_q, s.seqlen_q), return_lse)
        if io is None:
            return None
        stream, out, lse, ptr = io
        if s.batch and s.seqlen_q and s.heads_q:
            self.launch.run(ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse), stream, ptr(table),
                            ptr(lengths))
        return (out, lse) if return_lse else out


def append_kv(k_cache, v_cache, k_new, v_new, *, cache_seqlens, block_table=None):
    """Write new tokens into a KV cache in place: ``k_new``, ``v_new`` [B, S_new,
    Hkv, D] land at positions ``cache_seqlens[b] + t`` of each sequence (pages from
    ``block_table`` for a paged cache; those pages must already be in the table).
    ``cache_seqlens`` (int32 [B], the lengths before the append) is not changed:
    advance it by S_new afterwards. Shapes and checks as :func:`attention_decode`."""
    ki, vi = describe(k_cache, "k_cache"), describe(v_cache, "v_cache")
    for name, info in (("k_cache", ki), ("v_cache", vi)):
        if len(info.shape) != 4:
            raise ShapeError(f"{name} must have rank 4 ([B, Sk, Hkv, D] or [pages, page_size, "
                             f"Hkv, D]), got shape {info.shape}")
    if ki.shape != vi.shape or ki.dtype != vi.dtype:
        raise ShapeError(f"k_cache and v_cache must have the same shape and dtype, got "
                         f"{ki.shape} {ki.dtype} and {vi.shape} {vi.dtype}")
    if ki.dtype not in DTYPES:
        raise DTypeError(f"k_cache has dtype {ki.dtype}; append_kv takes {', '.join(DTYPES)}")
    if k_new is None or v_new is None:
        raise ShapeError("append_kv needs both k_new and v_new")
    kn = describe(k_new, "k_new")
    if len(kn.shape) != 4:
        raise ShapeError(f"k_new must have rank 4 ([B, S_new, Hkv, D]), got shape {kn.shape}")
    _, page_size, _ = validate_cache(ki, vi, kn.shape[0], ki.device,
                                     cache_seqlens=cache_seqlens, block_table=block_table,
                                     k_new=k_new, v_new=v_new)
    interop.check_jax_call(k_cache, ki.device, k_cache=k_cache, v_cache=v_cache)
    _device.require_device()
    cupy = _device.require_cupy()
    ctx = interop.context_for(k_cache)
    with cupy.cuda.Device(ctx.device_id), ctx.stream:
        view = _viewer(ctx)
        fam.launch_append(view(k_cache, "k_cache"), view(v_cache, "v_cache"),
                          view(k_new, "k_new"), view(v_new, "v_new"),
                          seqlens=view(_as_int32(cache_seqlens), "cache_seqlens"),
                          block_table=(None if block_table is None
                                       else view(_as_int32(block_table), "block_table")),
                          page_size=page_size, dtype=ki.dtype, stream=ctx.stream,
                          device_id=ctx.device_id, arch=_device.device_arch(ctx.device_id))


def _as_int32(x):
    return np.asarray(x, dtype=np.int32) if isinstance(x, (list, tuple)) else x


def _strides(x, axes):
    st = [v // x.itemsize for v in x.strides]
    return tuple(st[a] for a in axes)


def _viewer(ctx):
    """x -> something with .data.ptr, .shape, .strides (bytes), .itemsize on ctx's device."""
    def view(x, name):
        if interop.array_kind(x) == "torch" and x.is_cuda:
            return interop.torch_view(x, name, ctx)
        if type(x).__module__.startswith("torch"):   # a CPU tensor: copy its values
            x = x.numpy()
        return interop.to_cupy(x, name, ctx)
    return view


def _results(ctx, q, qv, s, return_lse):
    """(out, lse) as handed back, and their device views."""
    shape, lse_shape = (s.batch, s.seqlen_q, s.heads_q, s.head_dim), (s.batch, s.heads_q,
                                                                          s.seqlen_q)
    if ctx.kind == "torch":
        import torch

        out = torch.empty(shape, dtype=q.dtype, device=q.device)
        lse = (torch.empty(lse_shape, dtype=torch.float32, device=q.device)
               if return_lse else None)
        ov = interop.torch_view(out, "out", ctx)
        lv = None if lse is None else interop.torch_view(lse, "lse", ctx)
        return out, lse, ov, lv
    cupy = _device.require_cupy()
    out = cupy.empty(shape, dtype=qv.dtype)
    lse = cupy.empty(lse_shape, dtype=cupy.float32) if return_lse else None
    return out, lse, out, lse


def _give(x, ctx):
    if x is None or ctx.kind == "torch":
        return x
    return interop.from_cupy(x, ctx)


# ---------------------------------------------------------------------------
# Merging attention states

def _lead(shape, layout):
    """The (n0, n1, n2) axes of o's leading dims (and of lse's, which match them
    unless layout="bshd"): tuples of axis indices into o and into lse, None = a
    padded axis of length 1."""
    rank = len(shape) - 1
    if layout == "bshd":
        return (0, 2, 1), (0, 1, 2)
    axes = (None,) * (3 - rank) + tuple(range(rank))
    return axes, axes


def _merge_layout(o_info, lse_info, layout, name_o, name_lse, stacked):
    """Check one (o, lse) pair (a stack when ``stacked``); returns the result shapes
    (o, lse) and the n-axes."""
    off = 1 if stacked else 0
    oshape, lshape = o_info.shape[off:], lse_info.shape[off:]
    if layout not in (None, "bshd"):
        raise ShapeError(f"layout must be None or 'bshd', got {layout!r}")
    if not 2 <= len(oshape) <= 4 or (layout == "bshd" and len(oshape) != 4):
        want = "[B, S, H, D]" if layout == "bshd" else "[..., D] with 1 to 3 leading axes"
        raise ShapeError(f"{name_o} must be {'a stack of ' if stacked else ''}{want}, got "
                         f"shape {o_info.shape}")
    want = ((oshape[0], oshape[2], oshape[1]) if layout == "bshd" else tuple(oshape[:-1]))
    if tuple(lshape) != want or (stacked and lse_info.shape[:1] != o_info.shape[:1]):
        lead = tuple(o_info.shape[:1]) if stacked else ()
        raise ShapeError(f"{name_lse} must have shape {lead + want} to match {name_o} "
                         f"{o_info.shape}{' (layout bshd: lse is [B, H, S])' if layout else ''}, "
                         f"got {lse_info.shape}")
    if o_info.dtype not in MERGE_DTYPES:
        raise DTypeError(f"{name_o} has dtype {o_info.dtype}; merging takes "
                         f"{', '.join(MERGE_DTYPES)}")
    if lse_info.dtype != "float32":
        raise DTypeError(f"{name_lse} must have dtype float32, got {lse_info.dtype}")
    if o_info.shape[-1] > 256:
        raise UnsupportedError(f"merging takes head dims up to 256, not {o_info.shape[-1]}")
    if o_info.strides[-1] != 1 and o_info.shape[-1] > 1:
        raise LayoutError(f"{name_o} must have unit stride in its last axis, got strides "
                          f"{o_info.strides}")
    return tuple(oshape), tuple(lshape)


def _state_view(o, lse, layout, stacked):
    """(o, lse, o strides [state, n0, n1, n2], lse strides, states) for MergeParams."""
    off = 1 if stacked else 0
    oax, lax = _lead(o.shape[off:], layout)
    ost = [x // o.itemsize for x in o.strides]
    lst = [x // 4 for x in lse.strides]
    o4 = [ost[0] if stacked else 0] + [0 if a is None else ost[a + off] for a in oax]
    l4 = [lst[0] if stacked else 0] + [0 if a is None else lst[a + off] for a in lax]
    return o, lse, o4, l4, (o.shape[0] if stacked else 1)


def _merge(pairs, layout, stacked):
    """pairs: [(o, lse, name_o, name_lse)] (one stack or two states)."""
    infos = [(describe(o, no), describe(l, nl), no, nl) for o, l, no, nl in pairs]
    shapes = [_merge_layout(oi, li, layout, no, nl, stacked) for oi, li, no, nl in infos]
    o0, l0, no0, _ = infos[0]
    for (oi, li, no, nl), sh in zip(infos[1:], shapes[1:]):
        if sh != shapes[0]:
            raise ShapeError(f"{no} {oi.shape} and {no0} {o0.shape} must have the same shape "
                             f"(and their LSEs too)")
        if oi.dtype != o0.dtype:
            raise DTypeError(f"{no} has dtype {oi.dtype} but {no0} has {o0.dtype}")
    devices = {i.device for oi, li, _, _ in infos for i in (oi, li)}
    if len(devices) > 1:
        raise DeviceMismatchError(f"the states are on different devices ({sorted(map(str, devices))})")
    oshape, lshape = shapes[0]
    head_dim = oshape[-1]
    _device.require_device()
    cupy = _device.require_cupy()
    first = pairs[0][0]
    ctx = interop.context_for(first)
    with cupy.cuda.Device(ctx.device_id), ctx.stream:
        view = _viewer(ctx)
        views = [_state_view(view(o, no), view(lse, nl), layout, stacked)
                 for o, lse, no, nl in pairs]
        if ctx.kind == "torch":
            import torch

            out = torch.empty(oshape, dtype=first.dtype, device=first.device)
            lse_out = torch.empty(lshape, dtype=torch.float32, device=first.device)
            ov, lv = interop.torch_view(out, "out", ctx), interop.torch_view(lse_out, "lse", ctx)
        else:
            out = cupy.empty(oshape, dtype=views[0][0].dtype)
            lse_out = cupy.empty(lshape, dtype=cupy.float32)
            ov, lv = out, lse_out
        oax, lax = _lead(oshape, layout)
        ost = [x // ov.itemsize for x in ov.strides]
        lst = [x // 4 for x in lv.strides]
        dims = tuple(1 if a is None else oshape[a] for a in oax)
        rows = int(np.prod(dims))
        if rows and head_dim:
            params = fam.merge_params(
                views, ov, [0 if a is None else ost[a] for a in oax], lv,
                [0 if a is None else lst[a] for a in lax], dims, head_dim)
            fam.launch_merge(params, rows, fam.merge_spec(o0.dtype, o0.dtype, head_dim),
                             ctx.stream, ctx.device_id, _device.device_arch(ctx.device_id))
        return _give(out, ctx), _give(lse_out, ctx)


def merge_attention_states(o_a, lse_a, o_b, lse_b, *, layout=None):
    """The attention state over the union of two disjoint key sets.

    ``o_a``, ``o_b`` hold attention outputs (each normalized over its own keys) and
    ``lse_a``, ``lse_b`` their log-sum-exps (natural log, float32):

        lse = log(exp(lse_a) + exp(lse_b))
        o   = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b

    The building block of split-KV decoding, shared-prefix (cascade) inference and
    ring attention. A side with LSE -inf (no keys) contributes exactly nothing,
    whatever its ``o`` holds; both -inf give o = 0, lse = -inf.

    Shapes: ``o`` [..., D] with 1 to 3 leading axes and ``lse`` of shape
    ``o.shape[:-1]`` (FlashInfer's [S, H, D] / [S, H]); or, with ``layout="bshd"``,
    ``o`` [B, S, H, D] and ``lse`` [B, H, S], as ``ca.attention(...,
    layout="bshd", return_lse=True)`` and :func:`attention_decode` return them.
    ``o`` float32, float16 or bfloat16 (both the same), ``lse`` float32; D <= 256.

    Returns ``(o, lse)``: new arrays of the inputs' shapes and kind.
    """
    return _merge([(o_a, lse_a, "o_a", "lse_a"), (o_b, lse_b, "o_b", "lse_b")], layout, False)


def merge_attention_states_many(o, lse, *, layout=None):
    """:func:`merge_attention_states` over N states stacked on a leading axis:
    ``o`` [N, ..., D], ``lse`` [N, ...] (or [N, B, S, H, D] and [N, B, H, S] with
    ``layout="bshd"``). Returns ``(o, lse)`` without the N axis."""
    return _merge([(o, lse, "o", "lse")], layout, True)
