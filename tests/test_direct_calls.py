"""The functional forwards' direct calls (csrc/python_module.cpp): the same op through the
dispatcher as the OpOverload, taken only for arguments exactly of the schema's types; anything
else (a Tensor subclass, a torch function mode, another Python type) returns NotImplemented and
the function falls back to the OpOverload, so modes, subclasses and errors behave as before."""

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import fusedops
from fusedops import _C

OPS = {
    "softmax": torch.ops.fusedops.softmax_fwd.default,
    "log_softmax": torch.ops.fusedops.softmax_fwd.default,
    "layer_norm": torch.ops.fusedops.layer_norm_fwd.default,
    "rms_norm": torch.ops.fusedops.rms_norm_fwd.default,
    "bias_gelu": torch.ops.fusedops.bias_gelu_fwd.default,
    "fused_mlp": torch.ops.fusedops.mlp_fwd.default,
}


def _calls(x, w, b):
    """name -> (the public function's call, _C's direct call with the op's arguments)."""
    w1 = torch.outer(torch.linspace(-1, 1, 16, device=w.device), w)
    w2 = w1.t().contiguous()
    return {
        "softmax": (lambda: fusedops.softmax(x, -1), (_C.softmax, (x, -1, False))),
        "log_softmax": (lambda: fusedops.log_softmax(x, 0), (_C.softmax, (x, 0, True))),
        "layer_norm": (
            lambda: fusedops.layer_norm(x, (8,), w, b, 1e-5),
            (_C.layer_norm, (x, (8,), w, b, 1e-5)),
        ),
        "rms_norm": (lambda: fusedops.rms_norm(x, [8], w), (_C.rms_norm, (x, [8], w, None))),
        "bias_gelu": (lambda: fusedops.bias_gelu(x, b, "tanh"), (_C.bias_gelu, (x, b, "tanh"))),
        # hidden 16: w1 [16, 8], w2 [8, 16]; pre and act saved, as a call needing gradients
        "fused_mlp": (
            lambda: fusedops.fused_mlp(x, w1, None, w2, b, "tanh"),
            (_C.fused_mlp, (x, w1, None, w2, b, "tanh", True, True)),
        ),
    }


def _inputs(device, requires_grad=False):
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(n, generator=g).to(device) for n in ((5, 8), 8, 8))
    return x.requires_grad_(requires_grad), w, b


@pytest.mark.parametrize("name", list(OPS))
def test_direct_call_is_the_op(name, device):
    x, w, b = _inputs(device)
    call, (direct, args) = _calls(x, w, b)[name]
    expected = OPS[name](*args)
    expected = expected[0] if isinstance(expected, tuple) else expected
    torch.testing.assert_close(direct(*args), expected, rtol=0, atol=0)
    torch.testing.assert_close(call(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", list(OPS))
def test_direct_call_records_autograd(name, device):
    x, w, b = _inputs(device, requires_grad=True)
    _, (direct, args) = _calls(x, w, b)[name]
    out = direct(*args)
    assert out.grad_fn is not None
    (gx,) = torch.autograd.grad(out.square().sum(), x)
    x2 = x.detach().requires_grad_()
    ref = OPS[name](x2, *args[1:])
    ref = ref[0] if isinstance(ref, tuple) else ref
    (gx2,) = torch.autograd.grad(ref.square().sum(), x2)
    torch.testing.assert_close(gx, gx2, rtol=0, atol=0)


class _Subclass(torch.Tensor):
    pass


def test_direct_call_declines_what_it_does_not_take(device):
    x, w, b = _inputs(device)
    declined = [
        (_C.softmax, (x.as_subclass(_Subclass), -1, False)),  # a subclass: its __torch_function__
        (_C.softmax, (x, True, False)),  # a bool for the int dim
        (_C.softmax, (x, -1)),  # too few arguments
        (_C.layer_norm, (x, 8, w, b, 1e-5)),  # an int for int[] (the function wraps it)
        (_C.layer_norm, (x, (8,), w, b, 0)),  # an int for the float eps
        (_C.layer_norm, (x, (8,), w.tolist(), b, 1e-5)),  # not a tensor
        (_C.rms_norm, (x, (8.0,), w, None)),
        (_C.bias_gelu, (x, b, None)),
        (_C.fused_mlp, (x, b, None, b, None, "none", 1, False)),  # an int for the bool save_pre
        (_C.fused_mlp, (x.tolist(), b, None, b, None, "none", False, False)),
    ]
    for direct, args in declined:
        assert direct(*args) is NotImplemented, args


def _recording(mode: type, seen: list):
    """A torch function or dispatch mode that records every op it sees and runs it."""

    def record(self, func, types, args=(), kwargs=None):
        seen.append(func)
        return func(*args, **(kwargs or {}))

    hook = "__torch_function__" if mode is TorchFunctionMode else "__torch_dispatch__"
    return type("Record", (mode,), {hook: record})()


@pytest.mark.parametrize("mode", [TorchFunctionMode, TorchDispatchMode])
@pytest.mark.parametrize("name", list(OPS))
def test_modes_see_the_op(name, mode, device):
    """Under a torch function mode the direct call declines and the function takes the
    OpOverload, which the mode sees; a dispatch mode sees the op the direct call dispatches."""
    seen = []
    x, w, b = _inputs(device)
    call, (direct, args) = _calls(x, w, b)[name]
    with _recording(mode, seen):
        if mode is TorchFunctionMode:
            assert direct(*args) is NotImplemented
            call()
        else:
            direct(*args)
    assert OPS[name] in seen


def test_subclass_falls_back_and_keeps_its_type(device):
    x, _, _ = _inputs(device)
    out = fusedops.softmax(x.as_subclass(_Subclass), -1)
    assert type(out) is _Subclass
    torch.testing.assert_close(out.as_subclass(torch.Tensor), torch.softmax(x, -1))


def test_direct_call_errors_name_the_function():
    with pytest.raises(TypeError, match="fusedops.softmax: input must be float32"):
        _C.softmax(torch.ones(3, dtype=torch.int32), -1, False)
    with pytest.raises(IndexError, match="fusedops.log_softmax: dim=5"):
        fusedops.log_softmax(torch.ones(3, 4), 5)
    with pytest.raises(ValueError, match="fusedops.bias_gelu: approximate"):
        fusedops.bias_gelu(torch.ones(2, 3), torch.ones(3), "fast")


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:FutureWarning")
def test_tracers_record_the_op():
    """torch.jit.trace (the dispatcher's tracer) and make_fx (a dispatch mode, plain tensors in)
    record the op the direct call dispatches, as they did through the OpOverload."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        return fusedops.softmax(x, -1) + fusedops.layer_norm(x, (8,))

    x, _, _ = _inputs("cpu")
    kinds = [n.kind() for n in torch.jit.trace(f, (x,)).graph.nodes()]
    assert "fusedops::softmax_fwd" in kinds and "fusedops::layer_norm_fwd" in kinds
    targets = [n.target for n in make_fx(f)(x).graph.nodes if n.op == "call_function"]
    assert OPS["softmax"] in targets and OPS["layer_norm"] in targets
