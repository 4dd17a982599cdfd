"""The main job: profile a model, predict the gain of fused kernels, swap, verify, re-profile.

    python -m fusedops.demo [--model predictor|gpt2|bert|vit] [--device cuda|mps|cpu]
        [--dtype bf16|fp16|fp32] [--quick] [--out DIR] [--cache DIR] [--no-compile]

1. The model: the reference predictor (fusedops.tools.predictor) trained on scikit-learn's
   digits, its checkpoint cached under --cache; or a Hugging Face GPT-2 / BERT / ViT built from
   its config with random weights.
2. torch.profiler on inference and on a training step (forward + backward): top ops by self
   time, launches, peak memory, Chrome traces.
3. For every module fusedops.swap would replace (grouped by kind and input shape): its share f of
   the inference step (from the profile), the speedup s of its fused replacement timed now on
   this device at the model's shapes, the Amdahl prediction and ceiling.
4. fusedops.swap; the outputs against the original's and an fp64 reference; accuracy.
5. Re-profile; before/after latency, launches, peak memory; predicted vs measured; the same
   latencies with torch.compile.
6. An output folder: report.md, PNG plots, the traces and results.json (every number).
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import datetime
import functools
import math
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

import fusedops
from fusedops.tools import predictor, report
from fusedops.tools import profile as prof
from fusedops.tools.bench import DTYPES, L2_ROTATE, Timed, _cache_bytes, copy_gbps, measure

MODELS = ("predictor", "gpt2", "bert", "vit")
# Approximate arithmetic per output element of each primitive beside its matrix products, for the
# roofline's x axis; matrix products count 2 flops per multiply-add. The MLP's GELU (on the
# hidden activations) is left out: its GEMMs are ~100x more work.
ELEMENTWISE_FLOPS = {
    "softmax": 5,
    "log_softmax": 5,
    "layer_norm": 8,
    "rms_norm": 6,
    "gelu": 10,
    "mlp": 0,
}


def progress(iterable: Iterable, desc: str) -> Iterable:
    """The progress bar of every long step (tqdm)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=f"  {desc}", leave=False, dynamic_ncols=True)


# ---------------------------------------------------------------------------------------------
# Workloads


@dataclasses.dataclass
class Workload:
    """A model, one batch for it and what to do with its output.

    inputs: the model's keyword arguments; targets: class indices for the loss, one per logit row;
    accuracy: test-set accuracy and predictions of a model (the predictor only).
    """

    model: torch.nn.Module
    inputs: dict
    targets: torch.Tensor
    info: dict
    accuracy: Callable[[torch.nn.Module], tuple[float, torch.Tensor]] | None = None
    train: dict = dataclasses.field(default_factory=dict)

    def forward(self, model: torch.nn.Module | None = None, inputs=None) -> torch.Tensor:
        model = self.model if model is None else model
        out = model(**(self.inputs if inputs is None else inputs))
        return out if isinstance(out, torch.Tensor) else out.logits

    def infer_step(self, model: torch.nn.Module | None = None) -> torch.Tensor:
        with torch.no_grad():
            return self.forward(model)

    def train_step(self, model: torch.nn.Module | None = None) -> None:
        """Forward, cross-entropy, backward (no optimizer step: the weights stay as they are)."""
        model = self.model if model is None else model
        model.zero_grad(set_to_none=True)
        logits = self.forward(model)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), self.targets.reshape(-1)
        )
        loss.backward()


def _predictor(device, dtype, quick: bool, cache: Path) -> Workload:
    cfg = predictor.QUICK if quick else predictor.FULL
    t0 = time.perf_counter()
    model, trained_acc, path, cached = predictor.load_or_train(cfg, device, cache, progress)
    seconds = time.perf_counter() - t0
    model = model.to(dtype)
    _, _, xte, yte = (t.to(device) for t in predictor.digits(cfg.image))
    xte = xte.to(dtype)

    def accuracy(m: torch.nn.Module):
        return predictor.accuracy(m, xte, yte)

    g = torch.Generator().manual_seed(1)
    # the timed batch, from the test set
    idx = torch.randint(len(yte), (cfg.batch,), generator=g).to(device)
    train = {
        "checkpoint": str(path),
        "cached": cached,
        "seconds": seconds,
        "accuracy_fp32": trained_acc,
        "test_images": len(yte),
    }
    info = {"config": dataclasses.asdict(cfg) | {"tokens": cfg.tokens}}
    return Workload(model, {"images": xte[idx]}, yte[idx], info, accuracy, train)


def _hf(name: str, device, dtype, quick: bool) -> Workload:
    try:
        import transformers
    except ImportError as e:
        raise SystemExit(
            f"fusedops.demo: --model {name} needs Hugging Face transformers "
            "(pip install transformers); --model predictor needs nothing more"
        ) from e
    small = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    g = torch.Generator().manual_seed(0)
    if name == "gpt2":
        tiny = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1024}
        cfg = transformers.GPT2Config(
            **(tiny if quick else {}), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
        )
        model_cls = transformers.GPT2LMHeadModel
        b, t = (2, 64) if quick else (8, 1024)
        ids = torch.randint(cfg.vocab_size, (b, t), generator=g)
        inputs, targets = {"input_ids": ids}, torch.randint(cfg.vocab_size, (b, t), generator=g)
    elif name == "bert":
        tiny = small | {"intermediate_size": 256, "vocab_size": 1024}
        cfg = transformers.BertConfig(**(tiny if quick else {}), **no_dropout, num_labels=2)
        model_cls = transformers.BertForSequenceClassification
        b, t = (2, 64) if quick else (8, 512)
        ids = torch.randint(cfg.vocab_size, (b, t), generator=g)
        inputs, targets = {"input_ids": ids}, torch.randint(2, (b,), generator=g)
    else:
        tiny = small | {"intermediate_size": 256, "image_size": 32, "patch_size": 8}
        cfg = transformers.ViTConfig(**(tiny if quick else {}), **no_dropout, num_labels=10)
        model_cls = transformers.ViTForImageClassification
        b = 8 if quick else 64
        pixels = torch.randn(b, 3, cfg.image_size, cfg.image_size, generator=g)
        inputs, targets = {"pixel_values": pixels.to(dtype)}, torch.randint(10, (b,), generator=g)
    torch.manual_seed(0)
    model = model_cls(cfg).to(device=device, dtype=dtype).eval()
    inputs = {k: v.to(device) for k, v in inputs.items()}
    info = {"config": cfg.to_diff_dict(), "inputs": {k: list(v.shape) for k, v in inputs.items()}}
    return Workload(model, inputs, targets.to(device), info)


def workload(name: str, device, dtype, quick: bool, cache: Path) -> Workload:
    if name == "predictor":
        return _predictor(device, dtype, quick, cache)
    return _hf(name, device, dtype, quick)


# ---------------------------------------------------------------------------------------------
# What swap covers, and its speedup at the model's shapes


def kind_of(replacement: str) -> str:
    """The primitive a swap replacement computes, from the report's replacement text."""
    for key, kind in (
        ("fused_mlp", "mlp"),
        ("bias_gelu", "gelu"),
        ("LayerNorm", "layer_norm"),
        ("RMSNorm", "rms_norm"),
        ("LogSoftmax", "log_softmax"),
        ("Softmax", "softmax"),
    ):
        if key in replacement:
            return kind
    raise ValueError(f"kind_of: unknown replacement {replacement!r}")


@dataclasses.dataclass
class Group:
    """Modules swap replaces by the same kind of fused module, seen with the same input."""

    label: str  # "<kind> <shape> <dtype>", the profile label
    kind: str
    replacement: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    paths: list[str]


def groups(work: Workload) -> list[Group]:
    """The modules fusedops.swap would replace (a dry run), grouped by kind and input shape (one
    forward with hooks records the shapes)."""
    rows = [r for r in fusedops.swap(work.model, dry_run=True).rows if r.replacement]
    seen: dict[str, tuple] = {}

    def record(path):
        def hook(module, args, kwargs):
            x = (*args, *kwargs.values())[0]
            seen.setdefault(path, (tuple(x.shape), x.dtype))

        return hook

    handles = [
        work.model.get_submodule(r.path).register_forward_pre_hook(record(r.path), with_kwargs=True)
        for r in rows
    ]
    try:
        work.infer_step()
    finally:
        for h in handles:
            h.remove()
    out: dict[str, Group] = {}
    for r in rows:
        if r.path not in seen:  # never called in this forward
            continue
        shape, dtype = seen[r.path]
        kind = kind_of(r.replacement)
        label = f"{kind} {'x'.join(map(str, shape))} {str(dtype).removeprefix('torch.')}"
        g = out.setdefault(label, Group(label, kind, r.replacement, shape, dtype, []))
        g.paths.append(r.path)
    return list(out.values())


def module_times(work: Workload, g: Group, device) -> dict:
    """Seconds per call of one of g's modules, as it is and swapped, on fresh inputs of its shape
    (rotated through several L2 sizes, as the benchmarks do); bytes and flops of one call for the
    roofline."""
    holder = torch.nn.Sequential(copy.deepcopy(work.model.get_submodule(g.paths[0])))
    x = torch.randn(g.shape, device=device, dtype=g.dtype)
    sets = [(x,)] + [
        (torch.randn_like(x),)
        for _ in range(math.ceil(L2_ROTATE * _cache_bytes(device) / x.nbytes) - 1)
    ]
    with torch.no_grad():
        y = holder(x)
    torch_s = measure(Timed(holder, sets, grad=False, nbytes=0), device)
    fusedops.swap(holder)
    fused_s = measure(Timed(holder, sets, grad=False, nbytes=0), device)
    params = list(holder.parameters())
    gemm = 2 * (x.numel() // x.shape[-1]) * sum(p.numel() for p in params if p.dim() == 2)
    return {
        "torch_s": torch_s,
        "fused_s": fused_s,
        "s": torch_s / fused_s,
        "bytes": (x.numel() + y.numel()) * x.element_size()
        + sum(p.numel() * p.element_size() for p in params),
        "flops": gemm + ELEMENTWISE_FLOPS[g.kind] * y.numel(),
    }


def matmul_flops(device, dtype) -> float:
    """FLOP/s of one square matmul (the roofline's compute roof)."""
    n = 4096 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / measure(Timed(torch.mm, [(a, a)], grad=False, nbytes=0), device)


# ---------------------------------------------------------------------------------------------
# Checks


def _err(t: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest error relative to the largest reference value."""
    return ((t.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def compare(before: torch.Tensor, after: torch.Tensor, ref: torch.Tensor | None) -> dict:
    """Swapped vs original outputs, and both against the fp64 reference where there is one:
    the tolerance rule err(fused) <= 2 err(torch) + eps(dtype)."""
    diff = (after.double() - before.double()).abs()
    out = {
        "max_abs": diff.max().item(),
        "max_rel": _err(after, before.double()),
    }
    if ref is not None:
        eps = torch.finfo(before.dtype).eps
        out["err_torch"], out["err_fused"] = _err(before, ref), _err(after, ref)
        out["within_rule"] = out["err_fused"] <= 2 * out["err_torch"] + eps
    return out


# ---------------------------------------------------------------------------------------------
# The run


def latencies(work: Workload, swapped, device, with_compile: bool, rounds: int = 3) -> dict:
    """{variant: {phase: median seconds per step}} for eager_before/after (inference, training)
    and compile_before/after (inference, torch.compile's default mode). The variants are timed in
    interleaved rounds, so drifting clocks or load hit the original and the swapped model alike."""
    calls = {}
    for when, model in (("before", work.model), ("after", swapped)):
        calls[f"eager_{when}", "inference"] = functools.partial(work.infer_step, model), False
        calls[f"eager_{when}", "training"] = functools.partial(work.train_step, model), True
        if with_compile:
            compiled = torch.compile(model)
            calls[f"compile_{when}", "inference"] = (
                functools.partial(work.infer_step, compiled),
                False,
            )
    times = collections.defaultdict(list)
    for _ in progress(range(rounds), "time before/after"):
        for key, (call, grad) in calls.items():
            times[key].append(measure(Timed(call, [()], grad=grad, nbytes=0), device))
    out: dict = {}
    for (variant, phase), ts in times.items():
        out.setdefault(variant, {})[phase] = statistics.median(ts)
    return out


def _device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return f"Apple {platform.machine()} (MPS)"
    return f"CPU {platform.machine()}, {torch.get_num_threads()} threads"


def _profiles(work: Workload, model, found: list[Group], device, out: Path, when: str) -> dict:
    """Inference (each group's modules labelled) and training profiles of model, traces under
    out."""
    labels = [(g.label, model.get_submodule(p)) for g in found for p in g.paths]
    return {
        phase: prof.profile(
            functools.partial(step, model),
            device,
            out / f"trace-{when}-{phase}.json",
            labels=labels if phase == "inference" else (),
            progress=progress,
            desc=f"profile {phase}",
        )
        for phase, step in (("inference", work.infer_step), ("training", work.train_step))
    }


def _fp64_reference(work: Workload) -> torch.Tensor | None:
    """The original model's output in fp64 from the same (upcast) inputs; None on MPS (no fp64)."""
    if next(work.model.parameters()).device.type == "mps":
        return None
    inputs = {k: v.double() if v.is_floating_point() else v for k, v in work.inputs.items()}
    with torch.no_grad():
        return work.forward(copy.deepcopy(work.model).double(), inputs)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def run(
    model: str,
    device: torch.device,
    dtype: torch.dtype,
    quick: bool,
    out: Path,
    cache: Path,
    with_compile: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    """Steps 1-5; returns every number (results.json). Traces are written under out."""
    res: dict = {
        "model": model,
        "device": _device_name(device),
        "device_type": device.type,
        "dtype": str(dtype).removeprefix("torch."),
        "quick": quick,
        "torch": torch.__version__,
        "fusedops": fusedops.build_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    t0 = time.perf_counter()

    def stage(i: int, text: str) -> None:
        log(f"[{i}/6] {text} (at {time.perf_counter() - t0:.0f} s)")

    stage(1, f"{model} on {res['device']}, {res['dtype']}")
    work = workload(model, device, dtype, quick, cache)
    res["workload"], res["train"] = work.info, work.train
    if work.accuracy:
        how = "cached" if work.train["cached"] else f"trained in {work.train['seconds']:.1f} s"
        log(f"  checkpoint {work.train['checkpoint']} ({how})")
        log(f"  test accuracy after training (fp32): {work.train['accuracy_fp32']:.3f}")

    stage(2, "profiling inference and a training step (forward + backward)")
    found = groups(work)
    before = _profiles(work, work.model, found, device, out, "before")
    for phase, p in before.items():
        log(_indent(f"{phase} (trace {p.trace}):\n{prof.table(p)}"))

    stage(3, "shares f, fused speedups s at the model's shapes, Amdahl")
    res["copy_gbps"] = copy_gbps(device, quick)
    res["matmul_flops"] = matmul_flops(device, dtype)
    inf = before["inference"]
    prims = []
    for g in progress(found, "time fused modules"):
        t = module_times(work, g, device)
        f = inf.labels.get(g.label, 0.0) / inf.step_us
        prims.append(
            {
                "label": g.label,
                "kind": g.kind,
                "replacement": g.replacement,
                "count": len(g.paths),
                "paths": g.paths,
                "f": f,
            }
            | t
        )
    predicted, ceiling = prof.amdahl((p["f"], p["s"]) for p in prims)
    res["primitives"], res["predicted"], res["ceiling"] = prims, predicted, ceiling
    log(_indent(report.primitives_table(res)))

    stage(4, "fusedops.swap (of a copy: the original stays for comparison) and checks")
    swapped = copy.deepcopy(work.model)
    swap_report = fusedops.swap(swapped)
    res["swap"] = swap_report.to_dict()
    log(_indent(str(swap_report)))
    check = compare(work.infer_step(), work.infer_step(swapped), _fp64_reference(work))
    if work.accuracy:
        (acc_before, pred_before), (acc_after, pred_after) = map(
            work.accuracy, (work.model, swapped)
        )
        check |= {
            "accuracy_before": acc_before,
            "accuracy_after": acc_after,
            "predictions_changed": int((pred_before != pred_after).sum()),
        }
    res["check"] = check
    log(_indent(report.check_text(check)))

    stage(5, "re-profiling; before/after latencies" + (", torch.compile" if with_compile else ""))
    after = _profiles(work, swapped, found, device, out, "after")
    res["latency_s"] = lat = latencies(work, swapped, device, with_compile)
    res["measured"] = lat["eager_before"]["inference"] / lat["eager_after"]["inference"]
    res["profile"] = {
        "before": {k: v.to_dict() for k, v in before.items()},
        "after": {k: v.to_dict() for k, v in after.items()},
    }
    log(_indent(report.summary_table(res)))
    return res


# ---------------------------------------------------------------------------------------------
# Command line


def add_workload_args(ap: argparse.ArgumentParser) -> None:
    """--model, --device, --dtype, --quick, --cache: shared with python -m fusedops.profile."""
    ap.add_argument(
        "--model",
        default="predictor",
        choices=MODELS,
        help="predictor (default): trained here on scikit-learn's digits; gpt2, bert, vit: "
        "Hugging Face configs with random weights (needs transformers)",
    )
    ap.add_argument("--device", choices=("cuda", "mps", "cpu"), help="default: the best present")
    ap.add_argument("--dtype", choices=tuple(DTYPES), help="default: bf16 on CUDA, fp32 elsewhere")
    ap.add_argument("--quick", action="store_true", help="a small model: seconds on a CPU")
    ap.add_argument(
        "--cache", default="fusedops-demo/cache", help="checkpoint cache (default: %(default)s)"
    )


def resolve_device(name: str | None, dtype: str | None) -> tuple[torch.device, torch.dtype]:
    """The device asked for (an error naming it when absent) or the best present, and the
    dtype: bf16 on CUDA, fp32 elsewhere unless asked."""
    present = {
        "cuda": torch.cuda.is_available(),
        "mps": hasattr(torch.backends, "mps") and torch.backends.mps.is_available(),
        "cpu": True,
    }
    if name is None:
        name = next(d for d, ok in present.items() if ok)
    elif not present[name]:
        raise SystemExit(f"fusedops.demo: --device {name}: no {name} device on this machine")
    device = torch.device(name)
    return device, DTYPES[dtype or ("bf16" if device.type == "cuda" else "fp32")]


def output_folder(out: str | None) -> Path:
    """--out, or a new fusedops-demo/run-<UTC time> under the working directory."""
    if out is None:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
        out = Path("fusedops-demo") / f"run-{stamp}"
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    return path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m fusedops.demo", description=__doc__.splitlines()[0]
    )
    add_workload_args(ap)
    ap.add_argument("--out", help="output folder (default: fusedops-demo/run-<UTC time>)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile reference")
    args = ap.parse_args(argv)
    device, dtype = resolve_device(args.device, args.dtype)
    out = output_folder(args.out)
    t0 = time.perf_counter()
    res = run(args.model, device, dtype, args.quick, out, Path(args.cache), not args.no_compile)
    res["seconds"] = time.perf_counter() - t0
    print("[6/6] writing the report", flush=True)
    for path in report.write(res, out):
        print(f"  wrote {path}", flush=True)
    print(f"done in {res['seconds']:.0f} s: {out / 'report.md'}", flush=True)
