"""The row kernels and bias_gelu's back to back, each reading what the one before it wrote. On
sm_90+ such a kernel may be launched while the kernel ahead of it is still running (programmatic
dependent launch) and must wait for that kernel's writes before touching memory: a chain enqueued
with no synchronization, eagerly and as a replayed CUDA graph, gives bit for bit what the same ops
give with the GPU drained after every kernel."""

import re
from pathlib import Path

import pytest
import torch
from reference import capture_cuda_graph

import fusedops
import fusedops.functional as FF

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

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


@cuda_only
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


CUDA_SOURCES = Path(__file__).resolve().parents[1] / "csrc" / "cuda"
# Launched with <<<>>>, without the attribute that lets a kernel start early.
PLAIN_KERNELS = {"ffm_forward_kernel", "ffm_backward_kernel", "ffm_sum_partials_kernel"}


def _kernels(text):
    """(name, body) of every __global__ function in a CUDA source."""
    for m in re.finditer(r"__global__\b", text):
        open_ = text.index("{", m.end())
        name = re.findall(r"(\w+)\s*\(", text[m.end() : open_])[-1]
        depth, i = 0, open_
        while True:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        yield name, text[open_ : i + 1]


def test_every_early_launched_kernel_waits():
    """A kernel launched through launch() (every one but PLAIN_KERNELS) may start before the
    kernel ahead of it has finished: it must wait for it before touching memory."""
    sources = {f.name: f.read_text() for f in sorted(CUDA_SOURCES.glob("*.cu*"))}
    kernels = dict(k for text in sources.values() for k in _kernels(text))
    assert len(kernels) >= 15 and PLAIN_KERNELS <= set(kernels), sorted(kernels)
    for name, body in kernels.items():
        waits = "sm90::grid_dependency_wait();" in body
        assert waits != (name in PLAIN_KERNELS), f"{name}: waits={waits}"
    assert [f for f, text in sources.items() if "<<<" in text] == ["fully_fused_mlp_kernels.cu"]
