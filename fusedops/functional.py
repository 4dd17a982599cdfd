"""Fused ops with torch.nn.functional's names and signatures."""

import torch

from fusedops._ops import ops

__all__ = ["softmax", "log_softmax"]


def softmax(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax(input, dim) as torch.softmax, fused: one read of input, one write of the result."""
    return ops.softmax_fwd.default(input, dim, False)


def log_softmax(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """log_softmax(input, dim) as torch.log_softmax, fused like softmax."""
    return ops.softmax_fwd.default(input, dim, True)
