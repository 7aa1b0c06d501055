"""The torch custom operators (CPU, kernel="reference"): fake implementations agree
with the real ones (torch.library.opcheck), and torch.compile(fullgraph=True) traces
the differentiable attention and CUDAAttention without a graph break, forward and
backward equal to eager."""
import pytest

torch = pytest.importorskip("torch")

from cupy_attention import torch as cat  # noqa: E402
from cupy_attention.errors import DTypeError, ShapeError  # noqa: E402


def _qkv(layout="bhsd", requires_grad=False):
    g = torch.Generator().manual_seed(0)
    shape_q, shape_kv = ((2, 4, 7, 16), (2, 2, 9, 16)) if layout == "bhsd" else \
        ((2, 7, 4, 16), (2, 9, 2, 16))
    return [torch.randn(s, generator=g, dtype=torch.float32, requires_grad=requires_grad)
            for s in (shape_q, shape_kv, shape_kv)]


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("window,softcap,alibi", [((-2, 0), None, False), ((3, 1), 20.0, False),
                                                 ((-2, 0), None, True)])
def test_opcheck_forward_and_backward(layout, window, softcap, alibi):
    q, k, v = _qkv(layout, requires_grad=True)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]) if alibi else None
    drop = (0.25, 1234, 3) if softcap else (0.0, -1, 0)   # a fixed stream: opcheck reruns
    args = (q, k, v, None, slopes, True, None, layout, window[0], window[1], softcap, "reference",
            False) + drop
    torch.library.opcheck(torch.ops.cupy_attention.attention_fwd.default, args)
    out, lse, stream = torch.ops.cupy_attention.attention_fwd(*args)
    assert out.shape == q.shape and lse.dtype == torch.float32
    assert lse.shape == ((2, 4, 7) if layout == "bhsd" else (2, 4, 7))
    assert stream.dtype == torch.int64 and stream.shape == (2,)
    dout = torch.randn_like(out)
    bargs = (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), None, slopes,
             True, None, layout, window[0], window[1], softcap, False, "reference", drop[0],
             stream)
    torch.library.opcheck(torch.ops.cupy_attention.attention_bwd.default, bargs)


def test_fullgraph_compile_matches_eager():
    def step(q, k, v):
        return cat.attention(q, k, v, causal=True, window=(4, 0), softcap=30.0,
                             kernel="reference").square().sum()

    q, k, v = _qkv(requires_grad=True)
    loss = step(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    loss2 = compiled(q2, k2, v2)
    grads2 = torch.autograd.grad(loss2, (q2, k2, v2))
    torch.testing.assert_close(loss2, loss)
    for a, b in zip(grads2, grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("varlen", [False, True])
def test_eager_function_matches_the_operators(varlen):
    """Eager calls run the operators' bodies under a plain autograd.Function (the
    operators' own Python autograd costs ~0.3 ms of host time a step); the graph,
    gradients and saved state are the operators'."""
    q, k, v = _qkv("bshd", requires_grad=True)
    if varlen:
        q, k, v = (x.detach()[0].clone().requires_grad_() for x in (q, k, v))
        cu_q, cu_k = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 5, 9],
                                                                           dtype=torch.int32)
        out = cat.attention_varlen(q, k, v, cu_q, cu_k, causal=True, kernel="reference")
        ref, _, _ = torch.ops.cupy_attention.attention_varlen_fwd(
            q, k, v, cu_q, cu_k, None, True, None, cat.NO_WINDOW, 0, None, "reference", False,
            True, 0.0, -1, 0)
    else:
        out = cat.attention(q, k, v, causal=True, layout="bshd", softcap=20.0,
                            kernel="reference")
        ref, _, _ = torch.ops.cupy_attention.attention_fwd(
            q, k, v, None, None, True, None, "bshd", cat.NO_WINDOW, 0, 20.0, "reference", False,
            0.0, -1, 0)
    assert type(out.grad_fn).__name__ == "_EagerBackward"
    assert "cupy_attention" in type(ref.grad_fn).__name__
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    grads_ref = torch.autograd.grad(ref, (q, k, v), dout)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_traced_tensors_take_the_operators():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = _qkv()
    assert cat._eager(q, k, v, None)
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(x) for x in (q, k, v))
        assert not cat._eager(fq, fk, fv)
        out = cat.attention(fq, fk, fv, causal=True, kernel="reference")
        assert out.shape == q.shape


def test_module_compiles_fullgraph():
    torch.manual_seed(0)
    block = cat.CUDAAttention(32, 4, num_kv_heads=2, causal=True, kernel="reference")
    x = torch.randn(2, 5, 32)
    eager = block(x)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), eager)


def test_arguments_are_validated_before_the_operator():
    q, k, v = _qkv()
    with pytest.raises(DTypeError, match="window left"):
        cat.attention(q, k, v, window=(1.5, 0), kernel="reference")
    with pytest.raises(ShapeError, match="softcap"):
        cat.attention(q, k, v, softcap=-1.0, kernel="reference")


def test_dropout_through_autograd_and_compile():
    """A fixed stream: autograd's gradients are the float64 reference's with the same
    mask, and a fullgraph compile gives the eager result. No seed: each call draws a
    new stream (at run time, also when compiled), reproducible after manual_seed."""
    import numpy as np

    from cupy_attention import dropout
    from cupy_attention.reference import attention_backward_reference

    q, k, v = _qkv(requires_grad=True)
    kw = dict(causal=True, kernel="reference", dropout_p=0.3, dropout_seed=77, dropout_offset=1)
    out = cat.attention(q, k, v, **kw)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    host = [x.detach().double().numpy() for x in (dout, q, k, v)]
    refs = attention_backward_reference(*host, causal=True, dropout=(0.3, 77, 1))
    for g, r in zip(grads, refs):
        np.testing.assert_allclose(g.double().numpy(), r, rtol=1e-4, atol=1e-5)
    compiled = torch.compile(lambda a, b, c: cat.attention(a, b, c, **kw), fullgraph=True,
                             backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), out)

    drawn = dict(causal=True, kernel="reference", dropout_p=0.3)
    dropout.manual_seed(5)
    a = cat.attention(q, k, v, **drawn)
    b = cat.attention(q, k, v, **drawn)
    assert not torch.equal(a, b)
    dropout.manual_seed(5)
    torch.testing.assert_close(cat.attention(q, k, v, **drawn), a)
    step = torch.compile(lambda x, y, z: cat.attention(x, y, z, **drawn), fullgraph=True,
                         backend="aot_eager")
    assert not torch.equal(step(q, k, v), step(q, k, v))


def test_varlen_dropout_through_autograd_and_compile():
    """Packed sequences with dropout: the operators' schema (opcheck, fixed stream),
    autograd's gradients against the float64 varlen reference with the same masks, a
    fullgraph compile equal to eager, and drawn streams that differ call to call."""
    import numpy as np

    from cupy_attention.varlen import attention_varlen_backward_reference

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(n, h, 16, generator=g, requires_grad=True)
               for n, h in ((10, 4), (13, 2), (13, 2)))
    cu_q, cu_k = (torch.tensor(c, dtype=torch.int32) for c in ([0, 3, 3, 10], [0, 5, 6, 13]))
    args = (q, k, v, cu_q, cu_k, None, True, None, cat.NO_WINDOW, 0, None, "reference", False,
            True, 0.25, 99, 2)
    torch.library.opcheck(torch.ops.cupy_attention.attention_varlen_fwd.default, args)
    out, lse, stream = torch.ops.cupy_attention.attention_varlen_fwd(*args)
    assert stream.tolist() == [99, 2]
    dout = torch.randn(out.shape, generator=g)
    bargs = (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), cu_q, cu_k,
             None, True, None, cat.NO_WINDOW, 0, None, False, "reference", True, 0.25, stream)
    torch.library.opcheck(torch.ops.cupy_attention.attention_varlen_bwd.default, bargs)

    kw = dict(causal=True, kernel="reference", dropout_p=0.25, dropout_seed=99,
              dropout_offset=2)
    out = cat.attention_varlen(q, k, v, cu_q, cu_k, **kw)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    host = [x.detach().double().numpy() for x in (dout, q, k, v)] + [cu_q.numpy(), cu_k.numpy()]
    refs = attention_varlen_backward_reference(*host, causal=True, dropout=(0.25, 99, 2))
    for got, ref in zip(grads, refs):
        np.testing.assert_allclose(got.double().numpy(), ref, rtol=1e-4, atol=1e-5)
    plain = cat.attention_varlen(q, k, v, cu_q, cu_k, causal=True, kernel="reference")
    assert not torch.equal(out, plain)
    compiled = torch.compile(lambda a, b, c: cat.attention_varlen(a, b, c, cu_q, cu_k, **kw),
                             fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), out)
    drawn = dict(causal=True, kernel="reference", dropout_p=0.25)
    assert not torch.equal(cat.attention_varlen(q, k, v, cu_q, cu_k, **drawn),
                           cat.attention_varlen(q, k, v, cu_q, cu_k, **drawn))
    with pytest.raises(ShapeError, match="dropout_seed"):
        cat.attention_varlen(q, k, v, cu_q, cu_k, dropout_p=0.1, dropout_seed=1 << 63)


def test_module_dropout_only_in_training():
    torch.manual_seed(0)
    block = cat.CUDAAttention(32, 4, causal=True, kernel="reference", dropout=0.5)
    x = torch.randn(2, 5, 32)
    block.eval()
    torch.testing.assert_close(block(x), block(x))
    block.train()
    assert not torch.equal(block(x), block(x))
    assert "dropout=0.5" in repr(block)
