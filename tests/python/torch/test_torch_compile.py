"""tilelab.torch under torch.compile(fullgraph=True) and torch.library.opcheck: the custom ops'
schemas, fake kernels and autograd registration are what the compiler needs."""

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402, N812
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import tilelab.torch as tt  # noqa: E402


class AttentionBlock(torch.nn.Module):
    """linear -> multi-head attention (tilelab's, or torch's when `reference`) -> linear."""

    def __init__(self, width=32, heads=4, kv_heads=2, reference=False):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.q = torch.nn.Linear(width, width)
        self.kv = torch.nn.Linear(width, 2 * kv_heads * self.head_dim)
        self.out = torch.nn.Linear(width, width)
        self.attention = (F.scaled_dot_product_attention if reference
                          else tt.scaled_dot_product_attention)

    def forward(self, x, mask):
        batch, length, _ = x.shape
        q = self.q(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k, v = (self.kv(x).view(batch, length, 2, self.kv_heads, self.head_dim)
                .permute(2, 0, 3, 1, 4).unbind(0))
        y = self.attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.out(y.transpose(1, 2).reshape(batch, length, -1))


def run(block, x, mask):
    x = x.detach().requires_grad_()
    mask = mask.detach().requires_grad_()
    y = block(x, mask)
    (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
    grads = [x.grad, mask.grad] + [p.grad for p in block.parameters()]
    return y.detach(), grads


# Inductor itself touches torch.jit.script_method while compiling (torch's own deprecation).
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_compiled_block_forward_and_backward_match_eager_and_torch():
    torch.manual_seed(0)
    ours = AttentionBlock()
    reference = AttentionBlock(reference=True)
    reference.load_state_dict(ours.state_dict())
    x = torch.randn(2, 11, 32)
    mask = 0.1 * torch.randn(1, 4, 11, 11)

    same = AttentionBlock()
    same.load_state_dict(ours.state_dict())
    compiled = torch.compile(same, fullgraph=True)
    compiled_y, compiled_grads = run(compiled, x, mask)
    eager_y, eager_grads = run(ours, x, mask)
    with sdpa_kernel(SDPBackend.MATH):
        want_y, want_grads = run(reference, x, mask)

    torch.testing.assert_close(compiled_y, eager_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(eager_y, want_y, rtol=1e-4, atol=1e-5)
    for got, eager, want in zip(compiled_grads, eager_grads, want_grads, strict=True):
        torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(eager, want, rtol=1e-3, atol=1e-5)


def test_the_compiled_graph_calls_the_custom_ops():
    # With fullgraph=True a graph break would raise; the op must also appear in the graph
    # (not be traced into its numpy implementation).
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(str(graph_module.graph))
        return graph_module.forward

    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    compiled = torch.compile(lambda q, k, v: tt.scaled_dot_product_attention(q, k, v) * 2,
                             fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(q, k, v), 2 * tt.scaled_dot_product_attention(q, k, v))
    assert len(graphs) == 1 and "tilelab.flash_attention" in graphs[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_opcheck(dtype, with_bias):
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 5, 8, generator=generator).to(dtype).requires_grad_()
    k = torch.randn(1, 2, 7, 8, generator=generator).to(dtype).requires_grad_()
    v = torch.randn(1, 2, 7, 8, generator=generator).to(dtype).requires_grad_()
    bias = torch.randn(1, 4, 5, 7, generator=generator).requires_grad_() if with_bias else None
    # The trailing arguments are the score options, off: window (-1, -1), softcap 0, no ALiBi
    # slopes, no sinks.
    arguments = (q, k, v, bias, True, "bottom_right", 0.5, -1, -1, 0.0, None, None)
    torch.library.opcheck(torch.ops.tilelab.flash_attention.default, arguments)
    out, lse = torch.ops.tilelab.flash_attention(*arguments)
    # The backward op has no autograd formula of its own (no double backward): plain tensors.
    bias = None if bias is None else bias.detach()
    torch.library.opcheck(
        torch.ops.tilelab.flash_attention_backward.default,
        (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse, bias,
         with_bias, True, "bottom_right", 0.5, -1, -1, 0.0, None, None, False),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_with_score_options(dtype):
    """Both ops with a window, a softcap, ALiBi slopes and sinks, and the sinks' gradient."""
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 12, 8, generator=generator).to(dtype).requires_grad_()
    k = torch.randn(1, 2, 15, 8, generator=generator).to(dtype).requires_grad_()
    v = torch.randn(1, 2, 15, 8, generator=generator).to(dtype).requires_grad_()
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    sinks = torch.tensor([0.3, -0.5, 1.0, 0.0]).requires_grad_()
    arguments = (q, k, v, None, True, "bottom_right", None, 6, -1, 3.0, slopes, sinks)
    torch.library.opcheck(torch.ops.tilelab.flash_attention.default, arguments)
    out, lse = torch.ops.tilelab.flash_attention(*arguments)
    torch.library.opcheck(
        torch.ops.tilelab.flash_attention_backward.default,
        (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse, None,
         False, True, "bottom_right", None, 6, -1, 3.0, slopes, sinks.detach(), True),
    )
