"""Resource report of fusedops' CUDA kernels: per launch configuration, registers per thread,
shared memory (static + dynamic), local memory, the block-size limit, and the theoretical
occupancy with the resource that limits it.

    python -m fusedops.tools.kernels [--device 0] [--json PATH]

It records the launch configurations the kernels really get (block size, dynamic shared memory,
cluster size) while running every op forward and backward over the benchmark shapes in each
dtype, then asks the CUDA runtime (cudaFuncGetAttributes, the occupancy API) about each. Resident
blocks per SM are the runtime's; the per-resource limits beside them are computed here from the
device's limits, to name what binds first.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass

import torch

REG_ALLOC_UNIT = 256  # registers are allocated per warp in units of 256
SUB_PARTITIONS = 4  # an SM's register file is split between 4 schedulers (sm_70 on)
SMEM_ALLOC_UNIT = 128  # bytes


@dataclass(frozen=True)
class Device:
    cc: str
    sm_count: int
    regs_per_sm: int
    smem_per_sm: int
    threads_per_sm: int
    blocks_per_sm: int
    reserved_smem_per_block: int


@dataclass(frozen=True)
class Kernel:
    name: str  # demangled
    threads: int  # per block, as launched
    dynamic_smem: int
    cluster: int
    calls: int  # launches recorded with this configuration
    regs: int  # per thread
    static_smem: int
    local_bytes: int  # per thread: register spills and local arrays
    max_threads: int  # the most threads per block this kernel can be launched with
    max_dynamic_smem: int
    active_blocks_per_sm: int  # from the occupancy API
    active_clusters: int | None = None  # per GPU, for cluster launches


def _fields(line: str) -> tuple[str, dict[str, str]]:
    kind, *pairs = line.rstrip("\n").split("\t")
    return kind, dict(p.split("=", 1) for p in pairs)


def parse_report(text: str) -> tuple[Device, list[Kernel]]:
    """fusedops::cuda_kernel_report's lines: one "device" line, then one "kernel" line per
    launch configuration; tab-separated key=value fields."""
    device, kernels = None, []
    for line in text.splitlines():
        if not line:
            continue
        kind, f = _fields(line)
        if kind == "device":
            device = Device(f.pop("cc"), **{k: int(v) for k, v in f.items()})
        elif kind == "kernel":
            name = f.pop("name")
            kernels.append(Kernel(name, **{k: int(v) for k, v in f.items()}))
        else:
            raise ValueError(f"fusedops.tools.kernels.parse_report: unknown line kind {kind!r}")
    if device is None:
        raise ValueError("fusedops.tools.kernels.parse_report: no device line")
    return device, kernels


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def block_limits(k: Kernel, dev: Device) -> dict[str, int]:
    """Blocks per SM each resource allows on its own (the occupancy calculator's rules; the
    runtime may allow fewer, e.g. for its shared-memory carveout)."""
    warps = -(-k.threads // 32)
    limits = {"threads": dev.threads_per_sm // (warps * 32), "blocks": dev.blocks_per_sm}
    if k.regs:
        regs_per_warp = _round_up(k.regs * 32, REG_ALLOC_UNIT)
        per_partition = dev.regs_per_sm // SUB_PARTITIONS // regs_per_warp
        limits["registers"] = per_partition * SUB_PARTITIONS // warps
    smem = _round_up(k.static_smem + k.dynamic_smem + dev.reserved_smem_per_block, SMEM_ALLOC_UNIT)
    limits["shared memory"] = dev.smem_per_sm // smem
    return limits


def limiter(k: Kernel, dev: Device) -> str:
    """The resource(s) whose limit is the smallest, e.g. "registers" or "threads/registers"."""
    limits = block_limits(k, dev)
    least = min(limits.values())
    return "/".join(r for r, n in limits.items() if n == least)


def occupancy(k: Kernel, dev: Device) -> float:
    """Theoretical occupancy: resident warps per SM (the runtime's blocks) / the SM's maximum."""
    return k.active_blocks_per_sm * math.ceil(k.threads / 32) / (dev.threads_per_sm // 32)


def short_name(name: str, width: int = 60) -> str:
    """'void fusedops::(anonymous namespace)::foo_kernel<float, 4>(Args, long)' ->
    'foo_kernel<float, 4>', cut to width."""
    name = name.removeprefix("void ")
    if name.endswith(")"):  # drop the parameter list: back to its matching "("
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    for prefix in ("(anonymous namespace)::", "fusedops::", "softmax_rows::", "at::native::"):
        name = name.replace(prefix, "")
    return name if len(name) <= width else name[: width - 1] + "…"


def table(dev: Device, kernels: list[Kernel], width: int = 98) -> str:
    """Each kernel's name, then one row per launch configuration; fits 100 columns."""
    head = ["block", "cluster", "regs", "smem st", "smem dyn", "local"]
    head += ["blk/SM", "occ %", "limited by", "calls"]
    groups: dict[str, list[list[str]]] = {}
    for k in sorted(kernels, key=lambda k: (short_name(k.name, 999), k.threads, k.dynamic_smem)):
        flag = "" if k.active_blocks_per_sm == min(block_limits(k, dev).values()) else "*"
        groups.setdefault(short_name(k.name, width), []).append(
            [
                f"{k.threads}/{k.max_threads}",
                str(k.cluster),
                str(k.regs),
                str(k.static_smem),
                str(k.dynamic_smem),
                str(k.local_bytes),
                f"{k.active_blocks_per_sm}{flag}",
                f"{100 * occupancy(k, dev):.0f}",
                limiter(k, dev),
                str(k.calls),
            ]
        )
    rows = [r for g in groups.values() for r in g]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def fmt(r):
        cells = zip(r, widths, strict=True)
        return "    " + "  ".join(
            v.ljust(w) if i == 8 else v.rjust(w) for i, (v, w) in enumerate(cells)
        )

    title = (
        f"sm_{dev.cc.replace('.', '')}, {dev.sm_count} SMs: {dev.regs_per_sm} registers, "
        f"{dev.smem_per_sm // 1024} KiB shared memory, {dev.threads_per_sm} threads, "
        f"{dev.blocks_per_sm} blocks per SM"
    )
    lines = [title, "kernel", fmt(head)]
    for name, configs in groups.items():
        lines += [name, *map(fmt, configs)]
    notes = [
        "block: threads launched / the kernel's maximum; smem in bytes per block; local: bytes per",
        "thread; blk/SM: the occupancy API's resident blocks (*: fewer than each per-resource",
        "limit computed here allows); occ %: resident warps / the SM's maximum.",
    ]
    return "\n".join([*lines, *notes])


def exercise(device: torch.device) -> None:
    """Every op forward and backward at the benchmark shapes (each kernel path) and at a few
    small and odd ones (the scalar paths), in each dtype its CUDA kernels take."""
    import fusedops
    from fusedops.tools.bench import SHAPES

    shapes = [(1, 7), (64, 1000), (8, 256), *SHAPES]
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        for rows, n in shapes:

            def rand(*shape, dt=dtype):
                return torch.randn(*shape, dtype=dt, device=device, requires_grad=True)

            x, w, b = rand(rows, n), rand(n), rand(n)
            runs = [fusedops.softmax(x), fusedops.log_softmax(x)]
            runs += [fusedops.bias_gelu(x, b, a) for a in ("none", "tanh")]
            if dtype != torch.float64:  # the CUDA norms take fp32, fp16, bf16
                runs += [fusedops.layer_norm(x, [n], w, b), fusedops.rms_norm(x, [n], w)]
                if dtype != torch.float32:  # fp32 parameters with half-precision activations
                    w32, b32 = rand(n, dt=torch.float32), rand(n, dt=torch.float32)
                    runs += [fusedops.layer_norm(x, [n], w32, b32), fusedops.rms_norm(x, [n], w32)]
            for y in runs:
                y.backward(torch.randn_like(y))
            del x, w, b, runs
            torch.cuda.empty_cache()
    for approximate in ("none", "tanh"):  # the MLP's GELU epilogues
        x = torch.randn(64, 256, device=device, dtype=torch.bfloat16, requires_grad=True)
        mlp = fusedops.FusedMLP(256, 1024, approximate=approximate).to(device, torch.bfloat16)
        mlp(x).sum().backward()
    torch.cuda.synchronize(device)


def report(device: torch.device) -> tuple[Device, list[Kernel]]:
    """Record the launches of exercise() and the runtime's answers about each."""
    ops = torch.ops.fusedops
    ops.cuda_kernel_recording(True)
    try:
        exercise(device)
    finally:
        ops.cuda_kernel_recording(False)
    return parse_report(ops.cuda_kernel_report(device.index or 0))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m fusedops.tools.kernels", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--device", type=int, default=0, help="CUDA device index")
    ap.add_argument("--json", help="also write the report as JSON to this path")
    args = ap.parse_args(argv)
    import fusedops

    if not torch.cuda.is_available():
        sys.exit("fusedops.tools.kernels: no CUDA device (the report is about CUDA kernels)")
    if not hasattr(torch.ops.fusedops, "cuda_kernel_report"):
        sys.exit(f"fusedops.tools.kernels: this build has no CUDA kernels: {fusedops.build_info()}")
    dev, kernels = report(torch.device("cuda", args.device))
    print(table(dev, kernels))
    if args.json:
        data = {"device": asdict(dev), "kernels": [asdict(k) for k in kernels]}
        for k in data["kernels"]:
            k_obj = Kernel(**k)
            k.update(limits=block_limits(k_obj, dev), limiter=limiter(k_obj, dev))
            k["occupancy"] = occupancy(k_obj, dev)
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
