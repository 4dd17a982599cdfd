"""softmax and log_softmax beside torch's at shapes the kernel benchmark doesn't cover, on the
default device (CUDA, else CPU): dims other than the last and their layouts, and short rows,
forward and backward (the backward ops alone, given torch's forward output). Median of 7 runs
of 10 calls, ms, fusedops / torch; with --graph (CUDA), kernel-only: each cell a CUDA graph of
20 calls, median of 15 replays.

    python bench/softmax_shapes.py [--device cpu|cuda] [--graph] [--rows-only]
"""

import argparse
import statistics
import time

import torch

import fusedops

DIM_CASES = (  # shape, dim, layout
    ((16, 21, 128, 128), 1, "contiguous"),
    ((16, 21, 128, 128), 1, "channels_last"),
    ((8, 150, 128, 128), 1, "channels_last"),
    ((64, 12, 197, 197), 2, "contiguous"),
    ((4096, 1024), 0, "contiguous"),
    ((1024, 4096), 0, "transposed"),
)
ROW_CASES = (
    (262144, 21),
    (262144, 32),
    (262144, 64),
    (262144, 128),
    (262144, 256),
    (262144, 197),
    (131072, 512),
    (65536, 100),
    (151296, 197),
    (4096, 1024),
)


def median_ms(f, device: torch.device, reps: int = 10) -> float:
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    f()
    sync()
    runs = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(reps):
            f()
        sync()
        runs.append((time.perf_counter() - start) / reps * 1e3)
    return statistics.median(runs)


def graph_ms(f, device: torch.device, calls: int = 20) -> float:
    """Kernel-only: a CUDA graph of `calls` calls, median of 15 replays, ms per call."""
    for _ in range(3):
        f()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            f()
    graph.replay()
    runs = []
    for _ in range(15):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / calls)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--graph", action="store_true", help="kernel-only (CUDA graph replays)")
    parser.add_argument("--rows-only", action="store_true", help="only the short-row cases")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.graph and device.type != "cuda":
        parser.error(f"--graph times CUDA graphs; --device is {device.type}")
    timed = graph_ms if args.graph else median_ms
    ops = torch.ops
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        for shape, dim, layout in () if args.rows_only else DIM_CASES:
            x = torch.randn(shape, device=device, dtype=dtype)
            if layout == "channels_last":
                x = x.contiguous(memory_format=torch.channels_last)
            elif layout == "transposed":
                x = x.t()
            y = torch.softmax(x, dim)
            g = torch.randn_like(y)
            fwd = (
                timed(lambda x=x, dim=dim: fusedops.softmax(x, dim), device),
                timed(lambda x=x, dim=dim: torch.softmax(x, dim), device),
            )
            bwd = (
                timed(lambda g=g, y=y, d=dim: ops.fusedops.softmax_bwd(g, y, d, False), device),
                timed(
                    lambda g=g, y=y, d=dim: ops.aten._softmax_backward_data(g, y, d, y.dtype),
                    device,
                ),
            )
            print(
                f"{name:8} softmax {str(list(x.shape)):18} dim {dim:2} {layout:13} "
                f"fwd {fwd[0]:7.3f} / {fwd[1]:7.3f} ({fwd[1] / fwd[0]:.2f}x)  "
                f"bwd {bwd[0]:7.3f} / {bwd[1]:7.3f} ({bwd[1] / bwd[0]:.2f}x)"
            )
        for rows, cols in ROW_CASES:
            x = torch.randn(rows, cols, device=device, dtype=dtype)
            g = torch.randn_like(x)
            cells = []
            for log in (False, True):
                y = (torch.log_softmax if log else torch.softmax)(x, -1)
                aten_fwd = torch._log_softmax if log else torch._softmax
                aten_bwd = (
                    ops.aten._log_softmax_backward_data if log else ops.aten._softmax_backward_data
                )
                times = (
                    timed(lambda x=x, log=log: ops.fusedops.softmax_fwd(x, -1, log), device),
                    timed(lambda x=x, f=aten_fwd: f(x, -1, False), device),
                    timed(
                        lambda g=g, y=y, log=log: ops.fusedops.softmax_bwd(g, y, -1, log), device
                    ),
                    timed(lambda g=g, y=y, f=aten_bwd: f(g, y, -1, y.dtype), device),
                )
                op = "log_softmax" if log else "softmax"
                cells.append(
                    f"{op} fwd {times[0]:.2f} / {times[1]:.2f}, bwd {times[2]:.2f} / {times[3]:.2f}"
                )
            print(f"{name:8} rows {rows}x{cols}: " + " | ".join(cells))


if __name__ == "__main__":
    main()
