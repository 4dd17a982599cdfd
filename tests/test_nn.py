"""fusedops.nn.Softmax / LogSoftmax as drop-in replacements for torch.nn's modules."""

import copy
import pickle
import warnings

import pytest
import torch
from reference import assert_close_to_reference, assert_softmax_close, make_input

import fusedops
import fusedops.nn

MODULES = [
    pytest.param((fusedops.nn.Softmax, torch.nn.Softmax, False), id="Softmax"),
    pytest.param((fusedops.nn.LogSoftmax, torch.nn.LogSoftmax, True), id="LogSoftmax"),
]


def legacy_dim(ndim: int) -> int:
    """torch's rule for dim=None: 0 for 0-, 1- and 3-dim inputs, else 1."""
    return 0 if ndim in (0, 1, 3) else 1


def torch_module_output(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the implicit-dim deprecation warning
        return module(x)


@pytest.mark.parametrize("modules", MODULES)
def test_is_a_torch_module(modules):
    fused_cls, torch_cls, _ = modules
    assert issubclass(fused_cls, torch_cls)
    assert isinstance(fused_cls(dim=1), torch_cls)
    assert isinstance(fused_cls(), torch.nn.Module)


@pytest.mark.parametrize(
    "args,kwargs", [((), {}), ((1,), {}), ((), {"dim": -1}), ((), {"dim": None})]
)
@pytest.mark.parametrize("modules", MODULES)
def test_constructor_and_repr_match_torch(modules, args, kwargs):
    fused_cls, torch_cls, _ = modules
    fused, ref = fused_cls(*args, **kwargs), torch_cls(*args, **kwargs)
    assert fused.dim == ref.dim
    assert repr(fused) == repr(ref)
    assert fused.extra_repr() == ref.extra_repr()


@pytest.mark.parametrize("bad", ["1", 1.0, True])
@pytest.mark.parametrize("modules", MODULES)
def test_constructor_rejects_what_torch_rejects(modules, bad):
    fused_cls, torch_cls, _ = modules
    try:
        torch_cls(dim=bad)
    except TypeError:
        with pytest.raises(TypeError):
            fused_cls(dim=bad)
    else:
        fused_cls(dim=bad)


@pytest.mark.parametrize("modules", MODULES)
def test_state_dict_compatible(modules):
    fused_cls, torch_cls, _ = modules
    fused, ref = fused_cls(dim=1), torch_cls(dim=1)
    assert fused.state_dict() == {} == ref.state_dict()
    fused.load_state_dict(ref.state_dict(), strict=True)
    ref.load_state_dict(fused.state_dict(), strict=True)
    assert list(dict(fused.named_parameters())) == [] and list(dict(fused.named_buffers())) == []


@pytest.mark.parametrize("modules", MODULES)
def test_pickle_and_deepcopy(modules):
    fused_cls, _, log = modules
    module = fused_cls(dim=0)
    for clone in (pickle.loads(pickle.dumps(module)), copy.deepcopy(module)):
        assert type(clone) is fused_cls and clone.dim == 0
        x = make_input((5, 3))
        assert torch.equal(clone(x), module(x))


# (input shape, dim) pairs; dim=None exercises torch's legacy rule for 0- to 4-dim inputs.
FORWARD_CASES = [
    ((), None),
    ((7,), None),
    ((4, 9), None),
    ((3, 4, 9), None),
    ((2, 3, 4, 5), None),
    ((4, 9), 0),
    ((3, 4, 9), -1),
    ((2, 3, 4, 5), 2),
]


@pytest.mark.parametrize("shape,dim", FORWARD_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("modules", MODULES)
def test_forward_matches_torch_module(device, modules, dtype, shape, dim):
    fused_cls, torch_cls, log = modules
    x = make_input(shape, dtype, device)
    out = fused_cls(dim=dim)(x)
    torch_out = torch_module_output(torch_cls(dim=dim), x)
    resolved = legacy_dim(x.dim()) if dim is None else dim
    assert_softmax_close(out, torch_out, x, resolved, log)


@pytest.mark.parametrize("modules", MODULES)
def test_in_sequential_forward_and_backward(device, modules):
    fused_cls, torch_cls, log = modules
    lin = torch.nn.Linear(16, 33).to(device)
    fused_model = torch.nn.Sequential(copy.deepcopy(lin), fused_cls(dim=-1))
    torch_model = torch.nn.Sequential(copy.deepcopy(lin), torch_cls(dim=-1))
    ref_model = torch.nn.Sequential(copy.deepcopy(lin).to("cpu", torch.float64), torch_cls(dim=-1))
    x = make_input((8, 16), torch.float32, device)
    g = make_input((8, 33), torch.float32, device, scale=1.0)

    outs, grads = [], []
    for model, inp, grad in (
        (fused_model, x, g),
        (torch_model, x, g),
        (ref_model, x.double().cpu(), g.double().cpu()),
    ):
        out = model(inp)
        out.backward(grad)
        outs.append(out.detach())
        grads.append(model[0].weight.grad)
    assert_close_to_reference(outs[0], outs[1], outs[2], torch.float32, what="output")
    assert_close_to_reference(grads[0], grads[1], grads[2], torch.float32, what="weight grad")


@pytest.mark.parametrize("modules", MODULES)
def test_compiled_module(device, modules):
    fused_cls, torch_cls, log = modules
    model = torch.nn.Sequential(torch.nn.Linear(16, 33), fused_cls(dim=-1)).to(device)
    compiled = torch.compile(model, fullgraph=True)
    for _ in range(2):  # the second call reuses the compiled graph on fresh input
        x = make_input((8, 16), torch.float32, device)
        with torch.no_grad():
            h = model[0](x)
            out = compiled(x)
        torch_out = torch_cls(dim=-1)(h)
        assert_softmax_close(out, torch_out, h, -1, log)
