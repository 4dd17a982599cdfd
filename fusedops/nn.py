"""Drop-in nn.Module replacements with torch.nn's constructor arguments and state_dict keys."""

import torch

from fusedops import functional as F

__all__ = ["LayerNorm", "LogSoftmax", "RMSNorm", "Softmax"]


class Softmax(torch.nn.Softmax):
    """torch.nn.Softmax computed by fusedops.softmax. dim=None follows torch's legacy rule."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.softmax(input, _dim(self.dim, input))


class LogSoftmax(torch.nn.LogSoftmax):
    """torch.nn.LogSoftmax computed by fusedops.log_softmax."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(input, _dim(self.dim, input))


def _dim(dim, input: torch.Tensor) -> int:
    # torch.nn.Softmax(dim=None) picks dim 0 for 0-, 1- and 3-dim inputs, else 1.
    if dim is not None:
        return dim
    return 0 if input.dim() in (0, 1, 3) else 1


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm computed by fusedops.layer_norm: same constructor, parameters and
    state_dict keys, so state dicts load either way."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm computed by fusedops.rms_norm: same constructor, parameters and
    state_dict keys, so state dicts load either way."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)
