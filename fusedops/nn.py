"""Drop-in nn.Module replacements with torch.nn's constructor arguments and state_dict keys."""

import torch

from fusedops import functional as F

__all__ = ["BiasGELU", "FusedMLP", "LayerNorm", "LogSoftmax", "RMSNorm", "Softmax"]


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


def _check_approximate(owner: str, approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"{owner}: approximate must be 'none' or 'tanh', got '{approximate}'")


class BiasGELU(torch.nn.Module):
    """gelu(input + bias) with a learnable bias of shape [num_features], fused in one pass.

    Replaces a biased nn.Linear followed by nn.GELU as nn.Linear(bias=False) + BiasGELU, where
    BiasGELU.bias holds the Linear's bias (zeros when created here).
    """

    def __init__(self, num_features: int, approximate: str = "none", device=None, dtype=None):
        super().__init__()
        _check_approximate("BiasGELU", approximate)
        self.num_features = num_features
        self.approximate = approximate
        self.bias = torch.nn.Parameter(torch.zeros(num_features, device=device, dtype=dtype))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        bias = self.bias
        if torch.is_autocast_enabled(self.bias.device.type):
            # This is the bias of the Linear before: autocast runs that Linear, bias included, in
            # the input's dtype, so the output keeps it (as Linear + GELU) instead of promoting.
            bias = bias.to(input.dtype)
        return F.bias_gelu(input, bias, self.approximate)

    def extra_repr(self) -> str:
        return f"{self.num_features}, approximate={self.approximate!r}"


class FusedMLP(torch.nn.Module):
    """Linear -> GELU -> Linear as one fused block (fusedops.fused_mlp).

    Parameters live in fc1 and fc2, plain nn.Linear modules: the same shapes, initialization and
    state_dict keys (fc1.weight, fc1.bias, fc2.weight, fc2.bias) as an MLP built from nn.Linear.
    recompute_activation=True saves only the pre-activation for the backward (less memory) and
    recomputes the GELU output there.
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        out_features: int | None = None,
        bias: bool = True,
        approximate: str = "none",
        device=None,
        dtype=None,
        recompute_activation: bool = False,
    ):
        super().__init__()
        _check_approximate("FusedMLP", approximate)
        out_features = in_features if out_features is None else out_features
        factory = {"device": device, "dtype": dtype}
        self.fc1 = torch.nn.Linear(in_features, hidden_features, bias=bias, **factory)
        self.fc2 = torch.nn.Linear(hidden_features, out_features, bias=bias, **factory)
        self.approximate = approximate
        self.recompute_activation = recompute_activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.fused_mlp(
            x,
            self.fc1.weight,
            self.fc1.bias,
            self.fc2.weight,
            self.fc2.bias,
            self.approximate,
            self.recompute_activation,
        )

    @classmethod
    def from_modules(
        cls,
        fc1: torch.nn.Module,
        act: torch.nn.Module | None = None,
        fc2: torch.nn.Linear | None = None,
        *,
        recompute_activation: bool = False,
    ) -> "FusedMLP":
        """A FusedMLP computing fc2(act(fc1(x))), sharing fc1's and fc2's parameters.

        Takes (fc1, act, fc2) or one nn.Sequential(Linear, GELU, Linear); act must be nn.GELU.
        """
        if isinstance(fc1, torch.nn.Sequential):
            if act is not None or fc2 is not None or len(fc1) != 3:
                raise TypeError(
                    "FusedMLP.from_modules: pass (fc1, act, fc2) or one nn.Sequential of exactly "
                    f"(Linear, GELU, Linear), got a Sequential of {len(fc1)} modules"
                )
            fc1, act, fc2 = fc1
        for name, module, kind in (
            ("fc1", fc1, torch.nn.Linear),
            ("act", act, torch.nn.GELU),
            ("fc2", fc2, torch.nn.Linear),
        ):
            if type(module) is not kind:
                raise TypeError(
                    f"FusedMLP.from_modules: {name} must be a torch.nn.{kind.__name__}, "
                    f"got {type(module).__name__}"
                )
        if fc1.out_features != fc2.in_features:
            raise ValueError(
                f"FusedMLP.from_modules: fc1 has {fc1.out_features} output features but fc2 "
                f"expects {fc2.in_features}"
            )
        w1, w2 = fc1.weight, fc2.weight
        if w1.device != w2.device or w1.dtype != w2.dtype:
            raise ValueError(
                f"FusedMLP.from_modules: fc1 is {w1.dtype} on {w1.device} but fc2 is "
                f"{w2.dtype} on {w2.device}"
            )
        mlp = cls(
            fc1.in_features,
            fc1.out_features,
            fc2.out_features,
            approximate=act.approximate,
            device="meta",
            recompute_activation=recompute_activation,
        )
        mlp.fc1, mlp.fc2 = fc1, fc2
        return mlp

    def extra_repr(self) -> str:
        extra = f"approximate={self.approximate!r}"
        if self.recompute_activation:
            extra += ", recompute_activation=True"
        return extra
