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
