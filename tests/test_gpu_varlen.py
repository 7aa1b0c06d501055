"""Packed sequences (attention_varlen) on the device: flash_mma and flash_wgmma,
forward (O and LSE) and backward (dQ, dK, dV, both dQ modes), against the float64
reference sequence by sequence with TESTING.md's tolerance rule (``same`` from
test_gpu_variants: fp32 scores, inputs and P rounded to the dtype).

Lengths include 0, 1 and lengths that are no multiple of any tile; query and key
lengths differ per sequence (the causal and window alignment is each sequence's
own); GQA; windows, softcap and ALiBi ([Hq] slopes, distances within each sequence)
on some cases; torch autograd through
cupy_attention.torch.attention_varlen.
"""

from __future__ import annotations

import numpy as np
import pytest

import cupy_attention as ca
from cupy_attention.varlen import (attention_varlen_backward_reference,
                                   attention_varlen_reference)

from helpers import as_float, cast, prewarm_calls, seed_for, tolerance
from test_backward import _flat_runs
from test_gpu_variants import _same, _slopes

pytestmark = pytest.mark.gpu

# (query lengths, key lengths) per sequence
LENGTHS = [
    ([300, 0, 1, 129, 64, 7], [300, 5, 1, 200, 64, 0]),
    ([513, 190, 33], [513, 190, 33]),
    ([17, 250, 0, 128], [40, 250, 9, 100]),
]
HEAD_DIMS = {"flash_wgmma": (64, 128, 80, 256), "flash_mma": (64, 128, 40, 96)}
CASES = []
for fam in ("flash_wgmma", "flash_mma"):
    for idx in range(8):
        causal = idx % 2 == 0
        window = (64, 0) if idx % 4 == 1 else (32, 16) if idx == 6 else None
        CASES.append(pytest.param(dict(
            family=fam, causal=causal and window != (32, 16), window=window,
            softcap=30.0 if idx % 3 == 2 else None, alibi=idx % 3 == 1,
            head_dim=HEAD_DIMS[fam][idx % 4],
            lengths=LENGTHS[idx % 3], dtype=("float16", "bfloat16")[idx % 2],
            heads_kv=(2, 1, 4)[idx % 3], deterministic=idx % 4 == 3),
            id=f"{fam}-i{idx}"))


def _inputs(c, cupy):
    lq, lk = c["lengths"]
    rng = np.random.default_rng(seed_for("varlen", c["family"], c["head_dim"], str(lq)))
    hq, hkv, d = 4, c["heads_kv"], c["head_dim"]
    mag = 2.0 if c["softcap"] else 1.0
    def arr(rows, heads):
        x = rng.standard_normal((rows, heads, d)).astype(np.float32) * mag
        return cast(cupy.asarray(x), c["dtype"], cupy)
    q, k, v = arr(sum(lq), hq), arr(sum(lk), hkv), arr(sum(lk), hkv)
    cu_q = cupy.asarray(np.concatenate([[0], np.cumsum(lq)]).astype(np.int32))
    cu_k = cupy.asarray(np.concatenate([[0], np.cumsum(lk)]).astype(np.int32))
    return q, k, v, cu_q, cu_k


def _f64(x):
    return as_float(x).get()


def _per_sequence_same(c, q, k, v, cu_q, cu_k, dout=None, out=None):
    """``same`` of every sequence, packed like the results."""
    hq_, hk_ = cu_q.get(), cu_k.get()
    sc = dict(c, layout="bshd", window=c["window"] or (-1, -1))
    if dout is None:
        o = np.zeros(q.shape)
        lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    else:
        grads = [np.zeros(x.shape) for x in (q, k, v)]
    for b in range(len(hq_) - 1):
        q0, q1, k0, k1 = int(hq_[b]), int(hq_[b + 1]), int(hk_[b]), int(hk_[b + 1])
        if q1 == q0 or k1 == k0:
            continue
        qs, ks, vs = q[None, q0:q1], k[None, k0:k1], v[None, k0:k1]
        if dout is None:
            ob, lb = _same(qs, ks, vs, sc)
            o[q0:q1] = ob[0].transpose(1, 0, 2)
            lse[:, q0:q1] = lb[0]
        else:
            g = _same(qs, ks, vs, sc, dout=dout[None, q0:q1], out=out[None, q0:q1])
            grads[0][q0:q1] = g[0][0].transpose(1, 0, 2)
            grads[1][k0:k1] = g[1][0].transpose(1, 0, 2)
            grads[2][k0:k1] = g[2][0].transpose(1, 0, 2)
    return (o, lse) if dout is None else grads


def _skip_unless(c):
    import cupy
    from cupy_attention import device

    cc = device.compute_capability(cupy.cuda.runtime.getDevice())
    if c["family"] == "flash_wgmma" and cc != 90:
        pytest.skip("flash_wgmma needs compute capability 9.0")


@pytest.fixture(scope="module", autouse=True)
def _compile_in_parallel():
    """Compile every instantiation this module launches in a process pool first."""
    import cupy

    def calls():
        for param in CASES:
            c = param.values[0]
            try:
                q, k, v, cu_q, cu_k = _inputs(c, cupy)
                kw = dict(causal=c["causal"], window=c["window"], softcap=c["softcap"],
                          alibi_slopes=_slopes(c), kernel=c["family"])
                out, lse = ca.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **kw)
                for det in (False, True):
                    ca.attention_varlen_backward(out, q, k, v, out, lse, cu_q, cu_k,
                                                 deterministic=det, **kw)
            except Exception:
                continue

    prewarm_calls(calls)


@pytest.mark.parametrize("c", CASES)
def test_varlen_forward(c):
    import cupy

    _skip_unless(c)
    q, k, v, cu_q, cu_k = _inputs(c, cupy)
    slopes = _slopes(c)
    out, lse = ca.attention_varlen(q, k, v, cu_q, cu_k, causal=c["causal"], window=c["window"],
                                   softcap=c["softcap"], alibi_slopes=slopes, return_lse=True,
                                   kernel=c["family"])
    assert out.shape == q.shape and lse.shape == (q.shape[1], q.shape[0])
    ref, ref_lse = attention_varlen_reference(q, k, v, cu_q, cu_k, causal=c["causal"],
                                              window=c["window"], softcap=c["softcap"],
                                              alibi_slopes=slopes)
    same, same_lse = _per_sequence_same(c, q, k, v, cu_q, cu_k)
    tolerance(_f64(out), ref, same, c["dtype"], "out")
    tolerance(_f64(lse), ref_lse, same_lse, "float32", "lse",
              extra=4 * 2.0 ** -23 * max(1.0, float(np.abs(ref_lse[np.isfinite(ref_lse)]).max()))
              / np.log(2))


@pytest.mark.parametrize("c", CASES)
def test_varlen_backward(c):
    import cupy

    _skip_unless(c)
    q, k, v, cu_q, cu_k = _inputs(c, cupy)
    kw = dict(causal=c["causal"], window=c["window"], softcap=c["softcap"],
              alibi_slopes=_slopes(c))
    out, lse = ca.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, kernel=c["family"], **kw)
    rng = np.random.default_rng(7)
    dout = cast(cupy.asarray(rng.standard_normal(q.shape).astype(np.float32)), c["dtype"], cupy)
    dq, dk, dv = ca.attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k,
                                              deterministic=c["deterministic"],
                                              kernel=c["family"], **kw)
    refs = attention_varlen_backward_reference(dout, q, k, v, cu_q, cu_k, **kw)
    sames = _per_sequence_same(c, q, k, v, cu_q, cu_k, dout=dout, out=out)
    for name, g, r, s in zip(("dq", "dk", "dv"), (dq, dk, dv), refs, sames):
        tolerance(_f64(g), r, s, c["dtype"], name, factor=3.0)
    if c["deterministic"]:
        again = ca.attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k,
                                             deterministic=True, kernel=c["family"], **kw)
        for g, h in zip((dq, dk, dv), again):
            assert bool((g.view(cupy.uint16) == h.view(cupy.uint16)).all())


@pytest.mark.parametrize("c", [
    dict(family="flash_wgmma", causal=True, window=None, softcap=None, alibi=False,
         head_dim=96, lengths=([64, 0, 190, 1, 128, 513], [64, 3, 190, 1, 200, 513]),
         dtype="bfloat16", heads_kv=2, deterministic=False),
    dict(family="flash_wgmma", causal=False, window=(100, 20), softcap=30.0, alibi=False,
         head_dim=64, lengths=([256, 129, 0, 384], [256, 300, 7, 384]),
         dtype="float16", heads_kv=4, deterministic=False),
], ids=["d96-causal", "d64-window-softcap"])
def test_varlen_backward_flat_dq(c, monkeypatch):
    """Packed sequences with dQ in its own order (flat_dq): the tiles whole within
    their sequence staged in the fragments' order, each sequence's partial last tile
    in rows; the reference's gradients, and the same within rounding as rows in
    order throughout."""
    import cupy

    _skip_unless(c)
    q, k, v, cu_q, cu_k = _inputs(c, cupy)
    kw = dict(causal=c["causal"], window=c["window"], softcap=c["softcap"])
    out, lse = ca.attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, kernel=c["family"], **kw)
    rng = np.random.default_rng(11)
    dout = cast(cupy.asarray(rng.standard_normal(q.shape).astype(np.float32)), c["dtype"], cupy)
    runs = {}
    for on in (False, True):
        runs[on], chosen = _flat_runs(monkeypatch, on, lambda: ca.attention_varlen_backward(
            dout, q, k, v, out, lse, cu_q, cu_k, kernel=c["family"], **kw))
    assert chosen == [True], chosen
    refs = attention_varlen_backward_reference(dout, q, k, v, cu_q, cu_k, **kw)
    sames = _per_sequence_same(c, q, k, v, cu_q, cu_k, dout=dout, out=out)
    eps = 2.0 ** -7 if c["dtype"] == "bfloat16" else 2.0 ** -10
    for name, g, rows, r, s in zip(("dq", "dk", "dv"), runs[True], runs[False], refs, sames):
        tolerance(_f64(g), r, s, c["dtype"], name, factor=3.0)
        err, top = float(abs(_f64(g) - _f64(rows)).max()), float(abs(_f64(rows)).max())
        assert err <= 2 * eps * top, f"{name}: {err} against {top} with rows in order"


def test_varlen_empty_keys_and_errors():
    import cupy

    q = cupy.ones((5, 2, 64), dtype=cupy.float16)
    k = cupy.ones((0, 2, 64), dtype=cupy.float16)
    cu_q = cupy.asarray(np.array([0, 2, 5], np.int32))
    cu_k = cupy.zeros(3, dtype=cupy.int32)
    out, lse = ca.attention_varlen(q, k, k, cu_q, cu_k, return_lse=True)
    assert bool((out == 0).all()) and bool(cupy.isneginf(lse).all())
    with pytest.raises(ca.ShapeError, match="must not decrease"):
        ca.attention_varlen(q, q, q, cupy.asarray(np.array([0, 3, 2, 5], np.int32)),
                            cupy.asarray(np.array([0, 1, 2, 5], np.int32)))
    with pytest.raises(ca.ShapeError, match="last entry"):
        ca.attention_varlen(q, q, q, cu_q, cupy.asarray(np.array([0, 2, 4], np.int32)))


@pytest.mark.parametrize("dropout", [None, (0.2, 31, 4)])
def test_varlen_torch_autograd(dropout):
    torch = pytest.importorskip("torch")
    import cupy_attention.torch as cat

    lq = [37, 0, 200, 64]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(sum(lq), h, 64, device="cuda", generator=gen, dtype=torch.bfloat16)
               .requires_grad_() for h in (4, 2, 2))
    drop = {} if dropout is None else dict(zip(("dropout_p", "dropout_seed", "dropout_offset"),
                                               dropout))
    out = cat.attention_varlen(q, k, v, cu, cu, causal=True, **drop)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref = attention_varlen_reference(q.detach(), k.detach(), v.detach(), cu, cu, causal=True,
                                     dropout=dropout)[0]
    grads = attention_varlen_backward_reference(dout, q.detach(), k.detach(), v.detach(), cu, cu,
                                                causal=True, dropout=dropout)
    err = np.abs(out.detach().double().cpu().numpy() - ref).max()
    assert err < 3e-2, err
    for g, r in zip((q.grad, k.grad, v.grad), grads):
        assert np.abs(g.double().cpu().numpy() - r).max() < 6e-2 * max(1.0, np.abs(r).max())


@pytest.mark.parametrize("kind", ["cupy", "torch"])
def test_varlen_hot_path_matches_the_general_path(kind):
    """A repeated signature takes the hot path (no validation, launch with new pointers,
    cu_seqlens included): bitwise the general path's result for new values and new
    lengths; ``check=True`` still refuses bad lengths there."""
    import cupy

    from cupy_attention import varlen

    torch = pytest.importorskip("torch") if kind == "torch" else None
    rng = np.random.default_rng(11)

    def case(lens):
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        arrs = [rng.standard_normal((int(cu[-1]), h, 64)).astype(np.float16) for h in (4, 2, 2)]
        if torch is not None:
            return ([torch.from_numpy(a).cuda() for a in arrs], torch.from_numpy(cu).cuda())
        return [cupy.asarray(a) for a in arrs], cupy.asarray(cu)

    def run(arrs, cu, **kw):
        return ca.attention_varlen(*arrs, cu, cu, causal=True, return_lse=True, **kw)

    def bits(x):
        x = x.contiguous().view(torch.int16).cpu().numpy() if torch is not None else x.get()
        return x.view(np.uint16) if x.dtype.itemsize == 2 else x.view(np.uint32)

    a, cu_a = case([100, 0, 37, 119])
    run(a, cu_a)                                       # registers the signature
    before = len(varlen.HOT)
    b, cu_b = case([3, 200, 50, 3])                    # same total and B: same signature
    hot = [run(b, cu_b, check=check) for check in (True, False)]
    assert len(varlen.HOT) == before, "no new entry: the hot path ran"
    saved = dict(varlen.HOT.entries)
    varlen.HOT.entries.clear()
    try:
        general = run(b, cu_b)
    finally:
        varlen.HOT.entries.update(saved)
    for got in hot:
        for x, y in zip(got, general):
            assert (bits(x) == bits(y)).all()
    bad = cu_b.clone() if torch is not None else cu_b.copy()
    bad[1], bad[2] = 250, 203
    with pytest.raises(ca.ShapeError, match="must not decrease"):
        run(b, bad)


@pytest.mark.parametrize("kind", ["cupy", "torch"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_varlen_backward_hot_path_matches_the_general_path(kind, deterministic):
    """attention_varlen_backward's hot path runs for a repeated signature with new
    values and new lengths: the deterministic mode bitwise the general path's
    gradients, the atomic mode equal up to the order of its fp32 dQ sums."""
    import cupy

    from cupy_attention import varlen

    torch = pytest.importorskip("torch") if kind == "torch" else None
    rng = np.random.default_rng(12)

    def case(lens):
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        arrs = [rng.standard_normal((int(cu[-1]), h, 128)).astype(np.float16)
                for h in (4, 2, 2, 4)]
        if torch is not None:
            return [torch.from_numpy(a).cuda() for a in arrs], torch.from_numpy(cu).cuda()
        return [cupy.asarray(a) for a in arrs], cupy.asarray(cu)

    def grads(arrs, cu, **kw):
        q, k, v, dout = arrs
        out, lse = ca.attention_varlen(q, k, v, cu, cu, causal=True, return_lse=True)
        return ca.attention_varlen_backward(dout, q, k, v, out, lse, cu, cu, causal=True,
                                            deterministic=deterministic, **kw)

    def host(x):
        return (x.float().cpu().numpy() if torch is not None else x.get()).astype(np.float64)

    saved = dict(varlen.HOT_BACKWARD.entries)
    varlen.HOT_BACKWARD.entries.clear()
    try:
        a, cu_a = case([100, 0, 37, 219])
        grads(a, cu_a)                                 # registers the signature
        (key, entry), = varlen.HOT_BACKWARD.entries.items()
        ran = []

        def counting(*args):
            ran.append(1)
            return entry(*args)

        varlen.HOT_BACKWARD.entries[key] = counting
        b, cu_b = case([3, 300, 50, 3])                # same totals and B: same signature
        hot = [grads(b, cu_b, check=check) for check in (True, False)]
        assert len(ran) == 2, "the hot path ran"
        varlen.HOT_BACKWARD.entries.clear()
        general = grads(b, cu_b)
    finally:
        varlen.HOT_BACKWARD.entries.clear()
        varlen.HOT_BACKWARD.entries.update(saved)
    for got in hot:
        for name, x, y in zip(("dq", "dk", "dv"), got, general):
            if deterministic or name != "dq":
                assert (host(x) == host(y)).all(), name
            else:
                assert np.abs(host(x) - host(y)).max() <= 1e-2 * max(1.0, np.abs(host(y)).max())
