"""What a norm's params cost its forward: layer_norm with weight and bias, weight alone, bias alone
and none, beside rms_norm with a weight, at the benchmark's long-row shapes. Host-timed
back-to-back calls (median of 5 runs of 50), % of a 1 GiB device-to-device copy timed in the
same process.

    python bench/norm_params.py [label]

Needs CUDA.
"""

import statistics
import sys

import torch

import fusedops

SHAPES = ((512, 262144), (1024, 131072), (4096, 32768))
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def median_us(f, reps: int = 50) -> float:
    for _ in range(5):
        f()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            f()
        end.record()
        torch.cuda.synchronize()
        runs.append(start.elapsed_time(end) * 1000 / reps)
    return statistics.median(runs)


def main() -> None:
    buf = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    half = 1 << 30
    copy_gbs = 2 * half / median_us(lambda: buf[:half].copy_(buf[half:]), 10) / 1e3
    print(f"{sys.argv[1] if len(sys.argv) > 1 else ''}: copy {copy_gbs:.0f} GB/s")
    for dtype in DTYPES:
        for rows, cols in SHAPES:
            x = torch.randn(rows, cols, dtype=dtype, device="cuda")
            w = torch.randn(cols, dtype=dtype, device="cuda")
            b = torch.randn(cols, dtype=dtype, device="cuda")
            cases = {
                "ln w,b": (fusedops.layer_norm, (x, [cols], w, b)),
                "ln w": (fusedops.layer_norm, (x, [cols], w, None)),
                "ln b": (fusedops.layer_norm, (x, [cols], None, b)),
                "ln none": (fusedops.layer_norm, (x, [cols])),
                "rms w": (fusedops.rms_norm, (x, [cols], w)),
            }
            gb = 2 * x.numel() * x.element_size() / 1e9
            cells = []
            for name, (op, args) in cases.items():
                us = median_us(lambda op=op, args=args: op(*args))
                cells.append(f"{name} {100 * gb * 1e6 / us / copy_gbs:.1f}")
            print(f"  {str(dtype).removeprefix('torch.')} {rows}x{cols}:", " | ".join(cells))


if __name__ == "__main__":
    main()
