"""softmax and log_softmax beside torch's on the CPU over short rows that stay in cache (the
sizes where the per-row reductions, not memory, decide), forward and backward (the backward op
alone, given fusedops' forward output). Each timing: median of 7 runs of about 3M elements' worth
of calls (softmax_shapes.median_ms); each cell warms both up, then times them in turns for
--rounds rounds, either one first in alternate rounds, and reports the median round: µs per call,
fusedops / torch and torch's time over fusedops'. (Timed once each, fusedops first, whichever ran
first at a shape often read 10-30% slow.)

    python bench/cpu_short_rows.py [--threads 2] [--rounds 3] [--json FILE]

To compare two builds, run it in each tree in turn (twice or more: this is a shared machine).
"""

import argparse
import json
import statistics
import time

import torch
from softmax_shapes import median_ms

import fusedops

WARMUP_S = 0.2  # per op and cell, before its rounds

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the cells here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ops = torch.ops
    cpu = torch.device("cpu")

    def warm(f) -> None:
        end = time.perf_counter() + WARMUP_S
        while time.perf_counter() < end:
            f()

    def pair_us(f, g, calls: int) -> tuple[float, float]:
        """(f's, g's) median round, µs per call; warmed up, then in turns, either first."""
        warm(f)
        warm(g)
        rounds = ([], [])
        for r in range(args.rounds):
            for k in (0, 1) if r % 2 == 0 else (1, 0):
                rounds[k].append(median_ms((f, g)[k], cpu, calls) * 1e3)
        return statistics.median(rounds[0]), statistics.median(rounds[1])

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
                times = [
                    *pair_us(
                        lambda x=x, log=log: ops.fusedops.softmax_fwd(x, -1, log),
                        lambda x=x, f=torch_fwd: f(x, -1),
                        calls,
                    ),
                    *pair_us(
                        lambda g=g, y=y, log=log: ops.fusedops.softmax_bwd(g, y, -1, log),
                        lambda g=g, y=y, f=torch_bwd: f(g, y, -1, y.dtype),
                        calls,
                    ),
                ]
                name = f"{'log_softmax' if log else 'softmax'} {str(dtype)[6:]} {rows}x{cols}"
                cells[name] = times
                fwd, torch_fwd_us, bwd, torch_bwd_us = times
                print(
                    f"{name:32} fwd {fwd:8.1f} / {torch_fwd_us:8.1f} ({torch_fwd_us / fwd:.2f}x)  "
                    f"bwd {bwd:8.1f} / {torch_bwd_us:8.1f} ({torch_bwd_us / bwd:.2f}x)",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cells, f, indent=1)


if __name__ == "__main__":
    main()
