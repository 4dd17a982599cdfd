"""softmax and log_softmax beside torch's on the CPU over short rows that stay in cache (the
sizes where the per-row reductions, not memory, decide), forward and backward (the backward op
alone, given fusedops' forward output). Each cell: median of 7 runs of about 3M elements' worth
of calls, µs per call, fusedops / torch and torch's time over fusedops'.

    python bench/cpu_short_rows.py [--threads 2] [--json FILE]

To compare two builds, run it in each tree in turn (twice or more: this is a shared machine).
"""

import argparse
import json
import statistics
import time

import torch

import fusedops

SHAPES = (
    (64, 17),
    (512, 17),
    (4352, 17),
    (512, 48),
    (4352, 48),
    (64, 100),
    (512, 100),
    (4352, 100),
    (16384, 64),
    (16384, 128),
    (512, 255),
    (4096, 255),
    (1024, 1000),
    (4096, 1024),
    (256, 8192),
    (64, 32768),
)


def median_us(f, calls: int) -> float:
    for _ in range(max(3, calls // 10)):
        f()
    runs = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(calls):
            f()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the cells here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ops = torch.ops
    cells = {}
    for dtype in (torch.float32, torch.bfloat16):
        for rows, cols in SHAPES:
            calls = max(5, 3_000_000 // (rows * cols))
            x = torch.randn(rows, cols, dtype=dtype)
            for log in (False, True):
                y = (fusedops.log_softmax if log else fusedops.softmax)(x, -1)
                g = torch.randn_like(y)
                torch_fwd = torch.log_softmax if log else torch.softmax
                torch_bwd = (
                    ops.aten._log_softmax_backward_data if log else ops.aten._softmax_backward_data
                )
                us = [
                    median_us(lambda x=x, log=log: ops.fusedops.softmax_fwd(x, -1, log), calls),
                    median_us(lambda x=x, f=torch_fwd: f(x, -1), calls),
                    median_us(
                        lambda g=g, y=y, log=log: ops.fusedops.softmax_bwd(g, y, -1, log), calls
                    ),
                    median_us(lambda g=g, y=y, f=torch_bwd: f(g, y, -1, y.dtype), calls),
                ]
                name = f"{'log_softmax' if log else 'softmax'} {str(dtype)[6:]} {rows}x{cols}"
                cells[name] = us
                print(
                    f"{name:32} fwd {us[0]:8.1f} / {us[1]:8.1f} ({us[1] / us[0]:.2f}x)  "
                    f"bwd {us[2]:8.1f} / {us[3]:8.1f} ({us[3] / us[2]:.2f}x)",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cells, f, indent=1)


if __name__ == "__main__":
    main()
