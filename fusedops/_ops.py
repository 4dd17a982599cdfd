"""Loads the compiled operators and registers a fake (meta) kernel for each one."""

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
    _wrap_dim("softmax", dim, input.dim())
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@torch.library.register_fake("fusedops::softmax_bwd")
def _softmax_bwd_fake(grad_output, output, dim, log):
    _wrap_dim("softmax_backward", dim, output.dim())
    torch._check(grad_output.shape == output.shape, lambda: "grad_output and output shapes differ")
    return torch.empty_like(output, memory_format=torch.contiguous_format)


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
    return tuple(x.new_empty(shape if need else (0,)) for shape, need in pairs)
