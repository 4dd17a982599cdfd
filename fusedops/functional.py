"""Fused ops with torch.nn.functional's names and signatures."""

import torch

from fusedops._ops import ops

__all__ = ["softmax", "log_softmax", "bias_gelu", "fused_mlp"]


def softmax(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax(input, dim) as torch.softmax, fused: one read of input, one write of the result."""
    return ops.softmax_fwd.default(input, dim, False)


def log_softmax(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """log_softmax(input, dim) as torch.log_softmax, fused like softmax."""
    return ops.softmax_fwd.default(input, dim, True)


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
