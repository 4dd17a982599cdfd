"""fusedops.softmax / fusedops.log_softmax and their backward, against fp64 references.

Every numerical check goes through reference.assert_close_to_reference (the tolerance rule).
Tests marked `cuda` skip without a CUDA device; the rest run on every device the conftest finds.
"""

import subprocess
import sys

import pytest
import torch
from reference import (
    FLOAT_DTYPES,
    STAGED_GROUP_SHAPES,
    assert_close_to_reference,
    assert_softmax_backward_close,
    assert_softmax_close,
    capture_cuda_graph,
    make_input,
    make_misaligned,
    poison_,
    poison_allocator,
    staged_group_rows,
)

import fusedops

ops = torch.ops.fusedops

OPS = [pytest.param(False, id="softmax"), pytest.param(True, id="log_softmax")]
ALL_DTYPES = [
    pytest.param(d, id=str(d).removeprefix("torch.")) for d in (torch.float64,) + FLOAT_DTYPES
]
LOW_DTYPES = [pytest.param(d, id=str(d).removeprefix("torch.")) for d in FLOAT_DTYPES]


def fused_fn(log: bool):
    return fusedops.log_softmax if log else fusedops.softmax


def torch_fn(log: bool):
    return torch.log_softmax if log else torch.softmax


def torch_backward(grad_output, output, dim, log):
    """torch's own backward kernel, given an output (for checks that bypass autograd)."""
    if log:
        return torch.ops.aten._log_softmax_backward_data(grad_output, output, dim, output.dtype)
    return torch.ops.aten._softmax_backward_data(grad_output, output, dim, output.dtype)


def skip_unsupported(device, dtype):
    if dtype == torch.float64 and device != "cpu":
        pytest.skip("fp64 is tested on the CPU only")


def _bits(t: torch.Tensor) -> torch.Tensor:
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
    return t.detach().contiguous().view(ints[t.element_size()]).clone()


def check_fwd_bwd(x: torch.Tensor, dim: int, log: bool, grad: torch.Tensor | None = None):
    """Forward and backward (through autograd) of fusedops vs torch vs the fp64 reference, for
    an input x of any layout. Also: outputs are contiguous like torch's, on x's device, and x and
    the gradient are left untouched."""
    x = x.detach()
    x_bits = _bits(x)
    xf, xt = x.detach().requires_grad_(), x.detach().requires_grad_()  # x's layout, two leaves

    poison_allocator(x.device, x.numel() * x.element_size())
    yf = fused_fn(log)(xf, dim)
    yt = torch_fn(log)(xt, dim)
    assert_softmax_close(yf, yt, x, dim, log)
    assert yf.device == x.device
    assert yf.stride() == yt.stride() and yf.is_contiguous()

    g = make_input(x.shape, x.dtype, x.device, scale=1.0) if grad is None else grad
    g_bits = _bits(g)
    poison_allocator(x.device, x.numel() * x.element_size())
    (gf,) = torch.autograd.grad(yf, xf, g)
    (gt,) = torch.autograd.grad(yt, xt, g)
    # Each implementation's gradient is judged on its own forward output (the forward was
    # judged above): this checks the autograd wiring and the backward kernel.
    assert_softmax_backward_close(gf, gt, g, yf, dim, log, torch_output=yt)
    assert gf.device == x.device
    assert gf.stride() == gt.stride() and gf.is_contiguous()

    # The backward op alone, both implementations given the same output (torch's), which takes
    # the forward's rounding out of the comparison.
    y_in = yt.detach()
    dx = ops.softmax_bwd(g, y_in, dim, log)
    dx_t = torch_backward(g, y_in, dim, log)
    assert_softmax_backward_close(dx, dx_t, g, y_in, dim, log, what="softmax_bwd")

    assert torch.equal(_bits(x), x_bits), "the input was modified"
    assert torch.equal(_bits(g), g_bits), "grad_output was modified"
    return yf, gf


# --------------------------------------------------------------------------------------------
# Shapes x dtypes, along the last dim
# --------------------------------------------------------------------------------------------

NS = (1, 7, 31, 32, 33, 100, 1000, 1024, 1025, 4096, 4097, 12345, 32768, 65536 + 3, 131072, 262144)


def _many_rows(n: int) -> int:
    """An odd row count giving about 2^20 elements (at least 5 rows, at most 4097)."""
    return min(4097, max(5, (2**20 // n) | 1))


SHAPES = [(rows, n) for n in NS for rows in sorted({1, 7, _many_rows(n)})]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("log", OPS)
def test_matches_reference(device, log, dtype, shape):
    skip_unsupported(device, dtype)
    check_fwd_bwd(make_input(shape, dtype, device), -1, log)


@pytest.mark.parametrize("n", [4096, 65536 + 3])
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("log", OPS)
def test_batched_leading_dims(device, log, dtype, n):
    check_fwd_bwd(make_input((2, 3, 5, n), dtype, device), -1, log)


# --------------------------------------------------------------------------------------------
# Other dims, 0-dim, non-contiguous, empty
# --------------------------------------------------------------------------------------------

DIM_CASES = [((5, 33, 17), d) for d in (0, 1, 2, -1, -2, -3)] + [
    ((1000, 3, 7), 0),
    ((3, 1025, 5), 1),
    ((2, 3, 4, 65), 1),
    ((2, 3, 4, 65), -3),
    ((4, 1, 9), 1),
    ((257,), 0),
]


@pytest.mark.parametrize("shape,dim", DIM_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("log", OPS)
def test_dims(device, log, dtype, shape, dim):
    check_fwd_bwd(make_input(shape, dtype, device), dim, log)


@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("log", OPS)
def test_zero_dim_tensor(device, log, dtype, dim):
    skip_unsupported(device, dtype)
    x = make_input((), dtype, device)
    y, g = check_fwd_bwd(x, dim, log)
    assert y.shape == () and g.shape == ()
    assert y.item() == (0.0 if log else 1.0)
    assert g.item() == 0.0


NONCONTIG = {
    "transposed": ((37, 129), lambda t: t.t()),
    "sliced_step": ((20, 258), lambda t: t[:, ::2]),
    "sliced_rows_and_cols": ((21, 300), lambda t: t[::3, 1::2]),
    "expanded": ((1, 77), lambda t: t.expand(9, 77)),
    "permuted_3d": ((4, 33, 6), lambda t: t.permute(2, 0, 1)),
    "channels_last": ((2, 5, 7, 9), lambda t: t.contiguous(memory_format=torch.channels_last)),
    "long_row_transposed": ((4097, 3), lambda t: t.t()),
}


@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("case", list(NONCONTIG))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("log", OPS)
def test_non_contiguous(device, log, dtype, case, dim):
    base_shape, view = NONCONTIG[case]
    x = view(make_input(base_shape, dtype, device))
    assert not x.is_contiguous()
    # A non-contiguous gradient as well: the transpose of a fresh contiguous tensor.
    g = make_input(tuple(reversed(x.shape)), dtype, device, scale=1.0).permute(
        *reversed(range(x.dim()))
    )
    check_fwd_bwd(x, dim, log, grad=g)


def _aten_ops_run(f, part: str = "softmax") -> set[str]:
    """The aten ops named with `part` a call of f ran (torch.profiler, CPU-side op events)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        f()
    return {e.name for e in prof.events() if part in e.name and e.name.startswith("aten::")}


@pytest.mark.parametrize("log", OPS)
def test_strided_dim_read_in_place(device, log):
    """A dim with elements after it in memory is read in place, not moved last with a copy in and
    another out: by torch's kernel on the CPU (always: the same bits as torch), by a thread per
    softmax on CUDA and torch's kernel on MPS where there are many short softmaxes (the channels
    of a contiguous [4, 5, 64, 64]); few long ones (dim 0 of [4096, 64]) keep the rows path on a
    GPU. A dim already last in memory (dim 0 of a transposed tensor, dim 1 of a channels_last
    one) keeps the rows kernels everywhere."""
    aten_fwd = f"aten::_{'log_' if log else ''}softmax"
    via_torch = {aten_fwd} if device != "cuda" else set()
    x = make_input((4, 5, 64, 64), torch.float32, device).requires_grad_()
    g = make_input((4, 5, 64, 64), torch.float32, device, scale=1.0)
    assert _aten_ops_run(lambda: fused_fn(log)(x.detach(), 1)) == via_torch
    y = fused_fn(log)(x, 1)
    aten = _aten_ops_run(lambda: y.backward(g))
    assert aten == ({f"{aten_fwd}_backward_data"} if via_torch else set()), aten
    if device == "cpu":
        yt = torch_fn(log)(x.detach(), 1)
        assert torch.equal(y, yt)
        assert torch.equal(x.grad, torch_backward(g, yt, 1, log))
    long_dim = make_input((4096, 64), torch.float32, device)
    want = {aten_fwd} if device == "cpu" else set()
    assert _aten_ops_run(lambda: fused_fn(log)(long_dim, 0)) == want
    for t, dim in (
        (make_input((9, 70), torch.float32, device).t(), 0),  # 70: fp32 rows of 16-63 go to torch
        (make_input((2, 5, 6, 7), torch.float32, device).to(memory_format=torch.channels_last), 1),
    ):
        assert _aten_ops_run(lambda t=t, dim=dim: fused_fn(log)(t, dim)) == set()


# Many short softmaxes down a strided dim (CUDA: the strided kernel, 16-byte packs along the
# inner dim where it divides, else single elements; elsewhere torch's kernel).
STRIDED_CASES = [((4, 5, 64, 64), 1), ((2, 33, 8192), 1), ((4, 7, 4097), 1), ((300, 100, 60), 1)]


@pytest.mark.parametrize("shape,dim", STRIDED_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("log", OPS)
def test_strided_dim(device, log, dtype, shape, dim):
    check_fwd_bwd(make_input(shape, dtype, device), dim, log)


@pytest.mark.cuda
@pytest.mark.parametrize("log", OPS)
def test_strided_dim_long_columns(cuda_device, log):
    """fp32 softmaxes of 1024 elements down a strided dim, the longest the CUDA strided kernel
    takes: its sums down a column are split in parts (a serial fp32 sum of 1024 terms fails the
    tolerance rule). Elsewhere torch's kernel runs there."""
    check_fwd_bwd(make_input((1, 1024, 16384), torch.float32, cuda_device), 1, log)


# Many short rows of a dim last in memory but not in the result, read in place (CUDA: a tile
# kernel writing torch's layout, 16-byte loads where every tile allows, else single elements; odd
# and even row lengths, partial tiles; the CPU: torch's kernel below 64 columns).
TRANSPOSED_CASES = {
    "channels_last": ((4, 5, 64, 64), lambda t: t.contiguous(memory_format=torch.channels_last)),
    "bcl_33": ((2, 8192, 33), lambda t: t.transpose(1, 2)),
    "bcl_7_partial_tile": ((4, 4097, 7), lambda t: t.transpose(1, 2)),
    "bcl_64": ((2, 8192, 64), lambda t: t.transpose(1, 2)),
    "bcl_200": ((1, 16384, 200), lambda t: t.transpose(1, 2)),
}


@pytest.mark.parametrize("case", list(TRANSPOSED_CASES))
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("log", OPS)
def test_transposed_dim(device, log, dtype, case):
    base_shape, view = TRANSPOSED_CASES[case]
    check_fwd_bwd(view(make_input(base_shape, dtype, device)), 1, log)


@pytest.mark.parametrize("log", OPS)
def test_transposed_dim_one_pass(device, log):
    """channels_last [4, 5, 64, 64] over dim 1 (16384 rows of 5, last in memory): on CUDA one
    kernel reads the rows in place and writes the contiguous result, with no copy; on the CPU
    torch's kernel runs (the same bits as torch)."""
    x = make_input((4, 5, 64, 64), torch.float32, device)
    x = x.contiguous(memory_format=torch.channels_last)
    if device == "cuda":
        assert _aten_ops_run(lambda: fused_fn(log)(x, 1), "copy") == set()
        assert _aten_ops_run(lambda: fused_fn(log)(x, 1)) == set()
    elif device == "cpu":
        aten_fwd = f"aten::_{'log_' if log else ''}softmax"
        assert _aten_ops_run(lambda: fused_fn(log)(x, 1)) == {aten_fwd}
        assert torch.equal(fused_fn(log)(x, 1), torch_fn(log)(x, 1))


@pytest.mark.parametrize("layout", ["strided", "transposed", "many_rows"])
@pytest.mark.parametrize("n", [5, 40])
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("log", OPS)
def test_nonfinite_many_short(device, log, dtype, n, layout):
    """The non-finite rows of test_nonfinite_rows, repeated 2048 times, in the layouts a thread
    per softmax serves on CUDA: down dim 0 of a contiguous [n, 9 * 2048] (a strided dim) or of a
    transposed one (the dim last in memory only), or as 9 * 2048 rows of n (the last dim)."""
    old_torch = tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 5)
    if old_torch and log and device == "cpu" and dtype != torch.float32 and layout != "many_rows":
        # fusedops keeps its rows path there (csrc/cpu/softmax.cpp), but the test's torch baseline
        # is torch's own kernel, which maps -inf inputs to NaN.
        pytest.skip(f"torch {torch.__version__}'s CPU 16-bit log_softmax over a strided dim")
    rows = _nonfinite_rows(n, dtype, device)
    x, dim = {
        "strided": (rows.t().contiguous().repeat(1, 2048), 0),
        "transposed": (rows.repeat(2048, 1).t(), 0),
        "many_rows": (rows.repeat(2048, 1), 1),
    }[layout]
    yf, _ = check_fwd_bwd(x, dim, log)
    yt = torch_fn(log)(x, dim)
    assert torch.equal(yf.isnan(), yt.isnan()), "NaN pattern differs from torch's"
    assert torch.equal(yf.isinf(), yt.isinf()), "infinities differ from torch's"


# Many short rows of the last dim. CUDA: rows of up to 72 elements and 200 bytes that are no
# multiple of 16 bytes take the tile kernel (2, 21 with a partial last tile, 50, 16-bit 72); the
# others the register tiers (64, 73, 100, 127 in single elements, 200).
MANY_ROWS_CASES = [
    (16384, 2),
    (16384 + 77, 21),
    (16384, 50),
    (20000, 64),
    (16384, 72),
    (16384, 73),
    (16384, 100),
    (16384, 127),
    (16384, 200),
]


@pytest.mark.parametrize("shape", MANY_ROWS_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("log", OPS)
def test_many_short_rows(device, log, dtype, shape):
    check_fwd_bwd(make_input(shape, dtype, device), -1, log)


EMPTY_CASES = [
    ((0, 5), -1),
    ((0, 5), 0),
    ((5, 0), -1),
    ((5, 0), 0),
    ((0,), 0),
    ((0, 0), 1),
    ((2, 0, 3), 1),
    ((2, 0, 3), 2),
]


@pytest.mark.parametrize("shape,dim", EMPTY_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("log", OPS)
def test_empty(device, log, dtype, shape, dim):
    x = torch.empty(shape, dtype=dtype, device=device)
    xf = x.clone().requires_grad_()
    xt = x.clone().requires_grad_()
    yf, yt = fused_fn(log)(xf, dim), torch_fn(log)(xt, dim)
    assert (yf.shape, yf.dtype, yf.device, yf.stride()) == (
        yt.shape,
        yt.dtype,
        yt.device,
        yt.stride(),
    )
    g = torch.empty(shape, dtype=dtype, device=device)
    (gf,) = torch.autograd.grad(yf, xf, g)
    (gt,) = torch.autograd.grad(yt, xt, g)
    assert (gf.shape, gf.dtype, gf.device) == (gt.shape, gt.dtype, gt.device)
    dx = ops.softmax_bwd(g, yf.detach(), dim, log)
    assert (dx.shape, dx.dtype, dx.device) == (x.shape, x.dtype, x.device)


# --------------------------------------------------------------------------------------------
# Non-finite and large inputs
# --------------------------------------------------------------------------------------------


def _nonfinite_rows(n: int, dtype, device) -> torch.Tensor:
    """Rows: all -inf | one NaN | half -inf | one +inf | all NaN | all but one -inf |
    finite | -inf at both ends | finite."""
    inf, nan = float("inf"), float("nan")
    x = make_input((9, n), torch.float32, "cpu")
    x[0] = -inf
    x[1, torch.randint(n, ()).item()] = nan
    x[2, torch.randperm(n)[: n // 2]] = -inf
    x[3, torch.randint(n, ()).item()] = inf
    x[4] = nan
    keep = torch.randint(n, ()).item()
    x[5, :keep] = -inf
    x[5, keep + 1 :] = -inf
    x[7, 0] = -inf
    x[7, -1] = -inf
    return x.to(device=device, dtype=dtype)


@pytest.mark.parametrize("n", [5, 40, 1025, 4096, 65536 + 3])
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("log", OPS)
def test_nonfinite_rows(device, log, dtype, n):
    x = _nonfinite_rows(n, dtype, device)
    yf, gf = check_fwd_bwd(x, -1, log)
    yt = torch_fn(log)(x, -1)
    assert torch.equal(yf.isnan(), yt.isnan()), "NaN pattern differs from torch's"
    assert torch.equal(yf.isinf(), yt.isinf()), "infinities differ from torch's"
    # The input does what the docstring says: these rows are NaN, the others have no NaN.
    assert yf.isnan().all(dim=1).tolist() == [True, True, False, True, True] + [False] * 4
    assert not yf[[2, 5, 6, 7, 8]].isnan().any() and not gf[[2, 5, 6, 7, 8]].isnan().any()


@pytest.mark.parametrize("n", [7, 1000, 32768, 131072])
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("log", OPS)
def test_nonfinite_rows_transposed_dim0(device, log, dtype, n):
    """The same rows laid out down the columns (softmax over dim 0 of a transposed input)."""
    x = _nonfinite_rows(min(n, 4097), dtype, device).t()
    check_fwd_bwd(x, 0, log)


@pytest.mark.parametrize("scale,shift", [(1000.0, 0.0), (3.0, 3.0e4), (3.0, -3.0e4), (50.0, 0.0)])
@pytest.mark.parametrize("n", [33, 4097, 65536 + 3])
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("log", OPS)
def test_large_magnitude(device, log, dtype, n, scale, shift):
    x = make_input((7, n), dtype, device, scale=scale, shift=shift)
    y, g = check_fwd_bwd(x, -1, log)
    assert torch.isfinite(y).all() and torch.isfinite(g).all()


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

# Raises, in a child process, the errors whose messages format integers (dim, shapes, devices).
# A toolchain whose extensions crash in std::ostream's integer formatting would otherwise kill the
# whole pytest run (seen with a torch 2.11 wheel and g++ 13.3; fusedops now formats integers with
# std::to_string, csrc/common/checks.h): if it ever crashes again, the error tests fail, alone.
_ERROR_PROBE = """
import torch, fusedops
x = torch.randn(3, 4)
for call, exc in ((lambda: fusedops.softmax(x, 2), IndexError),
                  (lambda: torch.ops.fusedops.softmax_bwd(torch.randn(3, 5), x, 1, False),
                   ValueError)):
    try:
        call()
    except exc:
        pass
"""


@pytest.fixture(scope="module")
def error_paths_do_not_crash():
    proc = subprocess.run(
        [sys.executable, "-c", _ERROR_PROBE], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        pytest.fail(
            f"raising fusedops' errors crashed a child process (exit code {proc.returncode}); "
            f"this build can't report bad input. stderr tail:\n{proc.stderr[-2000:]}",
            pytrace=False,
        )


@pytest.mark.parametrize("log", OPS)
def test_dim_out_of_range(error_paths_do_not_crash, device, log):
    x = make_input((3, 4), torch.float32, device)
    for dim in (2, -3, 100):
        with pytest.raises(IndexError, match=rf"dim={dim}\b"):
            fused_fn(log)(x, dim)
    s = make_input((), torch.float32, device)
    for dim in (1, -2):
        with pytest.raises(IndexError, match=rf"dim={dim}\b"):
            fused_fn(log)(s, dim)
    y = fused_fn(log)(x, -1)
    with pytest.raises(IndexError, match=r"dim=2\b"):
        ops.softmax_bwd(make_input((3, 4), torch.float32, device), y, 2, log)


DTYPE_NAMES = {
    torch.int64: "Long|int64",
    torch.int32: "Int|int32",
    torch.int8: "Char|int8",
    torch.uint8: "Byte|uint8",
    torch.bool: "Bool|bool",
    torch.complex64: "ComplexFloat|complex64",
}


@pytest.mark.parametrize("dtype", list(DTYPE_NAMES), ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("log", OPS)
def test_non_float_dtype_raises(error_paths_do_not_crash, device, log, dtype):
    if device == "mps" and dtype == torch.complex64:
        pytest.skip("MPS complex support varies")
    x = make_input((3, 4), torch.float32, device, scale=5.0).to(dtype)
    with pytest.raises(TypeError, match=DTYPE_NAMES[dtype]):
        fused_fn(log)(x, -1)
    g = make_input((3, 4), torch.float32, device)
    with pytest.raises(TypeError, match=DTYPE_NAMES[dtype]):
        ops.softmax_bwd(g.to(dtype), x, -1, log)


@pytest.mark.parametrize("log", OPS)
def test_bad_grad_output_raises(error_paths_do_not_crash, device, log):
    y = fused_fn(log)(make_input((3, 4), torch.float32, device), -1)
    with pytest.raises(ValueError, match=r"grad_output.*shape"):
        ops.softmax_bwd(make_input((3, 5), torch.float32, device), y, -1, log)
    with pytest.raises(ValueError, match=r"grad_output.*shape"):
        ops.softmax_bwd(make_input((1, 4), torch.float32, device), y, -1, log)
    with pytest.raises(TypeError, match=r"grad_output.*dtype"):
        ops.softmax_bwd(make_input((3, 4), torch.float16, device), y, -1, log)


@pytest.mark.cuda
@pytest.mark.parametrize("log", OPS)
def test_grad_output_on_wrong_device_raises(error_paths_do_not_crash, cuda_device, log):
    y = fused_fn(log)(make_input((3, 4), torch.float32, cuda_device), -1)
    with pytest.raises(RuntimeError, match=r"grad_output.*cpu"):
        ops.softmax_bwd(make_input((3, 4), torch.float32, "cpu"), y, -1, log)
    y_cpu = fused_fn(log)(make_input((3, 4), torch.float32, "cpu"), -1)
    with pytest.raises(RuntimeError, match=r"grad_output.*cuda"):
        ops.softmax_bwd(make_input((3, 4), torch.float32, cuda_device), y_cpu, -1, log)


# --------------------------------------------------------------------------------------------
# torch.library.opcheck, gradcheck, gradgradcheck
# --------------------------------------------------------------------------------------------

OPCHECK_CASES = [((3, 7), -1), ((2, 5, 3), 1), ((4, 6), 0), ((), 0)]


@pytest.mark.parametrize("shape,dim", OPCHECK_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "requires_grad"])
@pytest.mark.parametrize("log", OPS)
def test_opcheck_softmax_fwd(device, log, requires_grad, shape, dim):
    x = make_input(shape, torch.float32, device, requires_grad=requires_grad)
    torch.library.opcheck(ops.softmax_fwd.default, (x, dim, log))


@pytest.mark.parametrize("shape,dim", OPCHECK_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "requires_grad"])
@pytest.mark.parametrize("log", OPS)
def test_opcheck_softmax_bwd(device, log, requires_grad, shape, dim):
    y = fused_fn(log)(make_input(shape, torch.float32, device), dim).requires_grad_(requires_grad)
    g = make_input(shape, torch.float32, device, requires_grad=requires_grad)
    torch.library.opcheck(ops.softmax_bwd.default, (g, y, dim, log))


GRADCHECK_CASES = [((3, 5), -1), ((3, 5), 0), ((2, 3, 4), 1), ((2, 3, 4), -3), ((6,), 0), ((), 0)]


@pytest.mark.parametrize("shape,dim", GRADCHECK_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("log", OPS)
def test_gradcheck(log, shape, dim):
    x = make_input(shape, torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: fused_fn(log)(t, dim), (x,))
    assert torch.autograd.gradgradcheck(lambda t: fused_fn(log)(t, dim), (x,))


@pytest.mark.parametrize("shape,dim", GRADCHECK_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("log", OPS)
def test_gradcheck_softmax_bwd(log, shape, dim):
    """The backward op is differentiable in both of its tensor arguments (double backward)."""
    y = fused_fn(log)(make_input(shape, torch.float64), dim).requires_grad_()
    g = make_input(shape, torch.float64, scale=1.0, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: ops.softmax_bwd(a, b, dim, log), (g, y))


# --------------------------------------------------------------------------------------------
# torch.compile (compiling is slow: few tests, small shapes)
# --------------------------------------------------------------------------------------------


def _pair(x):
    return fusedops.softmax(x, -1), fusedops.log_softmax(x, 0)


def test_compile_fullgraph(device):
    compiled = torch.compile(_pair, fullgraph=True)
    for _ in range(2):  # the second call runs the cached graph on fresh input
        x = make_input((6, 33), torch.float32, device)
        y, ly = compiled(x)
        assert_softmax_close(y, torch.softmax(x, -1), x, -1, what="softmax")
        assert_softmax_close(ly, torch.log_softmax(x, 0), x, 0, log=True, what="log_softmax")


def test_compile_fullgraph_backward(device):
    def loss(x, w, fns):
        softmax, log_softmax = fns
        return (softmax(x * w, -1) * w).sum() + (log_softmax(x, 0) * w.flip(-1)).sum()

    compiled = torch.compile(
        lambda x, w: loss(x, w, (fusedops.softmax, fusedops.log_softmax)), fullgraph=True
    )
    for _ in range(2):
        x = make_input((5, 17), torch.float32, device, requires_grad=True)
        w = make_input((17,), torch.float32, device, scale=1.0)
        out = compiled(x, w)
        (gx,) = torch.autograd.grad(out, x)

        xt = x.detach().clone().requires_grad_()
        out_t = loss(xt, w, (torch.softmax, torch.log_softmax))
        (gt,) = torch.autograd.grad(out_t, xt)
        x64 = x.detach().double().cpu().requires_grad_()
        out_64 = loss(x64, w.double().cpu(), (softmax_ref_op, log_softmax_ref_op))
        (g64,) = torch.autograd.grad(out_64, x64)
        assert_close_to_reference(out, out_t, out_64.detach(), what="loss")
        assert_close_to_reference(gx, gt, g64, what="grad")


def softmax_ref_op(x, dim):
    return torch.softmax(x.double(), dim)


def log_softmax_ref_op(x, dim):
    return torch.log_softmax(x.double(), dim)


# --------------------------------------------------------------------------------------------
# CUDA only: graphs, streams, every kernel path, > 2^31 elements
# --------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(37, 4097), (3, 131072)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("log", OPS)
def test_cuda_graph_capture_replay(cuda_device, log, dtype, shape):
    static_x = make_input(shape, dtype, cuda_device)
    static_g = make_input(shape, dtype, cuda_device, scale=1.0)

    def step():
        y = fused_fn(log)(static_x, -1)
        return y, ops.softmax_bwd(static_g, y, -1, log)

    graph, (static_y, static_dx) = capture_cuda_graph(step)

    for _ in range(3):
        x = make_input(shape, dtype, cuda_device)
        g = make_input(shape, dtype, cuda_device, scale=1.0)
        static_x.copy_(x)
        static_g.copy_(g)
        poison_(static_y)
        poison_(static_dx)
        graph.replay()
        torch.cuda.synchronize()
        assert_softmax_close(static_y, torch_fn(log)(x, -1), x, -1, log)
        # The graph's backward consumed fusedops' own forward output: judge it on that input.
        y_in = static_y.clone()
        assert_softmax_backward_close(static_dx, torch_backward(g, y_in, -1, log), g, y_in, -1, log)


@pytest.mark.cuda
@pytest.mark.parametrize("log", OPS)
def test_compile_reduce_overhead(cuda_device, log):
    fn = fused_fn(log)
    compiled = torch.compile(lambda x: fn(x, -1) * 1.0, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):  # warm-up, recording, then replays of the CUDA graph
        x = make_input((64, 1000), torch.bfloat16, cuda_device)
        y = compiled(x).clone()
        assert_softmax_close(y, torch_fn(log)(x, -1), x, -1, log)


@pytest.mark.cuda
@pytest.mark.parametrize("n", [1000, 32768, 262144], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("log", OPS)
def test_runs_on_current_stream(cuda_device, log, n):
    """On a side stream that is busy, the input only becomes valid after a sleep on that stream.
    A kernel launched on another stream would read the NaN written before the sleep."""
    x_src = make_input((8, n), torch.float32, cuda_device)
    g_src = make_input((8, n), torch.float32, cuda_device, scale=1.0)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = poison_(torch.empty_like(x_src))
        g = poison_(torch.empty_like(g_src))
        torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time
        x.copy_(x_src)
        g.copy_(g_src)
        y = fused_fn(log)(x, -1)
        dx = ops.softmax_bwd(g, y, -1, log)
        y_snapshot = y.clone()
    side.synchronize()
    assert_softmax_close(y, torch_fn(log)(x_src, -1), x_src, -1, log)
    assert_softmax_backward_close(
        dx, torch_backward(g_src, y_snapshot, -1, log), g_src, y_snapshot, -1, log
    )


TIER_NS = {
    "tiny": (1, 2, 3, 5, 8, 16, 17, 31, 32),
    "warp": (33, 64, 100, 129, 197, 255, 256, 511, 512, 999, 1000, 1024),
    "block": (1025, 2047, 2048, 4095, 4096, 4104, 8191, 8192, 12345, 16384, 32767, 32768),
    "cluster": (32769, 65536, 65539, 100000, 131072, 131080, 200003, 262144),
    "offchip": (262145, 262152, 1_000_003, 2**20),
}
TIER_CASES = [pytest.param(n, id=f"{tier}-n{n}") for tier, ns in TIER_NS.items() for n in ns]


@pytest.mark.cuda
@pytest.mark.parametrize("misaligned", [False, True], ids=["aligned_ptr", "misaligned_ptr"])
@pytest.mark.parametrize("n", TIER_CASES)
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("log", OPS)
def test_cuda_every_kernel_path(cuda_device, log, dtype, n, misaligned):
    rows = 513 if n <= 1024 else 67 if n <= 32768 else 3
    x = make_input((rows, n), dtype, cuda_device)
    g = make_input((rows, n), dtype, cuda_device, scale=1.0)
    if misaligned:
        x, g = make_misaligned(x), make_misaligned(g)
    poison_allocator(cuda_device, x.numel() * x.element_size())
    y = fused_fn(log)(x, -1)
    assert_softmax_close(y, torch_fn(log)(x, -1), x, -1, log)
    y_in = make_misaligned(y) if misaligned else y
    poison_allocator(cuda_device, x.numel() * x.element_size())
    dx = ops.softmax_bwd(g, y_in, -1, log)
    assert_softmax_backward_close(dx, torch_backward(g, y_in, -1, log), g, y_in, -1, log)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "dtype,n",
    [(torch.float16, 8192), *STAGED_GROUP_SHAPES],
)
@pytest.mark.parametrize("log", OPS)
def test_cuda_rows_grouped_per_block(cuda_device, log, dtype, n):
    """The staged kernels' blocks of several rows (of x forward, of y and dy backward;
    reference.STAGED_GROUP_SHAPES)."""
    sms = torch.cuda.get_device_properties(cuda_device).multi_processor_count
    x = make_input((staged_group_rows(dtype, n, sms), n), dtype, cuda_device)
    g = make_input(x.shape, dtype, cuda_device, scale=1.0)
    poison_allocator(cuda_device, x.numel() * x.element_size())
    y = fused_fn(log)(x, -1)
    assert_softmax_close(y, torch_fn(log)(x, -1), x, -1, log)
    poison_allocator(cuda_device, x.numel() * x.element_size())
    dx = ops.softmax_bwd(g, y, -1, log)
    assert_softmax_backward_close(dx, torch_backward(g, y, -1, log), g, y, -1, log)


# Rows of the register tiers in more than two waves of blocks, which take a block per row step
# instead of a grid striding over them (warp tier: 64 and 256 columns; block tier: 2048 columns
# of fp16/bf16, 1024 of fp32), each with a partial last block.
MANY_WAVES_SHAPES = [(70001, 64), (35001, 256), (20001, 1024), (20001, 2048)]


@pytest.mark.cuda
@pytest.mark.parametrize("shape", MANY_WAVES_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("log", OPS)
def test_cuda_rows_of_many_waves(cuda_device, log, dtype, shape):
    check_fwd_bwd(make_input(shape, dtype, cuda_device), -1, log)


HUGE_SHAPES = [
    pytest.param((2**28 + 1, 8), id="2^28+1x8"),
    pytest.param((8193, 262144), id="8193x262144"),
]


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.bigmem
@pytest.mark.parametrize("shape", HUGE_SHAPES)
@pytest.mark.parametrize("log", OPS)
def test_more_than_2_31_elements(cuda_device, log, shape):
    rows, n = shape
    numel = rows * n
    assert numel > 2**31
    need = 4 * numel * 2 + 2 * 2**30  # x, y, g, dx in bf16, plus room for the checks
    free, _ = torch.cuda.mem_get_info()
    if free < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory, {free / 2**30:.1f} free")
    x = torch.randn(shape, device=cuda_device, dtype=torch.bfloat16).mul_(3)
    y = fused_fn(log)(x, -1)

    # Every row: finite, and sums to 1 (checked in chunks to keep the memory flat).
    step = max(1, 2**26 // n)
    for r in range(0, rows, step):
        chunk = y[r : r + step].float()
        p = chunk.exp() if log else chunk
        assert torch.isfinite(chunk).all(), f"non-finite output in rows {r}..{r + step}"
        err = (p.sum(-1) - 1).abs().max().item()
        assert err < (0.05 if log else 0.02), f"a row in {r}..{r + step} sums to 1 +- {err}"
        del chunk, p

    # Sampled rows against torch and the reference, including those across element 2^31.
    boundary = 2**31 // n
    idx = [0, 1, rows // 2, boundary - 1, boundary, min(boundary + 1, rows - 1), rows - 1]
    idx += torch.randint(rows, (5,)).tolist()
    idx = torch.tensor(sorted(set(idx)), device=cuda_device)
    xs = x[idx]
    assert_softmax_close(y[idx], torch_fn(log)(xs, -1), xs, -1, log)

    g = torch.randn(shape, device=cuda_device, dtype=torch.bfloat16)
    dx = ops.softmax_bwd(g, y, -1, log)
    gs, ys = g[idx], y[idx]
    assert_softmax_backward_close(dx[idx], torch_backward(gs, ys, -1, log), gs, ys, -1, log)
    assert torch.isfinite(dx[-1]).all() and torch.isfinite(dx[boundary]).all()
