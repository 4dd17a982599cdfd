"""FullyFusedMLP benchmark: fusedops.nn.FullyFusedMLP beside the nn.Sequential it replaces, eager
and compiled, in one process (python -m fusedops.bench_mlp --fully-fused ...).

The network: in = out = width, hidden_layers hidden layers of `width` features, an activation
after each (gelu by default), bias everywhere. infer: the forward under torch.no_grad; train:
forward and backward to x and every parameter. Providers: eager (the nn.Sequential), compile
(torch.compile of it), max-autotune (mode "max-autotune-no-cudagraphs"; --no-max-autotune
leaves it out) and fusedops. Per cell: ms (fusedops.bench.measure: CUDA events, median), TFLOP/s
(2 * rows * sum of in*out per layer forward, 3x that for a training step), speedup vs eager and
vs compile, peak memory of one step. Results: <out>/<device>-fully_fused_mlp.json.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Callable
from pathlib import Path

import torch

import fusedops
from fusedops.tools import bench, bench_mlp
from fusedops.tools.bench_mlp import COMPILED, first_call, peak_memory

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


def prepare(provider, mode, width, rows, layers, activation, dtype, device) -> bench.Timed:
    net = network(provider, width, layers, activation, dtype, device)
    train = mode == "train"
    x = torch.randn(rows, width, dtype=dtype, device=device, requires_grad=train)
    if not train:
        return bench.Timed(net, [(x,)], grad=False, nbytes=x.nbytes)
    params = list(net.parameters())
    dy = torch.randn(rows, width, dtype=dtype, device=device)

    def step(x, dy):
        return torch.autograd.grad(net(x), [x, *params], dy)

    return bench.Timed(step, [(x, dy)], grad=True, nbytes=2 * x.nbytes)


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
                cell = {"mode": mode, "width": width, "rows": n, "ms": {}, "peak_mib": {}}
                cell.update(flops=3 * fwd_flops if mode == "train" else fwd_flops, errors={})
                for p in provs:
                    ms = peak = None
                    try:
                        t = prepare(p, mode, width, n, layers, activation, dt, device)
                        first_call(t, device)
                        ms = bench.measure(t, device, quick) * 1e3
                        peak = peak_memory(t) / 2**20
                    except Exception as e:  # a failed provider is a missing cell
                        cell["errors"][p] = bench._error(e)
                    t = None
                    torch.cuda.empty_cache()
                    cell["ms"][p], cell["peak_mib"][p] = ms, peak
                ms = cell["ms"]
                cell["tflops"] = {p: cell["flops"] / v / 1e9 if v else None for p, v in ms.items()}
                cell["speedup"] = {
                    p: ms["eager"] / v if v and ms.get("eager") else None for p, v in ms.items()
                }
                result["cells"].append(cell)
                log(row(cell, provs))
                if out:
                    write(result, out)
    return result


def row(cell: dict, provs) -> str:
    def fmt(p):
        ms, sp = cell["ms"][p], cell["speedup"][p]
        return f"{p} {ms:.3f} ms ({sp:.2f}x)" if ms else f"{p} failed"

    head = f"{cell['mode']:5} width {cell['width']:3} rows {cell['rows']:>8}"
    return head + ": " + ", ".join(fmt(p) for p in provs)


def table(result: dict) -> str:
    provs = result["providers"]
    lines = [
        f"FullyFusedMLP, {result['device']}, {result['dtype']}, {result['layers']} hidden layers "
        f"of width = in = out, {result['activation']}: ms (speedup vs eager)",
        "",
        "| mode | width | rows | " + " | ".join(provs) + " | fusedops vs compile |",
        "| --- | --- | --- | " + " | ".join("---" for _ in provs) + " | --- |",
    ]
    for c in result["cells"]:
        cells = []
        for p in provs:
            ms, sp = c["ms"][p], c["speedup"][p]
            cells.append(f"{ms:.3f} ({sp:.2f}x)" if ms else "failed")
        ours, comp = c["ms"].get("fusedops"), c["ms"].get("compile")
        vs = f"{comp / ours:.2f}x" if ours and comp else "-"
        lines.append(
            f"| {c['mode']} | {c['width']} | {c['rows']} | " + " | ".join(cells) + f" | {vs} |"
        )
    return "\n".join(lines)


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
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--max-autotune", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--out", default=bench.DEFAULT_OUT)
    a = ap.parse_args(argv)
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
    )
    print(table(result))
    print(f"wrote {write(result, a.out)}")
