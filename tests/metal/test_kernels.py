"""Check 2: the MSL kernels of metal/kernels run on the CPU emulator (ASan + UBSan), in forward
and reverse thread order, against the fp64 references under the suite's tolerance rule (torch's
own CPU op at the same dtype is the comparison), for every op, dtype, tier and edge shape.

Launch shapes follow the host (csrc/mps): row tier with the host's threads per threadgroup,
looped tier with small threadgroups (any multiple of 32 must work: the host takes the pipeline's
maximum), 32 floats of threadgroup scratch, weight gradients as partials summed by colsum."""

import functools
import math
import re

import pytest
import torch
import torch.nn.functional as F
from mslcheck import KERNEL_DIR, Emulator
from reference import (
    assert_close_to_reference,
    assert_softmax_backward_close,
    assert_softmax_close,
    make_input,
)

DTYPES = {"float": torch.float32, "half": torch.float16, "bfloat": torch.bfloat16}
ORDERS = ("fwd", "rev")
SCRATCH_BYTES = 32 * 4
ROW_VALUES = int(re.search(r"kMetalRowValues = (\d+)", (KERNEL_DIR / "params.h").read_text())[1])
LOOPED_THREADS = 96  # three SIMD groups: not a power of two
NAN = float("nan")


@functools.cache
def emulator(name: str) -> Emulator:
    return Emulator(KERNEL_DIR / f"{name}.metal", KERNEL_DIR / "params.h")


def threads(tier: str, cols: int) -> int:
    """The host's row_plan for the row tier; small threadgroups for the looped one."""
    if tier == "looped":
        return LOOPED_THREADS
    return max(32, math.ceil(math.ceil(cols / ROW_VALUES) / 32) * 32)


def run(file: str, kernel: str, buffers, params, *, grid: int, tg_size: int):
    """Runs in both thread orders; the results must agree bitwise (no race on any output)."""
    outs = [
        emulator(file).run(
            kernel,
            buffers,
            params,
            grid=grid,
            tg_size=tg_size,
            scratch_bytes=SCRATCH_BYTES,
            order=o,
        )
        for o in ORDERS
    ]
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (
            f"{kernel}: thread order changes the result"
        )
    return outs[0]


def poisoned(shape, dtype=torch.float32):
    return torch.full(shape, NAN, dtype=dtype)


def colsum(part: torch.Tensor) -> torch.Tensor:
    chunks, cols = part.shape
    params = {"chunks": chunks, "cols": cols}
    out = run(
        "colsum",
        "colsum_bwd_partials_float",
        [part, poisoned((cols,))],
        params,
        grid=math.ceil(cols / 64),
        tg_size=64,
    )
    return out[1]


# --------------------------------------------------------------------------------------------
# softmax / log_softmax
# --------------------------------------------------------------------------------------------

SOFTMAX_COLS = [1, 37, 300, 1000]  # one element, a partial SIMD group, tails, > 1 value/thread


def softmax_input(cols: int, dtype: torch.dtype) -> torch.Tensor:
    x = make_input((6, cols), dtype)
    x[1, ::3] = -math.inf  # some -inf
    x[2] = -math.inf  # a row of all -inf: NaN, as torch
    x[3] += 40.0  # far from 0: the max must be subtracted
    x[4, 0] = math.nan  # NaN anywhere: a NaN row
    x[5, -1] = math.inf  # +inf: a NaN row, as torch
    return x


@pytest.mark.parametrize("cols", SOFTMAX_COLS)
@pytest.mark.parametrize("tier", ["row", "looped"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("type", DTYPES)
def test_softmax_forward(type, log, tier, cols):
    dtype = DTYPES[type]
    x = softmax_input(cols, dtype)
    rows = x.shape[0]
    params = {"rows": rows, "cols": cols, "log": int(log)}
    out = run(
        "softmax",
        f"softmax_fwd_{tier}_{type}",
        [x, poisoned(x.shape, dtype)],
        params,
        grid=rows,
        tg_size=threads(tier, cols),
    )
    torch_out = torch.log_softmax(x, -1) if log else torch.softmax(x, -1)
    assert_softmax_close(out[1], torch_out, x, -1, log)


@pytest.mark.parametrize("cols", SOFTMAX_COLS)
@pytest.mark.parametrize("tier", ["row", "looped"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("type", DTYPES)
def test_softmax_backward(type, log, tier, cols):
    dtype = DTYPES[type]
    x = make_input((3, cols), dtype)
    y = torch.log_softmax(x, -1) if log else torch.softmax(x, -1)
    dy = make_input((3, cols), dtype)
    params = {"rows": 3, "cols": cols, "log": int(log)}
    buffers = [dy, y, poisoned(y.shape, dtype)]
    out = run(
        "softmax",
        f"softmax_bwd_{tier}_{type}",
        buffers,
        params,
        grid=3,
        tg_size=threads(tier, cols),
    )
    backward = (
        torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
    )
    assert_softmax_backward_close(out[2], backward(dy, y, -1, dtype), dy, y, -1, log)


# --------------------------------------------------------------------------------------------
# layer_norm / rms_norm
# --------------------------------------------------------------------------------------------

NORM_COLS = [1, 37, 300, 1000]
EPS = 1e-5


def norm_params(op, rows, cols, *, affine, chunks=1, want=(0, 0, 0)):
    has_bias = affine and op == "layer_norm"  # rms_norm has no bias
    return {
        "rows": rows,
        "cols": cols,
        "eps": EPS,
        "has_weight": int(affine),
        "has_bias": int(has_bias),
        "want_dx": want[0],
        "want_dw": want[1],
        "want_db": want[2],
        "chunks": chunks,
    }


def norm_torch(op, x, w, b):
    shape = (x.shape[-1],)
    if op == "rms_norm":
        return F.rms_norm(x, shape, w, EPS)
    return F.layer_norm(x, shape, w, b, EPS)


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("cols", NORM_COLS)
@pytest.mark.parametrize("tier", ["row", "looped"])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("type", DTYPES)
def test_norm_forward(type, op, tier, cols, affine):
    dtype, rows = DTYPES[type], 3
    x = make_input((rows, cols), dtype, shift=2.0)
    w, b = make_input(cols), make_input(cols)
    buffers = [x, w, b, poisoned(x.shape, dtype), poisoned((rows,)), poisoned((rows,))]
    out = run(
        "norms",
        f"{op}_fwd_{tier}_{type}",
        buffers,
        norm_params(op, rows, cols, affine=affine),
        grid=rows,
        tg_size=threads(tier, cols),
    )
    ref = norm_torch(op, x.double(), *(t.double() if affine else None for t in (w, b)))
    torch_out = norm_torch(op, x, *(t.to(dtype) if affine else None for t in (w, b)))
    assert_close_to_reference(out[3], torch_out, ref, dtype, f"{op} forward")
    x64 = x.double()
    mean = x64.mean(1) if op == "layer_norm" else torch.zeros(rows, dtype=torch.float64)
    rstd = ((x64 - mean[:, None]).pow(2).mean(1) + EPS).rsqrt()
    torch.testing.assert_close(out[5].double(), rstd, rtol=1e-5, atol=0)
    if op == "layer_norm":
        torch.testing.assert_close(
            out[4].double(), mean, rtol=0, atol=1e-6 * x64.abs().max().item()
        )


# affine: dx, dw and db; plain: dx only; params: dw and db only (fused layers whose input
# needs no gradient): dx must stay untouched.
@pytest.mark.parametrize("grads", ["affine", "plain", "params"])
@pytest.mark.parametrize("cols", NORM_COLS)
@pytest.mark.parametrize("tier", ["row", "looped"])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("type", DTYPES)
def test_norm_backward(type, op, tier, cols, grads):
    dtype, rows, chunks = DTYPES[type], 5, 2  # rows 0-1 and 2-4: an uneven split
    affine, want_dx = grads != "plain", grads != "params"
    x = make_input((rows, cols), dtype, shift=2.0)
    dy = make_input((rows, cols), dtype)
    w, b = make_input(cols), make_input(cols)
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_() if affine else None
    b64 = b.double().requires_grad_() if affine and op == "layer_norm" else None
    norm_torch(op, x64, w64, b64).backward(dy.double())
    mean = x64.detach().mean(1) if op == "layer_norm" else torch.zeros(rows, dtype=torch.float64)
    rstd = ((x64.detach() - mean[:, None]).pow(2).mean(1) + EPS).rsqrt()
    want = (int(want_dx), int(affine), int(b64 is not None))
    params = norm_params(op, rows, cols, affine=affine, chunks=chunks, want=want)
    parts = [poisoned((chunks, cols)), poisoned((chunks, cols))]
    buffers = [dy, x, mean.float(), rstd.float(), w, poisoned(x.shape, dtype), *parts]
    tg_size = threads(tier, cols)
    out = run("norms", f"{op}_bwd_{tier}_{type}", buffers, params, grid=chunks, tg_size=tg_size)

    xt = x.clone().requires_grad_()
    wt = w.to(dtype).requires_grad_() if affine else None
    bt = b.to(dtype).requires_grad_() if b64 is not None else None
    norm_torch(op, xt, wt, bt).backward(dy)
    if want_dx:
        assert_close_to_reference(out[5], xt.grad, x64.grad, dtype, f"{op} dx")
    else:
        assert out[5].isnan().all(), f"{op}: dx written though not wanted"
    if affine:
        assert_close_to_reference(colsum(out[6]).to(dtype), wt.grad, w64.grad, dtype, f"{op} dw")
    if b64 is not None:
        assert_close_to_reference(colsum(out[7]).to(dtype), bt.grad, b64.grad, dtype, f"{op} db")


# --------------------------------------------------------------------------------------------
# bias_gelu
# --------------------------------------------------------------------------------------------

APPROX = {"none": 0, "tanh": 1}
GELU_ROWS = 37  # three chunks of the host's 16 rows, the last one partial
GELU_COLS = [1, 70, 300]  # one column, a partial SIMD group, two column blocks


def gelu_launch(rows, cols, approx, has_bias, want_dbias):
    """The host's plan (bias_gelu.mm): params, threadgroups, threads, chunks."""
    threads = min(256, math.ceil(cols / 32) * 32)
    col_blocks = math.ceil(cols / threads)
    rows_per_chunk = max(16, math.ceil(rows / 1024))
    chunks = math.ceil(rows / rows_per_chunk)
    params = {
        "rows": rows,
        "cols": cols,
        "approx": APPROX[approx],
        "has_bias": int(has_bias),
        "want_dbias": int(want_dbias),
        "rows_per_chunk": rows_per_chunk,
        "col_blocks": col_blocks,
    }
    return params, col_blocks * chunks, threads, chunks


@pytest.mark.parametrize("cols", GELU_COLS)
@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("approx", APPROX)
@pytest.mark.parametrize("type", DTYPES)
def test_bias_gelu_forward(type, approx, has_bias, cols):
    dtype, rows = DTYPES[type], GELU_ROWS
    x, b = make_input((rows, cols), dtype), make_input(cols, dtype)
    params, grid, tg_size, _ = gelu_launch(rows, cols, approx, has_bias, False)
    buffers = [x, b, poisoned(x.shape, dtype)]
    out = run(
        "bias_gelu", f"bias_gelu_fwd_rows_{type}", buffers, params, grid=grid, tg_size=tg_size
    )
    bias = b if has_bias else torch.zeros_like(b)
    ref = F.gelu(x.double() + bias.double(), approximate=approx)
    assert_close_to_reference(out[2], F.gelu(x + bias, approximate=approx), ref, dtype, "bias_gelu")


@pytest.mark.parametrize("cols", GELU_COLS)
@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("approx", APPROX)
@pytest.mark.parametrize("type", DTYPES)
def test_bias_gelu_backward(type, approx, has_bias, cols):
    dtype, rows = DTYPES[type], GELU_ROWS
    x, dy = make_input((rows, cols), dtype), make_input((rows, cols), dtype)
    b = make_input(cols, dtype)
    params, grid, tg_size, chunks = gelu_launch(rows, cols, approx, has_bias, has_bias)
    buffers = [dy, x, b, poisoned(x.shape, dtype), poisoned((chunks, cols))]
    out = run(
        "bias_gelu", f"bias_gelu_bwd_rows_{type}", buffers, params, grid=grid, tg_size=tg_size
    )
    bias = b if has_bias else torch.zeros_like(b)
    x64, b64 = x.double().requires_grad_(), bias.double().requires_grad_()
    F.gelu(x64 + b64, approximate=approx).backward(dy.double())
    xt, bt = x.clone().requires_grad_(), bias.clone().requires_grad_()
    F.gelu(xt + bt, approximate=approx).backward(dy)
    assert_close_to_reference(out[3], xt.grad, x64.grad, dtype, "bias_gelu dx")
    if has_bias:
        db = colsum(out[4]).to(dtype)
        assert_close_to_reference(db, bt.grad, b64.grad, dtype, "bias_gelu dbias")


# The host's largest threadgroups: 1024 threads (32 SIMD groups, every scratch slot), the row tier
# at its longest row and the looped tier past it.
@pytest.mark.parametrize(
    "tier, cols", [("row", ROW_VALUES * 1024), ("looped", ROW_VALUES * 1024 + 37)]
)
def test_softmax_forward_1024_threads(tier, cols):
    x = softmax_input(cols, torch.float32)
    params = {"rows": x.shape[0], "cols": cols, "log": 0}
    tg_size = threads("row", cols) if tier == "row" else 1024
    assert tg_size == 1024
    out = run(
        "softmax",
        f"softmax_fwd_{tier}_float",
        [x, poisoned(x.shape)],
        params,
        grid=x.shape[0],
        tg_size=tg_size,
    )
    assert_softmax_close(out[1], torch.softmax(x, -1), x)


@pytest.mark.parametrize(
    "tier, cols", [("row", ROW_VALUES * 1024), ("looped", ROW_VALUES * 1024 + 37)]
)
def test_layer_norm_forward_1024_threads(tier, cols):
    x, w, b = make_input((2, cols), shift=2.0), make_input(cols), make_input(cols)
    tg_size = threads("row", cols) if tier == "row" else 1024
    assert tg_size == 1024
    buffers = [x, w, b, poisoned(x.shape), poisoned((2,)), poisoned((2,))]
    params = norm_params("layer_norm", 2, cols, affine=True)
    out = run("norms", f"layer_norm_fwd_{tier}_float", buffers, params, grid=2, tg_size=tg_size)
    ref = norm_torch("layer_norm", x.double(), w.double(), b.double())
    assert_close_to_reference(out[3], norm_torch("layer_norm", x, w, b), ref, torch.float32)
