"""Loads the compiled operators and registers a fake (meta) kernel for each one."""

import math

import torch

from fusedops import _C  # noqa: F401  (registers torch.ops.fusedops.*)

ops = torch.ops.fusedops


def _wrap_dim(op: str, dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(
            f"fusedops.{op}: dim={dim} is out of range for a tensor with {ndim} dimension(s) "
            f"(expected [{-n}, {n - 1}])"
        )
    return dim


@torch.library.register_fake("fusedops::softmax_fwd")
def _softmax_fwd_fake(input, dim, log):
    _wrap_dim("log_softmax" if log else "softmax", dim, input.dim())
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@torch.library.register_fake("fusedops::softmax_bwd")
def _softmax_bwd_fake(grad_output, output, dim, log):
    _wrap_dim("log_softmax_backward" if log else "softmax_backward", dim, output.dim())
    torch._check(grad_output.shape == output.shape, lambda: "grad_output and output shapes differ")
    return torch.empty_like(output, memory_format=torch.contiguous_format)


def _norm_rows(op: str, input, normalized_shape) -> int:
    """Checks normalized_shape against input's trailing dims; returns the first normalized dim."""
    k = len(normalized_shape)
    torch._check(
        k >= 1, lambda: f"fusedops.{op}: normalized_shape must have at least one dimension"
    )
    torch._check(
        input.dim() >= k and tuple(input.shape[input.dim() - k :]) == tuple(normalized_shape),
        lambda: (
            f"fusedops.{op}: normalized_shape={list(normalized_shape)} does not match the "
            f"trailing dimensions of input of shape {list(input.shape)}"
        ),
    )
    return input.dim() - k


def _norm_stat(input, axis: int):
    """One statistic per row, fp32 (fp64 for fp64 input), contiguous."""
    dtype = torch.float64 if input.dtype == torch.float64 else torch.float32
    return input.new_empty(input.shape[:axis], dtype=dtype)


def _norm_grad(param):
    return None if param is None else torch.empty_like(param, memory_format=torch.contiguous_format)


@torch.library.register_fake("fusedops::layer_norm_fwd")
def _layer_norm_fwd_fake(input, normalized_shape, weight, bias, eps):
    axis = _norm_rows("layer_norm", input, normalized_shape)
    out = torch.empty_like(input, memory_format=torch.contiguous_format)
    return out, _norm_stat(input, axis), _norm_stat(input, axis)


@torch.library.register_fake("fusedops::layer_norm_bwd")
def _layer_norm_bwd_fake(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    _norm_rows("layer_norm_backward", input, normalized_shape)
    dx = torch.empty_like(input, memory_format=torch.contiguous_format) if output_mask[0] else None
    return (
        dx,
        _norm_grad(weight) if output_mask[1] else None,
        _norm_grad(bias) if output_mask[2] else None,
    )


@torch.library.register_fake("fusedops::rms_norm_fwd")
def _rms_norm_fwd_fake(input, normalized_shape, weight, eps):
    axis = _norm_rows("rms_norm", input, normalized_shape)
    out = torch.empty_like(input, memory_format=torch.contiguous_format)
    return out, _norm_stat(input, axis)


@torch.library.register_fake("fusedops::rms_norm_bwd")
def _rms_norm_bwd_fake(grad_out, input, normalized_shape, rstd, weight, output_mask):
    _norm_rows("rms_norm_backward", input, normalized_shape)
    dx = torch.empty_like(input, memory_format=torch.contiguous_format) if output_mask[0] else None
    return dx, _norm_grad(weight) if output_mask[1] else None


def _check_approximate(op: str, approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(
            f"fusedops.{op}: approximate must be 'none' or 'tanh', got '{approximate}'"
        )


@torch.library.register_fake("fusedops::bias_gelu_fwd")
def _bias_gelu_fwd_fake(input, bias, approximate):
    _check_approximate("bias_gelu", approximate)
    torch._check(bias.dim() == 1 and bias.shape[0] == input.shape[-1], lambda: "bias shape")
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@torch.library.register_fake("fusedops::bias_gelu_bwd")
def _bias_gelu_bwd_fake(grad_output, input, bias, approximate):
    _check_approximate("bias_gelu_backward", approximate)
    torch._check(grad_output.shape == input.shape, lambda: "grad_output and input shapes differ")
    return (
        torch.empty_like(input, memory_format=torch.contiguous_format),
        torch.empty_like(bias, memory_format=torch.contiguous_format),
    )


def _features(x, n):
    return (*x.shape[:-1], n)


@torch.library.register_fake("fusedops::mlp_fwd")
def _mlp_fwd_fake(x, w1, b1, w2, b2, approximate, save_pre, save_act):
    _check_approximate("fused_mlp", approximate)
    torch._check(x.shape[-1] == w1.shape[1], lambda: "x and w1 feature sizes differ")
    torch._check(w2.shape[1] == w1.shape[0], lambda: "w1 and w2 hidden sizes differ")
    hidden = _features(x, w1.shape[0])
    return (
        x.new_empty(_features(x, w2.shape[0])),
        x.new_empty(hidden if save_pre else (0,)),
        x.new_empty(hidden if save_act else (0,)),
    )


@torch.library.register_fake("fusedops::mlp_bwd")
def _mlp_bwd_fake(grad_out, x, w1, w2, pre, act, approximate, output_mask):
    _check_approximate("fused_mlp_backward", approximate)
    shapes = (x.shape, w1.shape, w1.shape[:1], w2.shape, w2.shape[:1])
    pairs = zip(shapes, output_mask, strict=True)
    out = [x.new_empty(shape if need else (0,)) for shape, need in pairs]
    for i, w in ((1, w1), (3, w2)):
        # A transposed weight (the .t() of a contiguous [in, out]) gets its gradient column-major.
        if output_mask[i] and not w.is_contiguous() and w.stride() == (1, w.shape[0]):
            out[i] = x.new_empty(w.shape[::-1]).t()
    return tuple(out)


_MLP_ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "none")


def _check_activation(op: str, arg: str, value: str) -> None:
    if value not in _MLP_ACTIVATIONS:
        raise ValueError(
            f"fusedops.{op}: {arg} must be 'gelu', 'gelu_tanh', 'relu' or 'none', got '{value}'"
        )


@torch.library.register_fake("fusedops::fully_fused_mlp_fwd")
def _fully_fused_mlp_fwd_fake(x, weights, biases, activation, output_activation, save):
    _check_activation("fully_fused_mlp", "activation", activation)
    _check_activation("fully_fused_mlp", "output_activation", output_activation)
    torch._check(len(weights) >= 2, lambda: "fully_fused_mlp needs at least 2 weights")
    torch._check(x.shape[-1] == weights[0].shape[1], lambda: "x and weights[0] sizes differ")
    rows = math.prod(x.shape[:-1])
    layers, hidden, out = len(weights) - 1, weights[0].shape[0], weights[-1].shape[0]

    def save_if(keep, shape):  # absent saves are [0], each its own tensor
        return x.new_empty(shape if save and keep else (0,))

    return (
        x.new_empty(_features(x, out)),
        # one save per hidden layer: the GELUs' pre-activation, the others' output
        save_if(not activation.startswith("gelu"), (layers, rows, hidden)),
        save_if(activation.startswith("gelu"), (layers, rows, hidden)),
        save_if(output_activation != "none", (rows, out)),
    )


@torch.library.register_fake("fusedops::fully_fused_mlp_bwd")
def _fully_fused_mlp_bwd_fake(
    grad_out, x, weights, hidden_act, hidden_pre, out_pre, activation, output_activation, has_bias
):
    _check_activation("fully_fused_mlp_backward", "activation", activation)
    _check_activation("fully_fused_mlp_backward", "output_activation", output_activation)
    grad_w = [torch.empty_like(w, memory_format=torch.contiguous_format) for w in weights]
    grad_b = [w.new_empty(w.shape[:1]) for w in weights] if has_bias else []
    return torch.empty_like(x, memory_format=torch.contiguous_format), grad_w, grad_b
