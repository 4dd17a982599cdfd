"""fusedops.swap: replace a model's modules by fused ones, per instance, with a report and undo.

Recognised (each replacement reuses the original's Parameter objects and child modules, so
optimizers keep working and state_dict keys and shapes don't change):

- torch.nn.Softmax / LogSoftmax / LayerNorm / RMSNorm -> the fusedops.nn module of that name.
- LLaMA-style RMSNorm modules (weight * x / rms, eps under another name such as
  variance_epsilon), recognised by name and confirmed numerically -> WeightDtypeRMSNorm.
- A module whose forward is a plain chain of its children (every nn.Sequential; others are
  checked with torch.fx), holding Linear -> GELU [-> Dropout / Identity ...] -> Linear (the MLP:
  fusedops.fused_mlp) or Linear -> GELU (fusedops.bias_gelu) -> FusedChain / FusedSequential.
  "Linear" is nn.Linear or Hugging Face's Conv1D (weight stored [in, out], passed transposed: a
  view, never a copy). An activation is GELU when it is nn.GELU or computes torch's erf or tanh
  GELU (checked numerically: Hugging Face's GELUActivation, NewGELUActivation, FastGELU...).

Everything else that was considered gets a row saying why it was left.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import sys

import torch

import fusedops
import fusedops.nn
from fusedops import functional as F

__all__ = ["FusedChain", "FusedSequential", "SwapReport", "SwapRow", "WeightDtypeRMSNorm", "swap"]

_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


@dataclasses.dataclass(frozen=True)
class SwapRow:
    """One considered module: what replaced it (None: nothing) and why it, or a part of it, was
    left (None: nothing was)."""

    path: str
    original: str
    replacement: str | None
    reason: str | None


class SwapReport:
    """What swap() did: rows (one per considered module path), swapped, undo()."""

    def __init__(self, rows: list[SwapRow], changes: list, dry_run: bool):
        self.rows = rows
        self.dry_run = dry_run
        # (parent, child name, path, original, replacement), in the order they were applied.
        self._changes = changes

    @property
    def swapped(self) -> int:
        """Number of modules replaced (0 for a dry run)."""
        return len({id(change[-1]) for change in self._changes})

    def undo(self) -> None:
        """Puts the original module objects back where the replacements are; a no-op when undone."""
        for parent, name, path, original, replacement in reversed(self._changes):
            if parent._modules.get(name) is not replacement:
                raise RuntimeError(
                    f"fusedops.swap: undo: {path or 'the model'} no longer holds the "
                    f"{type(replacement).__name__} that swap put there"
                )
            original.training = replacement.training
            setattr(parent, name, original)
        self._changes = []

    def to_dict(self) -> dict:
        return {
            "swapped": self.swapped,
            "dry_run": self.dry_run,
            "rows": [dataclasses.asdict(r) for r in self.rows],
        }

    def __str__(self) -> str:
        head = ("path", "original", "replacement / reason")
        body = [(r.path or "(model)", r.original, _outcome(r)) for r in self.rows]
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(2)]
        lines = [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in [head, *body]]
        fused = sum(r.replacement is not None for r in self.rows)
        done = "dry run: nothing replaced" if self.dry_run else f"{self.swapped} replaced"
        lines.append(f"{fused} of {len(self.rows)} considered modules fusable ({done})")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"SwapReport(swapped={self.swapped}, rows={len(self.rows)}, dry_run={self.dry_run})"


def _outcome(row: SwapRow) -> str:
    if row.replacement is None:
        return f"left: {row.reason}"
    return row.replacement if row.reason is None else f"{row.replacement} ({row.reason})"


class WeightDtypeRMSNorm(fusedops.nn.RMSNorm):
    """fusedops.nn.RMSNorm returning what LLaMA-style modules return, weight * normalized(x):
    the dtype promoted from x's and the weight's (fp32 for bf16 x with an fp32 weight)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = super().forward(input)
        return out.to(torch.promote_types(out.dtype, self.weight.dtype))


class _Steps:
    """The forward of FusedChain / FusedSequential: the children run in the order the replaced
    forward called them, a step at a time. A step is (kind, child names, approximate):
      "mlp":    fc1, act, [Dropout / Identity ...], fc2 as one fusedops.fused_mlp (run unfused
                while one of the dropouts between is active: training mode and p > 0)
      "gelu":   fc, act as bias_gelu(x @ W^T, b)
      "module": one child as it is
    Children named in `transposed` store their weight [in, out] (Conv1D): passed as weight.t().
    """

    def __init__(self, children: dict, steps: tuple, transposed: frozenset, training: bool):
        super().__init__()
        for name, child in children.items():
            self.add_module(name, child)
        self._steps = steps
        self._transposed = transposed
        self.training = training

    def _weight(self, name: str) -> torch.Tensor:
        weight = self._modules[name].weight
        return weight.t() if name in self._transposed else weight

    def forward(self, *args, **kwargs) -> torch.Tensor:
        (x,) = (*args, *kwargs.values())  # the replaced forward took one tensor
        for kind, names, approximate in self._steps:
            if kind == "mlp" and not any(_active_dropout(self._modules[n]) for n in names[2:-1]):
                b1, b2 = self._modules[names[0]].bias, self._modules[names[-1]].bias
                w1, w2 = self._weight(names[0]), self._weight(names[-1])
                x = F.fused_mlp(x, w1, b1, w2, b2, approximate)
            elif kind == "gelu":
                pre = torch.nn.functional.linear(x, self._weight(names[0]))
                # Under autocast pre has the autocast dtype, as the Linear's output would.
                x = F.bias_gelu(pre, self._modules[names[0]].bias.to(pre.dtype), approximate)
            else:
                for name in names:
                    x = self._modules[name](x)
        return x

    def extra_repr(self) -> str:
        fused = [
            f"{'fused_mlp' if kind == 'mlp' else 'bias_gelu'}({', '.join(names)}, "
            f"approximate={approximate!r})"
            for kind, names, approximate in self._steps
            if kind != "module"
        ]
        return "; ".join(fused)


class FusedChain(_Steps, torch.nn.Module):
    """Replaces a module whose forward chains its children (Hugging Face's GPT2MLP, BERT's and
    ViT's intermediate, timm's Mlp): the same children under the same names, fused where a
    Linear -> GELU [-> Linear] run allows."""


class FusedSequential(_Steps, torch.nn.Sequential):
    """Replaces an nn.Sequential (indexing and iteration as before), fused like FusedChain."""


def _active_dropout(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Dropout) and module.training and module.p > 0


# ------------------------------------------------------------------------------------------------
# What fusedops can run: device and dtype
# ------------------------------------------------------------------------------------------------


def _unsupported(op: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why fusedops can't run `op` on device with dtype, or None. The op itself is asked (a tiny
    call, once per op, device and dtype), so this is the kernels' own rule."""
    if (
        device.type.upper() not in fusedops.build_info()["backends"]
    ):  # dispatch keys: CPU, CUDA, MPS
        return f"this fusedops build has no {device.type} kernels"
    return _probe(op, device, dtype)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    """fp32 CPU values for probes, from a private generator: swap leaves the caller's random
    stream where it was."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@functools.cache
def _probe(op: str, device: torch.device, dtype: torch.dtype) -> str | None:
    x, w = _randn(2, 8).to(device, dtype), _randn(8).to(device, dtype)
    calls = {
        "softmax": lambda: F.softmax(x, -1),
        "layer_norm": lambda: F.layer_norm(x, (8,), w, w),
        "rms_norm": lambda: F.rms_norm(x, (8,), w),
        "bias_gelu": lambda: F.bias_gelu(x, w),
        "fused_mlp": lambda: F.fused_mlp(x, x.new_ones(8, 8), w, x.new_ones(8, 8), w),
    }
    try:
        with torch.no_grad():
            calls[op]()
    except (RuntimeError, TypeError, ValueError) as e:
        return f"{dtype} on {device.type}: " + str(e).splitlines()[0]
    return None


def _float_tensor(module: torch.nn.Module) -> torch.Tensor | None:
    for t in (*module.parameters(), *module.buffers()):
        if t.is_floating_point():
            return t
    return None


# ------------------------------------------------------------------------------------------------
# Recognising modules
# ------------------------------------------------------------------------------------------------


def _is(module: torch.nn.Module, cls: type) -> bool:
    """module is a cls computing cls's forward (a subclass that overrides it is something else)."""
    return isinstance(module, cls) and type(module).forward is cls.forward


def _conv1d_class() -> type | None:
    # Hugging Face's Conv1D, when transformers is loaded (a model holding one has loaded it).
    return getattr(sys.modules.get("transformers.pytorch_utils"), "Conv1D", None)


def _linear_layout(module: torch.nn.Module) -> str | None:
    """ "linear" (weight [out, in]), "conv1d" (weight [in, out]) or None."""
    if _is(module, torch.nn.Linear) and not torch.nn.parameter.is_lazy(module.weight):
        return "linear"
    conv1d = _conv1d_class()
    if conv1d is not None and type(module) is conv1d:
        return "conv1d"
    return None


def _features(module: torch.nn.Module, layout: str) -> tuple[int, int]:
    """(in, out) features of a Linear-like module."""
    rows, cols = module.weight.shape
    return (cols, rows) if layout == "linear" else (rows, cols)


def _stateless_leaf(module: torch.nn.Module) -> bool:
    return not module._modules and not module._parameters and not module._buffers


def _passthrough(module: torch.nn.Module) -> bool:
    """Runs between an MLP's GELU and its second Linear without changing values in eval mode."""
    return type(module) in (torch.nn.Dropout, torch.nn.Identity)


def _is_activation(module: torch.nn.Module) -> bool:
    """Could be the activation after a Linear: a stateless leaf that isn't a passthrough."""
    return _stateless_leaf(module) and not _passthrough(module)


# Where erf and tanh GELU differ by up to 4.7e-4; large values catch clipped variants.
_GELU_PROBE = torch.cat([torch.linspace(-12, 12, 2401), torch.tensor([-1e3, -50.0, 50.0, 1e3])])


def _gelu_approximate(module: torch.nn.Module) -> str | None:
    """ "none" / "tanh" when module computes torch's erf / tanh GELU, else None."""
    if _is(module, torch.nn.GELU):
        return module.approximate
    try:
        with torch.no_grad():
            y = module(_GELU_PROBE.clone())
    except Exception:  # noqa: BLE001  (any failure means: not a GELU we can vouch for)
        return None
    for approximate in ("none", "tanh"):
        if _close(y, torch.nn.functional.gelu(_GELU_PROBE, approximate=approximate)):
            return approximate
    return None


def _close(y, ref: torch.Tensor) -> bool:
    return (
        isinstance(y, torch.Tensor)
        and y.shape == ref.shape
        and bool(((y - ref).abs() <= 1e-5 * (1 + ref.abs())).all())
    )


def _computes(module: torch.nn.Module, reference, shape) -> bool:
    """module(x) == reference(module, x) for x of `shape`, checked on an fp32 CPU copy of module
    with random parameters (a weight of ones would hide a formula such as Gemma's
    (1 + weight) * x / rms)."""
    probe = copy.deepcopy(module).to("cpu", torch.float32)
    x = _randn(4, *shape) * 3
    try:
        with torch.no_grad():
            for seed, p in enumerate(probe.parameters(), start=1):
                p.copy_(_randn(*p.shape, seed=seed))
            return _close(probe(x), reference(probe, x))
    except Exception:  # noqa: BLE001  (a module that fails here is not one we can vouch for)
        return False


def _torch_layer_norm(m, x):
    return torch.nn.functional.layer_norm(x, m.normalized_shape, m.weight, m.bias, m.eps)


def _torch_rms_norm(m, x):
    return torch.nn.functional.rms_norm(x, m.normalized_shape, m.weight, m.eps)


def _rms_norm_like(module: torch.nn.Module) -> float | None:
    """eps of a module shaped like LLaMA's RMSNorm (a name with RMSNorm, one 1-D weight, a float
    variance_epsilon or eps), else None. Whether it computes weight * x / rms is checked apart."""
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    weight = module._parameters.get("weight")
    shaped = (
        "rmsnorm" in type(module).__name__.lower()
        and set(module._parameters) == {"weight"}
        and weight is not None
        and weight.dim() == 1
        and not module._modules
        and not module._buffers
        and isinstance(eps, float)
    )
    return eps if shaped else None


# ------------------------------------------------------------------------------------------------
# Plans: a replacement factory, or the reason there is none
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Plan:
    replacement: str | None  # its description for the report
    reason: str | None
    build: object = None  # () -> the replacement module, reading the children at build time


def _rebuilt(cls, original, params, **kwargs):
    """cls(**kwargs) holding the original's own Parameter objects (or None) under `params`."""
    new = cls(**kwargs, device="meta")
    for name in params:
        setattr(new, name, getattr(original, name))
    new.training = original.training
    return new


def _hooked(modules) -> str | None:
    """Why these (name, module) pairs can't be replaced or fused away: hooks, or a forward set on
    the instance (as accelerate's device-map hooks do), would no longer run."""
    for name, module in modules:
        if any(getattr(module, h, None) for h in _HOOKS):
            return f"{name or 'it'} has hooks, which a replacement would not call"
        if "forward" in module.__dict__:
            return f"{name or 'it'} has its own forward set on the instance, which would not run"
    return None


def _plan_leaf(module, opts, where) -> _Plan | None:
    """Softmax / LogSoftmax / LayerNorm / RMSNorm (torch's and LLaMA-style), else None."""
    ref = _float_tensor(module)
    device, dtype = (ref.device, ref.dtype) if ref is not None else where
    if opts["softmax"] and (_is(module, torch.nn.Softmax) or _is(module, torch.nn.LogSoftmax)):
        cls = fusedops.nn.Softmax if _is(module, torch.nn.Softmax) else fusedops.nn.LogSoftmax
        op = "softmax"

        def build():
            new = cls(dim=module.dim)
            new.training = module.training
            return new

    elif opts["norms"] and isinstance(module, torch.nn.LayerNorm):
        # A subclass (timm's LayerNorm) qualifies when it computes what torch's does.
        if not _is(module, torch.nn.LayerNorm) and not _computes(
            module, _torch_layer_norm, module.normalized_shape
        ):
            return _Plan(None, "its forward is not torch's layer_norm (checked numerically)")
        cls, op = fusedops.nn.LayerNorm, "layer_norm"

        def build():
            kwargs = {"eps": module.eps, "elementwise_affine": module.elementwise_affine}
            kwargs["bias"] = module.bias is not None
            return _rebuilt(
                cls, module, ("weight", "bias"), normalized_shape=module.normalized_shape, **kwargs
            )

    elif opts["norms"] and isinstance(module, torch.nn.RMSNorm):
        if not _is(module, torch.nn.RMSNorm) and not _computes(
            module, _torch_rms_norm, module.normalized_shape
        ):
            return _Plan(None, "its forward is not torch's rms_norm (checked numerically)")
        cls, op = fusedops.nn.RMSNorm, "rms_norm"

        def build():
            kwargs = {"eps": module.eps, "elementwise_affine": module.elementwise_affine}
            return _rebuilt(
                cls, module, ("weight",), normalized_shape=module.normalized_shape, **kwargs
            )

    elif opts["norms"] and (eps := _rms_norm_like(module)) is not None:
        shape = tuple(module.weight.shape)

        def reference(m, x):
            return torch.nn.functional.rms_norm(x, shape, m.weight, eps)

        if not _computes(module, reference, shape):
            return _Plan(
                None, "it computes something other than weight * x / rms (checked numerically)"
            )
        cls, op = WeightDtypeRMSNorm, "rms_norm"

        def build():
            return _rebuilt(cls, module, ("weight",), normalized_shape=shape, eps=eps)

    else:
        return None
    name = (
        f"fusedops.swap.{cls.__name__}"
        if cls is WeightDtypeRMSNorm
        else f"fusedops.nn.{cls.__name__}"
    )
    reason = _unsupported(op, device, dtype)
    return _Plan(None, reason) if reason else _Plan(name, None, build)


class _ChildrenAsLeaves(torch.fx.Tracer):
    """Traces one module's own forward: every submodule it calls is a leaf (call_module)."""

    def is_leaf_module(self, module: torch.nn.Module, qualname: str) -> bool:
        return True


def _chain(module: torch.nn.Module) -> tuple[list[str] | None, str | None]:
    """(names of the children in the order module's forward calls them, each once on the
    previous one's output, None), or (None, why its forward is not such a chain)."""
    if type(module) is torch.nn.Sequential:
        return list(module._modules), None
    try:
        graph = _ChildrenAsLeaves().trace(module)
    except Exception as e:  # noqa: BLE001  (any failure means: we can't see its dataflow)
        return None, f"its forward could not be traced by torch.fx ({type(e).__name__})"
    names, prev = [], None
    for node in graph.nodes:
        if node.op == "placeholder" and prev is None:
            prev = node
        elif node.op == "output" and node.args == (prev,):
            return names, None
        elif (
            node.op == "call_module"
            and node.target in module._modules
            and node.target not in names
            and node.args == (prev,)
            and not node.kwargs
            and len(prev.users) == 1
        ):
            names.append(node.target)
            prev = node
        elif node.op == "call_module" and len(prev.users) > 1:
            return None, f"its forward is not a plain chain of its children ({prev} feeds several)"
        else:
            return None, f"its forward is not a plain chain of its children ({node.op} {node})"
    return None, "its forward returns nothing"


def _mlp_reason(children, names, fc1_layout, fc2_layout) -> str | None:
    """Why children names[0] (fc1) .. names[-1] (fc2) can't run as one fused_mlp, or None."""
    fc1, fc2 = children[names[0]], children[names[-1]]
    active = [n for n in names[2:-1] if _active_dropout(children[n])]
    if active:
        p = children[active[0]].p
        return f"dropout {active[0]} (p={p}) between {names[0]} and {names[-1]} is in training mode"
    hidden, fc2_in = _features(fc1, fc1_layout)[1], _features(fc2, fc2_layout)[0]
    if hidden != fc2_in:
        return f"{names[0]} makes {hidden} features but {names[-1]} takes {fc2_in}"
    w1, w2 = fc1.weight, fc2.weight
    if (w1.device, w1.dtype) != (w2.device, w2.dtype):
        return (
            f"{names[0]} is {w1.dtype} on {w1.device} but {names[-1]} is {w2.dtype} on {w2.device}"
        )
    biases = [b for b in (fc1.bias, fc2.bias) if b is not None]
    if any(b.dtype != w1.dtype for b in biases):
        return f"a bias of {names[0]} / {names[-1]} is not {w1.dtype} like the weights"
    return _hooked([(n, children[n]) for n in names]) or _unsupported(
        "fused_mlp", w1.device, w1.dtype
    )


def _gelu_reason(children, fc_name, act_name) -> str | None:
    """Why children fc_name -> act_name can't run as linear + bias_gelu, or None."""
    fc = children[fc_name]
    if fc.bias is None:
        return f"{fc_name} has no bias: nothing to fuse into the GELU"
    if fc.bias.dtype != fc.weight.dtype:
        return f"{fc_name}'s bias is {fc.bias.dtype} but its weight is {fc.weight.dtype}"
    hooked = _hooked([(fc_name, fc), (act_name, children[act_name])])
    return hooked or _unsupported("bias_gelu", fc.weight.device, fc.weight.dtype)


def _step_at(children, names, i, opts) -> tuple[tuple, str | None, int]:
    """(the step starting at names[i], a note on what was left there or None, the next i)."""
    one = ("module", (names[i],), None)
    layout = _linear_layout(children[names[i]])
    if layout is None or i + 1 == len(names) or not _is_activation(children[names[i + 1]]):
        return one, None, i + 1
    fc, act = names[i], names[i + 1]
    approximate = _gelu_approximate(children[act])
    if approximate is None:
        return (
            one,
            f"{act} ({type(children[act]).__name__}) is not GELU (checked numerically)",
            i + 1,
        )
    j = i + 2
    while j < len(names) and _passthrough(children[names[j]]):
        j += 1
    mlp_note = None
    if opts["mlp"] and j < len(names) and (fc2_layout := _linear_layout(children[names[j]])):
        mlp_note = _mlp_reason(children, names[i : j + 1], layout, fc2_layout)
        if mlp_note is None:
            return ("mlp", tuple(names[i : j + 1]), approximate), None, j + 1
        mlp_note = f"not fused as an MLP: {mlp_note}"
    if not opts["gelu"]:
        note = mlp_note or f"{fc} -> {act} has no Linear after it to fuse as an MLP (gelu=False)"
        return one, note, i + 1
    gelu_note = _gelu_reason(children, fc, act)
    if gelu_note is None:
        return ("gelu", (fc, act), approximate), mlp_note, i + 2
    return (
        one,
        "; ".join(n for n in (mlp_note, f"{fc} -> {act} not fused: {gelu_note}") if n),
        i + 1,
    )


def _plan_chain(module: torch.nn.Module, opts) -> _Plan | None:
    """A FusedChain / FusedSequential for a module holding Linear and activation children, or
    None when it holds no such pair (or has no forward: ModuleList, ModuleDict)."""
    children = {n: c for n, c in module._modules.items() if c is not None}
    if (
        type(module).forward is torch.nn.Module.forward
        or not any(map(_linear_layout, children.values()))
        or not any(map(_is_activation, children.values()))
    ):
        return None
    if module._parameters or module._buffers:
        return _Plan(None, "it has parameters or buffers of its own, not in its children")
    names, why = _chain(module)
    if names is None:
        return _Plan(None, why)
    steps, notes, i = [], [], 0
    while i < len(names):
        step, note, i = _step_at(children, names, i, opts)
        steps.append(step)
        notes.append(note)
    notes = "; ".join(n for n in notes if n) or None
    fused = [s for s in steps if s[0] != "module"]
    if not fused:
        return _Plan(None, notes) if notes else None
    cls = FusedSequential if type(module) is torch.nn.Sequential else FusedChain
    summary = "; ".join(
        f"{'fused_mlp' if kind == 'mlp' else 'bias_gelu'}({', '.join(n)}; {a})"
        for kind, n, a in fused
    )

    def build():
        # The children as they are now: those swapped before their parent are in place.
        current = dict(module._modules)
        transposed = frozenset(n for n, c in current.items() if _linear_layout(c) == "conv1d")
        return cls(current, tuple(steps), transposed, module.training)

    return _Plan(f"fusedops.swap.{cls.__name__}: {summary}", notes, build)


# The widest hidden layers swap gives FullyFusedMLP, by activation: where it was ahead of eager in
# every measured cell (H100, bench/MEASUREMENTS.md). GELUs (erf, tanh) up to 128: at 2^18 and
# 2^21 rows, inference 1.97-2.74x and training 1.55-1.88x eager (training since 1.56-2.64x at 2^21
# rows).
# ReLU up to 64: not measured wider since the kernels' last changes (at 128, an older build's
# GELU training step was 0.90x eager).
_FULLY_FUSED_MAX_HIDDEN = {"gelu": 128, "gelu_tanh": 128}
_FULLY_FUSED_MAX_HIDDEN_OTHERS = 64


def _plan_fully_fused(module: torch.nn.Module) -> _Plan | None:
    """A FullyFusedMLP for an nn.Sequential of Linear, act, Linear, act, ..., Linear with two or
    more hidden layers that its CUDA kernels run fused, or None (the chain rules apply then)."""
    if type(module) is not torch.nn.Sequential:
        return None
    try:
        probe = fusedops.nn.FullyFusedMLP.from_sequential(module)
    except TypeError:
        return None
    linears = probe.linears()
    w = linears[0].weight
    n_in, hidden, n_out = linears[0].in_features, linears[0].out_features, linears[-1].out_features
    if (
        len(linears) < 3  # one hidden layer: fused_mlp's
        or w.device.type != "cuda"
        or w.dtype not in (torch.float16, torch.bfloat16)
        or torch.cuda.get_device_capability(w.device)[0] < 8
        or any((m.weight.device, m.weight.dtype) != (w.device, w.dtype) for m in linears)
        or any(m.bias is not None and m.bias.dtype != w.dtype for m in linears)
        or hidden % 16
        or hidden > _FULLY_FUSED_MAX_HIDDEN.get(probe.activation, _FULLY_FUSED_MAX_HIDDEN_OTHERS)
        or max(n_in, n_out) > 128
        or _hooked(list(module.named_children()))
    ):
        return None

    def build():
        new = fusedops.nn.FullyFusedMLP.from_sequential(module)
        new.training = module.training
        return new

    summary = f"{len(linears) - 1} hidden layers of {hidden}, {probe.activation}"
    return _Plan(f"fusedops.nn.FullyFusedMLP: {summary}", None, build)


def _parents(model: torch.nn.Module) -> dict[int, list[tuple[torch.nn.Module, str]]]:
    """id(module) -> every (parent, name) holding it (a shared module is replaced everywhere)."""
    out: dict[int, list] = {}
    for parent in model.modules():
        for name, child in parent._modules.items():
            if child is not None:
                out.setdefault(id(child), []).append((parent, name))
    return out


def _fused_types() -> tuple[type, ...]:
    return (*(getattr(fusedops.nn, n) for n in fusedops.nn.__all__), _Steps)


def swap(
    model: torch.nn.Module,
    *,
    softmax: bool = True,
    norms: bool = True,
    mlp: bool = True,
    gelu: bool = True,
    dry_run: bool = False,
) -> SwapReport:
    """Replaces, in place and per instance, the modules of `model` that fusedops computes fused.

    softmax: nn.Softmax / LogSoftmax. norms: nn.LayerNorm / RMSNorm and LLaMA-style RMSNorm
    modules. mlp: Linear -> GELU [-> Dropout] -> Linear chains (fused_mlp), and on CUDA (sm_80+,
    fp16/bf16) nn.Sequential MLPs of two or more hidden layers, up to 128 wide with GELU or 64
    with ReLU (FullyFusedMLP). gelu: Linear -> GELU
    (linear + bias_gelu) where no MLP is fused. dry_run: only report.

    Replacements share the originals' Parameter objects and children (optimizers keep working;
    state_dict keys and shapes unchanged) and keep training mode, device and dtype. Modules
    already fused are left, so a second swap changes nothing. Returns a SwapReport: one row per
    considered module path (what replaced it, or why it was left) and undo().
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"fusedops.swap: model must be a torch.nn.Module, got {type(model).__name__}"
        )
    opts = {"softmax": softmax, "norms": norms, "mlp": mlp, "gelu": gelu}
    ref = _float_tensor(model)
    # Where modules without tensors of their own (Softmax) will run: the model's device and dtype.
    where = (
        (ref.device, ref.dtype)
        if ref is not None
        else (torch.device("cpu"), torch.get_default_dtype())
    )
    parents = _parents(model)
    fused_types = _fused_types()
    rows, plans = [], []
    for path, module in model.named_modules():
        original = type(module).__name__
        if isinstance(module, fused_types):
            rows.append(SwapRow(path, original, None, "already a fusedops module"))
            continue
        plan = _plan_leaf(module, opts, where)
        if plan is None and mlp:
            plan = _plan_fully_fused(module)
        if plan is None and (mlp or gelu):
            plan = _plan_chain(module, opts)
        if plan is None:
            continue
        if plan.build is not None:
            blocked = _hooked([("", module)]) or (
                None
                if id(module) in parents
                else "it is the model itself: swap replaces modules inside it"
            )
            if blocked:
                plan = _Plan(None, blocked)
        rows.append(SwapRow(path, original, plan.replacement, plan.reason))
        if plan.build is not None:
            plans.append((path, module, plan.build))
    changes = []
    if not dry_run:
        # Children before their parents, so a parent's replacement holds the swapped children.
        for path, module, build in reversed(plans):
            new = build()
            for parent, name in parents[id(module)]:
                setattr(parent, name, new)
                changes.append((parent, name, path, module, new))
    return SwapReport(rows, changes, dry_run)
