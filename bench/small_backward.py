"""The backward ops at small batches, where launches and fixed latencies decide: bias_gelu's
backward (dx and dbias), layer_norm's and rms_norm's (every gradient) and fused_mlp's (every
gradient, hidden = 4D), kernel-only: each cell a CUDA graph of 20 calls, median of 15 replays,
µs per call.

    python bench/small_backward.py [--dtype bf16]

Needs CUDA.
"""

import argparse
from functools import partial

import torch
from softmax_shapes import graph_ms

import fusedops  # noqa: F401  (registers torch.ops.fusedops)

BIAS_GELU = ((1, 3072), (32, 768), (64, 768), (64, 3072), (128, 3072), (256, 768), (512, 3072))
NORMS = ((8, 256), (64, 768), (512, 768), (64, 4096))
MLP = ((64, 768), (1024, 768))  # tokens, D
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    dtype = DTYPES[parser.parse_args().dtype]
    device = torch.device("cuda")
    ops = torch.ops.fusedops
    for rows, cols in BIAS_GELU:
        dy = torch.randn(rows, cols, device=device, dtype=dtype)
        x, b = torch.randn_like(dy), torch.randn(cols, device=device, dtype=dtype)
        ms = graph_ms(partial(ops.bias_gelu_bwd.default, dy, x, b, "none"), device)
        print(f"bias_gelu_bwd {rows}x{cols}: {ms * 1e3:.2f} us")
    for rows, cols in NORMS:
        x, dy = (torch.randn(rows, cols, device=device, dtype=dtype) for _ in range(2))
        w, b = (torch.randn(cols, device=device, dtype=dtype) for _ in range(2))
        _, mean, rstd = ops.layer_norm_fwd.default(x, [cols], w, b, 1e-5)
        bwd = partial(ops.layer_norm_bwd.default, dy, x, [cols], mean, rstd, w, b, [True] * 3)
        print(f"layer_norm_bwd {rows}x{cols}: {graph_ms(bwd, device) * 1e3:.2f} us")
        _, rstd = ops.rms_norm_fwd.default(x, [cols], w, None)
        bwd = partial(ops.rms_norm_bwd.default, dy, x, [cols], rstd, w, [True] * 2)
        print(f"rms_norm_bwd {rows}x{cols}: {graph_ms(bwd, device) * 1e3:.2f} us")
    for tokens, d in MLP:
        x = torch.randn(tokens, d, device=device, dtype=dtype)
        w1 = torch.randn(4 * d, d, device=device, dtype=dtype) * d**-0.5
        w2 = torch.randn(d, 4 * d, device=device, dtype=dtype) * (4 * d) ** -0.5
        b1, b2 = (
            torch.zeros(4 * d, device=device, dtype=dtype),
            torch.zeros(d, device=device, dtype=dtype),
        )
        for approx in ("none", "tanh"):
            out, pre, act = ops.mlp_fwd.default(x, w1, b1, w2, b2, approx, True, True)
            grad = torch.randn_like(out)
            bwd = partial(ops.mlp_bwd.default, grad, x, w1, w2, pre, act, approx, [True] * 5)
            ms = graph_ms(bwd, device)
            print(f"mlp_bwd {approx} T={tokens} D={d}: {ms * 1e3:.2f} us")


if __name__ == "__main__":
    main()
