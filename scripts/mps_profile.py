"""Profile fusedops beside torch eager on an Apple GPU: os_signpost intervals for Instruments,
optionally a Metal capture per call for Xcode, and the time per call of each.

    python scripts/mps_profile.py [--ops softmax_fwd,layer_norm_bwd] [--dtype bf16]
        [--shape 4096x1024] [--wait] [--capture DIR]

Instruments: record the run with the Metal System Trace template, e.g.
    xcrun xctrace record --template 'Metal System Trace' --output fusedops.trace \\
        --launch -- .venv/bin/python scripts/mps_profile.py
Each (op, provider) is timed inside torch.mps.profiler.profile(), which adds an os_signpost
interval per torch op, fusedops' ops included (--wait: each interval waits for the GPU, so it is
the op's GPU time, at the cost of serializing the run). The GPU track shows every compute
dispatch under its kernel's name (softmax_fwd_row_bfloat, ...).
--capture DIR: one call of each (op, provider) is also recorded into DIR/<op>-<provider>.gputrace
for Xcode's Metal debugger, where torch has torch.mps.profiler.metal_capture; Metal capture must be
enabled for the process: MTL_CAPTURE_ENABLED=1.

The ops, inputs and timing are fusedops.bench's (python -m fusedops.bench --device mps for the
full table with % of copy).
"""

import argparse
import sys
from pathlib import Path

import torch

from fusedops.tools import bench


def capture(timed: bench.Timed, path: Path) -> None:
    with torch.mps.profiler.metal_capture(str(path)), torch.set_grad_enabled(timed.grad):
        timed.call(*timed.sets[0])
        torch.mps.synchronize()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--ops", default=",".join(bench.DEFAULT_OPS), help="as python -m fusedops.bench"
    )
    ap.add_argument("--dtype", default="bf16", choices=list(bench.DTYPES))
    ap.add_argument("--shape", default="4096x4096", help="ROWSxN")
    ap.add_argument("--wait", action="store_true", help="signposts wait for the GPU")
    ap.add_argument("--capture", type=Path, help="directory for .gputrace files")
    args = ap.parse_args(argv)
    if not torch.backends.mps.is_available():
        sys.exit("mps_profile: no MPS device (torch.backends.mps.is_available() is False)")
    if args.capture and not (
        hasattr(torch.mps.profiler, "metal_capture")
        and torch.mps.profiler.is_metal_capture_enabled()
    ):
        sys.exit(
            f"mps_profile: --capture needs torch.mps.profiler.metal_capture (torch "
            f"{torch.__version__}) and MTL_CAPTURE_ENABLED=1 in the environment"
        )
    device = torch.device("mps")
    rows, n = bench._shape(args.shape)
    dtype = bench.DTYPES[args.dtype]
    for spec, pass_ in bench.select(args.ops.split(",")):
        op = f"{spec.name}_{pass_}"
        for provider in ("fusedops", "eager"):
            timed = bench.prepare(spec, pass_, provider, rows, n, dtype, device)
            if args.capture:
                args.capture.mkdir(parents=True, exist_ok=True)
                capture(timed, args.capture / f"{op}-{provider}.gputrace")
            with torch.mps.profiler.profile(mode="interval", wait_until_completed=args.wait):
                seconds = bench.measure(timed, device)
            gbps = timed.nbytes / seconds / 1e9
            print(
                f"{op} {args.dtype} {rows}x{n} {provider}: {seconds * 1e6:.1f} us, {gbps:.0f} GB/s"
            )
            torch.mps.empty_cache()


if __name__ == "__main__":
    main()
