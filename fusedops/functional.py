"""Fused ops with torch.nn.functional's names and signatures."""

from collections.abc import Sequence

import torch

from fusedops._ops import ops

__all__ = ["bias_gelu", "fused_mlp", "layer_norm", "log_softmax", "rms_norm", "softmax"]


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


def bias_gelu(input: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(input + bias) as torch.nn.functional.gelu, fused: one read of input, one write.

    bias has shape [input.size(-1)]. approximate: "none" (exact, erf) or "tanh", as torch.
    """
    return ops.bias_gelu_fwd.default(input, bias, approximate)


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
    the GELU output there: less activation memory for one extra elementwise pass.
    """
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, w1, b1, w2, b2)
    )
    out, _, _ = ops.mlp_fwd.default(
        x, w1, b1, w2, b2, approximate, needs_grad, needs_grad and not recompute_activation
    )
    return out
