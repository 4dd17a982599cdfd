"""The row kernels and bias_gelu's back to back, each reading what the one before it wrote. On
sm_90+ such a kernel may be launched while the kernel ahead of it is still running (programmatic
dependent launch) and must wait for that kernel's writes before touching memory: a chain enqueued
with no synchronization, eagerly and as a replayed CUDA graph, gives bit for bit what the same ops
give with the GPU drained after every kernel."""

import pytest
import torch
from reference import capture_cuda_graph

import fusedops
import fusedops.functional as FF

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# Row lengths for each tier: warp rows, block and cluster teams, the staged engine (>= 8 KB
# rows), rows that are not 16-byte multiples, and the looping kernels.
COLS = [256, 1000, 2048, 4096, 12288, 65536, 300000]


def _step(x, dy, ln, bias, rms, between=lambda t: t):
    """Forward and backward through every row op, most of them on the previous op's output:
    the output and the gradients of x and of every parameter."""
    params = [x, *ln.parameters(), bias, *rms.parameters()]
    for p in params:
        p.grad = None
    h = between(ln(x))
    h = between(FF.bias_gelu(h, bias))
    h = between(FF.softmax(h, -1))
    h = between(rms(h * 64))
    h = between(FF.log_softmax(h, -1))
    h.backward(dy)
    return (h, *(p.grad for p in params))


def _drained(t):
    """The GPU drained after the kernel that made t, and after the one that made t's gradient."""
    torch.cuda.synchronize()
    t.register_hook(lambda g: (torch.cuda.synchronize(), g)[1])
    return t


@pytest.mark.filterwarnings("ignore:The AccumulateGrad node's stream does not match")
@pytest.mark.parametrize("cols", COLS)
def test_chain_matches_one_at_a_time(cols):
    rows = max(8, min(4096, 2**22 // cols))
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    ln, rms = fusedops.nn.LayerNorm(cols, **bf16), fusedops.nn.RMSNorm(cols, **bf16)
    with torch.no_grad():
        for p in (ln.weight, rms.weight):
            p.normal_(1, 0.1)
        ln.bias.normal_(0, 0.1)
    bias = torch.randn(cols, **bf16, requires_grad=True)
    x = torch.randn(rows, cols, **bf16, requires_grad=True)
    dy = torch.randn_like(x)
    # Captured first: a leaf's gradient node made by an eager backward on the default stream and
    # still alive would make the capture wait on the default stream, which torch refuses.
    graph, static = capture_cuda_graph(lambda: _step(x, dy, ln, bias, rms))
    expected = _step(x, dy, ln, bias, rms, between=_drained)
    torch.cuda.synchronize()
    for _ in range(3):
        for got, want in zip(_step(x, dy, ln, bias, rms), expected, strict=True):
            assert torch.equal(got, want)
    for _ in range(3):
        graph.replay()
        for got, want in zip(static, expected, strict=True):
            assert torch.equal(got, want)
