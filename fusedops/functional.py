"""Fused ops with torch.nn.functional's names and signatures."""

import warnings
from collections.abc import Sequence

import torch

from fusedops import _C
from fusedops._ops import ops

__all__ = [
    "bias_gelu",
    "fully_fused_mlp",
    "fused_mlp",
    "layer_norm",
    "log_softmax",
    "rms_norm",
    "softmax",
]


# Python-level argument types: the binding would turn None into an undefined tensor (an error
# that names no function) and its own type errors name the schema, not the function called.
# Values (dtype, shape, device, dim, eps) are checked in C++, where every caller passes.


def _tensor(op: str, arg: str, value) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"fusedops.{op}: {arg} must be a Tensor, got {type(value).__name__}")


def _optional_tensor(op: str, arg: str, value) -> None:
    if value is not None and not isinstance(value, torch.Tensor):
        raise TypeError(
            f"fusedops.{op}: {arg} must be a Tensor or None, got {type(value).__name__}"
        )


def _is_optional_tensor(a, b) -> bool:
    return (a is None or isinstance(a, torch.Tensor)) and (b is None or isinstance(b, torch.Tensor))


def _int(op: str, arg: str, value) -> None:
    if not isinstance(value, (int, torch.SymInt)) or isinstance(value, bool):
        raise TypeError(f"fusedops.{op}: {arg} must be an int, got {value!r}")


def _approximate(op: str, value) -> None:
    if not isinstance(value, str):
        raise TypeError(f"fusedops.{op}: approximate must be 'none' or 'tanh', got {value!r}")


# The ops, looked up once: host cost per call counts on small tensors. Outside torch.compile each
# function first tries _C's direct call of its op (csrc/python_module.cpp: the same op through the
# dispatcher, without the OpOverload's boxed argument parsing, ~1 µs less per call); it returns
# NotImplemented for what only the OpOverload takes (a Tensor subclass, a torch function mode,
# arguments of other Python types), which then checks and calls as before.
_is_compiling = torch.compiler.is_compiling
_softmax_fwd = ops.softmax_fwd.default
_layer_norm_fwd = ops.layer_norm_fwd.default
_rms_norm_fwd = ops.rms_norm_fwd.default
_bias_gelu_fwd = ops.bias_gelu_fwd.default
_mlp_fwd = ops.mlp_fwd.default


def softmax(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax(input, dim) as torch.softmax, fused: one read of input, one write of the result."""
    if not _is_compiling():
        out = _C.softmax(input, dim, False)
        if out is not NotImplemented:
            return out
    if not isinstance(input, torch.Tensor) or type(dim) is not int:  # the checks, off the fast path
        _tensor("softmax", "input", input)
        _int("softmax", "dim", dim)
    return _softmax_fwd(input, dim, False)


def log_softmax(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """log_softmax(input, dim) as torch.log_softmax, fused like softmax."""
    if not _is_compiling():
        out = _C.softmax(input, dim, True)
        if out is not NotImplemented:
            return out
    if not isinstance(input, torch.Tensor) or type(dim) is not int:
        _tensor("log_softmax", "input", input)
        _int("log_softmax", "dim", dim)
    return _softmax_fwd(input, dim, True)


_SHAPE_TYPES = (tuple, list, torch.Size)


def _shape(op: str, normalized_shape: int | Sequence[int]) -> Sequence[int]:
    # The common case in a few exact type checks (the general ones below cost 0.5 µs per call).
    if type(normalized_shape) in _SHAPE_TYPES:
        for s in normalized_shape:
            if type(s) is not int:
                break
        else:
            return normalized_shape
    if isinstance(normalized_shape, (int, torch.SymInt)):
        return [normalized_shape]
    if not isinstance(normalized_shape, Sequence) or not all(
        isinstance(s, (int, torch.SymInt)) for s in normalized_shape
    ):
        raise TypeError(
            f"fusedops.{op}: normalized_shape must be an int or a sequence of ints, "
            f"got {normalized_shape!r}"
        )
    return list(normalized_shape)


def layer_norm(
    input: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """layer_norm as torch.nn.functional.layer_norm, fused: one read of input, one write of the
    result; fp32 statistics. weight/bias may be fp32 for fp16/bf16 input."""
    if not _is_compiling():
        out = _C.layer_norm(input, normalized_shape, weight, bias, eps)
        if out is not NotImplemented:
            return out
    if not isinstance(input, torch.Tensor) or not _is_optional_tensor(weight, bias):
        _tensor("layer_norm", "input", input)
        _optional_tensor("layer_norm", "weight", weight)
        _optional_tensor("layer_norm", "bias", bias)
    shape = _shape("layer_norm", normalized_shape)
    return _layer_norm_fwd(input, shape, weight, bias, eps)[0]


def _torch_rms_norm_rules() -> tuple[bool, bool]:
    """How the running torch's rms_norm treats fp16/bf16 input, probed once: torch 2.4 takes the
    input dtype's epsilon as the default eps and promotes the result to an fp32 weight's dtype;
    later versions take fp32's epsilon and keep the input dtype. fusedops follows the torch it
    runs with, so a swap changes nothing on either."""
    x = torch.full((1,), 1e-3, dtype=torch.bfloat16)
    eps_of_input_dtype = torch.rms_norm(x, [1]).item() < 0.5  # 1e-3 / sqrt(1e-6 + eps)
    with warnings.catch_warnings():  # newer torch warns that mixed dtypes skip its fused kernel
        warnings.simplefilter("ignore")
        promotes_to_weight = torch.rms_norm(x, [1], torch.ones(1)).dtype == torch.float32
    return eps_of_input_dtype, promotes_to_weight


_RMS_EPS_OF_INPUT_DTYPE, _RMS_PROMOTES_TO_WEIGHT = _torch_rms_norm_rules()
_RMS_DIRECT = not (_RMS_EPS_OF_INPUT_DTYPE or _RMS_PROMOTES_TO_WEIGHT)  # torch 2.5 and later


def rms_norm(
    input: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> torch.Tensor:
    """rms_norm as torch.nn.functional.rms_norm, fused like layer_norm. eps=None is the running
    torch's default: the accumulation type's epsilon (fp32's for fp16/bf16/fp32 input; torch 2.4:
    the input dtype's)."""
    if _RMS_DIRECT and not _is_compiling():
        out = _C.rms_norm(input, normalized_shape, weight, eps)
        if out is not NotImplemented:
            return out
    if not isinstance(input, torch.Tensor) or not _is_optional_tensor(weight, None):
        _tensor("rms_norm", "input", input)
        _optional_tensor("rms_norm", "weight", weight)
    shape = _shape("rms_norm", normalized_shape)
    if (_RMS_EPS_OF_INPUT_DTYPE or _RMS_PROMOTES_TO_WEIGHT) and input.dtype in (
        torch.float16,
        torch.bfloat16,
    ):
        return _rms_norm_torch24(input, shape, weight, eps)
    return _rms_norm_fwd(input, shape, weight, eps)[0]


def _rms_norm_torch24(input, shape, weight, eps):
    """fp16/bf16 rms_norm under torch 2.4's rules (_torch_rms_norm_rules)."""
    if eps is None and _RMS_EPS_OF_INPUT_DTYPE:
        eps = torch.finfo(input.dtype).eps
    if _RMS_PROMOTES_TO_WEIGHT and weight is not None and weight.dtype == torch.float32:
        # normalized in the input dtype, then times the weight, in fp32
        return ops.rms_norm_fwd.default(input, shape, None, eps)[0] * weight
    return ops.rms_norm_fwd.default(input, shape, weight, eps)[0]


def bias_gelu(input: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(input + bias) as torch.nn.functional.gelu, fused: one read of input, one write.

    bias has shape [input.size(-1)]. approximate: "none" (exact, erf) or "tanh", as torch.
    """
    if not _is_compiling():
        out = _C.bias_gelu(input, bias, approximate)
        if out is not NotImplemented:
            return out
    if (
        not (isinstance(input, torch.Tensor) and isinstance(bias, torch.Tensor))
        or type(approximate) is not str
    ):
        _tensor("bias_gelu", "input", input)
        _tensor("bias_gelu", "bias", bias)
        _approximate("bias_gelu", approximate)
    return _bias_gelu_fwd(input, bias, approximate)


def fused_mlp(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    approximate: str = "none",
    recompute_activation: bool = False,
) -> torch.Tensor:
    """linear(gelu(linear(x, w1, b1), approximate), w2, b2) as one fused block.

    x [..., in], w1 [hidden, in], b1 [hidden], w2 [out, hidden], b2 [out] (nn.Linear's layouts).
    recompute_activation=True keeps only the pre-activation for the backward and recomputes
    the GELU output there, in the backward's own GELU pass (CUDA): less memory kept between
    forward and backward for one extra write in the backward.
    """
    # pre (and act, unless recomputed) are kept only where a gradient will be asked for
    save_pre = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (x, w1, b1, w2, b2)
    )
    save_act = save_pre and not recompute_activation
    if not _is_compiling():
        out = _C.fused_mlp(x, w1, b1, w2, b2, approximate, save_pre, save_act)
        if out is not NotImplemented:
            return out
    for arg, value in (("x", x), ("w1", w1), ("w2", w2)):
        _tensor("fused_mlp", arg, value)
    _optional_tensor("fused_mlp", "b1", b1)
    _optional_tensor("fused_mlp", "b2", b2)
    _approximate("fused_mlp", approximate)
    return _mlp_fwd(x, w1, b1, w2, b2, approximate, save_pre, save_act)[0]


def fully_fused_mlp(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor] | None = None,
    activation: str = "gelu",
    output_activation: str = "none",
) -> torch.Tensor:
    """A small-width MLP as one kernel per direction (fusedops.nn.FullyFusedMLP's function).

    h = x [..., in]; h = activation(linear(h, weights[l], biases[l])) for every weight but the
    last; returns output_activation(linear(h, weights[-1], biases[-1])). weights[l] is
    nn.Linear's [out_l, in_l]; biases is None or one per weight. activation and
    output_activation: 'gelu' (erf), 'gelu_tanh', 'relu' or 'none'. On CUDA, fp16/bf16
    networks with features up to 128 (hidden a multiple of 16) run fused on sm_80+; any other
    input runs the same network as ATen ops.
    """
    op = "fully_fused_mlp"
    _tensor(op, "x", x)
    biases = [] if biases is None else biases
    for arg, seq in (("weights", weights), ("biases", biases)):
        if not isinstance(seq, Sequence) or not all(isinstance(t, torch.Tensor) for t in seq):
            raise TypeError(f"fusedops.{op}: {arg} must be a sequence of Tensors, got {seq!r}")
    for arg, value in (("activation", activation), ("output_activation", output_activation)):
        if not isinstance(value, str):
            raise TypeError(f"fusedops.{op}: {arg} must be a str, got {value!r}")
    weights, biases = list(weights), list(biases)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, *weights, *biases))
    return ops.fully_fused_mlp_fwd.default(
        x, weights, biases, activation, output_activation, needs_grad
    )[0]
