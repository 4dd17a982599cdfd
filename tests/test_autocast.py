"""Under torch.autocast, every function and module returns the dtype its torch counterpart
returns on that device (CPU, CUDA, MPS), checked against torch itself at run time rather than
against a list, since torch's policies differ by device and version; values agree, and gradients
flow back through autocast's casts with torch's dtypes.
"""

import pytest
import torch
import torch.nn.functional as F

import fusedops

COLS, HIDDEN = 64, 96
AUTOCAST_DTYPES = [torch.bfloat16, torch.float16]
# Loose: the two sides may round at different points (cast, then compute, or not).
TOL = {torch.bfloat16: 4e-2, torch.float16: 1e-2, torch.float32: 1e-2}


def _params(device):
    g = torch.Generator().manual_seed(0)

    def p(*shape):
        return torch.nn.Parameter((torch.randn(*shape, generator=g) * 0.3).to(device))

    return {
        "w": p(COLS),
        "b": p(COLS),
        "w1": p(HIDDEN, COLS),
        "b1": p(HIDDEN),
        "w2": p(COLS, HIDDEN),
        "b2": p(COLS),
    }


def _mlp_torch(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


# name -> (fusedops call, torch call), both f(x, params) with fp32 parameters.
FUNCTIONS = {
    "softmax": (lambda x, p: fusedops.softmax(x, -1), lambda x, p: torch.softmax(x, -1)),
    "log_softmax": (
        lambda x, p: fusedops.log_softmax(x, -1),
        lambda x, p: F.log_softmax(x, -1),
    ),
    "layer_norm": (
        lambda x, p: fusedops.layer_norm(x, [COLS], p["w"], p["b"]),
        lambda x, p: F.layer_norm(x, [COLS], p["w"], p["b"]),
    ),
    "rms_norm": (
        lambda x, p: fusedops.rms_norm(x, [COLS], p["w"]),
        lambda x, p: F.rms_norm(x, [COLS], p["w"]),
    ),
    "bias_gelu": (
        lambda x, p: fusedops.bias_gelu(x, p["b"]),
        lambda x, p: F.gelu(x + p["b"]),
    ),
    "fused_mlp": (
        lambda x, p: fusedops.fused_mlp(x, p["w1"], p["b1"], p["w2"], p["b2"]),
        lambda x, p: _mlp_torch(x, p["w1"], p["b1"], p["w2"], p["b2"]),
    ),
}


def _module_pair(name, device):
    """(fusedops module, torch counterpart) sharing their fp32 parameters."""
    kw = {"device": device}
    if name == "Softmax":
        return fusedops.nn.Softmax(-1), torch.nn.Softmax(-1)
    if name == "LogSoftmax":
        return fusedops.nn.LogSoftmax(-1), torch.nn.LogSoftmax(-1)
    if name in ("LayerNorm", "RMSNorm"):
        ours, theirs = getattr(fusedops.nn, name)(COLS, **kw), getattr(torch.nn, name)(COLS, **kw)
        with torch.no_grad():
            ours.weight.normal_()
        theirs.load_state_dict(ours.state_dict())
        return ours, theirs
    if name == "BiasGELU":
        # What swap builds from Linear + GELU: Linear(bias=False) + BiasGELU holding the bias.
        theirs = torch.nn.Sequential(torch.nn.Linear(COLS, COLS, **kw), torch.nn.GELU())
        bias_gelu = fusedops.nn.BiasGELU(COLS, **kw)
        linear = torch.nn.Linear(COLS, COLS, bias=False, **kw)
        with torch.no_grad():
            linear.weight.copy_(theirs[0].weight)
            bias_gelu.bias.copy_(theirs[0].bias)
        return torch.nn.Sequential(linear, bias_gelu), theirs
    if name == "FusedMLP":
        ours = fusedops.FusedMLP(COLS, HIDDEN, **kw)
        theirs = torch.nn.Sequential(ours.fc1, torch.nn.GELU(), ours.fc2)
        return ours, theirs
    raise AssertionError(name)


MODULES = ["Softmax", "LogSoftmax", "LayerNorm", "RMSNorm", "BiasGELU", "FusedMLP"]


def _autocast_or_skip(device, dtype):
    if (
        device == "mps"
        and dtype == torch.bfloat16
        and not torch.backends.mps.is_macos_or_newer(14, 0)
    ):
        pytest.skip("bf16 on MPS needs macOS 14")
    return torch.autocast(device, dtype=dtype)


def _check(ours, theirs, ref_dtype, what):
    assert ours.dtype == theirs.dtype, f"{what}: fusedops {ours.dtype}, torch {theirs.dtype}"
    tol = TOL[ref_dtype]
    torch.testing.assert_close(ours.float(), theirs.float(), atol=tol, rtol=tol, msg=what)


@pytest.mark.parametrize("input_dtype", ["fp32", "low"])
@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_function_dtype_like_torch(device, name, dtype, input_dtype):
    ours_fn, torch_fn = FUNCTIONS[name]
    params = _params(device)
    x = torch.randn(8, COLS, device=device, dtype=torch.float32 if input_dtype == "fp32" else dtype)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    with _autocast_or_skip(device, dtype):
        ours = ours_fn(xs[0], params)
        theirs = torch_fn(xs[1], params)
    _check(ours, theirs, dtype, f"{name} forward")
    grads = []
    for out, inp in ((ours, xs[0]), (theirs, xs[1])):
        for p in params.values():
            p.grad = None
        out.float().sum().backward()
        grads.append([inp.grad] + [p.grad for p in params.values()])
    for g_ours, g_torch in zip(*grads, strict=True):
        assert (g_ours is None) == (g_torch is None), f"{name}: gradient present on one side only"
        if g_ours is not None:
            assert g_ours.dtype == g_torch.dtype, f"{name} grad: {g_ours.dtype} vs {g_torch.dtype}"


@pytest.mark.parametrize("input_dtype", ["fp32", "low"])
@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", MODULES)
def test_module_dtype_like_torch(device, name, dtype, input_dtype):
    ours, theirs = _module_pair(name, device)
    low = torch.float32 if input_dtype == "fp32" else dtype
    x = torch.randn(8, COLS, device=device, dtype=low, requires_grad=True)
    with _autocast_or_skip(device, dtype):
        y_ours, y_torch = ours(x), theirs(x)
    _check(y_ours, y_torch, dtype, f"{name} forward")
    y_ours.float().sum().backward()
    y_torch.float().sum().backward()
    for (n, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        assert p.grad is not None and p.grad.dtype == q.grad.dtype == p.dtype, n


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_no_autocast_no_cast(device, name):
    """Outside autocast the autocast kernels are not reached: fp32 in, fp32 out."""
    ours_fn, _ = FUNCTIONS[name]
    x = torch.randn(8, COLS, device=device)
    assert ours_fn(x, _params(device)).dtype == torch.float32


def test_autocast_compiles(device):
    """torch.compile(fullgraph=True) of a swapped block under autocast gives torch's dtypes."""
    ours, theirs = _module_pair("LayerNorm", device)
    x = torch.randn(8, COLS, device=device)
    with _autocast_or_skip(device, torch.bfloat16):
        y = torch.compile(ours, fullgraph=True)(x)
        assert y.dtype == theirs(x).dtype
