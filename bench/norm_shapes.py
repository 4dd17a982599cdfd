"""layer_norm and rms_norm beside torch's at the short and model-width rows the kernel benchmark
doesn't cover (attention heads' q/k norms, 768-wide hidden states), forward and backward (the
backward ops alone, every gradient), kernel-only: each cell a CUDA graph of 20 calls, median of
15 replays, µs per call, fusedops / torch, and fusedops' GB/s (bytes it must move / time).
rms_norm has no torch backward op to time alone: its torch cell is empty.

    python bench/norm_shapes.py [--dtypes bf16,fp32] [--shapes 262144x64,65536x768]
                                [--ops layer_norm_bwd,rms_norm_bwd] [--no-torch]

Needs CUDA.
"""

import argparse

import torch
from softmax_shapes import graph_ms

import fusedops  # noqa: F401  (registers torch.ops.fusedops)

SHAPES = (
    (262144, 16),
    (262144, 64),
    (262144, 128),
    (262144, 256),
    (65536, 384),
    (65536, 768),
    (65536, 1024),
    (32768, 1536),
    (4096, 1024),
)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
OPS = ("layer_norm", "layer_norm_bwd", "rms_norm", "rms_norm_bwd")


def cases(x: torch.Tensor, eps: float = 1e-5) -> dict:
    """op -> (fusedops call, torch's call or None, tensors of x's size the op must move)."""
    ops, cols = torch.ops, x.shape[-1]
    g = torch.randn_like(x)
    w, b = torch.randn(2, cols, device=x.device, dtype=x.dtype)
    _, mean, rstd = ops.aten.native_layer_norm(x, [cols], w, b, eps)
    _, rms_rstd = ops.fusedops.rms_norm_fwd(x, [cols], w, eps)
    every = [True, True, True]
    return {
        "layer_norm": (
            lambda: ops.fusedops.layer_norm_fwd(x, [cols], w, b, eps),
            lambda: ops.aten.native_layer_norm(x, [cols], w, b, eps),
            2,
        ),
        "layer_norm_bwd": (
            lambda: ops.fusedops.layer_norm_bwd(g, x, [cols], mean, rstd, w, b, every),
            lambda: ops.aten.native_layer_norm_backward(g, x, [cols], mean, rstd, w, b, every),
            3,
        ),
        "rms_norm": (
            lambda: ops.fusedops.rms_norm_fwd(x, [cols], w, eps),
            lambda: torch.nn.functional.rms_norm(x, [cols], w, eps),
            2,
        ),
        "rms_norm_bwd": (
            lambda: ops.fusedops.rms_norm_bwd(g, x, [cols], rms_rstd, w, every[:2]),
            None,
            3,
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--shapes", default=",".join(f"{r}x{c}" for r, c in SHAPES))
    parser.add_argument("--ops", default=",".join(OPS), help="a comma-separated subset of OPS")
    parser.add_argument("--no-torch", action="store_true", help="time fusedops only")
    args = parser.parse_args()
    ops = args.ops.split(",")
    if unknown := [op for op in ops if op not in OPS]:
        parser.error(f"--ops: unknown {unknown}; choose from {', '.join(OPS)}")
    if not torch.cuda.is_available():
        parser.error("needs CUDA")
    device = torch.device("cuda")
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    for dtype_name in args.dtypes.split(","):
        for rows, cols in shapes:
            x = torch.randn(rows, cols, device=device, dtype=DTYPES[dtype_name])
            for op, (ours, theirs, tensors) in cases(x).items():
                if op not in ops:
                    continue
                if args.no_torch:
                    theirs = None
                us = 1e3 * graph_ms(ours, device)
                gbs = tensors * x.numel() * x.element_size() / us / 1e3
                torch_us = f"{1e3 * graph_ms(theirs, device):8.2f}" if theirs else f"{'':8}"
                print(
                    f"{dtype_name:4} {op:14} {rows}x{cols:<6} fusedops {us:8.2f} us "
                    f"({gbs:5.0f} GB/s)  torch {torch_us}"
                )


if __name__ == "__main__":
    main()
