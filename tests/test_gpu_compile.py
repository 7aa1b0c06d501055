"""torch.compile and CUDA graphs on the device: a small transformer block with our
attention compiles with fullgraph=True (inductor) and matches eager forward and
backward; forward + backward captured in a CUDA graph replay to the eager results
(the forward bitwise)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cupy_attention import torch as cat  # noqa: E402

pytestmark = pytest.mark.gpu


class Block(torch.nn.Module):
    def __init__(self, dim=256, heads=4, kv_heads=2):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.attn = cat.CUDAAttention(dim, heads, num_kv_heads=kv_heads, causal=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm(x))
        return x + self.mlp(x)


def _grads(model, x):
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    y = model(x)
    y.float().square().mean().backward()
    return y.detach(), [x.grad] + [p.grad for p in model.parameters()]


def test_fullgraph_compile_forward_backward_matches_eager():
    torch.manual_seed(0)
    model = Block().cuda().to(torch.bfloat16)
    x = torch.randn(2, 512, 256, device="cuda", dtype=torch.bfloat16)
    y_eager, g_eager = _grads(model, x)
    compiled = torch.compile(model, fullgraph=True)
    y_comp, g_comp = _grads(compiled, x)
    torch.testing.assert_close(y_comp.float(), y_eager.float(), rtol=2e-2, atol=2e-2)
    for a, b in zip(g_comp, g_eager):
        torch.testing.assert_close(a.float(), b.float(), rtol=5e-2, atol=5e-2)


def test_cuda_graph_replay_matches_eager():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 384, 128, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    dout = torch.randn(2, 4, 384, 128, device="cuda", dtype=torch.bfloat16)

    def step():
        out = cat.attention(q, k, v, causal=True)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        return out, dq, dk, dv

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager = [t.clone() for t in step()]   # warm: compiles and loads the kernels
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], eager[0])          # the forward: bitwise
    for a, b in zip(captured[1:], eager[1:]):           # dQ may sum atomically
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)
