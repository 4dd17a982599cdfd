"""FusedMLP benchmark: fusedops.fused_mlp beside torch eager and torch.compile, in one process.

    python -m fusedops.bench_mlp [--dims 768,1024,4096] [--tokens 8192] [--dtype bf16]
        [--approx tanh,none] [--modes infer,train] [--quick] [--[no-]compile]
        [--[no-]max-autotune] [--rounds 3] [--device cuda|mps|cpu] [--out DIR]

The block: x [T, D] -> Linear(D, H) -> GELU -> Linear(H, D), H = 4D. infer: the forward under
torch.no_grad; train: forward and backward to x, w1, b1, w2, b2. Providers: eager (F.linear,
F.gelu, F.linear: what nn.Sequential(Linear, GELU, Linear) runs), compile (torch.compile of
that), max-autotune (its mode "max-autotune-no-cudagraphs": autotunes every GEMM, minutes per
cell; --no-max-autotune leaves it out), fusedops (fusedops.fused_mlp) and, for train,
fusedops-recompute (recompute_activation=True).

Timing is fusedops.bench.measure's: CUDA events around batches of calls, inputs rotated past L2,
median; every provider of a cell runs on the same inputs, and they take turns, --rounds times
(default 3): the median round is reported beside the fastest and slowest. Per cell: ms, TFLOP/s
(forward 2 * 2*T*D*H FLOPs, a training step 3x that), speedup vs eager, peak memory of one step
above what was allocated before it, and the first call's seconds (for the compiled providers:
the compile). On CUDA each provider's step is also timed kernel-only, a CUDA graph of its calls
replayed in the same turns (graph ms and its speedup over eager's graph): the GPU's side of the
step without the Python, autograd and launch cost, which on a slow host can decide a training
step of D = 768 (eager's host-timed rounds moved 0.50-0.81 ms there on one H200, its kernels
0.45). Then, on CUDA, the kernels one step launches (counted with torch.profiler) for
eager and fusedops at D = 1024. Results: <out>/<device>-fused_mlp.json,
rewritten after every cell so a run cut short keeps what it measured; <out> is ./fusedops-bench
(untracked) unless given (the committed results: --out bench/results).

--fully-fused benchmarks fusedops.nn.FullyFusedMLP instead (fusedops.tools.bench_ffm).

CPU (a smoke test): 256 tokens by default, ms and speedups only, no torch.compile unless
--compile.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import fusedops
from fusedops.tools import bench

DIMS = (768, 1024, 4096)
APPROX = ("tanh", "none")
MODES = ("infer", "train")
PROVIDERS = ("eager", "compile", "max-autotune", "fusedops", "fusedops-recompute")
COMPILED = ("compile", "max-autotune")
KERNELS_DIM = 1024  # the D whose kernel launches are counted


def _eager(x, w1, b1, w2, b2, approximate):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate=approximate), w2, b2)


def forward(provider: str, approximate: str) -> Callable[..., torch.Tensor]:
    """provider's f(x, w1, b1, w2, b2). The compiled ones compile on their first call."""

    def eager(*t):
        return _eager(*t, approximate)

    if provider in COMPILED:
        # A fresh compile per cell, as fusedops.bench does: each shape recompiles (dynamic=False)
        # and dynamo's recompile limit would otherwise fall back to eager after a few cells.
        torch._dynamo.reset()
        mode = "max-autotune-no-cudagraphs" if provider == "max-autotune" else None
        return torch.compile(eager, mode=mode, dynamic=False, fullgraph=True)
    if provider == "eager":
        return eager
    recompute = provider == "fusedops-recompute"
    return lambda *t: fusedops.fused_mlp(
        *t, approximate=approximate, recompute_activation=recompute
    )


def providers(mode: str, with_compile: bool, with_max_autotune: bool) -> list[str]:
    """The providers timed for mode, in PROVIDERS order."""
    offered = {
        "compile": with_compile,
        "max-autotune": with_max_autotune,
        "fusedops-recompute": mode == "train",  # it only changes what the backward keeps
    }
    return [p for p in PROVIDERS if offered.get(p, True)]


def inputs(tokens: int, d: int, dtype, device, train: bool) -> tuple[torch.Tensor, ...]:
    """x, w1, b1, w2, b2 in nn.Linear's layouts and scale; train: they require grad, plus dy."""

    def rand(*shape, fan_in=1):
        t = torch.randn(*shape, dtype=dtype, device=device) / fan_in**0.5
        return t.requires_grad_(train)

    h = 4 * d
    x, w1, b1 = rand(tokens, d), rand(h, d, fan_in=d), rand(h, fan_in=d)
    w2, b2 = rand(d, h, fan_in=h), rand(d, fan_in=h)
    if train:
        return x, w1, b1, w2, b2, torch.randn(tokens, d, dtype=dtype, device=device)
    return x, w1, b1, w2, b2


def flops(mode: str, tokens: int, d: int) -> int:
    """Two GEMMs of 2*T*D*H forward; the backward has twice those (input and weight grads)."""
    fwd = 2 * (2 * tokens * d * 4 * d)
    return 3 * fwd if mode == "train" else fwd


def _train_step(fwd: Callable) -> Callable:
    def step(*args):
        *tensors, dy = args
        return torch.autograd.grad(fwd(*tensors), tensors, dy)

    return step


def input_sets(mode: str, tokens: int, d: int, dtype, device) -> list[tuple[torch.Tensor, ...]]:
    """Enough input sets of one step (x, the parameters, and dy for train) to rotate past L2."""
    train = mode == "train"
    first = inputs(tokens, d, dtype, device, train)
    nbytes = sum(t.nbytes for t in first)
    k = max(1, math.ceil(bench.L2_ROTATE * bench._cache_bytes(device) / nbytes))
    return [first] + [inputs(tokens, d, dtype, device, train) for _ in range(k - 1)]


def prepare(
    provider: str, mode: str, approximate: str, tokens: int, d: int, dtype, device, sets=None
):
    """A bench.Timed of one step (forward, or forward + backward) over rotated input sets: sets,
    or new ones (input_sets)."""
    train = mode == "train"
    sets = sets or input_sets(mode, tokens, d, dtype, device)
    nbytes = sum(t.nbytes for t in sets[0])  # one input set: x, the parameters (and dy)
    fwd = forward(provider, approximate)
    return bench.Timed(_train_step(fwd) if train else fwd, sets, grad=train, nbytes=nbytes)


def first_call(t: bench.Timed, device: torch.device) -> float:
    """Seconds of t's first call: for the compiled providers, the compile (and autotuning)."""
    start = time.perf_counter()
    with torch.set_grad_enabled(t.grad):
        t.call(*t.sets[0])
    bench.synchronize(device)
    return time.perf_counter() - start


def peak_memory(t: bench.Timed) -> int:
    """Bytes one step allocates at its peak beyond what was allocated before it: its output
    (train: the gradients), what autograd saves for the backward, temporaries. CUDA only."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.set_grad_enabled(t.grad):
        t.call(*t.sets[0])
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def kernels(t: bench.Timed) -> list[str]:
    """Names of the CUDA kernels one step of t launches (memcpy and memset left out)."""
    with torch.set_grad_enabled(t.grad):
        t.call(*t.sets[0])  # first-call work (cuBLAS setup, allocations) stays out of the count
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t.call(*t.sets[0])
            torch.cuda.synchronize()
    return [
        e.name
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
    ]


def time_in_turns(
    cell: dict, provs: list[str], timed: dict[str, bench.Timed], device, quick: bool, rounds: int
) -> None:
    """Time each provider of timed (those of provs that were prepared) `rounds` times, the
    providers taking turns round after round: a slow spell of the machine falls on all of them
    rather than on whichever ran then. Into cell, per provider of provs (None where it failed,
    the reason under cell["errors"]): ms_rounds and ms, their median; tflops (of cell["flops"],
    CUDA only) and speedup over eager; on CUDA also peak_mib and the kernel-only timing
    graph_ms_rounds, graph_ms and graph_speedup (errors["<provider> graph"] where it failed)."""
    cuda = device.type == "cuda"
    cell.update(ms={}, ms_rounds={p: [] for p in provs}, tflops={}, speedup={}, peak_mib={})
    if cuda:
        cell.update(graph_ms={}, graph_ms_rounds={p: [] for p in provs}, graph_speedup={})
    for _ in range(rounds):
        for p, t in list(timed.items()):
            try:
                cell["ms_rounds"][p].append(bench.measure(t, device, quick) * 1e3)
            except Exception as e:
                cell["errors"][p] = bench._error(e)
                del timed[p]
                continue
            if cuda and f"{p} graph" not in cell["errors"]:
                try:
                    cell["graph_ms_rounds"][p].append(bench.measure_device(t, quick) * 1e3)
                except Exception as e:
                    cell["errors"][f"{p} graph"] = bench._error(e)
    for p in provs:
        ms = statistics.median(cell["ms_rounds"][p]) if p in timed else None
        cell["ms"][p] = ms
        cell["peak_mib"][p] = peak_memory(timed[p]) / 2**20 if cuda and p in timed else None
        cell["tflops"][p] = cell["flops"] / ms / 1e9 if ms and cuda else None
        eager = cell["ms"].get("eager")  # eager comes first
        cell["speedup"][p] = eager / ms if ms and eager else None
        if cuda:
            g = cell["graph_ms_rounds"][p]
            cell["graph_ms"][p] = statistics.median(g) if p in timed and g else None
            graph, graph_eager = cell["graph_ms"][p], cell["graph_ms"].get("eager")
            cell["graph_speedup"][p] = graph_eager / graph if graph and graph_eager else None


def run(
    dims=DIMS,
    tokens: int | None = None,
    dtype: str = "bf16",
    approx=APPROX,
    modes=MODES,
    quick: bool = False,
    with_compile: bool | None = None,
    with_max_autotune: bool | None = None,
    out: str | Path | None = None,
    log: Callable[[str], None] | None = print,
    device: str | None = None,
    rounds: int = 3,
) -> dict:
    """Time every (D, mode, approximate) cell for each provider; return the results as a dict.
    out: where to write them after every cell, so a run cut short keeps what it measured.
    device: "cuda", "mps", "cpu", or None for the first present.

    tokens None: 8192 on CUDA, 256 on CPU. with_compile None: on CUDA only; with_max_autotune
    None: as with_compile. rounds: each provider's timing is repeated that many times, the
    providers taking turns; ms is the median, ms_rounds every round's. Per cell and provider: ms,
    ms_rounds, tflops, speedup (vs eager), peak_mib and first_s, None where the provider failed
    (the reason under errors); on CUDA also graph_ms, graph_ms_rounds and graph_speedup, the
    kernel-only timing (errors["<provider> graph"] where it failed); CPU: ms and speedup only.
    """
    log = log or (lambda s: None)
    device = bench.pick_device(device)
    cuda = device.type == "cuda"
    tokens = tokens or (8192 if cuda else 256)
    with_compile = cuda if with_compile is None else with_compile
    with_max_autotune = with_compile if with_max_autotune is None else with_max_autotune
    dt = bench.DTYPES[dtype]
    name = bench._device_name(device)
    result = {
        "device": name,
        "device_type": device.type,
        "slug": bench.device_slug(name),
        "torch": torch.__version__,
        "build_info": fusedops.build_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": quick,
        "dtype": dtype,
        "tokens": tokens,
        "providers": [
            p
            for p in PROVIDERS
            if any(p in providers(m, with_compile, with_max_autotune) for m in modes)
        ],
        "cells": [],
        "kernels": [],
    }
    log(f"{name}, torch {torch.__version__}, {dtype}, T={tokens}")
    if cuda:
        bench._spin_up(device)
    todo = [(d, m, a) for d in dims for m in modes for a in approx]
    for i, (d, mode, a) in enumerate(todo, 1):
        cell = {"mode": mode, "approximate": a, "d": d, "hidden": 4 * d, "tokens": tokens}
        cell.update(flops=flops(mode, tokens, d), first_s={}, errors={})
        label = f"[{i}/{len(todo)}] {mode} {a} D={d}"
        sets = input_sets(mode, tokens, d, dt, device)  # the same inputs for every provider
        provs = providers(mode, with_compile, with_max_autotune)
        timed = {}
        for p in provs:
            if p in COMPILED:
                slow = " (autotuning: minutes)" if p == "max-autotune" else ""
                log(f"{label}: {p} compiling{slow}")
            cell["first_s"][p] = None
            try:
                t = prepare(p, mode, a, tokens, d, dt, device, sets)
                cell["first_s"][p] = first_call(t, device)
                timed[p] = t
            except Exception as e:  # a failed provider is a missing cell, not a failed run
                cell["errors"][p] = bench._error(e)
        time_in_turns(cell, provs, timed, device, quick, rounds)
        for p in provs:
            log(f"{label}: {_progress(cell, p)}")
        timed = sets = None  # big shapes: free this cell's inputs before the next one's
        if cuda:
            torch.cuda.empty_cache()
        result["cells"].append(cell)
        if out:
            write(result, out)
    if cuda:
        result["kernels"] = [count_kernels(m, a, tokens, dt, device) for m in modes for a in approx]
        for k in result["kernels"]:
            log(f"CUDA kernels per {k['mode']} step, {k['approximate']}: {k['counts']}")
    return result


def count_kernels(mode: str, approximate: str, tokens: int, dtype, device) -> dict:
    """The CUDA kernels one step of eager and of fusedops launches at D = KERNELS_DIM. Run after
    all timing (a profiler session can leave launch overhead behind it) and without the compiled
    providers (they would compile again)."""
    names = {
        p: kernels(prepare(p, mode, approximate, tokens, KERNELS_DIM, dtype, device))
        for p in providers(mode, with_compile=False, with_max_autotune=False)
    }
    return {
        "mode": mode,
        "approximate": approximate,
        "d": KERNELS_DIM,
        "tokens": tokens,
        "counts": {p: len(n) for p, n in names.items()},
        "names": names,
    }


def spread(cell: dict, p: str) -> str:
    """' (fastest-slowest round)' where a provider was timed more than once."""
    r = cell.get("ms_rounds", {}).get(p) or []
    return f" ({min(r):.3f}-{max(r):.3f})" if len(r) > 1 else ""


def _progress(cell: dict, p: str) -> str:
    if cell["ms"][p] is None:
        return f"{p} failed ({cell['errors'][p]})"
    line = f"{p} {cell['ms'][p]:.3f} ms{spread(cell, p)}"
    if cell["tflops"][p]:
        line += f" {cell['tflops'][p]:.0f} TFLOP/s"
    if cell["speedup"][p]:
        line += f" {cell['speedup'][p]:.2f}x eager"
    if cell.get("graph_ms", {}).get(p):
        line += f"; kernel-only {cell['graph_ms'][p]:.3f} ms"
        if cell["graph_speedup"][p]:
            line += f" {cell['graph_speedup'][p]:.2f}x"
    if cell["peak_mib"][p] is not None:
        line += f", peak {cell['peak_mib'][p]:.0f} MiB"
    if p in COMPILED:
        line += f", first call {cell['first_s'][p]:.1f} s"
    return line


def table(result: dict) -> str:
    """One row per (cell, provider), then the kernel counts."""
    cuda = result["device_type"] == "cuda"
    head = ["mode", "approx", "D", "provider", "ms"]
    head += ["TFLOP/s", "vs eager", "graph ms", "vs eager", "peak MiB"] if cuda else ["vs eager"]
    rows = []
    for c in result["cells"]:
        for p, ms in c["ms"].items():
            row = [c["mode"], c["approximate"], str(c["d"]), p]
            row.append(f"{ms:.3f}{spread(c, p)}" if ms else "-")
            if cuda:
                row.append(f"{c['tflops'][p]:.0f}" if c["tflops"][p] else "-")
            row.append(f"{c['speedup'][p]:.2f}x" if c["speedup"][p] else "-")
            if cuda:
                graph, speedup = c.get("graph_ms", {}).get(p), c.get("graph_speedup", {}).get(p)
                row.append(f"{graph:.3f}" if graph else "-")
                row.append(f"{speedup:.2f}x" if speedup else "-")
                row.append(f"{c['peak_mib'][p]:.0f}" if c["peak_mib"][p] is not None else "-")
            rows.append(row)
    title = f"{result['device']}, torch {result['torch']}, {result['dtype']}, T={result['tokens']}"
    lines = [title, *bench.columns(head, rows, text=4)]
    if counts := result["kernels"]:
        counted = [p for p in PROVIDERS if any(p in k["counts"] for k in counts)]
        rows = [
            [k["mode"], k["approximate"], *(str(k["counts"].get(p, "-")) for p in counted)]
            for k in counts
        ]
        lines += ["", f"CUDA kernels per step, D={KERNELS_DIM}, T={result['tokens']}"]
        lines += bench.columns(["mode", "approx", *counted], rows, text=2)
    return "\n".join(lines)


def write(result: dict, out: str | Path, name: str = "fused_mlp") -> Path:
    """<out>/<device slug>-<name>.json (bench_ffm writes its own name)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{result['slug']}-{name}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def _list(kind: str, known):
    def parse(s: str) -> list[str]:
        items = s.split(",")
        if bad := [v for v in items if v not in known]:
            raise argparse.ArgumentTypeError(f"unknown {kind} {bad}; known: {', '.join(known)}")
        return items

    return parse


def _dims(s: str) -> list[int]:
    try:
        return [int(v) for v in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad dims {s!r}: expected e.g. 768,1024,4096") from None


def main(argv=None) -> None:
    if "--fully-fused" in (sys.argv[1:] if argv is None else argv):
        from fusedops.tools import bench_ffm  # its own options: --fully-fused --help

        return bench_ffm.main(argv)
    ap = argparse.ArgumentParser(
        prog="python -m fusedops.bench_mlp", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--dims", type=_dims, default=list(DIMS), help="comma list of D (hidden = 4D)")
    ap.add_argument("--tokens", type=int, help="T (default: 8192 on CUDA, 256 on CPU)")
    ap.add_argument("--dtype", default="bf16", choices=list(bench.DTYPES))
    ap.add_argument(
        "--approx", type=_list("approximate", APPROX), default=list(APPROX), help="tanh,none"
    )
    ap.add_argument("--modes", type=_list("mode", MODES), default=list(MODES), help="infer,train")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument(
        "--rounds", type=int, default=3, help="timings per provider, taken in turn (median)"
    )
    ap.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="time torch.compile (default: on CUDA only)",
    )
    ap.add_argument(
        "--max-autotune",
        action=argparse.BooleanOptionalAction,
        help="time torch.compile(mode='max-autotune-no-cudagraphs'); minutes per cell "
        "(default: as --compile)",
    )
    ap.add_argument("--device", choices=bench.DEVICES, help="default: cuda, else mps, else cpu")
    ap.add_argument(
        "--fully-fused",
        action="store_true",
        help="benchmark fusedops.nn.FullyFusedMLP instead (see --fully-fused --help)",
    )
    ap.add_argument(
        "--out",
        default=bench.DEFAULT_OUT,
        help=f"directory for the .json (default {bench.DEFAULT_OUT}/, untracked; the committed "
        "results: bench/results)",
    )
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    try:
        bench.pick_device(args.device)
    except ValueError as e:
        ap.error(str(e))

    def log(line: str) -> None:
        print(line, flush=True)

    result = run(
        args.dims,
        args.tokens,
        args.dtype,
        args.approx,
        args.modes,
        args.quick,
        args.compile,
        args.max_autotune,
        args.out,
        log,
        args.device,
        args.rounds,
    )
    print(table(result))
    print(f"wrote {write(result, args.out)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
