"""Fused ops with torch.nn.functional's names and signatures."""

from collections.abc import Sequence

import torch

from fusedops._ops import ops

__all__ = ["layer_norm", "log_softmax", "rms_norm", "softmax"]


def softmax(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax(input, dim) as torch.softmax, fused: one read of input, one write of the result."""
    return ops.softmax_fwd.default(input, dim, False)


def log_softmax(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """log_softmax(input, dim) as torch.log_softmax, fused like softmax."""
    return ops.softmax_fwd.default(input, dim, True)


def _shape(normalized_shape: int | Sequence[int]) -> list[int]:
    if isinstance(normalized_shape, int):
        return [normalized_shape]
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
    return ops.layer_norm_fwd.default(input, _shape(normalized_shape), weight, bias, eps)[0]


def rms_norm(
    input: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> torch.Tensor:
    """rms_norm as torch.nn.functional.rms_norm, fused like layer_norm. eps=None is torch's
    default: the epsilon of the accumulation type (fp32 for fp16/bf16/fp32 input)."""
    return ops.rms_norm_fwd.default(input, _shape(normalized_shape), weight, eps)[0]
