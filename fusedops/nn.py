"""Drop-in nn.Module replacements with torch.nn's constructor arguments and state_dict keys."""

import torch

from fusedops import functional as F

__all__ = [
    "BiasGELU",
    "FullyFusedMLP",
    "FusedMLP",
    "LayerNorm",
    "LogSoftmax",
    "RMSNorm",
    "Softmax",
]


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


# Under torch.compile (and torch.export) the norm modules hand the norm back to torch, so that
# inductor fuses it with its neighbours: the residual add before it and the norm become one
# pass, where an opaque norm kernel leaves the add a pass of its own. H200, bf16, compiled
# residual add + layer_norm, inductor's against the fused norm: 71 against 89 us at 8192x4096,
# 140 against 170 at 4096x16384; a compiled GPT-2 small forward at 1x64 tokens went from 13-14%
# slower than without the swap to 0-2.5% (bench/compile_swap.py). Called directly,
# fusedops.layer_norm and rms_norm keep their kernels under torch.compile: alone, the fused norm
# leads from 4096 columns (layer_norm 71 against 94 us at 16384x4096).


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm computed by fusedops.layer_norm: same constructor, parameters and
    state_dict keys, so state dicts load either way. Under torch.compile: torch's layer_norm,
    fused by inductor with its neighbours."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return super().forward(input)
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm computed by fusedops.rms_norm: same constructor, parameters and
    state_dict keys, so state dicts load either way. Under torch.compile: torch's rms_norm,
    fused by inductor with its neighbours."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return super().forward(input)
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


_ACTIVATION_MODULES = {
    "gelu": lambda: torch.nn.GELU(),
    "gelu_tanh": lambda: torch.nn.GELU(approximate="tanh"),
    "relu": lambda: torch.nn.ReLU(),
}


def _activation_name(module: torch.nn.Module) -> str | None:
    """The fully_fused_mlp name of an activation module, None if it has none."""
    if type(module) is torch.nn.GELU:
        return "gelu" if module.approximate == "none" else "gelu_tanh"
    if type(module) is torch.nn.ReLU:
        return "relu"
    return None


class FullyFusedMLP(torch.nn.Sequential):
    """A small-width MLP computed as one kernel per direction (fusedops.fully_fused_mlp).

    Linear(in, hidden), activation, then hidden_layers - 1 times Linear(hidden, hidden),
    activation, then Linear(hidden, out) and output_activation: an nn.Sequential of exactly those
    modules (activation 'none' adds none), so its state_dict keys are that Sequential's and a
    trained eager model loads into it (or use from_sequential). Activations: 'gelu' (erf),
    'gelu_tanh', 'relu', 'none'.

    On CUDA (sm_80+), fp16/bf16 networks with in, out <= 128 and hidden a multiple of 16 up to
    128 run fused: the activations stay on chip from layer to layer, and the backward's weight
    gradients are GEMMs over the pre-activation gradients (deterministic). Everything else (CPU,
    MPS, fp32, wider networks) runs the same network as ATen ops.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        hidden_features: int,
        hidden_layers: int,
        bias: bool = True,
        activation: str = "gelu",
        output_activation: str = "none",
        device=None,
        dtype=None,
    ):
        owner = "FullyFusedMLP"
        for arg, value in (("activation", activation), ("output_activation", output_activation)):
            if value not in (*_ACTIVATION_MODULES, "none"):
                raise ValueError(
                    f"{owner}: {arg} must be 'gelu', 'gelu_tanh', 'relu' or 'none', got {value!r}"
                )
        for arg, value in (
            ("in_features", in_features),
            ("out_features", out_features),
            ("hidden_features", hidden_features),
            ("hidden_layers", hidden_layers),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{owner}: {arg} must be a positive int, got {value!r}")
        factory = {"device": device, "dtype": dtype}
        modules: list[torch.nn.Module] = []
        for layer in range(hidden_layers + 1):
            fan_in = in_features if layer == 0 else hidden_features
            fan_out = out_features if layer == hidden_layers else hidden_features
            modules.append(torch.nn.Linear(fan_in, fan_out, bias=bias, **factory))
            act = output_activation if layer == hidden_layers else activation
            if act != "none":
                modules.append(_ACTIVATION_MODULES[act]())
        super().__init__(*modules)
        self.activation = activation
        self.output_activation = output_activation

    def linears(self) -> list[torch.nn.Linear]:
        """The Linear layers, input to output (the activations sit between them)."""
        return [m for m in self if isinstance(m, torch.nn.Linear)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        linears = self.linears()
        biases = [m.bias for m in linears] if linears[0].bias is not None else None
        return F.fully_fused_mlp(
            x, [m.weight for m in linears], biases, self.activation, self.output_activation
        )

    @classmethod
    def from_sequential(cls, seq: torch.nn.Sequential) -> "FullyFusedMLP":
        """A FullyFusedMLP computing seq, made of seq's own modules (no copy).

        seq must be Linear, act, Linear, act, ..., Linear[, out_act] with one activation type
        (nn.GELU or nn.ReLU) after every hidden Linear, all Linears biased or none, and at least
        one hidden layer.
        """
        modules, linears, acts = list(seq), [], []
        while modules:  # Linear, then its activation if one follows
            linears.append(modules.pop(0))
            acts.append("none")
            if modules and type(modules[0]) is not torch.nn.Linear:
                acts[-1] = _activation_name(modules.pop(0))
        if (
            len(linears) < 2
            or any(type(m) is not torch.nn.Linear for m in linears)
            or None in acts
            or len(set(acts[:-1])) != 1
            or len({m.bias is None for m in linears}) != 1
        ):
            raise TypeError(
                "FullyFusedMLP.from_sequential: expected Linear, act, ..., Linear[, out_act] with "
                "one activation (nn.GELU or nn.ReLU) after every hidden Linear and all Linears "
                f"biased or none, got {seq}"
            )
        activation, output_activation = acts[0], acts[-1]
        first, last = linears[0], linears[-1]
        hidden_features = first.out_features
        if any(m.in_features != hidden_features for m in linears[1:]) or any(
            m.out_features != hidden_features for m in linears[:-1]
        ):
            raise TypeError(
                "FullyFusedMLP.from_sequential: every hidden Linear must have the same width, "
                f"got {seq}"
            )
        with torch.device("meta"):
            mlp = cls(
                first.in_features,
                last.out_features,
                hidden_features,
                len(linears) - 1,
                bias=first.bias is not None,
                activation=activation,
                output_activation=output_activation,
            )
        for i, module in enumerate(seq):  # the same layout: take seq's own modules
            mlp[i] = module
        return mlp
