"""Bad input to every public function and module: a clear error that names the function the user
called, the argument and the offending value; never a crash, a hang or a silent result.

Each case is one row of a table (id, call, exception type, message pattern), so the table is also
the record of what was tried. Calls take the device, so the device-independent rows run on every
device present; device-mix rows need a second device (CUDA or MPS beside the CPU).
"""

import math

import pytest
import torch
from reference import make_input

import fusedops
from fusedops._ops import ops

# Not imported from conftest: tests/metal has a conftest module of the same name.
HAS_CUDA = torch.cuda.is_available()
HAS_MPS = torch.backends.mps.is_available()

FLOAT_NAMES = "float32, float16, bfloat16 or float64"
BAD_DTYPES = {
    torch.int32: "Int",
    torch.int64: "Long",
    torch.bool: "Bool",
    torch.uint8: "Byte",
    torch.complex64: "ComplexFloat",
}


def _x(device, dtype=torch.float32, shape=(4, 8)):
    return make_input(shape, torch.float32, device).to(dtype)


def _mlp_params(device, dtype=torch.float32):
    return _x(device, dtype, (16, 8)), _x(device, dtype, (16,)), _x(device, dtype, (8, 16))


def _mlp(x, device, dtype=torch.float32):
    w1, b1, w2 = _mlp_params(device, dtype)
    return fusedops.fused_mlp(x, w1, b1, w2, None)


# Every public entry point, called on one input x. `name` is what its errors must say.
ENTRY_POINTS = {
    "softmax": ("softmax", "input", lambda x, d: fusedops.softmax(x, -1)),
    "log_softmax": ("log_softmax", "input", lambda x, d: fusedops.log_softmax(x, -1)),
    "layer_norm": ("layer_norm", "input", lambda x, d: fusedops.layer_norm(x, [8])),
    "rms_norm": ("rms_norm", "input", lambda x, d: fusedops.rms_norm(x, [8])),
    "bias_gelu": ("bias_gelu", "input", lambda x, d: fusedops.bias_gelu(x, _x(d, shape=(8,)))),
    "fused_mlp": ("fused_mlp", "x", lambda x, d: _mlp(x, d)),
    "nn.Softmax": ("softmax", "input", lambda x, d: fusedops.nn.Softmax(-1)(x)),
    "nn.LogSoftmax": ("log_softmax", "input", lambda x, d: fusedops.nn.LogSoftmax(-1)(x)),
    "nn.LayerNorm": ("layer_norm", "input", lambda x, d: fusedops.nn.LayerNorm(8, device=d)(x)),
    "nn.RMSNorm": ("rms_norm", "input", lambda x, d: fusedops.nn.RMSNorm(8, device=d)(x)),
    "nn.BiasGELU": ("bias_gelu", "input", lambda x, d: fusedops.nn.BiasGELU(8, device=d)(x)),
    "FusedMLP": ("fused_mlp", "x", lambda x, d: fusedops.FusedMLP(8, 16, device=d)(x)),
}


@pytest.mark.parametrize("dtype", list(BAD_DTYPES), ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_non_float_dtype(device, entry, dtype):
    if device == "mps" and dtype == torch.complex64:
        pytest.skip("MPS has no complex64 for every op used to make the input")
    name, arg, call = ENTRY_POINTS[entry]
    x = _x(device, dtype)
    with pytest.raises(TypeError, match=rf"fusedops\.{name}: {arg} must be {FLOAT_NAMES}, got "):
        call(x, device)
    with pytest.raises(TypeError, match=BAD_DTYPES[dtype]):
        call(x, device)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize(
    "value", [[1.0, 2.0], 3.0, None, "x"], ids=["list", "float", "None", "str"]
)
def test_non_tensor_input(entry, value):
    name, arg, call = ENTRY_POINTS[entry]
    with pytest.raises(TypeError, match=rf"fusedops\.{name}: {arg} must be a Tensor, got "):
        call(value, "cpu")


def _norm_with_eps(op, eps):
    return lambda d: getattr(fusedops, op)(_x(d), [8], eps=eps)


# (id, call(device), exception, message pattern): shapes, arguments and values.
CASES = [
    # dim out of range
    (
        "softmax dim=2 of 2-D",
        lambda d: fusedops.softmax(_x(d), 2),
        IndexError,
        r"fusedops\.softmax: dim=2 is out of range for a tensor with 2 dimension\(s\)",
    ),
    (
        "log_softmax dim=-3 of 2-D",
        lambda d: fusedops.log_softmax(_x(d), -3),
        IndexError,
        r"fusedops\.log_softmax: dim=-3 is out of range",
    ),
    (
        "softmax dim=1 of 0-D",
        lambda d: fusedops.softmax(_x(d, shape=()), 1),
        IndexError,
        r"fusedops\.softmax: dim=1 is out of range for a tensor with 0 dimension",
    ),
    (
        "nn.LogSoftmax(dim=5)",
        lambda d: fusedops.nn.LogSoftmax(5)(_x(d)),
        IndexError,
        r"fusedops\.log_softmax: dim=5",
    ),
    (
        "softmax dim=1.5",
        lambda d: fusedops.softmax(_x(d), 1.5),
        TypeError,
        r"fusedops\.softmax: dim must be an int, got 1\.5",
    ),
    (
        "log_softmax dim=None",
        lambda d: fusedops.log_softmax(_x(d), None),
        TypeError,
        r"fusedops\.log_softmax: dim must be an int, got None",
    ),
    # normalized_shape
    (
        "layer_norm shape [7] of [4, 8]",
        lambda d: fusedops.layer_norm(_x(d), [7]),
        ValueError,
        r"fusedops\.layer_norm: normalized_shape=\[7\] does not match the trailing dimensions of "
        r"input of shape \[4, 8\]",
    ),
    (
        "rms_norm shape [4, 8, 1]",
        lambda d: fusedops.rms_norm(_x(d), [4, 8, 1]),
        ValueError,
        r"fusedops\.rms_norm: normalized_shape=\[4, 8, 1\] does not match",
    ),
    (
        "layer_norm shape []",
        lambda d: fusedops.layer_norm(_x(d), []),
        ValueError,
        r"fusedops\.layer_norm: normalized_shape must have at least one dimension, got \[\]",
    ),
    (
        "rms_norm shape [-8]",
        lambda d: fusedops.rms_norm(_x(d), [-8]),
        ValueError,
        r"fusedops\.rms_norm: normalized_shape=\[-8\] does not match",
    ),
    (
        "layer_norm shape '8'",
        lambda d: fusedops.layer_norm(_x(d), "8"),
        TypeError,
        r"fusedops\.layer_norm: normalized_shape must be an int or a sequence of ints, got '8'",
    ),
    (
        "rms_norm shape 8.0",
        lambda d: fusedops.rms_norm(_x(d), 8.0),
        TypeError,
        r"fusedops\.rms_norm: normalized_shape must be an int or a sequence of ints, got 8\.0",
    ),
    (
        "nn.LayerNorm(8) on [4, 7]",
        lambda d: fusedops.nn.LayerNorm(8, device=d)(_x(d, shape=(4, 7))),
        ValueError,
        r"fusedops\.layer_norm: normalized_shape=\[8\] does not match",
    ),
    # norm parameters
    (
        "layer_norm weight [7]",
        lambda d: fusedops.layer_norm(_x(d), [8], _x(d, shape=(7,))),
        ValueError,
        r"fusedops\.layer_norm: weight has shape \[7\] but normalized_shape is \[8\]",
    ),
    (
        "layer_norm bias [8, 1]",
        lambda d: fusedops.layer_norm(_x(d), [8], None, _x(d, shape=(8, 1))),
        ValueError,
        r"fusedops\.layer_norm: bias has shape \[8, 1\]",
    ),
    (
        "rms_norm weight int32",
        lambda d: fusedops.rms_norm(_x(d), [8], torch.ones(8, dtype=torch.int32, device=d)),
        TypeError,
        r"fusedops\.rms_norm: weight has dtype Int but input has dtype Float",
    ),
    (
        "layer_norm fp16 weight, fp32 input",
        lambda d: fusedops.layer_norm(_x(d), [8], _x(d, torch.float16, (8,))),
        TypeError,
        r"fusedops\.layer_norm: weight has dtype Half but input has dtype Float",
    ),
    (
        "layer_norm weight list",
        lambda d: fusedops.layer_norm(_x(d), [8], [1.0] * 8),
        TypeError,
        r"fusedops\.layer_norm: weight must be a Tensor or None, got list",
    ),
    (
        "rms_norm weight 1.0",
        lambda d: fusedops.rms_norm(_x(d), [8], 1.0),
        TypeError,
        r"fusedops\.rms_norm: weight must be a Tensor or None, got float",
    ),
    # eps
    *[
        (
            f"{op} eps={eps}",
            _norm_with_eps(op, eps),
            ValueError,
            rf"fusedops\.{op}: eps must be a finite number >= 0, got {shown}",
        )
        for op in ("layer_norm", "rms_norm")
        for eps, shown in ((-1e-5, "-1e-05"), (math.nan, "nan"), (math.inf, "inf"))
    ],
    (
        "nn.LayerNorm(eps=-1)",
        lambda d: fusedops.nn.LayerNorm(8, eps=-1.0, device=d)(_x(d)),
        ValueError,
        r"fusedops\.layer_norm: eps must be a finite number >= 0, got -1",
    ),
    (
        "nn.RMSNorm(eps=nan)",
        lambda d: fusedops.nn.RMSNorm(8, eps=math.nan, device=d)(_x(d)),
        ValueError,
        r"fusedops\.rms_norm: eps must be a finite number >= 0, got nan",
    ),
    # bias_gelu
    (
        "bias_gelu bias [7]",
        lambda d: fusedops.bias_gelu(_x(d), _x(d, shape=(7,))),
        ValueError,
        r"fusedops\.bias_gelu: bias must have shape \[8\] \(the size of input's last dimension\), "
        r"got \[7\]",
    ),
    (
        "bias_gelu bias [1, 8]",
        lambda d: fusedops.bias_gelu(_x(d), _x(d, shape=(1, 8))),
        ValueError,
        r"fusedops\.bias_gelu: bias must have shape \[8\]",
    ),
    (
        "bias_gelu 0-D input",
        lambda d: fusedops.bias_gelu(_x(d, shape=()), _x(d, shape=(1,))),
        ValueError,
        r"fusedops\.bias_gelu: input must have at least one dimension",
    ),
    (
        "bias_gelu bias fp64",
        lambda d: fusedops.bias_gelu(_x(d), _x(d, torch.float64, (8,))),
        TypeError,
        r"fusedops\.bias_gelu: bias has dtype Double but input has dtype Float",
    ),
    (
        "bias_gelu bias None",
        lambda d: fusedops.bias_gelu(_x(d), None),
        TypeError,
        r"fusedops\.bias_gelu: bias must be a Tensor, got NoneType",
    ),
    (
        "bias_gelu approximate='fast'",
        lambda d: fusedops.bias_gelu(_x(d), _x(d, shape=(8,)), "fast"),
        ValueError,
        r"fusedops\.bias_gelu: approximate must be 'none' or 'tanh', got 'fast'",
    ),
    (
        "bias_gelu approximate=1",
        lambda d: fusedops.bias_gelu(_x(d), _x(d, shape=(8,)), 1),
        TypeError,
        r"fusedops\.bias_gelu: approximate must be 'none' or 'tanh', got 1",
    ),
    (
        "nn.BiasGELU(8, 'erf')",
        lambda d: fusedops.nn.BiasGELU(8, "erf"),
        ValueError,
        r"BiasGELU: approximate must be 'none' or 'tanh', got 'erf'",
    ),
    (
        "nn.BiasGELU(8) on [4, 7]",
        lambda d: fusedops.nn.BiasGELU(8, device=d)(_x(d, shape=(4, 7))),
        ValueError,
        r"fusedops\.bias_gelu: bias must have shape \[7\]",
    ),
    # fused_mlp
    (
        "fused_mlp w1 [16, 7]",
        lambda d: fusedops.fused_mlp(_x(d), _x(d, shape=(16, 7)), None, _x(d, shape=(8, 16)), None),
        ValueError,
        r"fusedops\.fused_mlp: x has 8 features \(last dimension\) but w1 of shape "
        r"\[16, 7\] expects 7",
    ),
    (
        "fused_mlp w2 [8, 15]",
        lambda d: fusedops.fused_mlp(_x(d), _x(d, shape=(16, 8)), None, _x(d, shape=(8, 15)), None),
        ValueError,
        r"fusedops\.fused_mlp: w2 of shape \[8, 15\] expects 15 hidden features",
    ),
    (
        "fused_mlp w1 1-D",
        lambda d: fusedops.fused_mlp(_x(d), _x(d, shape=(16,)), None, _x(d, shape=(8, 16)), None),
        ValueError,
        r"fusedops\.fused_mlp: w1 must be 2-D, got shape \[16\]",
    ),
    (
        "fused_mlp b1 [15]",
        lambda d: fusedops.fused_mlp(
            _x(d), _x(d, shape=(16, 8)), _x(d, shape=(15,)), _x(d, shape=(8, 16)), None
        ),
        ValueError,
        r"fusedops\.fused_mlp: b1 must have shape \[16\] \(w1\.size\(0\)\), got \[15\]",
    ),
    (
        "fused_mlp b2 fp64",
        lambda d: fusedops.fused_mlp(
            _x(d), _x(d, shape=(16, 8)), None, _x(d, shape=(8, 16)), _x(d, torch.float64, (8,))
        ),
        TypeError,
        r"fusedops\.fused_mlp: b2 has dtype Double but x has dtype Float",
    ),
    (
        "fused_mlp w2 fp16",
        lambda d: fusedops.fused_mlp(
            _x(d), _x(d, shape=(16, 8)), None, _x(d, torch.float16, (8, 16)), None
        ),
        TypeError,
        r"fusedops\.fused_mlp: w2 has dtype Half but x has dtype Float",
    ),
    (
        "fused_mlp 0-D x",
        lambda d: fusedops.fused_mlp(
            _x(d, shape=()), _x(d, shape=(16, 1)), None, _x(d, shape=(8, 16)), None
        ),
        ValueError,
        r"fusedops\.fused_mlp: x must have at least one dimension",
    ),
    (
        "fused_mlp w1 None",
        lambda d: fusedops.fused_mlp(_x(d), None, None, _x(d, shape=(8, 16)), None),
        TypeError,
        r"fusedops\.fused_mlp: w1 must be a Tensor, got NoneType",
    ),
    (
        "fused_mlp b1 list",
        lambda d: fusedops.fused_mlp(
            _x(d), _x(d, shape=(16, 8)), [0.0], _x(d, shape=(8, 16)), None
        ),
        TypeError,
        r"fusedops\.fused_mlp: b1 must be a Tensor or None, got list",
    ),
    (
        "fused_mlp approximate='erf'",
        lambda d: fusedops.fused_mlp(_x(d), *_mlp_params(d), None, "erf"),
        ValueError,
        r"fusedops\.fused_mlp: approximate must be 'none' or 'tanh', got 'erf'",
    ),
    (
        "FusedMLP(8, 16) on [4, 7]",
        lambda d: fusedops.FusedMLP(8, 16, device=d)(_x(d, shape=(4, 7))),
        ValueError,
        r"fusedops\.fused_mlp: x has 7 features",
    ),
    # backward ops, called directly: their errors say which backward
    (
        "softmax_bwd grad [4, 7]",
        lambda d: ops.softmax_bwd(_x(d, shape=(4, 7)), _x(d), -1, False),
        ValueError,
        r"fusedops\.softmax_backward: grad_output has shape \[4, 7\] but output has shape \[4, 8\]",
    ),
    (
        "log_softmax bwd grad fp16",
        lambda d: ops.softmax_bwd(_x(d, torch.float16), _x(d), -1, True),
        TypeError,
        r"fusedops\.log_softmax_backward: grad_output has dtype Half but output has dtype Float",
    ),
    (
        "log_softmax bwd output int",
        lambda d: ops.softmax_bwd(_x(d), _x(d, torch.int32), -1, True),
        TypeError,
        r"fusedops\.log_softmax_backward: output must be " + FLOAT_NAMES,
    ),
    (
        "log_softmax bwd dim=2",
        lambda d: ops.softmax_bwd(_x(d), _x(d), 2, True),
        IndexError,
        r"fusedops\.log_softmax_backward: dim=2 is out of range",
    ),
    (
        "layer_norm bwd rstd [3]",
        lambda d: ops.layer_norm_bwd(
            _x(d),
            _x(d),
            [8],
            _x(d, shape=(4,)),
            _x(d, shape=(3,)),
            None,
            None,
            [True, False, False],
        ),
        ValueError,
        r"fusedops\.layer_norm_backward: rstd has 3 elements but input has 4 rows",
    ),
    (
        "rms_norm bwd grad [4, 7]",
        lambda d: ops.rms_norm_bwd(
            _x(d, shape=(4, 7)), _x(d), [8], _x(d, shape=(4,)), None, [True, False]
        ),
        ValueError,
        r"fusedops\.rms_norm_backward: grad_out has shape \[4, 7\] but input has shape",
    ),
    (
        "rms_norm bwd rstd fp16",
        lambda d: ops.rms_norm_bwd(
            _x(d), _x(d), [8], _x(d, torch.float16, (4,)), None, [True, False]
        ),
        TypeError,
        r"fusedops\.rms_norm_backward: rstd has dtype Half \(expected Float\)",
    ),
    (
        "bias_gelu bwd grad [4, 7]",
        lambda d: ops.bias_gelu_bwd(_x(d, shape=(4, 7)), _x(d), _x(d, shape=(8,)), "none"),
        ValueError,
        r"fusedops\.bias_gelu_backward: grad_output has shape \[4, 7\]",
    ),
    (
        "fused_mlp bwd pre [4, 15]",
        lambda d: ops.mlp_bwd(
            _x(d),
            _x(d),
            _x(d, shape=(16, 8)),
            _x(d, shape=(8, 16)),
            _x(d, shape=(4, 15)),
            _x(d, shape=(0,)),
            "none",
            [True] * 5,
        ),
        ValueError,
        r"fusedops\.fused_mlp_backward: pre has shape \[4, 15\]",
    ),
]


@pytest.mark.parametrize("grad_mode", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_forward_mode_ad_raises(device, entry, grad_mode):
    """Forward-mode AD is not implemented: a dual input raises instead of losing its tangent,
    with grad mode on or off (the autograd kernels skip the graph node when nothing needs it;
    a tangent must still take the path that raises)."""
    import torch.autograd.forward_ad as fwAD

    _, _, call = ENTRY_POINTS[entry]
    with fwAD.dual_level(), torch.set_grad_enabled(grad_mode):
        x = fwAD.make_dual(_x(device), _x(device))
        with pytest.raises(RuntimeError, match="jvp is not implemented"):
            call(x, device)


@pytest.mark.parametrize(
    ("call", "exc", "pattern"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_argument(device, call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(device)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_eps_zero_is_accepted(device, op):
    """The eps check rejects only what gives NaN/zeros silently: eps=0 is valid, as in torch."""
    x = _x(device)
    out = getattr(fusedops, op)(x, [8], eps=0.0)
    ref = getattr(torch.nn.functional, op)(x, [8], eps=0.0)
    torch.testing.assert_close(out, ref)


def test_dim_errors_name_the_function_on_meta():
    """torch.compile and torch.export trace with fake tensors: the fakes name the function too."""
    x = torch.empty(4, 8, device="meta")
    for fn, name in ((fusedops.softmax, "softmax"), (fusedops.log_softmax, "log_softmax")):
        with pytest.raises(IndexError, match=rf"fusedops\.{name}: dim=2 is out of range"):
            fn(x, 2)
    y = torch.empty(4, 8, device="meta")
    with pytest.raises(IndexError, match=r"fusedops\.log_softmax_backward: dim=2"):
        ops.softmax_bwd(y, y, 2, True)


OTHER_DEVICES = [
    pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")),
    pytest.param("mps", marks=pytest.mark.skipif(not HAS_MPS, reason="no MPS device")),
]

# (id, call(device, other), exception, pattern): one argument on the CPU, the rest on `device`.
DEVICE_MIX = [
    (
        "layer_norm weight on cpu",
        lambda d: fusedops.layer_norm(_x(d), [8], _x("cpu", shape=(8,))),
        RuntimeError,
        r"fusedops\.layer_norm: weight is on cpu but input is on ",
    ),
    (
        "layer_norm bias on cpu",
        lambda d: fusedops.layer_norm(_x(d), [8], None, _x("cpu", shape=(8,))),
        RuntimeError,
        r"fusedops\.layer_norm: bias is on cpu but input is on ",
    ),
    (
        "rms_norm weight on cpu",
        lambda d: fusedops.rms_norm(_x(d), [8], _x("cpu", shape=(8,))),
        RuntimeError,
        r"fusedops\.rms_norm: weight is on cpu but input is on ",
    ),
    (
        "bias_gelu bias on cpu",
        lambda d: fusedops.bias_gelu(_x(d), _x("cpu", shape=(8,))),
        RuntimeError,
        r"fusedops\.bias_gelu: bias is on cpu but input is on ",
    ),
    (
        "fused_mlp w2 on cpu",
        lambda d: fusedops.fused_mlp(
            _x(d), _x(d, shape=(16, 8)), None, _x("cpu", shape=(8, 16)), None
        ),
        RuntimeError,
        r"fusedops\.fused_mlp: w2 is on cpu but x is on ",
    ),
    (
        "nn.LayerNorm on cpu, input on device",
        lambda d: fusedops.nn.LayerNorm(8)(_x(d)),
        RuntimeError,
        r"fusedops\.layer_norm: weight is on cpu but input is on ",
    ),
    (
        "log_softmax bwd grad on cpu",
        lambda d: ops.softmax_bwd(_x("cpu"), _x(d), -1, True),
        RuntimeError,
        r"fusedops\.log_softmax_backward: grad_output is on cpu but output is on ",
    ),
]


@pytest.mark.parametrize("other", OTHER_DEVICES)
@pytest.mark.parametrize(
    ("call", "exc", "pattern"), [c[1:] for c in DEVICE_MIX], ids=[c[0] for c in DEVICE_MIX]
)
def test_device_mix(other, call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(other)


@pytest.mark.parametrize(
    ("op", "call"),
    [
        ("bias_gelu_backward", lambda x, d: fusedops.bias_gelu(x, _x(d, shape=(8,)))),
        ("fused_mlp_backward", lambda x, d: _mlp(x, d)),
    ],
    ids=["bias_gelu", "fused_mlp"],
)
def test_double_backward_raises(device, op, call):
    """These backward ops have no derivative: create_graph=True raises at the first backward,
    naming the op, instead of recording a node that fails later."""
    x = _x(device).requires_grad_()
    y = call(x, device)
    with pytest.raises(RuntimeError, match=f"fusedops.{op}: double backward is not supported"):
        torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
