"""Benchmark harness: fusedops beside torch eager, torch.compile and Liger-Kernel, in one process.

    python -m fusedops.bench [--ops softmax_fwd,softmax_bwd] [--dtypes bf16,fp32]
        [--shapes 4096x1024,...] [--quick] [--out bench/results] [--no-compile] [--no-plot]

CUDA: CUDA events around batches of back-to-back calls whose inputs rotate through >= 4x the L2
cache, so every call reads DRAM; time per call = batch time / batch size, median over batches.
That is throughput, and it shows host overhead where the host cannot keep the GPU fed. Each
kernel is reported as GB/s of minimal unique bytes and as % of a 2 GiB device-to-device copy
timed the same way. CPU: time.perf_counter, the same medians.

Providers: fusedops, torch eager, torch.compile and, on CUDA where `liger_kernel` imports,
Liger-Kernel's Triton kernels (layer_norm and rms_norm; ops it lacks get no liger entries).
The fused MLP is GEMM-bound, so % of copy says nothing about it: python -m fusedops.bench_mlp.

To add an op, register one Spec below. `run()` returns the results as data.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import itertools
import json
import math
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import fusedops

try:  # Liger-Kernel (Triton): one more provider for the norms where it is installed
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    LIGER_MISSING = None
except Exception as e:  # not installed, or triton failing to load: simply no liger provider
    LIGER_MISSING = f"{type(e).__name__}: {e}"

# The one list of benchmark shapes (rows x N). N spans every kernel path: warp-per-row through
# rows that do not fit on chip.
SHAPES = ((4096, 1024), (16384, 4096), (8192, 8192), (4096, 32768), (1024, 131072), (512, 262144))
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_DTYPES = ("bf16", "fp32")
PROVIDERS = ("fusedops", "eager", "compile", "liger")  # column order; see providers()
COPY_BYTES = 2 << 30  # the roof: one 2 GiB device-to-device copy
L2_ROTATE = 4  # rotated input sets span >= this many L2 caches, so each call reads DRAM


@dataclass(frozen=True)
class Spec:
    """One op: its inputs, the fusedops and torch implementations, and its minimal bytes.

    The forward pass is always timed; the backward pass when bwd_bytes is set (gradients of the
    inputs at grad_args). Byte formulas take (rows, N, element size) and count only tensors that
    must cross DRAM: parameters and per-row statistics are left out.
    """

    name: str
    inputs: Callable[[int, int, torch.dtype, torch.device], tuple[torch.Tensor, ...]]
    fused: Callable[..., torch.Tensor]
    eager: Callable[..., torch.Tensor]
    fwd_bytes: Callable[[int, int, int], int]
    bwd_bytes: Callable[[int, int, int], int] | None = None
    shapes: tuple[tuple[int, int], ...] = SHAPES
    grad_args: tuple[int, ...] = (0,)
    family: str = ""  # results file name: <device>-<family>.json; defaults to name
    liger: Callable[..., torch.Tensor] | None = None  # Liger-Kernel's version, where it has one


SPECS: dict[str, Spec] = {}


def register(spec: Spec) -> Spec:
    SPECS[spec.name] = spec
    return spec


def _matrix(rows: int, n: int, dtype: torch.dtype, device: torch.device):
    return (torch.randn(rows, n, dtype=dtype, device=device),)


for _name, _fused, _eager in (
    ("softmax", fusedops.softmax, torch.softmax),
    ("log_softmax", fusedops.log_softmax, torch.log_softmax),
):
    register(
        Spec(
            _name,
            _matrix,
            fused=lambda x, f=_fused: f(x, -1),
            eager=lambda x, f=_eager: f(x, -1),
            fwd_bytes=lambda r, n, e: 2 * r * n * e,  # read x, write y
            bwd_bytes=lambda r, n, e: 3 * r * n * e,  # read y and dy, write dx
            family="softmax",
        )
    )


def _norm_inputs(bias: bool, param_dtype: torch.dtype | None = None):
    """(x, weight[, bias]) with parameters in the input's dtype, or in param_dtype."""

    def inputs(rows: int, n: int, dtype: torch.dtype, device: torch.device):
        pdt = param_dtype or dtype
        x = torch.randn(rows, n, dtype=dtype, device=device)
        params = [torch.randn(n, dtype=pdt, device=device) for _ in range(2 if bias else 1)]
        return (x, *params)

    return inputs


def _norm_spec(name: str, fused, eager, bias: bool, **kw) -> Spec:
    return Spec(
        name,
        _norm_inputs(bias, kw.pop("param_dtype", None)),
        fused=fused,
        eager=eager,
        fwd_bytes=lambda r, n, e: 2 * r * n * e,  # read x, write y
        bwd_bytes=lambda r, n, e: 3 * r * n * e,  # read x and dy, write dx (+ dweight, dbias)
        grad_args=(0, 1, 2) if bias else (0, 1),
        **kw,
    )


def _layer_norm(f):
    return lambda x, w, b: f(x, x.shape[-1:], w, b)


def _rms_norm(f):
    return lambda x, w: f(x, x.shape[-1:], w)


def _liger_layer_norm(x, w, b):
    return LigerLayerNormFunction.apply(x, w, b, 1e-5)  # eps: F.layer_norm's default


def _liger_rms_norm(x, w):
    # eps: F.rms_norm's default for fp32/bf16/fp16 input; offset 0 and "llama" casting are
    # torch's math. in_place=True, LigerRMSNorm's default: dx goes over dy (otherwise into a
    # zero-filled new tensor, one more write). The harness reuses dy, so its values drift from
    # call to call; a bandwidth-bound kernel's time does not depend on them.
    return LigerRMSNormFunction.apply(x, w, torch.finfo(torch.float32).eps, 0.0, "llama", True)


_F = torch.nn.functional
register(
    _norm_spec(
        "layer_norm",
        _layer_norm(fusedops.layer_norm),
        _layer_norm(_F.layer_norm),
        True,
        liger=_liger_layer_norm,
    )
)
register(
    _norm_spec(
        "rms_norm",
        _rms_norm(fusedops.rms_norm),
        _rms_norm(_F.rms_norm),
        False,
        liger=_liger_rms_norm,
    )
)
# bf16/fp16 activations with fp32 parameters (mixed-precision training's usual layout).
register(
    _norm_spec(
        "layer_norm_fp32w",
        _layer_norm(fusedops.layer_norm),
        _layer_norm(_F.layer_norm),
        True,
        param_dtype=torch.float32,
        shapes=((16384, 4096),),
        family="layer_norm",
        liger=_liger_layer_norm,
    )
)


def _bias_gelu_inputs(rows: int, n: int, dtype: torch.dtype, device: torch.device):
    return torch.randn(rows, n, dtype=dtype, device=device), torch.randn(
        n, dtype=dtype, device=device
    )


for _approx in ("none", "tanh"):
    register(
        Spec(
            "bias_gelu" if _approx == "none" else "bias_gelu_tanh",
            _bias_gelu_inputs,
            fused=lambda x, b, a=_approx: fusedops.bias_gelu(x, b, a),
            eager=lambda x, b, a=_approx: torch.nn.functional.gelu(x + b, approximate=a),
            fwd_bytes=lambda r, n, e: 2 * r * n * e,  # read x, write y
            bwd_bytes=lambda r, n, e: 3 * r * n * e,  # read x and dy, write dx (dbias: a param)
            grad_args=(0, 1),
            family="bias_gelu",
        )
    )

DEFAULT_OPS = (
    "softmax_fwd",
    "softmax_bwd",
    "log_softmax_fwd",
    "layer_norm_fwd",
    "layer_norm_bwd",
    "rms_norm_fwd",
    "rms_norm_bwd",
    "layer_norm_fp32w_fwd",
    "layer_norm_fp32w_bwd",
    "bias_gelu_fwd",
    "bias_gelu_bwd",
)


def select(names) -> list[tuple[Spec, str]]:
    """(spec, "fwd"|"bwd") for names like "softmax_fwd", or "softmax" for both passes."""
    names = names.split(",") if isinstance(names, str) else names
    out = []
    for name in names:
        base, _, pass_ = name.rpartition("_") if name.endswith(("_fwd", "_bwd")) else (name, "", "")
        spec = SPECS.get(base)
        if spec is None or (pass_ == "bwd" and spec.bwd_bytes is None):
            raise ValueError(f"unknown op {name!r}; known: {', '.join(op_names())}")
        passes = [pass_] if pass_ else ["fwd"] + (["bwd"] if spec.bwd_bytes else [])
        out += [(spec, p) for p in passes if (spec, p) not in out]
    return out


def cells(ops=DEFAULT_OPS, dtypes=DEFAULT_DTYPES, shapes=None):
    """Every (spec, pass, dtype, (rows, N)) to time; shapes=None: each op's own list."""
    return [
        (spec, pass_, dt, shape)
        for spec, pass_ in select(ops)
        for dt in dtypes
        for shape in shapes or spec.shapes
    ]


def providers(spec: Spec, device: torch.device, with_compile: bool = True) -> list[str]:
    """The providers timed for spec on device, in PROVIDERS order: fusedops and eager always,
    compile unless turned off, liger on CUDA where Liger-Kernel imports and has the op."""
    offered = {
        "fusedops": True,
        "eager": True,
        "compile": with_compile,
        "liger": spec.liger is not None and device.type == "cuda" and LIGER_MISSING is None,
    }
    return [p for p in PROVIDERS if offered[p]]


def op_names() -> list[str]:
    return [
        f"{s.name}_{p}" for s in SPECS.values() for p in ("fwd", "bwd") if p == "fwd" or s.bwd_bytes
    ]


# ---------------------------------------------------------------------------------------------
# Timing


@dataclass
class Timed:
    """A call ready to time: call(*sets[i]) with i rotating; grad: autograd on while timed."""

    call: Callable
    sets: list[tuple]
    grad: bool
    nbytes: int


def _cache_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).L2_cache_size
    return 0  # CPU: no rotation; big shapes dwarf the caches anyway


def _grad(y, xs, dy):
    return torch.autograd.grad(y, xs, dy, retain_graph=True)


def min_bytes(spec: Spec, pass_: str, rows: int, n: int, dtype: torch.dtype) -> int:
    return (spec.fwd_bytes if pass_ == "fwd" else spec.bwd_bytes)(rows, n, dtype.itemsize)


def prepare(spec: Spec, pass_: str, provider: str, rows: int, n: int, dtype, device) -> Timed:
    """Build the timed call and its rotated inputs. torch.compile compiles on the first call."""
    nbytes = min_bytes(spec, pass_, rows, n, dtype)
    k = max(1, math.ceil(L2_ROTATE * _cache_bytes(device) / nbytes))
    if provider == "compile":
        # A fresh compile per cell: every shape/dtype recompiles (dynamic=False), and dynamo's
        # recompile limit would otherwise fall back to eager after a few cells.
        torch._dynamo.reset()
        fn = torch.compile(spec.eager, dynamic=False, fullgraph=True)
    else:
        fn = {"fusedops": spec.fused, "eager": spec.eager, "liger": spec.liger}[provider]
    sets = [spec.inputs(rows, n, dtype, device) for _ in range(k)]
    if pass_ == "fwd":
        return Timed(fn, sets, grad=False, nbytes=nbytes)
    # Backward only: y is built once per set (by fn, so a compiled y runs compiled backward),
    # and the timed call is autograd.grad alone.
    bwd_sets = []
    with torch.enable_grad():
        for args in sets:
            args = [a.requires_grad_() if i in spec.grad_args else a for i, a in enumerate(args)]
            y = fn(*args)
            bwd_sets.append((y, [args[i] for i in spec.grad_args], torch.randn_like(y)))
    return Timed(_grad, bwd_sets, grad=True, nbytes=nbytes)


def _plan(device: torch.device, quick: bool) -> tuple[int, int, float]:
    """(warm-up calls, batches timed, target seconds per batch; 0: one call per batch)."""
    if device.type == "cuda":
        return (2, 10, 1e-3) if quick else (2, 30, 2e-3)
    # CPU: the big shapes take a second per call here, so --quick times a handful of calls.
    return (1, 3, 0.0) if quick else (2, 7, 20e-3)


def _per_call(step, batch: int, reps: int, cuda: bool) -> float:
    """Median over `reps` batches of `batch` back-to-back step() calls, in seconds per call."""
    if cuda:
        events = [[torch.cuda.Event(enable_timing=True) for _ in range(2)] for _ in range(reps)]
        for start, end in events:
            start.record()
            for _ in range(batch):
                step()
            end.record()
        # One sync after all batches: they queue back to back, so the GPU idles between them
        # only when the host cannot keep up, and then that host cost is what gets measured.
        torch.cuda.synchronize()
        times = [start.elapsed_time(end) * 1e-3 for start, end in events]
    else:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(batch):
                step()
            times.append(time.perf_counter() - t0)
    return statistics.median(times) / batch


def measure(t: Timed, device: torch.device, quick: bool = False) -> float:
    """Median seconds per call of t, after a warm-up that compiles and touches every set."""
    warmup, reps, target = _plan(device, quick)
    cuda = device.type == "cuda"
    it = itertools.cycle(t.sets)  # one cycle throughout: no set is used twice in a row
    # Outputs stay alive for a whole rotation, so the allocator hands each call a different
    # output buffer: writes rotate through memory like the reads do.
    outputs = collections.deque(maxlen=len(t.sets))

    def step():
        outputs.append(t.call(*next(it)))

    # Forward runs under no_grad (inference); backward needs autograd on.
    with torch.set_grad_enabled(t.grad):
        for _ in range(max(warmup, len(t.sets))):
            step()
        batch = 1
        if target:  # enough calls per batch to fill `target`, from one timed call
            batch = min(1000, max(1, math.ceil(target / _per_call(step, 1, 1, cuda))))
        return _per_call(step, batch, reps, cuda)


def measure_device(t: Timed, quick: bool = False) -> float:
    """Median GPU seconds per forward call with the host out of the way: one CUDA graph holds a
    call per rotated input set and is replayed. This is what the kernel alone achieves; measure()
    is what a Python caller gets."""
    _, reps, _ = _plan(torch.device("cuda"), quick)
    with torch.no_grad():
        side = torch.cuda.Stream()  # warm up off the capture stream, as torch.cuda.graph asks
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for args in t.sets:
                t.call(*args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = [t.call(*args) for args in t.sets]  # noqa: F841  (kept alive: distinct)
    graph.replay()
    replays = max(1, math.ceil(200 / len(t.sets)))
    return _per_call(graph.replay, replays, reps, cuda=True) / len(t.sets)


def _spin_up(device: torch.device, seconds: float = 0.5) -> None:
    """GPU clocks idle low and ramp up under load: keep the GPU busy before timing anything."""
    a = torch.randn(4096, 4096, device=device)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def copy_gbps(device: torch.device, quick: bool = False) -> float:
    """The roof: GB/s of dst.copy_(src) on 2 GiB, counting bytes read plus bytes written."""
    if device.type == "cuda":
        _spin_up(device)  # the copy comes first in a run
    src = torch.ones(COPY_BYTES, dtype=torch.uint8, device=device)  # ones: pages really mapped
    dst = torch.empty_like(src)
    seconds = measure(Timed(dst.copy_, [(src,)], grad=False, nbytes=2 * COPY_BYTES), device, quick)
    return 2 * COPY_BYTES / seconds / 1e9


# ---------------------------------------------------------------------------------------------
# Running, reporting


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.machine()}, {torch.get_num_threads()} threads"


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA GeForce RTX 4090' -> 'rtx-4090'."""
    if name.startswith("CPU"):
        return "cpu"
    drop = re.compile(r"nvidia|geforce|tesla|\d+gb|hbm\d*e?")
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and not drop.fullmatch(w)]
    return "-".join(words) or "gpu"


def _error(e: Exception) -> str:
    lines = str(e).strip().splitlines() or [""]
    return f"{type(e).__name__}: {lines[0][:160]}"


def run(
    ops=DEFAULT_OPS,
    dtypes=DEFAULT_DTYPES,
    shapes=None,
    quick: bool = False,
    with_compile: bool = True,
    log: Callable[[str], None] | None = print,
) -> dict:
    """Time every (op, dtype, shape) cell for each provider; return the results as a dict.

    ops: names as in select(); shapes: [(rows, N), ...], None for each op's own list. Each cell
    holds median_us, gbps and pct_copy for each of providers() of its op (None where a provider
    failed, with the reason under errors).
    """
    log = log or (lambda s: None)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = _device_name(device)
    copy = copy_gbps(device, quick)
    log(f"{name}: 2 GiB copy {copy:.0f} GB/s (bytes read + written)")
    if device.type == "cuda" and LIGER_MISSING and any(s.liger for s, _ in select(ops)):
        log(f"note: no liger provider: {LIGER_MISSING}")
    todo = cells(ops, dtypes, shapes)
    done = []
    for i, (spec, pass_, dt, (rows, n)) in enumerate(todo, 1):
        nbytes = min_bytes(spec, pass_, rows, n, DTYPES[dt])
        cell = {"op": f"{spec.name}_{pass_}", "dtype": dt, "rows": rows, "n": n, "bytes": nbytes}
        cell.update(median_us={}, gbps={}, pct_copy={}, errors={})
        # Forward on CUDA also gets the kernel-only time (CUDA graph replay): at small shapes
        # the host-inclusive time is Python and launch overhead, not the kernel.
        graphed = device.type == "cuda" and pass_ == "fwd"
        if graphed:
            cell.update(device_us={}, device_pct_copy={})
        for p in providers(spec, device, with_compile):
            try:
                timed = prepare(spec, pass_, p, rows, n, DTYPES[dt], device)
                us = measure(timed, device, quick) * 1e6
                if graphed:
                    dev_us = measure_device(timed, quick) * 1e6
                    cell["device_us"][p] = dev_us
                    cell["device_pct_copy"][p] = 100 * nbytes / dev_us / 1e3 / copy
            except Exception as e:  # a failed provider is a missing cell, not a failed run
                cell["errors"][p], us = _error(e), None
                if graphed:
                    cell["device_us"][p] = cell["device_pct_copy"][p] = None
            if device.type == "cuda":
                torch.cuda.empty_cache()  # big shapes: let the next provider have the memory
            gbps = nbytes / us / 1e3 if us else None
            cell["median_us"][p], cell["gbps"][p] = us, gbps
            cell["pct_copy"][p] = 100 * gbps / copy if gbps else None
        done.append(cell)
        log(f"[{i}/{len(todo)}] {_progress(cell, device.type)}")
    return {
        "device": name,
        "device_type": device.type,
        "slug": device_slug(name),
        "torch": torch.__version__,
        "build_info": fusedops.build_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": quick,
        "copy_gbps": copy,
        "providers": [p for p in PROVIDERS if any(p in c["median_us"] for c in done)],
        "families": list(dict.fromkeys((s.family or s.name) for s, _ in select(ops))),
        "cells": done,
    }


def _unit(device_type: str) -> tuple[str, float, int]:
    """(unit, scale from µs, decimals): µs for GPU kernels, ms for the slower CPU ones."""
    return ("µs", 1.0, 1) if device_type == "cuda" else ("ms", 1e-3, 2)


def _progress(cell: dict, device_type: str) -> str:
    unit, scale, dec = _unit(device_type)
    parts = []
    for p, us in cell["median_us"].items():
        if us is None:
            parts.append(f"{p} failed ({cell['errors'][p]})")
        else:
            gbps, pct = cell["gbps"][p], cell["pct_copy"][p]
            dev = cell.get("device_pct_copy", {}).get(p)
            graphed = f" (graph {dev:.0f}%)" if dev else ""
            parts.append(f"{p} {us * scale:.{dec}f} {unit} {gbps:.0f} GB/s {pct:.0f}%{graphed}")
    return f"{cell['op']} {cell['dtype']} {cell['rows']}x{cell['n']}: " + " | ".join(parts)


def table(result: dict) -> str:
    """The results as a fixed-width text table, with fusedops' speedups."""
    unit, scale, dec = _unit(result["device_type"])
    providers = result["providers"]
    others = [p for p in providers if p != "fusedops"]
    head = ["op", "dtype", "shape"]
    graphed = any("device_pct_copy" in c for c in result["cells"])
    head += [f"{p} {h}" for p in providers for h in (unit, "GB/s", "%copy")]
    head += [f"{p} graph%" for p in providers] if graphed else []
    head += [f"vs {p}" for p in others] if "fusedops" in providers else []
    rows = []
    for c in result["cells"]:
        row = [c["op"], c["dtype"], f"{c['rows']}x{c['n']}"]
        for p in providers:  # .get: a provider may lack an op (liger), "-" as for a failed one
            us, gbps, pct = c["median_us"].get(p), c["gbps"].get(p), c["pct_copy"].get(p)
            row += (
                ["-"] * 3 if us is None else [f"{us * scale:.{dec}f}", f"{gbps:.0f}", f"{pct:.0f}"]
            )
        if graphed:
            dev = c.get("device_pct_copy", {})
            row += [f"{dev[p]:.0f}" if dev.get(p) else "-" for p in providers]
        if "fusedops" in providers:
            mine = c["median_us"]["fusedops"]
            for p in others:
                theirs = c["median_us"].get(p)
                row.append(f"{theirs / mine:.2f}x" if mine and theirs else "-")
        rows.append(row)
    title = f"{result['device']}, torch {result['torch']}, copy {result['copy_gbps']:.0f} GB/s"
    return "\n".join([title, *columns(head, rows, text=3)])


def columns(head: list[str], rows: list[list[str]], text: int) -> list[str]:
    """Fixed-width lines: the first `text` columns left-aligned, the numbers right-aligned."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def fmt(r):
        cols = enumerate(zip(r, widths, strict=True))
        return "  ".join(v.ljust(w) if i < text else v.rjust(w) for i, (v, w) in cols)

    return [fmt(r) for r in [head, *rows]]


def plot(result: dict, path: Path) -> bool:
    """% of copy vs N per provider, one panel per op (rows) and dtype (columns). False: no
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ops = list(dict.fromkeys(c["op"] for c in result["cells"]))
    dtypes = list(dict.fromkeys(c["dtype"] for c in result["cells"]))
    fig, axes = plt.subplots(
        len(ops), len(dtypes), figsize=(5 * len(dtypes), 3.5 * len(ops)), squeeze=False
    )
    for (op, dt), ax in zip(itertools.product(ops, dtypes), axes.flat, strict=True):
        series = sorted(
            (c for c in result["cells"] if (c["op"], c["dtype"]) == (op, dt)),
            key=lambda c: (c["n"], c["rows"]),
        )
        for i, p in enumerate(result["providers"]):
            pts = [(c["n"], c["pct_copy"][p]) for c in series if c["pct_copy"].get(p) is not None]
            if pts:  # one color per provider in every panel, also where one is missing
                ax.plot(*zip(*pts, strict=True), marker="o", label=p, color=f"C{i}")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, max(110, ax.get_ylim()[1]))  # above 100%: data fit in cache (CPU)
        ax.axhline(100, color="gray", lw=0.8, ls="--")
        ax.set(title=f"{op} {dt}", xlabel="N (row length)", ylabel="% of copy GB/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"{result['device']}, torch {result['torch']}, 2 GiB copy {result['copy_gbps']:.0f} GB/s"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(result: dict, out: str | Path, with_plot: bool = True) -> list[Path]:
    """Write <slug>-<family>.json (and .png) under out; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{result['slug']}-{'-'.join(result['families'])}"
    path = stem.with_suffix(".json")
    path.write_text(json.dumps(result, indent=1) + "\n")
    written = [path]
    if with_plot:
        if plot(result, stem.with_suffix(".png")):
            written.append(stem.with_suffix(".png"))
        else:
            print("note: matplotlib not installed, no plot (pip install matplotlib)", flush=True)
    return written


def _shape(s: str) -> tuple[int, int]:
    rows, x, n = s.lower().partition("x")
    if not (x and rows.isdigit() and n.isdigit()):
        raise ValueError(f"bad shape {s!r}: expected ROWSxN, e.g. 4096x1024")
    return int(rows), int(n)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m fusedops.bench", description=__doc__.splitlines()[0]
    )
    ap.add_argument(
        "--ops", default=",".join(DEFAULT_OPS), help=f"comma list of: {', '.join(op_names())}"
    )
    ap.add_argument(
        "--dtypes", default=",".join(DEFAULT_DTYPES), help=f"comma list of: {', '.join(DTYPES)}"
    )
    ap.add_argument("--shapes", help="ROWSxN,... (default: the op's shape list)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--out", default="bench/results", help="directory for .json and .png")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--no-plot", action="store_true", help="skip the .png")
    args = ap.parse_args(argv)
    ops, dtypes = args.ops.split(","), args.dtypes.split(",")
    try:
        select(ops)
        shapes = [_shape(s) for s in args.shapes.split(",")] if args.shapes else None
    except ValueError as e:
        ap.error(str(e))
    if unknown := [d for d in dtypes if d not in DTYPES]:
        ap.error(f"unknown dtype(s) {unknown}; known: {', '.join(DTYPES)}")

    def log(line: str) -> None:
        print(line, flush=True)

    result = run(ops, dtypes, shapes, args.quick, not args.no_compile, log)
    print(table(result))
    for path in write(result, args.out, not args.no_plot):
        print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
