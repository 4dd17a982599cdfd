"""fusedops.bias_gelu / BiasGELU against an fp64 CPU reference and torch at the same dtype."""

import pytest
import torch
import torch.nn.functional as F
from reference import assert_close_to_reference, capture_cuda_graph

import fusedops

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
APPROX = ["none", "tanh"]

SHAPES = [(1, 1), (3, 7), (5, 1000), (2, 3, 257), (33, 4096), (2, 262144), (4, 8)]


def inputs(shape, dtype, device, requires_grad=False):
    x = torch.randn(shape, dtype=dtype, device=device) * 3
    b = torch.randn(shape[-1], dtype=dtype, device=device)
    return x.requires_grad_(requires_grad), b.requires_grad_(requires_grad)


def reference(x, b, approximate):
    """Output and (dx, db) for grad dy, all fp64 on CPU."""
    xr = x.detach().double().cpu().requires_grad_()
    br = b.detach().double().cpu().requires_grad_()
    return F.gelu(xr + br, approximate=approximate), xr, br


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_backward(shape, approximate, dtype, device):
    x, b = inputs(shape, dtype, device, requires_grad=True)
    y = fusedops.bias_gelu(x, b, approximate)
    y_torch = F.gelu(x + b, approximate=approximate)
    y_ref, xr, br = reference(x, b, approximate)
    assert y.shape == x.shape and y.dtype == dtype and y.is_contiguous()
    assert_close_to_reference(y, y_torch, y_ref, dtype)

    dy = torch.randn_like(y)
    dx, db = torch.autograd.grad(y, (x, b), dy)
    dx_torch, db_torch = torch.autograd.grad(y_torch, (x, b), dy)
    dx_ref, db_ref = torch.autograd.grad(y_ref, (xr, br), dy.double().cpu())
    assert dx.dtype == dtype and db.dtype == dtype and db.shape == b.shape
    assert_close_to_reference(dx, dx_torch, dx_ref, dtype)
    assert_close_to_reference(db, db_torch, db_ref, dtype)


@pytest.mark.parametrize("approximate", APPROX)
def test_matches_torch_fp32_and_fp64(approximate, device):
    # fp32 loosely: torch's CPU erf is a vectorized approximation, not the libm one used here.
    cases = [(torch.float32, 1e-5)] + ([(torch.float64, 1e-14)] if device != "mps" else [])
    for dtype, atol in cases:  # MPS has no float64
        x, b = inputs((17, 300), dtype, device)
        torch.testing.assert_close(
            fusedops.bias_gelu(x, b, approximate),
            F.gelu(x + b, approximate=approximate),
            atol=atol,
            rtol=atol,
        )


def test_non_contiguous(device):
    x = torch.randn(64, 48, device=device).t()  # [48, 64], transposed
    b = torch.randn(128, device=device)[::2]  # stride 2
    x.requires_grad_()
    b.requires_grad_()
    y = fusedops.bias_gelu(x, b)
    torch.testing.assert_close(y, F.gelu(x + b))
    dy = torch.randn(64, 48, device=device).t()
    dx, db = torch.autograd.grad(y, (x, b), dy)
    dx_t, db_t = torch.autograd.grad(F.gelu(x + b), (x, b), dy)
    torch.testing.assert_close(dx, dx_t)
    torch.testing.assert_close(db, db_t, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(0, 16), (4, 0), (2, 0, 8)])
def test_empty(shape, device):
    x, b = inputs(shape, torch.float32, device, requires_grad=True)
    y = fusedops.bias_gelu(x, b)
    assert y.shape == x.shape
    dx, db = torch.autograd.grad(y, (x, b), torch.randn_like(y))
    assert dx.shape == x.shape and db.shape == b.shape
    assert torch.equal(db, torch.zeros_like(b))


@pytest.mark.parametrize("approximate", APPROX)
def test_nonfinite(approximate, device):
    # NaN stays NaN; elsewhere as torch, except where torch's own erf gives NaN (its AVX512 erf
    # does at +inf), since gelu(+inf) = +inf.
    x = torch.tensor([[float("nan"), float("inf"), -float("inf"), 1.0, 30.0, -30.0]], device=device)
    y = fusedops.bias_gelu(x, torch.zeros(6, device=device), approximate)
    y_torch = F.gelu(x, approximate=approximate)
    assert torch.isnan(y[0, 0])
    known = ~torch.isnan(y_torch)
    torch.testing.assert_close(y[known], y_torch[known])


@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(requires_grad, approximate, device):
    x, b = inputs((3, 5, 40), torch.float32, device, requires_grad)
    torch.library.opcheck(torch.ops.fusedops.bias_gelu_fwd.default, (x, b, approximate))
    dy = torch.randn(3, 5, 40, device=device)
    torch.library.opcheck(
        torch.ops.fusedops.bias_gelu_bwd.default, (dy, x.detach(), b.detach(), approximate)
    )


@pytest.mark.parametrize("approximate", APPROX)
def test_gradcheck(approximate):
    x, b = inputs((4, 3, 11), torch.float64, "cpu", requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, b: fusedops.bias_gelu(x, b, approximate), (x, b))


def test_compile_fullgraph(device):
    def f(x, b):
        return fusedops.bias_gelu(x, b, "none") + fusedops.bias_gelu(x, b, "tanh")

    compiled = torch.compile(f, fullgraph=True)
    x, b = inputs((6, 70), torch.float32, device, requires_grad=True)
    y, y_eager = compiled(x, b), f(x, b)
    torch.testing.assert_close(y, y_eager)
    dy = torch.randn_like(y)
    for g, g_eager in zip(
        torch.autograd.grad(y, (x, b), dy), torch.autograd.grad(y_eager, (x, b), dy), strict=True
    ):
        torch.testing.assert_close(g, g_eager)


def test_module(device):
    m = fusedops.nn.BiasGELU(24, approximate="tanh", device=device)
    assert list(m.state_dict()) == ["bias"] and torch.equal(m.bias, torch.zeros(24, device=device))
    with torch.no_grad():
        m.bias.normal_()
    x = torch.randn(5, 24, device=device)
    torch.testing.assert_close(m(x), F.gelu(x + m.bias, approximate="tanh"))
    assert "approximate='tanh'" in repr(m)


def test_bad_inputs():
    x, b = inputs((4, 8), torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"bias_gelu: bias must have shape \[8\]"):
        fusedops.bias_gelu(x, torch.randn(7))
    with pytest.raises(ValueError, match=r"bias must have shape \[8\]"):
        fusedops.bias_gelu(x, torch.randn(1, 8))
    with pytest.raises(TypeError, match="bias has dtype Half but input has dtype Float"):
        fusedops.bias_gelu(x, b.half())
    with pytest.raises(TypeError, match="input must be float32, float16, bfloat16 or float64"):
        fusedops.bias_gelu(x.int(), b.int())
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh', got 'erf'"):
        fusedops.bias_gelu(x, b, "erf")
    with pytest.raises(ValueError, match="at least one dimension"):
        fusedops.bias_gelu(torch.tensor(1.0), torch.randn(1))
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        fusedops.nn.BiasGELU(8, approximate="fast")


@pytest.mark.cuda
def test_bad_device():
    x, b = inputs((4, 8), torch.float32, "cuda")
    with pytest.raises(RuntimeError, match="bias is on cpu but input is on cuda"):
        fusedops.bias_gelu(x, b.cpu())


GPUS = [
    pytest.param("cuda", marks=pytest.mark.cuda),
    pytest.param(
        "mps", marks=pytest.mark.skipif(not torch.backends.mps.is_available(), reason="no MPS")
    ),
]


@pytest.mark.parametrize("device", GPUS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_dbias_deterministic(dtype, device):
    x, b = inputs((8192, 1024), dtype, device, requires_grad=True)
    dy = torch.randn(8192, 1024, dtype=dtype, device=device)
    runs = [torch.autograd.grad(fusedops.bias_gelu(x, b), (x, b), dy) for _ in range(3)]
    for dx, db in runs[1:]:
        assert torch.equal(dx, runs[0][0]) and torch.equal(db, runs[0][1])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape", [(20000, 1001), (60000, 64), (300, 3), (2**22 + 3, 8)])
def test_cuda_dbias_many_partial_rows(shape, dtype):
    """dbias from many per-block partial rows (their sum's block shape follows the count), of
    a row length that isn't a multiple of 4 (the partial rows' padding is never read), and of
    more than 2048 of them (each thread of the sum then adds more than one batch of loads)."""
    x, b = inputs(shape, dtype, "cuda", requires_grad=True)
    dy = torch.randn(shape, dtype=dtype, device="cuda")
    _, db = torch.autograd.grad(fusedops.bias_gelu(x, b), (x, b), dy)
    y_ref, xr, br = reference(x, b, "none")
    _, db_ref = torch.autograd.grad(y_ref, (xr, br), dy.double().cpu())
    _, db_torch = torch.autograd.grad(F.gelu(x + b), (x, b), dy)
    assert_close_to_reference(db, db_torch, db_ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4096, 1024), (40, 9000), (3, 70000)])
def test_cpu_dbias_same_bits_for_any_thread_count(shape, dtype):
    # The CPU kernel's row blocks and column tiles depend on the shape only; these shapes take
    # many blocks, ragged tiles, and more tiles than rows.
    x, b = inputs(shape, dtype, "cpu", requires_grad=True)
    dy = torch.randn(shape, dtype=dtype)
    threads = torch.get_num_threads()
    runs = []
    try:
        for n in (1, 2, 3, 1):
            torch.set_num_threads(n)
            runs.append(torch.autograd.grad(fusedops.bias_gelu(x, b), (x, b), dy))
    finally:
        torch.set_num_threads(threads)
    for dx, db in runs[1:]:
        assert torch.equal(dx, runs[0][0]) and torch.equal(db, runs[0][1])


def _flushes_denormals():
    """Whether this thread flushes fp32 subnormal results to zero (MXCSR's FTZ on x86)."""
    return (torch.full((1,), torch.finfo(torch.float32).tiny) * 0.5).item() == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("approximate", APPROX)
def test_cpu_same_bits_with_denormals_flushed(approximate, dtype):
    # A thread's FTZ/DAZ state must change no bit: it differs between the threads of one process
    # (torch.set_flush_denormal sets the calling thread's; a library linked with -ffast-math, like
    # the code torch.compile built under torch 2.4, sets the loading thread's, and only threads
    # started later inherit it), so a subnormal that mattered would make the result depend on
    # which thread computed an element. Where they would appear: the far tail of gelu'
    # (x + bias < -13, phi's exp near fp32's smallest normal number) and dy * gelu' below it.
    # One thread, so that everything runs on this one.
    z = torch.cat([torch.linspace(-20, 20, 8001), torch.linspace(-15, -12.5, 5001)])
    x = z.to(dtype).expand(7, -1).contiguous()
    b = torch.zeros(z.numel(), dtype=dtype)
    dy = torch.tensor([1.0, -2.5, 0.3, 1e-3, -1e-6, 1e-30, 1e-36]).to(dtype)[:, None].expand_as(x)
    dy = dy.contiguous()
    flushing, threads = _flushes_denormals(), torch.get_num_threads()
    runs = []
    try:
        torch.set_num_threads(1)
        for flush in (False, True):
            if not torch.set_flush_denormal(flush):
                pytest.skip("no FTZ/DAZ control on this CPU")
            y = torch.ops.fusedops.bias_gelu_fwd(x, b, approximate)
            runs.append((y, *torch.ops.fusedops.bias_gelu_bwd(dy, x, b, approximate)))
    finally:
        torch.set_flush_denormal(flushing)
        torch.set_num_threads(threads)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    for what, a, f in zip(("y", "dx", "dbias"), *runs, strict=True):
        diff = (a.view(bits) != f.view(bits)).nonzero()
        assert diff.numel() == 0, (
            f"{what} differs with FTZ/DAZ at {diff.shape[0]} element(s), first {diff[0].tolist()}:"
            f" {a[tuple(diff[0])].item()} against {f[tuple(diff[0])].item()}"
        )


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", APPROX)
def test_cuda_unaligned_scalar_path(approximate, dtype):
    # A storage offset of one element defeats 16-byte loads: the scalar path must agree.
    base = torch.randn(64 * 520 + 1, dtype=dtype, device="cuda") * 3
    x = base[1:].view(64, 520).requires_grad_()
    b = torch.randn(520, dtype=dtype, device="cuda", requires_grad=True)
    y = fusedops.bias_gelu(x, b, approximate)
    y_ref, xr, br = reference(x, b, approximate)
    y_torch = F.gelu(x + b, approximate=approximate)
    assert_close_to_reference(y, y_torch, y_ref, dtype)
    dy = torch.randn_like(y)
    dx, db = torch.autograd.grad(y, (x, b), dy)
    dx_ref, db_ref = torch.autograd.grad(y_ref, (xr, br), dy.double().cpu())
    dx_t, db_t = torch.autograd.grad(y_torch, (x, b), dy)
    assert_close_to_reference(dx, dx_t, dx_ref, dtype)
    assert_close_to_reference(db, db_t, db_ref, dtype)


@pytest.mark.cuda
def test_cuda_graph():
    x, b = inputs((300, 1000), torch.bfloat16, "cuda", requires_grad=True)
    dy = torch.randn(300, 1000, dtype=torch.bfloat16, device="cuda")

    def step():
        y = fusedops.bias_gelu(x, b, "tanh")
        return (y, *torch.autograd.grad(y, (x, b), dy))

    graph, static = capture_cuda_graph(step)
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
        b.copy_(torch.randn_like(b))
        dy.copy_(torch.randn_like(dy))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(static, step(), strict=True):
        assert torch.equal(got, want)
