"""NaN and +Inf inputs, per forward family (``dispatch.FAMILIES``) and per backward
family (``dispatch.BACKWARD_FAMILIES``).

Forward matrix: value (NaN, +Inf) x tensor (q, k, v) x where:

- ``full``: no mask, the poisoned element is attended by every row of its group;
- ``causal``: a key attended by the later half of the rows only (bottom-right);
- ``window``: window (8, 2), a key attended by a few rows only;
- ``padded``: q, k, v are views of larger allocations whose every element outside
  the view (extra rows past Sq/Sk, extra columns, an extra head) holds the value.

Expected, element by element of out and row by row of LSE, written out from the
definition: a poisoned q row gives that row non-finite (out and LSE); a NaN key
gives every row that attends it non-finite; a +Inf key gives the rows whose score
with it is +Inf or NaN (q[d] >= 0) non-finite, and simply drops the key from the
others (score -Inf); a poisoned V element gives column d of every row that attends
the key non-finite. Masked-out and out-of-view poison reaches nothing. Every other
element is finite and passes TESTING.md's rule against the float64 reference of the
same inputs (V taken clean: the plain reference multiplies 0 by a masked V).

Known and documented limit (README, kernels/flash_mma.cu, kernels/flash_wgmma.cu,
kernels/decode.cu): the tensor-core families' P @ V multiplies the exact zeros of
masked-out P by V, so NaN/Inf in a masked-out V still reaches the rows of its tile;
those cases (``causal``/``window`` with poisoned v on flash_mma, flash_wgmma and
decode, whose packed query rows share one mma tile) are skipped with that reason. Out-of-view V (``padded``) is never read by any family.

Backward (fp16, D = 64): the forward's out and LSE come from ``flash`` (which keeps
masked-out V out), so the backward is tested on its own. ``full``: the other
(batch, KV head) groups' dq, dk, dv, every dq row but the poisoned one (q), and
every dv (v: dV = P^T dO never reads V) are finite and pass the gradient rule
against the clean inputs' reference; NaN shows up in the poisoned group.
``padded``: every gradient passes.
"""
from __future__ import annotations

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention.dispatch import BACKWARD_FAMILIES, FAMILIES

from helpers import (as_float, check_attention, make_qkv, plain_attention, plain_backward,
                     prewarm_calls, problem_for, seed_for, set_values, tolerance)

pytestmark = pytest.mark.gpu

NAMES = list(FAMILIES)
BWD_NAMES = list(BACKWARD_FAMILIES)
V_MASKED_LEAKS = {"flash_mma", "flash_wgmma", "decode"}
WHERE = ("full", "causal", "window", "padded")
VALUES = {"nan": np.nan, "inf": np.inf}
WINDOW = (8, 2)
D = 64
B0, KV0, D0 = 1, 1, 5          # the poisoned batch, KV head and column


def main_dtype(name):
    dtypes = FAMILIES[name].dtypes
    return "float16" if "float16" in dtypes else dtypes[0]


def fwd_shape(name):
    sq = 6 if name == "decode" else 150
    return dict(batch=2, heads_q=4, heads_kv=2, seqlen_q=sq, seqlen_k=150, head_dim=D,
                dtype=main_dtype(name))


BWD_SHAPE = dict(batch=2, heads_q=4, heads_kv=2, seqlen_q=150, seqlen_k=150, head_dim=D,
                 dtype="float16")


def attends(sq, sk, where):
    """keep[i, j] (numpy): row i attends key j, bottom-right aligned."""
    i = np.arange(sq)[:, None] + (sk - sq)
    j = np.arange(sk)[None, :]
    keep = np.ones((sq, sk), dtype=bool)
    if where == "causal":
        keep &= j <= i
    if where == "window":
        keep &= (j >= i - WINDOW[0]) & (j <= i + WINDOW[1])
    return keep


def kernel_args(where):
    return dict(causal=where == "causal", window=WINDOW if where == "window" else None)


def poisoned_key(sq, sk):
    """A key attended by the later rows only (causal) and by a few rows (window)."""
    return sk - sq + sq // 2


def _cc():
    import cupy

    from cupy_attention import device

    return device.compute_capability(cupy.cuda.runtime.getDevice())


def _fwd_calls():
    import cupy

    for name in NAMES:
        shape = fwd_shape(name)
        for where in WHERE:
            q, k, v, _ = make_qkv(cupy, 0, values=False, view="padded", **shape)
            out = cupy.empty((2, 4, shape["seqlen_q"], D), dtype=q.dtype)
            lse = cupy.empty((2, 4, shape["seqlen_q"]), dtype=cupy.float32)
            try:
                ca.attention(q, k, v, out=out, lse_out=lse, kernel=name, **kernel_args(where))
            except Exception:
                pass
    q, k, v, _ = make_qkv(cupy, 0, values=False, view="padded", **BWD_SHAPE)
    out = cupy.empty((2, 4, 150, D), dtype=q.dtype)
    lse = cupy.empty((2, 4, 150), dtype=cupy.float32)
    for name in BWD_NAMES:
        try:
            ca.attention_backward(out, q, k, v, out, lse, kernel=name)
        except Exception:
            pass


@pytest.fixture(scope="module", autouse=True)
def _prewarm():
    prewarm_calls(_fwd_calls)


def fill_outside(buf, value):
    """Every element of ``buf.base`` outside ``buf.view`` set to ``value``."""
    import cupy

    outside = cupy.ones(buf.base.shape, dtype=bool)
    outside[buf.index] = False
    set_values(buf.base, outside, value)


@pytest.mark.parametrize("value", list(VALUES))
@pytest.mark.parametrize("tensor", ["q", "k", "v"])
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("name", NAMES)
def test_forward(name, where, tensor, value):
    import cupy

    shape = fwd_shape(name)
    dtype, sq, sk = shape["dtype"], shape["seqlen_q"], shape["seqlen_k"]
    reason = FAMILIES[name].check(problem_for(causal=where == "causal", **shape), _cc())
    if reason is not None:
        pytest.skip(f"{name}: {reason}")
    if tensor == "v" and where in ("causal", "window") and name in V_MASKED_LEAKS:
        pytest.skip(f"{name}: P@V on tensor cores multiplies masked-out P (0) by V, so "
                    "NaN/Inf in a masked-out V reaches its tile's rows (documented limit)")
    val = VALUES[value]
    group = shape["heads_q"] // shape["heads_kv"]
    heads = list(range(KV0 * group, (KV0 + 1) * group))
    keep = attends(sq, sk, where)
    q, k, v, bufs = make_qkv(cupy, seed_for("nonfinite", name, where, tensor, value),
                             view="padded" if where == "padded" else "contiguous", **shape)
    v_clean = v.copy()
    expect = np.zeros((2, 4, sq, D), dtype=bool)     # non-finite elements of out
    expect_lse = np.zeros((2, 4, sq), dtype=bool)
    if where == "padded":
        fill_outside(bufs[tensor], val)
    elif tensor == "q":
        i0 = sq - 3
        row_k = as_float(k)[B0, KV0, :, D0].get()
        assert keep[i0].any()
        if value == "inf":   # +Inf * k[j, d]: +Inf or NaN for some attended key
            assert bool((keep[i0] & (row_k >= 0)).any()), "test setup: no key with k[d] >= 0"
        set_values(q, (B0, heads[0], i0, D0), val)
        expect[B0, heads[0], i0] = True
        expect_lse[B0, heads[0], i0] = True
    else:
        j0 = 40 if where == "full" else poisoned_key(sq, sk)
        rows = keep[:, j0]
        assert rows.any() and (where == "full" or not rows.all()), "test setup: rows"
        set_values(k if tensor == "k" else v, (B0, KV0, j0, D0), val)
        for h in heads:
            hit = rows.copy()
            if tensor == "k" and value == "inf":   # q[d] * +Inf: -Inf drops the key
                hit &= as_float(q)[B0, h, :, D0].get() >= 0
            if tensor == "k":
                expect[B0, h, hit] = True
                expect_lse[B0, h, hit] = True
            else:
                expect[B0, h, hit, D0] = True
    out, lse = ca.attention(q, k, v, return_lse=True, kernel=name, **kernel_args(where))
    got = as_float(out)
    bad = ~cupy.isfinite(got).get()
    bad_lse = ~cupy.isfinite(lse).get()
    assert np.array_equal(bad, expect), (
        f"non-finite output elements: {int(bad.sum())} where {int(expect.sum())} expected; "
        f"{int((bad & ~expect).sum())} unexpected, {int((expect & ~bad).sum())} missing")
    assert np.array_equal(bad_lse, expect_lse), (
        f"non-finite LSE rows: {np.argwhere(bad_lse).tolist()[:8]}, expected "
        f"{np.argwhere(expect_lse).tolist()[:8]}")
    mask = None if where in ("full", "padded") else cupy.asarray(keep)
    ref, ref_lse = plain_attention(q, k, v_clean, mask=mask)
    same, same_lse = plain_attention(q, k, v_clean, mask=mask, precision=dtype)
    ok, ok_lse = cupy.asarray(~expect), cupy.asarray(~expect_lse)
    check_attention(got[ok], ref[ok], same[ok], dtype, lse=lse.astype(cupy.float64)[ok_lse],
                    ref_lse=ref_lse[ok_lse], same_lse=same_lse[ok_lse])


def _skip_unless_backward(name):
    import cupy

    from cupy_attention import device

    smem = device.max_shared_per_block(cupy.cuda.runtime.getDevice())
    reason = BACKWARD_FAMILIES[name].check(problem_for(**BWD_SHAPE), _cc(), smem)
    if reason is not None:
        pytest.skip(f"{name} backward: {reason}")


def _check_grads(grads, refs, sames, selections):
    """The gradient rule (factor 3) on each gradient's selected elements."""
    for what, g, r, s in zip(("dq", "dk", "dv"), grads, refs, sames):
        for sel in selections[what]:
            tolerance(as_float(g)[sel], r[sel], s[sel], "float16", what=what, factor=3.0)


@pytest.mark.parametrize("value", list(VALUES))
@pytest.mark.parametrize("tensor", ["q", "k", "v"])
@pytest.mark.parametrize("where", ["full", "padded"])
@pytest.mark.parametrize("name", BWD_NAMES)
def test_backward(name, where, tensor, value):
    import cupy

    _skip_unless_backward(name)
    val = VALUES[value]
    group = BWD_SHAPE["heads_q"] // BWD_SHAPE["heads_kv"]
    heads = slice(KV0 * group, (KV0 + 1) * group)
    q, k, v, bufs = make_qkv(cupy, seed_for("nonfinite-bwd", name, where, tensor, value),
                             view="padded" if where == "padded" else "contiguous", **BWD_SHAPE)
    dout = make_qkv(cupy, seed_for("dout", tensor, value), **BWD_SHAPE)[0]
    refs = plain_backward(dout, q, k, v)
    sames = plain_backward(dout, q, k, v, precision="float16")
    i0, j0 = 147, 40
    if where == "padded":
        fill_outside(bufs[tensor], val)
    else:
        x = {"q": q, "k": k, "v": v}[tensor]
        pos = (B0, KV0 * group, i0, D0) if tensor == "q" else (B0, KV0, j0, D0)
        set_values(x, pos, val)
    out, lse = ca.attention(q, k, v, return_lse=True, kernel="flash")
    grads = ca.attention_backward(dout, q, k, v, out, lse, kernel=name)
    if where == "padded":
        _check_grads(grads, refs, sames, {w: [Ellipsis] for w in ("dq", "dk", "dv")})
        return
    # the other (batch, KV head) groups: (batch 0, all heads) and (batch 1, KV head 0)
    others_q = [(0,), (B0, slice(0, KV0 * group))]
    others_kv = [(0,), (B0, slice(0, KV0))]
    sel = {"dq": list(others_q), "dk": list(others_kv), "dv": list(others_kv)}
    if tensor == "q":
        rows = np.ones(150, dtype=bool)
        rows[i0] = False
        sel["dq"].append((B0, KV0 * group, cupy.asarray(rows)))
        sel["dq"].append((B0, slice(KV0 * group + 1, (KV0 + 1) * group)))
    if tensor == "v":
        sel["dv"] = [Ellipsis]
    _check_grads(grads, refs, sames, sel)
    dq = as_float(grads[0])
    if value == "nan":
        hit = dq[B0, KV0 * group, i0] if tensor == "q" else dq[B0, heads]
        assert not bool(cupy.isfinite(hit).all()), "NaN at an attended position must propagate"
