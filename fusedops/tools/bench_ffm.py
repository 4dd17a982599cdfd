"""FullyFusedMLP benchmark: fusedops.nn.FullyFusedMLP beside the nn.Sequential it replaces, eager
and compiled, in one process (python -m fusedops.bench_mlp --fully-fused ...).

The network: in = out = width, hidden_layers hidden layers of `width` features, an activation
after each (gelu by default), bias everywhere. infer: the forward under torch.no_grad; train:
forward and backward to x and every parameter. Providers: eager (the nn.Sequential), compile
(torch.compile of it), max-autotune (mode "max-autotune-no-cudagraphs"; --no-max-autotune
leaves it out) and fusedops. Timing as bench_mlp's: every provider on the same inputs (rotated
past L2), taking turns --rounds times (median round, the fastest and slowest beside it), each
also timed kernel-only (a CUDA graph of its calls). Per cell: ms, TFLOP/s (2 * rows * sum of
in*out per layer forward, 3x that for a training step), speedup vs eager and vs compile, both
host-timed and kernel-only, peak memory of one step. Results: <out>/<device>-fully_fused_mlp.json.
"""

from __future__ import annotations

import argparse
import datetime
import math
from collections.abc import Callable
from pathlib import Path

import torch

import fusedops
from fusedops.tools import bench, bench_mlp
from fusedops.tools.bench_mlp import COMPILED, first_call, spread, time_in_turns

WIDTHS = (64, 128)
ROWS = (2**18, 2**21)
PROVIDERS = ("eager", "compile", "max-autotune", "fusedops")


def network(provider: str, width: int, layers: int, activation: str, dtype, device):
    """provider's module (compiled ones compile on their first call) and its parameters."""
    torch.manual_seed(0)
    mlp = fusedops.nn.FullyFusedMLP(width, width, width, layers, activation=activation)
    mlp = mlp.to(device=device, dtype=dtype)
    if provider == "fusedops":
        return mlp
    seq = torch.nn.Sequential(*mlp)
    if provider in COMPILED:
        torch._dynamo.reset()
        mode = "max-autotune-no-cudagraphs" if provider == "max-autotune" else None
        return torch.compile(seq, mode=mode, dynamic=False, fullgraph=True)
    return seq


def input_sets(mode, width, rows, dtype, device) -> list[tuple[torch.Tensor, ...]]:
    """Enough (x,) or (x, dy) sets to rotate past L2; x requires grad for train."""
    train = mode == "train"

    def one():
        x = torch.randn(rows, width, dtype=dtype, device=device, requires_grad=train)
        return (x, torch.randn(rows, width, dtype=dtype, device=device)) if train else (x,)

    first = one()
    nbytes = sum(t.nbytes for t in first)
    k = max(1, math.ceil(bench.L2_ROTATE * bench._cache_bytes(device) / nbytes))
    return [first] + [one() for _ in range(k - 1)]


def prepare(provider, mode, width, layers, activation, dtype, device, sets) -> bench.Timed:
    net = network(provider, width, layers, activation, dtype, device)
    nbytes = sum(t.nbytes for t in sets[0])
    if mode != "train":
        return bench.Timed(net, sets, grad=False, nbytes=nbytes)
    params = list(net.parameters())

    def step(x, dy):
        return torch.autograd.grad(net(x), [x, *params], dy)

    return bench.Timed(step, sets, grad=True, nbytes=nbytes)


def run(
    widths=WIDTHS,
    rows=ROWS,
    layers: int = 4,
    activation: str = "gelu",
    dtype: str = "bf16",
    modes=("infer", "train"),
    quick: bool = False,
    with_compile: bool = True,
    with_max_autotune: bool = True,
    out: str | Path | None = None,
    log: Callable[[str], None] = print,
    rounds: int = 3,
) -> dict:
    device = bench.pick_device("cuda")
    dt = bench.DTYPES[dtype]
    name = bench._device_name(device)
    offered = {"compile": with_compile, "max-autotune": with_max_autotune}
    provs = [p for p in PROVIDERS if offered.get(p, True)]
    result = {
        "device": name,
        "slug": bench.device_slug(name),
        "torch": torch.__version__,
        "build_info": fusedops.build_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": quick,
        "rounds": rounds,
        "dtype": dtype,
        "layers": layers,
        "activation": activation,
        "providers": provs,
        "cells": [],
    }
    log(f"{name}, torch {torch.__version__}, {dtype}, {layers} hidden layers, {activation}")
    bench._spin_up(device)
    for width in widths:
        for n in rows:
            for mode in modes:
                fwd_flops = 2 * n * width * width * (layers + 1)
                cell = {"mode": mode, "width": width, "rows": n, "first_s": {}, "errors": {}}
                cell["flops"] = 3 * fwd_flops if mode == "train" else fwd_flops
                sets = input_sets(mode, width, n, dt, device)  # the same for every provider
                timed = {}
                for p in provs:
                    cell["first_s"][p] = None
                    try:
                        t = prepare(p, mode, width, layers, activation, dt, device, sets)
                        cell["first_s"][p] = first_call(t, device)
                        timed[p] = t
                    except Exception as e:  # a failed provider is a missing cell
                        cell["errors"][p] = bench._error(e)
                time_in_turns(cell, provs, timed, device, quick, rounds)
                timed = sets = None
                torch.cuda.empty_cache()
                result["cells"].append(cell)
                log(row(cell, provs))
                if out:
                    write(result, out)
    return result


def _vs(cell: dict, key: str, p: str, base: str) -> str:
    """p's speedup over base by cell[key] (ms or graph_ms), or '-'."""
    ours, theirs = cell[key].get(p), cell[key].get(base)
    return f"{theirs / ours:.2f}x" if ours and theirs else "-"


def row(cell: dict, provs) -> str:
    def fmt(p):
        ms, graph = cell["ms"][p], cell["graph_ms"][p]
        if not ms:
            return f"{p} failed"
        kernels = f", kernel-only {_vs(cell, 'graph_ms', p, 'eager')}" if graph else ""
        return f"{p} {ms:.3f} ms{spread(cell, p)} ({_vs(cell, 'ms', p, 'eager')}{kernels})"

    head = f"{cell['mode']:5} width {cell['width']:3} rows {cell['rows']:>8}"
    return head + ": " + ", ".join(fmt(p) for p in provs)


def table(result: dict) -> str:
    """One row per (cell, provider): host-timed ms (fastest-slowest round), kernel-only ms, and
    the speedups of each over eager and compile."""
    head = ["mode", "width", "rows", "provider", "ms", "vs eager", "vs compile"]
    head += ["graph ms", "vs eager", "vs compile", "TFLOP/s", "peak MiB"]
    rows = []
    for c in result["cells"]:
        for p in result["providers"]:
            ms, graph, peak, tflops = c["ms"][p], c["graph_ms"][p], c["peak_mib"][p], c["tflops"][p]
            rows.append(
                [
                    c["mode"],
                    str(c["width"]),
                    str(c["rows"]),
                    p,
                    f"{ms:.3f}{spread(c, p)}" if ms else "failed",
                    _vs(c, "ms", p, "eager"),
                    _vs(c, "ms", p, "compile"),
                    f"{graph:.3f}" if graph else "-",
                    _vs(c, "graph_ms", p, "eager"),
                    _vs(c, "graph_ms", p, "compile"),
                    f"{tflops:.0f}" if tflops else "-",
                    f"{peak:.0f}" if peak is not None else "-",
                ]
            )
    title = (
        f"FullyFusedMLP, {result['device']}, torch {result['torch']}, {result['dtype']}, "
        f"{result['layers']} hidden layers of width = in = out, {result['activation']}, "
        f"median of {result['rounds']} rounds"
    )
    return "\n".join([title, *bench.columns(head, rows, text=4)])


def write(result: dict, out: str | Path) -> Path:
    return bench_mlp.write(result, out, "fully_fused_mlp")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m fusedops.bench_mlp --fully-fused")
    ap.add_argument("--fully-fused", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--activation", default="gelu", choices=["gelu", "gelu_tanh", "relu", "none"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--modes", default="infer,train")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="timings per provider, taken in turn")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--max-autotune", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--out", default=bench.DEFAULT_OUT)
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {a.rounds}")
    result = run(
        widths=[int(w) for w in a.widths.split(",")],
        rows=[int(r) for r in a.rows.split(",")],
        layers=a.layers,
        activation=a.activation,
        dtype=a.dtype,
        modes=a.modes.split(","),
        quick=a.quick,
        with_compile=a.compile,
        with_max_autotune=a.max_autotune and a.compile,
        out=a.out,
        rounds=a.rounds,
    )
    print(table(result))
    print(f"wrote {write(result, a.out)}")
