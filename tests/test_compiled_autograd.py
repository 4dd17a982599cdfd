"""Compiled autograd (torch.compile of the backward graph) over every public function: each op's
graph node must hand compiled autograd what it needs (torch asserts, for instance, that a C++
autograd Function marked no output non-differentiable) and give the gradients eager gives."""

import pytest
import torch
from reference import make_input

import fusedops

compiled_autograd = pytest.importorskip("torch._dynamo.compiled_autograd")
# Compiled autograd takes C++ autograd Functions it was not told it can trace from torch 2.6 on
# (torch 2.4.1 raises "compiled_args not implemented for non-traceable node").
pytestmark = pytest.mark.skipif(
    tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 6),
    reason="compiled autograd of C++ autograd Functions needs torch >= 2.6",
)
# The context manager: `_enable` in recent releases, `enable` in earlier ones.
enable = getattr(compiled_autograd, "_enable", None) or compiled_autograd.enable


def _w(device, *shape):
    return make_input(shape, torch.float32, device).requires_grad_()


CASES = {
    "softmax": (lambda d: [], lambda x: fusedops.softmax(x, -1)),
    "log_softmax": (lambda d: [], lambda x: fusedops.log_softmax(x, -1)),
    "layer_norm": (
        lambda d: [_w(d, 16), _w(d, 16)],
        lambda x, w, b: fusedops.layer_norm(x, [16], w, b),
    ),
    "rms_norm": (lambda d: [_w(d, 16)], lambda x, w: fusedops.rms_norm(x, [16], w)),
    "bias_gelu": (lambda d: [_w(d, 16)], lambda x, b: fusedops.bias_gelu(x, b)),
    "fused_mlp": (
        lambda d: [_w(d, 32, 16), _w(d, 32), _w(d, 16, 32), _w(d, 16)],
        lambda x, w1, b1, w2, b2: fusedops.fused_mlp(x, w1, b1, w2, b2, approximate="tanh"),
    ),
    "fully_fused_mlp": (
        lambda d: [_w(d, 16, 16), _w(d, 16, 16), _w(d, 16), _w(d, 16)],
        lambda x, w1, w2, b1, b2: fusedops.fully_fused_mlp(x, [w1, w2], [b1, b2]),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_autograd_matches_eager(device, name):
    make_params, f = CASES[name]
    x = make_input((6, 16), torch.float32, device).requires_grad_()
    inputs = [x, *make_params(device)]
    g = make_input((6, 16), torch.float32, device, scale=1.0)

    def grads():
        for t in inputs:
            t.grad = None
        (f(*inputs) * g).sum().backward()
        return [t.grad.clone() for t in inputs]

    want = grads()
    torch._dynamo.reset()
    with enable(torch.compile(backend="eager")):
        got = grads()
    for ours, ref in zip(got, want, strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
