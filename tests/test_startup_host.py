"""Start-up and hot paths on the host (issue #26): ``import cupy_attention`` loads no
heavy optional module and none of the entry points a first ``attention`` call does not
need; the varlen hot path repeats a launch with new pointers (cu_seqlens included)
and still honours ``check=True``. No GPU: CuPy is replaced by a stand-in."""

from __future__ import annotations

import subprocess
import sys
import types

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention import backward, device, varlen
from cupy_attention.errors import ShapeError
from cupy_attention.families.base import HotLaunch
from cupy_attention.params import FWD_DTYPE
from cupy_attention.problem import Problem


def test_import_loads_no_optional_or_unneeded_module():
    code = ("import sys, cupy_attention as ca\n"
            "bad = [m for m in ('rich', 'torch', 'jax', 'matplotlib', 'cupy_attention.varlen',\n"
            "       'cupy_attention.decode', 'cupy_attention.backward', 'cupy_attention.reference',\n"
            "       'cupy_attention.families.flash_bwd', 'cupy_attention.cli',\n"
            "       'cupy_attention.bench') if m in sys.modules]\n"
            "assert not bad, bad\n"
            "assert callable(ca.attention_varlen) and 'cupy_attention.varlen' in sys.modules\n"
            "from cupy_attention import attention_backward, attention_decode\n"
            "assert 'attention_decode' in dir(ca)\n"
            "from cupy_attention.dispatch import BACKWARD_FAMILIES\n"
            "assert list(BACKWARD_FAMILIES) == ['flash_wgmma', 'flash_mma', 'flash']\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_attribute_still_raises():
    with pytest.raises(AttributeError):
        ca.no_such_function  # noqa: B018


class FakeArray:
    """Enough of a CuPy array for the hot path (shape, strides, dtype, device, pointer)."""

    def __init__(self, shape, dtype, ptr, values=None):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        strides, step = [], self.dtype.itemsize
        for n in reversed(self.shape):
            strides.append(step)
            step *= n
        self.strides = tuple(reversed(strides))
        self.device = types.SimpleNamespace(id=0)
        self.data = types.SimpleNamespace(ptr=ptr)
        self.values = values

    def get(self):
        return np.asarray(self.values, dtype=self.dtype)


FakeArray.__module__ = "cupy._stand_in"


@pytest.fixture
def fake_cupy(monkeypatch):
    ptrs = iter(range(1 << 20, 1 << 30, 1 << 16))
    stream = types.SimpleNamespace(is_capturing=lambda: False)
    fake = types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0,
                                                                 setDevice=lambda d: None),
                                   get_current_stream=lambda: stream),
        empty=lambda shape, dtype: FakeArray(shape, dtype, next(ptrs)),
        float32=np.float32)
    monkeypatch.setattr(device, "require_cupy", lambda: fake)
    return fake


class Recorder:
    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)


def _varlen_case(lens=(0, 5, 12, 20)):
    q = FakeArray((20, 4, 64), "float16", 0x1000)
    k = FakeArray((20, 2, 64), "float16", 0x2000)
    v = FakeArray((20, 2, 64), "float16", 0x3000)
    cu = FakeArray((len(lens),), "int32", 0x4000, lens)
    p = Problem(len(lens) - 1, 4, 2, 20, 20, 64, "float16", "thd", True, "none", 0.125, 0,
                varlen=True)
    return q, k, v, cu, p


def test_varlen_hot_call_patches_pointers_and_honours_check(fake_cupy, monkeypatch):
    monkeypatch.setattr(varlen, "HOT", varlen.HotCache(4))
    q, k, v, cu, p = _varlen_case()
    key = varlen.signature(q, k, v, cu, cu, None, None, True, None, None, None, True, "auto")
    assert key is not None
    rec = Recorder()
    varlen.HOT.put(key, varlen.VarlenHotCall("cupy", 0, p, rec))
    out, lse = ca.attention_varlen(q, k, v, cu, cu, causal=True, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (4, 20) and lse.dtype == np.float32
    (qp, kp, vp, op, lp, _stream, cus), = rec.calls
    assert (qp, kp, vp, op, lp, cus) == (0x1000, 0x2000, 0x3000, out.data.ptr, lse.data.ptr,
                                         (0x4000, 0x4000))
    bad = FakeArray(cu.shape, "int32", 0x5000, (0, 7, 5, 20))
    with pytest.raises(ShapeError, match="must not decrease"):
        ca.attention_varlen(q, k, v, bad, bad, causal=True, return_lse=True)
    ca.attention_varlen(q, k, v, bad, bad, causal=True, return_lse=True, check=False)
    assert rec.calls[-1][-1] == (0x5000, 0x5000), "check=False: the fast path, no host read"


def test_varlen_signature_separates_what_the_launch_depends_on():
    q, k, v, cu, _ = _varlen_case()
    base = dict(max_q=None, max_k=None, causal=True, scale=None, window=None, softcap=None,
                return_lse=False, kernel="auto")
    sig = lambda **kw: varlen.signature(q, k, v, cu, cu, **{**base, **kw})  # noqa: E731
    keys = [sig(), sig(causal=False), sig(scale=0.5), sig(window=(8, 0)), sig(softcap=30.0),
            sig(return_lse=True), sig(kernel="flash_mma"), sig(max_q=5)]
    assert None not in keys and len(set(keys)) == len(keys)
    other = FakeArray((5,), "int32", 0x9000, (0, 1, 2, 3, 20))
    assert varlen.signature(q, k, v, other, other, **base) != sig()
    assert varlen.signature(q, k, v, cu, cu, **{**base, "window": [1, 0]}) is not None
    host = np.zeros(4, np.int32)
    assert varlen.signature(q, k, v, host, host, **base) is None, "host cu_seqlens: no hot path"
    assert varlen.signature(np.zeros((20, 4, 64)), k, v, cu, cu, **base) is None


def test_hot_launch_patches_cu_seqlens():
    seen = []
    # HotLaunch hands the packed struct's bytes to launch_packed, and the family's
    # further arguments (``extra``: flash_wgmma's maps, counter and ints) as its tail
    kernel = types.SimpleNamespace(
        launch_packed=lambda grid, block, params, smem, stream_ptr, tail=():
        seen.append((np.frombuffer(bytes(params), FWD_DTYPE)[0], stream_ptr, tail)))
    stream = types.SimpleNamespace(ptr=1234)
    hl = HotLaunch.__new__(HotLaunch)
    hl.template = bytes(FWD_DTYPE.itemsize)
    hl.strides_aligned, hl.extra = True, None
    hl.variants = lambda vec: (kernel, (1,), (32,), 0)
    hl.run(16, 32, 48, 64, 80, stream, (96, 112))
    hl.run(16, 32, 48, 64, 0, stream)
    hl.extra = lambda vec, q, k, v, s: ("maps of", q, k, v, "for", s.ptr, vec)
    hl.run(16, 32, 48, 64, 0, stream)
    hl.run(16, 32, 40, 64, 0, stream)   # v not 16-byte aligned: the unaligned kernel
    (a, pa, ta), (b, _, tb), (_, _, tc), (_, _, td) = seen
    assert pa == 1234 and ta == tb == ()
    assert tc == ("maps of", 16, 32, 48, "for", 1234, True) and td[-1] is False
    assert [int(a[f]) for f in ("q", "k", "v", "o", "lse", "cu_seqlens_q", "cu_seqlens_k")] == \
        [16, 32, 48, 64, 80, 96, 112]
    assert int(b["lse"]) == 0 and int(b["cu_seqlens_q"]) == 0, "the template's value kept"


def _bwd_case():
    q = FakeArray((2, 4, 40, 64), "float16", 0x10000)
    k = FakeArray((2, 2, 40, 64), "float16", 0x20000)
    v = FakeArray((2, 2, 40, 64), "float16", 0x30000)
    out = FakeArray((2, 4, 40, 64), "float16", 0x40000)
    lse = FakeArray((2, 4, 40), "float32", 0x50000)
    dout = FakeArray((2, 4, 40, 64), "float16", 0x60000)
    p = Problem(2, 4, 2, 40, 40, 64, "float16", "bhsd", True, "none", 0.125, 0)
    return dout, q, k, v, out, lse, p


class BwdRecorder:
    kv_splits = 1

    def __init__(self, ok=True):
        self.calls, self.ok = [], ok

    def run(self, *args):
        self.calls.append(args)
        return self.ok


@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_hot_call_allocates_and_patches(fake_cupy, monkeypatch, deterministic):
    from cupy_attention import backward

    monkeypatch.setattr(backward, "_HOT", backward.HotCache(4))
    fake_cupy.cuda.get_current_stream().ptr = 77
    dout, q, k, v, out, lse, p = _bwd_case()
    key = backward._signature(dout, q, k, v, out, lse, True, None, "bhsd", None, None,
                              deterministic, "auto")
    rec = BwdRecorder()
    # the separate dQ pass's deterministic mode: no dq_accum
    accum = None if deterministic else (p.batch, p.heads_q, p.seqlen_q, p.head_dim)
    backward._HOT.put(key, backward.HotBackward("cupy", 0, p, rec, q, k, accum))
    dq, dk, dv = ca.attention_backward(dout, q, k, v, out, lse, causal=True,
                                       deterministic=deterministic)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert dq.dtype == q.dtype
    (args,) = rec.calls
    assert args[:6] == (0x10000, 0x20000, 0x30000, 0x40000, 0x50000, 0x60000)
    assert args[6:9] == (dq.data.ptr, dk.data.ptr, dv.data.ptr)
    assert (args[9] == 0) == deterministic, "dq_accum only where the shape says"
    assert args[10] != 0 and args[11] == 77


def test_backward_hot_call_declines_what_it_cannot_launch(fake_cupy, monkeypatch):
    """A launcher that refuses (unaligned pointers) makes the hot call return None, so
    the caller takes the general path; the key separates what the launches depend on."""
    from cupy_attention import backward

    monkeypatch.setattr(backward, "_HOT", backward.HotCache(4))
    fake_cupy.cuda.get_current_stream().ptr = 77
    dout, q, k, v, out, lse, p = _bwd_case()
    hot = backward.HotBackward("cupy", 0, p, BwdRecorder(ok=False), q, k,
                               (p.batch, p.heads_q, p.seqlen_q, p.head_dim))
    assert hot(dout, q, k, v, out, lse) is None
    sig = lambda **kw: backward._signature(  # noqa: E731
        *(dout, q, k, v, out, lse), **{**dict(causal=True, scale=None, layout="bhsd",
                                             window=None, softcap=None, deterministic=False,
                                             kernel="auto"), **kw})
    keys = [sig(), sig(causal=False), sig(scale=0.5), sig(window=(8, 0)), sig(softcap=30.0),
            sig(deterministic=True), sig(kernel="flash_mma")]
    assert None not in keys and len(set(keys)) == len(keys)
    assert backward._signature(np.zeros(3), q, k, v, out, lse, True, None, "bhsd", None, None,
                               False, "auto") is None


@pytest.mark.parametrize("deterministic", [False, True])
def test_varlen_backward_hot_call_patches_pointers_and_honours_check(fake_cupy, monkeypatch,
                                                                    deterministic):
    """attention_varlen_backward's hot path: fresh gradients like q, k, v, delta
    [Hq, total_q], dq_accum [Hq, total_q, D] only in the atomic mode, the call's
    cu_seqlens pointers patched in, and ``check=True`` still refusing bad lengths."""
    monkeypatch.setattr(varlen, "HOT_BACKWARD", varlen.HotCache(4))
    fake_cupy.cuda.get_current_stream().ptr = 77
    q, k, v, cu, p = _varlen_case()
    out = FakeArray(q.shape, "float16", 0x6000)
    dout = FakeArray(q.shape, "float16", 0x7000)
    lse = FakeArray((4, 20), "float32", 0x8000)
    key = varlen.backward_signature(dout, q, k, v, out, lse, cu, cu, None, None, True, None,
                                    None, None, deterministic, "auto")
    assert key is not None
    rec = BwdRecorder()
    accum = None if deterministic else (4, 20, 64)
    varlen.HOT_BACKWARD.put(key, varlen.VarlenHotBackward(p, backward.HotBackward(
        "cupy", 0, p, rec, q, k, accum, (4, 20))))
    dq, dk, dv = ca.attention_varlen_backward(dout, q, k, v, out, lse, cu, cu, causal=True,
                                              deterministic=deterministic)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    (args,) = rec.calls
    assert args[:6] == (0x1000, 0x2000, 0x3000, 0x6000, 0x8000, 0x7000)
    assert args[6:9] == (dq.data.ptr, dk.data.ptr, dv.data.ptr)
    assert (args[9] == 0) == deterministic, "dq_accum only in the atomic mode"
    assert args[10] != 0 and args[11] == 77 and args[-1] == (0x4000, 0x4000)
    bad = FakeArray(cu.shape, "int32", 0x5000, (0, 7, 5, 20))
    with pytest.raises(ShapeError, match="must not decrease"):
        ca.attention_varlen_backward(dout, q, k, v, out, lse, bad, bad, causal=True,
                                     deterministic=deterministic)
    assert len(rec.calls) == 1, "nothing launched for refused lengths"
    ca.attention_varlen_backward(dout, q, k, v, out, lse, bad, bad, causal=True,
                                 deterministic=deterministic, check=False)
    assert rec.calls[-1][-1] == (0x5000, 0x5000), "check=False: the fast path, no host read"


def test_varlen_backward_signature_separates_what_the_launches_depend_on():
    q, k, v, cu, _ = _varlen_case()
    out, dout = FakeArray(q.shape, "float16", 0x6000), FakeArray(q.shape, "float16", 0x7000)
    lse = FakeArray((4, 20), "float32", 0x8000)
    base = dict(max_q=None, max_k=None, causal=True, scale=None, window=None, softcap=None,
                deterministic=False, kernel="auto")
    sig = lambda *a, **kw: varlen.backward_signature(  # noqa: E731
        *(a or (dout, q, k, v, out, lse, cu, cu)), **{**base, **kw})
    lse_t = FakeArray((4, 20), "float32", 0x8000)
    lse_t.strides = (4, 16)   # a transposed view
    keys = [sig(), sig(causal=False), sig(scale=0.5), sig(window=(8, 0)), sig(softcap=30.0),
            sig(deterministic=True), sig(deterministic=1), sig(kernel="flash_mma"), sig(max_k=9),
            sig(dout, q, k, v, out, lse_t, cu, cu)]
    assert None not in keys and len(set(keys)) == len(keys)
    assert sig(dout, q, k, v, out, lse, np.zeros(4, np.int32), cu) is None, "host cu_seqlens"
    assert varlen.signature(q, k, v, cu, cu, None, None, True, None, None, None, False,
                            "auto") != sig(), "the forward's keys are its own"


def test_hot_backward_patches_every_pointer():
    from cupy_attention.families import flash_bwd
    from cupy_attention.params import BWD_DTYPE

    seen = []
    kernel = types.SimpleNamespace(launch_packed=lambda grid, block, params, smem, stream_ptr:
                                   seen.append((grid, np.frombuffer(bytes(params), BWD_DTYPE)[0],
                                                stream_ptr)))
    hb = flash_bwd.HotBackward.__new__(flash_bwd.HotBackward)
    hb.template = bytes(BWD_DTYPE.itemsize)
    hb.launches = [(kernel, (1,), (32,), 0), (kernel, (2,), (32,), 0)]
    hb.aligned = True
    assert not hb.run(16, 32, 40, 64, 80, 96, 112, 128, 144, 160, 176, 9), "k unaligned"
    assert hb.run(16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 9)
    assert [g for g, _, _ in seen] == [(1,), (2,)] and seen[0][2] == 9
    s = seen[0][1]
    fwd = s["fwd"]
    assert [int(fwd[f]) for f in ("q", "k", "v", "o", "lse")] == [16, 32, 48, 64, 80]
    assert [int(s[f]) for f in ("dout", "dq", "dk", "dv", "dq_accum", "delta")] == \
        [96, 112, 128, 144, 160, 176]


def test_hot_cache_keeps_limit_entries_then_says_full():
    from cupy_attention.calls import HotCache

    cache = HotCache(2)
    cache.put(None, "never kept")
    cache.put("a", 1)
    assert not cache.full and len(cache) == 1
    cache.put("b", 2)
    assert cache.full
    cache.put("c", 3)
    assert len(cache) == 2 and cache.get("c") is None and cache.get("a") == 1
