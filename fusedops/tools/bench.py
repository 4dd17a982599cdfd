"""Benchmark harness: fusedops beside torch eager, torch.compile and Liger-Kernel, in one process.

    python -m fusedops.bench [--device cuda|mps|cpu] [--ops softmax_fwd,softmax_bwd]
        [--dtypes bf16,fp32] [--shapes 4096x1024,...] [--quick] [--out DIR] [--no-compile]
        [--no-plot] [--no-host | --host-only] [--rounds N] [--providers fusedops,copy]

Results go to ./fusedops-bench/ (untracked) unless --out says otherwise; the project's committed
results are written on purpose with --out bench/results. The device is CUDA, else MPS, else the
CPU, unless --device picks one.

CUDA: CUDA events around batches of back-to-back calls whose inputs rotate through >= 4x the L2
cache, so every call reads DRAM; time per call = batch time / batch size, median over batches.
That is throughput, and it shows host overhead where the host cannot keep the GPU fed; each
cell is also timed kernel-only, its calls captured in a CUDA graph and replayed. Each
kernel is reported as GB/s of minimal unique bytes and as % of a 2 GiB device-to-device copy
timed the same way. MPS and CPU: time.perf_counter around each batch (synchronized on MPS), the
same medians. On the CPU the 2 GiB copy streams through DRAM while the smaller shapes stay in
cache, so those can exceed 100% of it: there % of copy compares with DRAM speed, not a roof.
--rounds N times each cell's providers in turn N times on inputs prepared once and reports the
median round: a slow spell of the machine then falls on every provider, not on whichever ran
during it (on CPU each provider also warms up for CPU_WARMUP_SECONDS first, then until its
calls settle: see SETTLED).

Host cost (on unless --no-host): microseconds per call on tiny tensors (HOST_SHAPE): each op
forward and forward+backward and each module, fusedops beside torch's equivalent; back-to-back
calls, one synchronize per batch, the two providers' batches in turn, median over batches. That
is what a model's many small calls pay; the GB/s tables are what large ones do.

Providers: fusedops, torch eager, torch.compile and, on CUDA where `liger_kernel` imports,
Liger-Kernel's Triton kernels (layer_norm and rms_norm; ops it lacks get no liger entries),
and for CUDA forwards "copy": a device-to-device copy of the input, the bytes a forward moves,
timed the same way: what the memory system gives a kernel of that size (replayed from a CUDA
graph, copies of 512 MB ran at ~80% of the 2 GiB copy on an H100: read their
host-timed cell there).
The fused MLP is GEMM-bound, so % of copy says nothing about it: python -m fusedops.bench_mlp.

To add an op, register one Spec below. `run()` returns the results as data.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
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
PROVIDERS = ("fusedops", "eager", "compile", "liger", "copy")  # column order; see providers()
COPY_BYTES = 2 << 30  # the roof: one 2 GiB device-to-device copy
DEFAULT_OUT = "fusedops-bench"  # untracked (.gitignore); committed results need --out
HOST_SHAPE = (8, 256)  # tiny: the host decides the time
HOST_DTYPE = "bf16"
DEVICES = ("cuda", "mps", "cpu")
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


def providers(
    spec: Spec, pass_: str, device: torch.device, with_compile: bool = True, only=None
) -> list[str]:
    """The providers timed for spec's pass on device, in PROVIDERS order: fusedops and eager
    always, compile unless turned off, liger on CUDA where Liger-Kernel imports and has the op,
    copy for CUDA forwards; of those, only the ones in `only` where it is given."""
    cuda = device.type == "cuda"
    offered = {
        "fusedops": True,
        "eager": True,
        "compile": with_compile,
        "liger": spec.liger is not None and cuda and LIGER_MISSING is None,
        "copy": cuda and pass_ == "fwd",
    }
    return [p for p in PROVIDERS if offered[p] and (only is None or p in only)]


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
    stream: torch.cuda.Stream | None = None  # where a CUDA backward runs: its forward's stream


def _mps_available() -> bool:
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()


def pick_device(name: str | None = None) -> torch.device:
    """The device named (it must be present), or CUDA, else MPS, else the CPU."""
    present = {"cuda": torch.cuda.is_available(), "mps": _mps_available(), "cpu": True}
    if name is None:
        return torch.device(next(d for d in DEVICES if present[d]))
    if name not in present:
        raise ValueError(f"fusedops.bench: unknown device {name!r}; known: {', '.join(DEVICES)}")
    if not present[name]:
        raise ValueError(f"fusedops.bench: device {name!r} is not available here")
    return torch.device(name)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _cache_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).L2_cache_size
    return 0  # CPU, MPS: no rotation; big shapes dwarf the caches anyway


def _grad(y, xs, dy):
    return torch.autograd.grad(y, xs, dy, retain_graph=True)


def _copy(x, *params):
    """The "copy" provider: the input copied, the x-read and y-write a forward makes."""
    return x.clone()


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
        fn = {"fusedops": spec.fused, "eager": spec.eager, "liger": spec.liger, "copy": _copy}[
            provider
        ]
    sets = [spec.inputs(rows, n, dtype, device) for _ in range(k)]
    if pass_ == "fwd":
        return Timed(fn, sets, grad=False, nbytes=nbytes)
    # Backward only: y is built once per set (by fn, so a compiled y runs compiled backward),
    # and the timed call is autograd.grad alone. On CUDA y is made on a side stream: autograd
    # runs a backward on its forward's stream, and a CUDA graph can capture a side stream only.
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream(device))  # the inputs are made
    bwd_sets = []
    with torch.enable_grad(), _on(stream):
        for args in sets:
            args = [a.requires_grad_() if i in spec.grad_args else a for i, a in enumerate(args)]
            y = fn(*args)
            bwd_sets.append((y, [args[i] for i in spec.grad_args], torch.randn_like(y)))
    return Timed(_grad, bwd_sets, grad=True, nbytes=nbytes, stream=stream)


def _on(stream: torch.cuda.Stream | None):
    """torch.cuda.stream(stream), or nothing where there is no stream (CPU, MPS, forwards)."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _plan(device: torch.device, quick: bool) -> tuple[int, int, float]:
    """(warm-up calls, batches timed, target seconds per batch; 0: one call per batch)."""
    if device.type != "cpu":
        return (2, 10, 1e-3) if quick else (2, 30, 2e-3)
    # CPU: the big shapes take a second per call here, so --quick times a handful of calls.
    return (1, 3, 0.0) if quick else (2, 7, 20e-3)


def _per_call(step, batch: int, reps: int, device: torch.device, host_clock: bool = False) -> float:
    """Median over `reps` batches of `batch` back-to-back step() calls, in seconds per call.
    CUDA: CUDA events unless host_clock; else time.perf_counter, synchronized per batch."""
    if device.type == "cuda" and not host_clock:
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
            synchronize(device)
            t0 = time.perf_counter()
            for _ in range(batch):
                step()
            synchronize(device)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) / batch


# A process's first calls at a size ran slower for a while on a 2-core CPU (fp32 softmax
# backward at 4096x1024: 9 ms for whichever provider was timed first, 3.5 ms for the second, and
# for the first when timed again): the kernel benchmark warms each CPU provider up this long,
# and then until a call runs within SETTLED of the fastest warm-up call (at most
# CPU_SETTLE_MAX_SECONDS more). On a 2-core virtual machine the first provider timed at 4096x32768
# fp32 took 3-4 calls of ~0.9 s each after its first two, whichever it was (layer_norm forward,
# ms per call: fusedops 125 357 996 949 908 149 127, then torch 129-133; torch first: 139 136 462
# 823 837 143, then fusedops 124-138); with a fixed 0.5 s, that cell read 0.34x over two rounds
# (fusedops 1002 and 145 ms).
CPU_WARMUP_SECONDS = 0.5
CPU_SETTLE_MAX_SECONDS = 10.0
SETTLED = 1.25


def measure(t: Timed, device: torch.device, quick: bool = False, warmup_s: float = 0.0) -> float:
    """Median seconds per call of t, after a warm-up that compiles and touches every set (and
    goes on for warmup_s seconds, then until a call is within SETTLED of the fastest)."""
    warmup, reps, target = _plan(device, quick)
    it = itertools.cycle(t.sets)  # one cycle throughout: no set is used twice in a row
    # Outputs stay alive for a whole rotation, so the allocator hands each call a different
    # output buffer: writes rotate through memory like the reads do.
    outputs = collections.deque(maxlen=len(t.sets))

    def step():
        outputs.append(t.call(*next(it)))

    def timed_step() -> float:
        t0 = time.perf_counter()
        step()
        return time.perf_counter() - t0

    # Forward runs under no_grad (inference); backward needs autograd on.
    with torch.set_grad_enabled(t.grad), _on(t.stream):
        first = [timed_step() for _ in range(max(warmup, len(t.sets)))]
        fastest, last = min(first), first[-1]
        start = time.perf_counter()
        while warmup_s > 0:
            elapsed = time.perf_counter() - start
            if elapsed >= warmup_s + (0 if last <= SETTLED * fastest else CPU_SETTLE_MAX_SECONDS):
                break
            last = timed_step()
            fastest = min(fastest, last)
        batch = 1
        if target:  # enough calls per batch to fill `target`, from one timed call
            batch = min(1000, max(1, math.ceil(target / _per_call(step, 1, 1, device))))
        return _per_call(step, batch, reps, device)


# Replays per timed batch of measure_device: ~200 calls, but at most this long (200 calls of the
# row benchmark's largest cell take ~50 ms on an H100; an MLP training step can take 10 ms).
GRAPH_BATCH_S = 0.1


def measure_device(t: Timed, quick: bool = False) -> float:
    """Median GPU seconds per call with the host out of the way: one CUDA graph holds a call per
    rotated input set and is replayed. This is what the kernels alone achieve; measure() is what
    a Python caller gets (a backward's autograd.grad costs ~100 µs of host per call, as much as
    the GPU time of a 400 MB backward). A backward is captured on its forward's stream."""
    cuda = torch.device("cuda")
    _, reps, _ = _plan(cuda, quick)
    with torch.set_grad_enabled(t.grad):
        side = t.stream or torch.cuda.Stream()  # warm up off the default stream, as asked
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for args in t.sets:
                t.call(*args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=t.stream):
            outputs = [t.call(*args) for args in t.sets]  # noqa: F841  (kept alive: distinct)
    graph.replay()
    replays = max(1, math.ceil(200 / len(t.sets)))
    replays = min(replays, max(1, math.ceil(GRAPH_BATCH_S / _per_call(graph.replay, 1, 1, cuda))))
    return _per_call(graph.replay, replays, reps, cuda) / len(t.sets)


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
# Host cost


def host_cases(
    device: torch.device, dtype: torch.dtype
) -> list[tuple[str, Callable, Callable, tuple]]:
    """(name, fusedops' call, torch's equivalent, inputs) for each op and module, at HOST_SHAPE."""
    rows, n = HOST_SHAPE
    hidden = 4 * n
    nn, F = torch.nn, torch.nn.functional

    def rand(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)

    x, w, b = rand(rows, n), rand(n), rand(n)
    mlp = (rand(hidden, n), rand(hidden), rand(n, hidden), rand(n))
    cases = [
        ("softmax", lambda x: fusedops.softmax(x, -1), lambda x: torch.softmax(x, -1), (x,)),
        (
            "log_softmax",
            lambda x: fusedops.log_softmax(x, -1),
            lambda x: torch.log_softmax(x, -1),
            (x,),
        ),
        ("layer_norm", _layer_norm(fusedops.layer_norm), _layer_norm(F.layer_norm), (x, w, b)),
        ("rms_norm", _rms_norm(fusedops.rms_norm), _rms_norm(F.rms_norm), (x, w)),
        ("bias_gelu", fusedops.bias_gelu, lambda x, b: F.gelu(x + b), (x, b)),
        (
            "fused_mlp",
            fusedops.fused_mlp,
            lambda x, w1, b1, w2, b2: F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2),
            (x, *mlp),
        ),
    ]
    seq = nn.Sequential(nn.Linear(n, hidden), nn.GELU(), nn.Linear(hidden, n))
    modules = [
        ("nn.Softmax", fusedops.nn.Softmax(-1), nn.Softmax(-1)),
        ("nn.LogSoftmax", fusedops.nn.LogSoftmax(-1), nn.LogSoftmax(-1)),
        ("nn.LayerNorm", fusedops.nn.LayerNorm(n), nn.LayerNorm(n)),
        ("nn.RMSNorm", fusedops.nn.RMSNorm(n), nn.RMSNorm(n)),
        ("nn.FusedMLP", fusedops.nn.FusedMLP.from_modules(seq), seq),  # shared parameters
    ]
    cases += [(name, f.to(device, dtype), t.to(device, dtype), (x,)) for name, f, t in modules]
    return cases


def host_us(
    calls: dict[str, Callable], args: tuple, device: torch.device, backward: bool, quick: bool
) -> tuple[dict[str, float | None], dict[str, str]]:
    """Median µs per call of each provider's f(*args) (and its backward), and the errors of
    those that failed: batches of back-to-back calls on the host clock, one synchronize at the
    end of each, the providers' batches taken in turn so that a drift in the machine's speed
    falls on all of them alike."""
    batch, reps = (50, 5) if quick else (200, 15)
    steps, times, errors = {}, {}, {}
    with torch.set_grad_enabled(backward):  # forward: inference, no autograd graph
        for provider, f in calls.items():
            try:
                steps[provider] = _host_step(f, args, backward)
                for _ in range(batch // 5 + 2):  # warm-up
                    steps[provider]()
                times[provider] = []
            except Exception as e:  # e.g. an op without kernels for this device
                errors[provider] = _error(e)
        for _ in range(reps):
            for provider, step in steps.items():
                times[provider].append(_per_call(step, batch, 1, device, host_clock=True) * 1e6)
    us = {p: statistics.median(times[p]) if p in times else None for p in calls}
    return us, errors


def _host_step(f: Callable, args: tuple, backward: bool) -> Callable[[], None]:
    if backward:
        args = tuple(a.detach().requires_grad_() for a in args)
        with torch.enable_grad():
            dy = torch.randn_like(f(*args))

    def step():
        y = f(*args)
        if backward:
            y.backward(dy)

    return step


def host_costs(device: torch.device, quick: bool = False) -> dict:
    """Host µs per call, fusedops and torch, forward and forward+backward of every host_cases()
    entry; a failed call is None with its reason under errors."""
    rows = []
    for name, fused, ref, args in host_cases(device, DTYPES[HOST_DTYPE]):
        for backward in (False, True):
            us, errors = host_us({"fusedops": fused, "torch": ref}, args, device, backward, quick)
            row = {"name": f"{name} {'fwd+bwd' if backward else 'fwd'}", "errors": errors}
            row.update({f"{provider}_us": v for provider, v in us.items()})
            rows.append(row)
    return {"shape": list(HOST_SHAPE), "dtype": HOST_DTYPE, "rows": rows}


def host_table(host: dict) -> str:
    rows = []
    for r in host["rows"]:
        mine, theirs = r["fusedops_us"], r["torch_us"]
        ratio = "-" if not (mine and theirs) else f"{mine / theirs:.2f}"
        rows.append([r["name"], _num(mine), _num(theirs), ratio])
    head = ["op / module", "fusedops µs", "torch µs", "fusedops/torch"]
    title = (
        f"host µs per call, {host['shape'][0]}x{host['shape'][1]} {host['dtype']} "
        "(back-to-back calls, median; <= 1.00 is the goal)"
    )
    return "\n".join([title, *columns(head, rows, text=1)])


# ---------------------------------------------------------------------------------------------
# Running, reporting


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return f"MPS ({platform.machine()} Apple GPU)"
    return f"CPU {platform.machine()}, {torch.get_num_threads()} threads"


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA GeForce RTX 4090' -> 'rtx-4090'."""
    if name.startswith(("CPU", "MPS")):
        return name[:3].lower()
    drop = re.compile(r"nvidia|geforce|tesla|\d+gb|hbm\d*e?")
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and not drop.fullmatch(w)]
    return "-".join(words) or "gpu"


def _error(e: Exception) -> str:
    lines = str(e).strip().splitlines() or [""]
    return f"{type(e).__name__}: {lines[0][:160]}"


def _calibrate(device: torch.device) -> tuple[float, float]:
    """(seconds per tiny call, bytes per second torch.randn fills) on device: with the copy's
    speed, what _predicted_seconds needs."""
    x = torch.randn(*HOST_SHAPE, device=device)
    floor = _per_call(x.clone, 100, 3, device, host_clock=True)
    synchronize(device)
    t0 = time.perf_counter()
    y = torch.randn(1 << 24, device=device)
    synchronize(device)
    return floor, y.nbytes / (time.perf_counter() - t0)


def _predicted_seconds(spec: Spec, pass_: str, dt: str, shape, device, copy, quick, calib, only):
    """A rough time for one cell: per provider, making its input sets and its calls (warm-up,
    timed batches, CUDA graph replays), each call at the copy's speed or the tiny-call floor.
    run() scales the estimate by the time the finished cells really took."""
    floor, randn_rate = calib
    warmup, reps, target = _plan(device, quick)
    nbytes = min_bytes(spec, pass_, *shape, DTYPES[dt])
    call = max(nbytes / (copy * 1e9), floor)
    batch = min(1000, max(1, math.ceil(target / call))) if target else 1
    sets = max(1, math.ceil(L2_ROTATE * _cache_bytes(device) / nbytes))
    calls = sets + max(warmup, sets) + reps * batch  # sets: a backward's y
    if device.type == "cuda":
        calls += reps * 200  # measure_device
    warm = CPU_WARMUP_SECONDS if device.type == "cpu" else 0.0
    timed = len(providers(spec, pass_, device, only=only))
    return timed * (calls * call + sets * nbytes / randn_rate + warm)


def _duration(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def run(
    ops=DEFAULT_OPS,
    dtypes=DEFAULT_DTYPES,
    shapes=None,
    quick: bool = False,
    with_compile: bool = True,
    log: Callable[[str], None] | None = print,
    device: str | torch.device | None = None,
    with_host: bool = True,
    rounds: int = 1,
    out: str | Path | None = None,
    only_providers=None,
) -> dict:
    """Time every (op, dtype, shape) cell for each provider; return the results as a dict.

    ops: names as in select() (none: only the host table); shapes: [(rows, N), ...], None for
    each op's own list; device: "cuda", "mps", "cpu" or None for the first present. Each cell
    holds median_us, gbps and pct_copy for each of providers() of its op (None where a provider
    failed, with the reason under errors). rounds > 1: a cell's providers are timed in turn that
    many times on inputs prepared once (all of them in memory together), median_us is the
    median round and rounds_us every round's. with_host adds "host": host_costs(). out: where to
    write the JSON after every cell (write()), so a run cut short keeps what it measured.
    only_providers: time only these of PROVIDERS (an A/B of fusedops builds needs no other).
    """
    log = log or (lambda s: None)
    device = pick_device(device) if not isinstance(device, torch.device) else device
    name = _device_name(device)
    todo = cells(ops, dtypes, shapes) if ops else []
    copy = copy_gbps(device, quick) if todo else None
    if todo:
        log(f"{name}: 2 GiB copy {copy:.0f} GB/s (bytes read + written)")
    if device.type == "cuda" and LIGER_MISSING and any(s.liger for s, _ in select(ops or [])):
        log(f"note: no liger provider: {LIGER_MISSING}")
    if todo:
        calib = _calibrate(device)
        predicted = [
            rounds * _predicted_seconds(*c, device, copy, quick, calib, only_providers)
            for c in todo
        ]
        compiles = ", plus a torch.compile per cell (--no-compile skips it)" if with_compile else ""
        log(
            f"{len(todo)} cells: about {_duration(sum(predicted))}{compiles}; "
            "each line below updates the estimate"
        )
    done = []
    result = {
        "device": name,
        "device_type": device.type,
        "slug": device_slug(name),
        "torch": torch.__version__,
        "build_info": fusedops.build_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": quick,
        "copy_gbps": copy,
        "providers": [],
        "families": list(dict.fromkeys((s.family or s.name) for s, _ in select(ops or []))),
        "cells": done,
    }
    start = time.perf_counter()
    for i, (spec, pass_, dt, (rows, n)) in enumerate(todo, 1):
        nbytes = min_bytes(spec, pass_, rows, n, DTYPES[dt])
        cell = {"op": f"{spec.name}_{pass_}", "dtype": dt, "rows": rows, "n": n, "bytes": nbytes}
        cell.update(median_us={}, gbps={}, pct_copy={}, errors={})
        # CUDA cells also get the kernel-only time (CUDA graph replay): at small shapes, and for
        # backwards up to a few hundred MB, the host-inclusive time is Python, autograd and
        # launch overhead, not the kernels.
        graphed = device.type == "cuda"
        if graphed:
            cell.update(device_us={}, device_pct_copy={})
        us_rounds = {p: [] for p in providers(spec, pass_, device, with_compile, only_providers)}
        dev_rounds = {p: [] for p in us_rounds}
        kept = {}  # with several rounds, each provider's inputs, prepared once
        for _ in range(rounds):
            for p in us_rounds:
                if p in cell["errors"]:
                    continue
                timed = None
                try:
                    timed = kept.get(p) or prepare(spec, pass_, p, rows, n, DTYPES[dt], device)
                    if rounds > 1:
                        kept[p] = timed
                    warmup_s = CPU_WARMUP_SECONDS if device.type == "cpu" else 0.0
                    us_rounds[p].append(measure(timed, device, quick, warmup_s) * 1e6)
                except Exception as e:  # a failed provider is a missing cell, not a failed run
                    cell["errors"][p] = _error(e)
                    kept.pop(p, None)
                    timed = None
                if graphed and timed is not None and f"{p} graph" not in cell["errors"]:
                    try:
                        dev_rounds[p].append(measure_device(timed, quick) * 1e6)
                    except Exception as e:  # the host-timed cell stands without it
                        cell["errors"][f"{p} graph"] = _error(e)
                timed = None
                if device.type == "cuda" and not kept:
                    torch.cuda.empty_cache()  # big shapes: let the next provider have the memory
        kept = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
        for p, samples in us_rounds.items():
            ok = p not in cell["errors"]
            us = statistics.median(samples) if ok else None
            gbps = nbytes / us / 1e3 if us else None
            cell["median_us"][p], cell["gbps"][p] = us, gbps
            cell["pct_copy"][p] = 100 * gbps / copy if gbps else None
            if rounds > 1:
                cell.setdefault("rounds_us", {})[p] = samples if ok else None
            if graphed:
                dev_us = statistics.median(dev_rounds[p]) if ok and dev_rounds[p] else None
                cell["device_us"][p] = dev_us
                cell["device_pct_copy"][p] = 100 * nbytes / dev_us / 1e3 / copy if dev_us else None
        done.append(cell)
        result["providers"] = [p for p in PROVIDERS if any(p in c["median_us"] for c in done)]
        if out:
            write(result, out, with_plot=False)
        elapsed = time.perf_counter() - start
        left = elapsed * sum(predicted[i:]) / sum(predicted[:i])
        eta = f"{_duration(elapsed)}, ~{_duration(left)} left"
        log(f"[{i}/{len(todo)} {eta}] {_progress(cell, device.type)}")
    if with_host:
        log(f"host cost per call, {HOST_SHAPE[0]}x{HOST_SHAPE[1]} {HOST_DTYPE}...")
        result["host"] = host_costs(device, quick)
    return result


def _unit(device_type: str) -> tuple[str, float, int]:
    """(unit, scale from µs, decimals): µs for GPU kernels, ms for the slower CPU ones."""
    return ("ms", 1e-3, 2) if device_type == "cpu" else ("µs", 1.0, 1)


def _num(x: float | None) -> str:
    """At most 3 significant digits, and never a small value rounded to 0: 2950, 12.3, 0.87."""
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2g}"


def _progress(cell: dict, device_type: str) -> str:
    unit, scale, dec = _unit(device_type)
    parts = []
    for p, us in cell["median_us"].items():
        if us is None:
            parts.append(f"{p} failed ({cell['errors'][p]})")
        else:
            gbps, pct = cell["gbps"][p], cell["pct_copy"][p]
            dev = cell.get("device_pct_copy", {}).get(p)
            graphed = f" (graph {_num(dev)}%)" if dev else ""
            parts.append(f"{p} {us * scale:.{dec}f} {unit} {_num(gbps)} GB/s {_num(pct)}%{graphed}")
    return f"{cell['op']} {cell['dtype']} {cell['rows']}x{cell['n']}: " + " | ".join(parts)


def _grouped(result: dict, head: list[str], row: Callable[[dict], list[str] | None]) -> list[str]:
    """A table with a line per (op, dtype) heading its shapes' rows; widths shared by all."""
    groups: dict[str, list[list[str]]] = {}
    for c in result["cells"]:
        if (r := row(c)) is not None:
            groups.setdefault(f"{c['op']} {c['dtype']}", []).append([f"{c['rows']}x{c['n']}", *r])
    rows = [r for g in groups.values() for r in g]
    lines = columns(head, rows, text=1)
    out, k = [lines[0]], 1
    for title, g in groups.items():
        out += [title, *("  " + line for line in lines[k : k + len(g)])]
        k += len(g)
    out[0] = "  " + out[0]
    return out


def table(result: dict) -> str:
    """The results as text tables of at most ~100 columns: time per call with fusedops'
    speedups; GB/s and % of copy; on CUDA the kernel-only % of copy; the host costs."""
    unit, scale, dec = _unit(result["device_type"])
    providers = result["providers"]
    others = [p for p in providers if p != "fusedops"] if "fusedops" in providers else []
    lines = [f"{result['device']}, torch {result['torch']}"]
    if result["cells"]:
        lines[0] += f", 2 GiB copy {result['copy_gbps']:.0f} GB/s"
        if result["device_type"] == "cpu":
            lines += [
                "CPU: the copy streams through DRAM; shapes that fit in cache can pass 100% of it."
            ]

        def times(c):  # .get: a provider may lack an op (liger); "-" as for a failed one
            us = [c["median_us"].get(p) for p in providers]
            mine = c["median_us"].get("fusedops")
            speed = [
                c["median_us"].get(p) / mine if mine and c["median_us"].get(p) else None
                for p in others
            ]
            return [f"{u * scale:.{dec}f}" if u else "-" for u in us] + [
                f"{x:.2f}x" if x else "-" for x in speed
            ]

        def bandwidth(c):
            return [
                f"{_num(c['gbps'].get(p))} ({_num(c['pct_copy'].get(p))}%)"
                if c["gbps"].get(p)
                else "-"
                for p in providers
            ]

        lines += ["", f"{unit} per call (host-inclusive) and fusedops' speedup"]
        lines += _grouped(result, ["shape", *providers, *(f"vs {p}" for p in others)], times)
        lines += ["", "GB/s (% of copy)"]
        lines += _grouped(result, ["shape", *providers], bandwidth)
        if any("device_pct_copy" in c for c in result["cells"]):
            lines += ["", "% of copy, kernel only (CUDA graph replay)"]
            lines += _grouped(
                result,
                ["shape", *providers],
                lambda c: (
                    [_num(c["device_pct_copy"].get(p)) for p in providers]
                    if "device_pct_copy" in c
                    else None
                ),
            )
    if host := result.get("host"):
        lines += ["", host_table(host)]
    return "\n".join(lines)


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
    stem = out / f"{result['slug']}-{'-'.join(result['families']) or 'host'}"
    path = stem.with_suffix(".json")
    path.write_text(json.dumps(result, indent=1) + "\n")
    written = [path]
    if with_plot and result["cells"]:
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
    ap.add_argument("--device", choices=DEVICES, help="default: cuda, else mps, else cpu")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"directory for .json and .png (default {DEFAULT_OUT}/, untracked; the committed "
        "results: bench/results)",
    )
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--no-plot", action="store_true", help="skip the .png")
    host = ap.add_mutually_exclusive_group()
    host.add_argument("--no-host", action="store_true", help="skip the host cost table")
    host.add_argument("--host-only", action="store_true", help="only the host cost table")
    ap.add_argument(
        "--providers",
        help=f"comma list of the providers to time, of: {', '.join(PROVIDERS)} (default: all that "
        "apply; e.g. fusedops,copy for an A/B of two builds)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time each cell's providers in turn this many times, inputs kept (median)",
    )
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    ops, dtypes = args.ops.split(","), args.dtypes.split(",")
    only = args.providers.split(",") if args.providers else None
    if only and (unknown := [p for p in only if p not in PROVIDERS]):
        ap.error(f"--providers: unknown {unknown}; choose from {', '.join(PROVIDERS)}")
    try:
        device = pick_device(args.device)
        select(ops)
        shapes = [_shape(s) for s in args.shapes.split(",")] if args.shapes else None
    except ValueError as e:
        ap.error(str(e))
    if unknown := [d for d in dtypes if d not in DTYPES]:
        ap.error(f"unknown dtype(s) {unknown}; known: {', '.join(DTYPES)}")

    def log(line: str) -> None:
        print(line, flush=True)

    result = run(
        [] if args.host_only else ops,
        dtypes,
        shapes,
        args.quick,
        not args.no_compile,
        log,
        device,
        with_host=not args.no_host,
        rounds=args.rounds,
        out=args.out,
        only_providers=only,
    )
    print(table(result))
    for path in write(result, args.out, not args.no_plot):
        print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
