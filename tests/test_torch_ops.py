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
    args = (q, k, v, None, slopes, True, None, layout, window[0], window[1], softcap, "reference",
            False)
    torch.library.opcheck(torch.ops.cupy_attention.attention_fwd.default, args)
    out, lse = torch.ops.cupy_attention.attention_fwd(*args)
    assert out.shape == q.shape and lse.dtype == torch.float32
    assert lse.shape == ((2, 4, 7) if layout == "bhsd" else (2, 4, 7))
    dout = torch.randn_like(out)
    bargs = (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), None, slopes,
             True, None, layout, window[0], window[1], softcap, False, "reference")
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
