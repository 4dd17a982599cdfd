"""fusedops.fully_fused_mlp / FullyFusedMLP against an fp64 CPU reference and torch at the same
dtype (the eager nn.Sequential it replaces)."""

import copy
import json

import pytest
import torch
from reference import (
    ATOL_GEMM,
    assert_close_to_reference,
    assert_compiles_like_eager,
    capture_cuda_graph,
)
from torch import nn

import fusedops
from fusedops import FullyFusedMLP

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ACTIVATIONS = ["gelu", "gelu_tanh", "relu", "none"]
OUT_ACTIVATIONS = ["none", "relu", "gelu"]

# (x shape, hidden, out, hidden_layers): in = x.shape[-1].
SHAPES = [
    ((37, 3), 64, 4, 2),  # NeRF-like: tiny in/out, rows not a multiple of 16
    ((2, 150, 32), 128, 16, 4),  # the widest width, several tiles per block
    ((129, 64), 16, 64, 1),  # one hidden layer, out wider than hidden
    ((5, 7, 16), 48, 8, 3),  # hidden not a power of two
    ((10, 130), 32, 8, 2),  # in > 128: the composed path on CUDA too
    ((1, 8), 32, 1, 2),  # one row, one output
    ((40, 64), 64, 64, 3),  # every layer 64 x 64: compile-time dims throughout
    # 13 matrices of 64 x 64: their fp32 weight-gradient sums don't fit beside the weights, so the
    # CUDA backward stores the pre-activation gradients for GEMMs (and recomputes the GELUs' output)
    ((33, 64), 64, 64, 12),
]


def eager(mlp: FullyFusedMLP) -> nn.Sequential:
    """The nn.Sequential mlp stands for, sharing its parameters."""
    return nn.Sequential(*mlp)


def check(mlp: FullyFusedMLP, x: torch.Tensor, ref_device="cpu"):
    """Output and every gradient against fp64 (computed on ref_device) and the eager Sequential,
    by the tolerance rule."""
    dtype = x.dtype
    ref_mlp = copy.deepcopy(mlp).double().to(ref_device)
    x_ref = x.detach().double().to(ref_device).requires_grad_()
    y, y_torch, y_ref = mlp(x), eager(mlp)(x), nn.Sequential(*ref_mlp)(x_ref)
    assert y.dtype == dtype and y.shape == y_torch.shape
    assert_close_to_reference(y, y_torch, y_ref, dtype, "out", atol=ATOL_GEMM)

    dy = torch.randn_like(y)
    inputs, ref_inputs = [x, *mlp.parameters()], [x_ref, *ref_mlp.parameters()]
    grads = torch.autograd.grad(y, inputs, dy)
    grads_torch = torch.autograd.grad(y_torch, inputs, dy)
    grads_ref = torch.autograd.grad(y_ref, ref_inputs, dy.double().to(ref_device))
    names = ["dx"] + [f"d{n}" for n, _ in mlp.named_parameters()]
    for name, g, gt, gr in zip(names, grads, grads_torch, grads_ref, strict=True):
        assert_close_to_reference(g, gt, gr, dtype, name, atol=ATOL_GEMM)
    return y, grads


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("x_shape, hidden, n_out, layers", SHAPES)
def test_forward_backward(x_shape, hidden, n_out, layers, activation, dtype, device):
    torch.manual_seed(0)
    mlp = FullyFusedMLP(x_shape[-1], n_out, hidden, layers, activation=activation)
    mlp = mlp.to(device=device, dtype=dtype)
    check(mlp, torch.randn(x_shape, device=device, dtype=dtype, requires_grad=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("output_activation", OUT_ACTIVATIONS[1:] + ["gelu_tanh"])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_output_activation(activation, output_activation, dtype, device):
    torch.manual_seed(1)
    mlp = FullyFusedMLP(
        24, 5, 32, 2, activation=activation, output_activation=output_activation
    ).to(device=device, dtype=dtype)
    check(mlp, torch.randn(70, 24, device=device, dtype=dtype, requires_grad=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_no_bias(dtype, device):
    mlp = FullyFusedMLP(16, 16, 64, 3, bias=False).to(device=device, dtype=dtype)
    assert all(m.bias is None for m in mlp.linears())
    check(mlp, torch.randn(33, 16, device=device, dtype=dtype, requires_grad=True))


def test_only_some_gradients(device):
    mlp = FullyFusedMLP(8, 8, 32, 2).to(device)
    mlp[0].weight.requires_grad_(False)
    x = torch.randn(20, 8, device=device)  # no gradient for x either
    mlp(x).sum().backward()
    assert mlp[0].weight.grad is None and mlp[2].weight.grad is not None
    assert all(m.bias.grad is not None for m in mlp.linears())


def test_state_dict_is_sequential(device):
    torch.manual_seed(3)
    mlp = FullyFusedMLP(12, 4, 32, 3, activation="relu", output_activation="gelu")
    assert list(mlp.state_dict()) == [f"{i}.{p}" for i in (0, 2, 4, 6) for p in ("weight", "bias")]
    torch.manual_seed(3)
    seq = nn.Sequential(
        nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU()
    )
    seq.append(nn.Linear(32, 4)).append(nn.GELU())
    for (k, v), (k_ref, v_ref) in zip(
        mlp.state_dict().items(), seq.state_dict().items(), strict=True
    ):
        assert k == k_ref and torch.equal(v, v_ref)  # nn.Linear's initialization too
    other = copy.deepcopy(seq)
    for p in other.parameters():
        p.data.normal_()
    mlp.load_state_dict(other.state_dict())
    x = torch.randn(9, 12)
    torch.testing.assert_close(mlp(x), other(x), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("out_act", [None, nn.ReLU()])
@pytest.mark.parametrize("act", [nn.GELU(), nn.GELU(approximate="tanh"), nn.ReLU()])
def test_from_sequential(act, out_act, device):
    seq = nn.Sequential(nn.Linear(6, 32), act, nn.Linear(32, 32), act, nn.Linear(32, 3))
    if out_act is not None:
        seq.append(out_act)
    seq = seq.to(device)
    mlp = FullyFusedMLP.from_sequential(seq)
    assert [m for m in mlp.linears()] == [seq[0], seq[2], seq[4]]  # shared, not copied
    assert mlp.output_activation == ("none" if out_act is None else "relu")
    x = torch.randn(40, 6, device=device)
    torch.testing.assert_close(mlp(x), seq(x), atol=1e-5, rtol=1e-5)


def test_from_sequential_rejects():
    lin = nn.Linear
    for bad in (
        nn.Sequential(lin(4, 8)),  # no hidden layer
        nn.Sequential(lin(4, 8), nn.SiLU(), lin(8, 2)),  # an activation it doesn't have
        nn.Sequential(lin(4, 8), nn.GELU(), lin(8, 8), nn.ReLU(), lin(8, 2)),  # two kinds
        nn.Sequential(lin(4, 8), nn.GELU(), lin(8, 2, bias=False)),  # mixed biases
        nn.Sequential(lin(4, 8), nn.GELU(), nn.GELU(), lin(8, 2)),
    ):
        with pytest.raises(TypeError, match="FullyFusedMLP.from_sequential"):
            FullyFusedMLP.from_sequential(bad)
    with pytest.raises(TypeError, match="same width"):
        FullyFusedMLP.from_sequential(nn.Sequential(lin(4, 8), nn.GELU(), lin(16, 2)))


def test_bad_inputs():
    with pytest.raises(
        ValueError, match="activation must be 'gelu', 'gelu_tanh', 'relu' or 'none'"
    ):
        FullyFusedMLP(4, 4, 16, 1, activation="silu")
    with pytest.raises(ValueError, match="hidden_layers must be a positive int, got 0"):
        FullyFusedMLP(4, 4, 16, 0)
    x = torch.randn(3, 8)
    w = [torch.randn(16, 8), torch.randn(16, 16), torch.randn(2, 16)]
    f = fusedops.fully_fused_mlp
    with pytest.raises(
        ValueError, match=r"weights\[1\] must have shape \[16, 16\], got \[16, 15\]"
    ):
        f(x, [w[0], w[1][:, :15], w[2]])
    with pytest.raises(ValueError, match=r"weights\[0\] must have shape \[16, 7\]"):
        f(x[:, :7], w)
    with pytest.raises(TypeError, match=r"weights\[2\] has dtype Half but x has dtype Float"):
        f(x, [w[0], w[1], w[2].half()])
    with pytest.raises(ValueError, match="biases must be empty or hold one per weight"):
        f(x, w, [torch.zeros(16)])
    with pytest.raises(ValueError, match=r"biases\[2\] must have shape \[2\]"):
        f(x, w, [torch.zeros(16), torch.zeros(16), torch.zeros(3)])
    with pytest.raises(ValueError, match="at least 2 matrices"):
        f(x, w[:1])
    with pytest.raises(ValueError, match="output_activation must be .* got 'tanh'"):
        f(x, w, None, "gelu", "tanh")
    with pytest.raises(TypeError, match="x must be float32, float16, bfloat16 or float64"):
        f(x.long(), [t.long() for t in w])
    with pytest.raises(ValueError, match="at least one dimension"):
        f(torch.tensor(1.0), w)
    with pytest.raises(TypeError, match="weights must be a sequence of Tensors"):
        f(x, w[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bf16: the CUDA kernels
def test_empty_batch(dtype, device):
    mlp = FullyFusedMLP(8, 4, 16, 2).to(device, dtype)
    x = torch.randn(0, 8, device=device, dtype=dtype, requires_grad=True)
    y = mlp(x)
    assert y.shape == (0, 4)
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert all(not p.grad.any() for p in mlp.parameters())


def test_inference_saves_nothing(device):
    mlp = FullyFusedMLP(8, 4, 16, 2).to(device)
    x = torch.randn(5, 8, device=device)
    with torch.no_grad():
        y = mlp(x)
    fwd = torch.ops.fusedops.fully_fused_mlp_fwd.default
    weights = [m.weight.detach() for m in mlp.linears()]
    biases = [m.bias.detach() for m in mlp.linears()]
    out, *saves = fwd(x, weights, biases, "gelu", "none", False)
    assert all(s.numel() == 0 for s in saves)
    torch.testing.assert_close(out, y)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_saves_one_tensor_per_hidden_layer(activation, dtype, device):
    # The GELUs save their pre-activation (the backward recomputes the output from it), the
    # others their output: one [layers, rows, hidden] tensor either way, on every path.
    mlp = FullyFusedMLP(8, 4, 16, 3, activation=activation).to(device, dtype)
    weights = [m.weight.detach() for m in mlp.linears()]
    biases = [m.bias.detach() for m in mlp.linears()]
    x = torch.randn(5, 8, device=device, dtype=dtype)
    _, act, pre, out_pre = torch.ops.fusedops.fully_fused_mlp_fwd(
        x, weights, biases, activation, "none", True
    )
    saved, absent = (pre, act) if activation.startswith("gelu") else (act, pre)
    assert saved.shape == (3, 5, 16) and absent.numel() == 0 and out_pre.numel() == 0


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("activation, output_activation", [("gelu", "none"), ("relu", "gelu")])
def test_opcheck(activation, output_activation, requires_grad, device):
    torch.manual_seed(0)
    mlp = FullyFusedMLP(8, 4, 16, 2, activation=activation, output_activation=output_activation)
    weights = [m.weight.detach().to(device).requires_grad_(requires_grad) for m in mlp.linears()]
    biases = [m.bias.detach().to(device).requires_grad_(requires_grad) for m in mlp.linears()]
    x = torch.randn(2, 5, 8, device=device, requires_grad=requires_grad)
    fwd = torch.ops.fusedops.fully_fused_mlp_fwd.default
    bwd = torch.ops.fusedops.fully_fused_mlp_bwd.default
    for save in [True] + ([] if requires_grad else [False]):
        torch.library.opcheck(fwd, (x, weights, biases, activation, output_activation, save))
    torch.library.opcheck(fwd, (x, weights, [], activation, output_activation, True))
    detached = [w.detach() for w in weights]
    _, act, pre, out_pre = fwd(
        x.detach(), detached, [b.detach() for b in biases], activation, output_activation, True
    )
    dy = torch.randn(2, 5, 4, device=device)
    for has_bias in (True, False):
        args = (dy, x.detach(), detached, act, pre, out_pre, activation, output_activation)
        torch.library.opcheck(bwd, (*args, has_bias))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gradcheck(activation):
    torch.manual_seed(0)
    mlp = FullyFusedMLP(5, 3, 6, 2, activation=activation, output_activation="gelu_tanh")
    mlp = mlp.double()
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    if activation == "relu":
        x = x + 0.05 * torch.sign(x)  # keep pre-activations off ReLU's kink
    weights = [m.weight for m in mlp.linears()]
    biases = [m.bias for m in mlp.linears()]

    def f(x, *params):
        n = len(weights)
        return fusedops.fully_fused_mlp(
            x, list(params[:n]), list(params[n:]), activation, "gelu_tanh"
        )

    assert torch.autograd.gradcheck(f, (x, *weights, *biases))


def test_compile_fullgraph(device):
    torch.manual_seed(0)
    mlp = FullyFusedMLP(16, 8, 32, 3, activation="gelu_tanh").to(device)
    x = torch.randn(3, 7, 16, device=device, requires_grad=True)
    assert_compiles_like_eager(mlp, x)


def test_autocast_dtype(device):
    if device == "cpu":
        dtype = torch.bfloat16
    else:
        dtype = torch.float16
    mlp = FullyFusedMLP(16, 8, 32, 2).to(device)
    x = torch.randn(10, 16, device=device)
    with torch.autocast(device_type=device, dtype=dtype):
        y, y_torch = mlp(x), eager(mlp)(x)
    assert y.dtype == y_torch.dtype == dtype


# --- the fused CUDA kernels -------------------------------------------------------------------


def _kernel_names(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_fused_kernels_run(dtype, cuda_device):
    mlp = FullyFusedMLP(32, 16, 64, 4).to(cuda_device, dtype)
    x = torch.randn(1000, 32, device=cuda_device, dtype=dtype, requires_grad=True)
    names = _kernel_names(lambda: mlp(x).sum().backward())
    assert any("ffm_forward_kernel" in n for n in names), names
    assert any("ffm_backward_kernel" in n for n in names), names
    # fp32 and widths past 128 take the composed path: no fused kernel.
    wide = FullyFusedMLP(32, 16, 144, 2).to(cuda_device, dtype)
    names = _kernel_names(lambda: wide(x))
    assert not any("ffm_" in n for n in names), names


@pytest.mark.cuda
@pytest.mark.parametrize(
    "n_in, hidden, layers",
    [(128, 128, 12), (16, 16, 20)],  # weights past a block's shared memory; past 17 matrices
)
def test_cuda_unserved_networks_run_composed(n_in, hidden, layers, cuda_device):
    torch.manual_seed(0)
    mlp = FullyFusedMLP(n_in, 8, hidden, layers).to(cuda_device, torch.bfloat16)
    x = torch.randn(50, n_in, device=cuda_device, dtype=torch.bfloat16, requires_grad=True)
    names = _kernel_names(lambda: mlp(x).sum().backward())
    assert not any("ffm_" in n for n in names), names
    check(mlp, x)


@pytest.mark.cuda
@pytest.mark.parametrize("width", [16, 32, 64, 128])
def test_cuda_many_rows(width, cuda_device):
    # Several tiles per persistent block, a ragged last tile, 16-byte and scalar row loads.
    torch.manual_seed(0)
    for n_in in (width, 3):
        mlp = FullyFusedMLP(n_in, 7, width, 4).to(cuda_device, torch.bfloat16)
        x = torch.randn(70001, n_in, device=cuda_device, dtype=torch.bfloat16, requires_grad=True)
        check(mlp, x)


# Width-128 networks whose backward runs in chunks of rows (n_in, activation, output_activation),
# at least two, of whole waves of the resident warps' tiles (16896 rows on an H100 or H200) and of
# up to ~1 GiB of what the weight GEMMs read (~500K rows for the GELU one, ~1M for the ReLU one).
# Rows: a few waves (two launches, the last ragged), and past that budget (two or three).
CHUNKED = [(128, "gelu", "none"), (3, "relu", "gelu")]
CHUNKED_ROWS = [pytest.param(40_001, id="few_waves"), pytest.param(1_100_001, id="past_budget")]


def _chunked_mlp(n_in, activation, output_activation, rows, device):
    torch.manual_seed(0)
    mlp = FullyFusedMLP(
        n_in, 16, 128, 4, activation=activation, output_activation=output_activation
    ).to(device, torch.bfloat16)
    x = torch.randn(rows, n_in, device=device, dtype=torch.bfloat16, requires_grad=True)
    return mlp, x


@pytest.mark.cuda
@pytest.mark.parametrize("rows", CHUNKED_ROWS)
@pytest.mark.parametrize("n_in, activation, output_activation", CHUNKED)
def test_cuda_width_128_backward_in_chunks(n_in, activation, output_activation, rows, cuda_device):
    # Each chunk's weight gradients come from fp32 GEMMs, added in order. x's 3-feature rows are
    # not 16-byte multiples, which cuBLASLt doesn't take: ATen's GEMM for that matrix. fp64
    # reference on the GPU (on the CPU it would take minutes).
    mlp, x = _chunked_mlp(n_in, activation, output_activation, rows, cuda_device)
    check(mlp, x, ref_device=cuda_device)


@pytest.mark.cuda
@pytest.mark.parametrize("rows", CHUNKED_ROWS)
@pytest.mark.parametrize("n_in, activation, output_activation", CHUNKED)
def test_cuda_width_128_backward_launches_per_chunk(
    n_in, activation, output_activation, rows, cuda_device
):
    mlp, x = _chunked_mlp(n_in, activation, output_activation, rows, cuda_device)
    y = mlp(x)
    names = _kernel_names(lambda: y.sum().backward())
    assert sum("ffm_backward_kernel" in n for n in names) >= 2, names


@pytest.mark.cuda
def test_cuda_width_128_training_peak_below_eager(cuda_device):
    # The GEMM path's backward keeps at most about half the batch's pre-activation gradients and
    # GELU outputs at once; with all of them a step's peak passed eager's (904 against 772 MiB).
    # A training step as a loss would run it: the output alive, a dense gradient.
    if torch.cuda.get_device_properties(cuda_device).shared_memory_per_block_optin < 227 * 1024:
        pytest.skip("width 128's kernels need 227 KiB of shared memory per block (else: composed)")
    torch.manual_seed(0)
    mlp = FullyFusedMLP(128, 128, 128, 4).to(cuda_device, torch.bfloat16)
    x = torch.randn(1 << 18, 128, device=cuda_device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)

    def step_peak(model) -> int:
        def step():
            return torch.autograd.grad(model(x), [x, *mlp.parameters()], dy)

        step()  # first calls allocate what the process keeps (GEMM workspaces)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start

    fused, torch_peak = step_peak(mlp), step_peak(eager(mlp))
    assert fused < torch_peak, (fused, torch_peak)


def _block_sizes(fn, tmp_path) -> dict[str, int]:
    """Threads per block of each fused kernel fn launches, from the profiler's trace."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    return {
        kind: e["args"]["block"][0]
        for e in events
        if e.get("cat") == "kernel"
        for kind in ("forward", "backward")
        if f"ffm_{kind}_kernel" in e["name"]
    }


# Width-128 networks (in, hidden layers) and the threads per block each kernel gets with sm_90's
# 227 KiB of shared memory: 12 warps where their staging tiles fit beside the weights, else 8.
WIDTH_128_BLOCKS = {
    (128, 4): {"forward": 384, "backward": 384},
    (16, 5): {"forward": 256, "backward": 384},  # the forward's biases leave room for 8
}


def _width_128_mlp(n_in, layers, device):
    torch.manual_seed(0)
    mlp = FullyFusedMLP(n_in, 128, 128, layers).to(device, torch.bfloat16)
    x = torch.randn(5000, n_in, device=device, dtype=torch.bfloat16, requires_grad=True)
    return mlp, x


@pytest.mark.cuda
@pytest.mark.parametrize("n_in, layers", list(WIDTH_128_BLOCKS))
def test_cuda_width_128_networks(n_in, layers, cuda_device):
    check(*_width_128_mlp(n_in, layers, cuda_device))


@pytest.mark.cuda
@pytest.mark.parametrize("n_in, layers", list(WIDTH_128_BLOCKS))
def test_cuda_width_128_takes_the_warps_that_fit(n_in, layers, cuda_device, tmp_path):
    if torch.cuda.get_device_properties(cuda_device).shared_memory_per_block_optin != 227 * 1024:
        pytest.skip("the expected block sizes are for 227 KiB of shared memory per block")
    mlp, x = _width_128_mlp(n_in, layers, cuda_device)
    blocks = _block_sizes(lambda: mlp(x).sum().backward(), tmp_path)
    assert blocks == WIDTH_128_BLOCKS[(n_in, layers)]


@pytest.mark.cuda
def test_cuda_width_64_block_sizes(cuda_device, tmp_path):
    # Width 64 with 227 KiB of shared memory: the forward two blocks of 10 warps per SM (96
    # registers), the backward, which sums the weight gradients, one block of 16.
    if torch.cuda.get_device_properties(cuda_device).shared_memory_per_block_optin != 227 * 1024:
        pytest.skip("the expected block sizes are for 227 KiB of shared memory per block")
    torch.manual_seed(0)
    mlp = FullyFusedMLP(64, 64, 64, 4).to(cuda_device, torch.bfloat16)
    x = torch.randn(5000, 64, device=cuda_device, dtype=torch.bfloat16, requires_grad=True)
    blocks = _block_sizes(lambda: mlp(x).sum().backward(), tmp_path)
    assert blocks == {"forward": 320, "backward": 512}


def one_past_16_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t whose data starts one element past a 16-byte boundary."""
    out = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:].view(t.shape)
    return out.copy_(t)


@pytest.mark.cuda
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_cuda_misaligned_tensors(activation, cuda_device):
    # Every input of both kernels one element off 16-byte alignment: their element-wise loads
    # instead of the 16-byte ones (and of the backward's cp.async): the kernels' outputs the same
    # bit for bit.
    torch.manual_seed(0)
    mlp = FullyFusedMLP(32, 16, 64, 3, activation=activation, output_activation="gelu")
    mlp = mlp.to(cuda_device, torch.bfloat16)
    weights = [m.weight.detach() for m in mlp.linears()]
    biases = [m.bias.detach() for m in mlp.linears()]
    x = torch.randn(1000, 32, device=cuda_device, dtype=torch.bfloat16)
    dy = torch.randn(1000, 16, device=cuda_device, dtype=torch.bfloat16)
    ops = torch.ops.fusedops
    fwd = ops.fully_fused_mlp_fwd(x, weights, biases, activation, "gelu", True)
    fwd_off = ops.fully_fused_mlp_fwd(
        one_past_16_bytes(x), weights, biases, activation, "gelu", True
    )
    for a, b in zip(fwd, fwd_off, strict=True):
        assert torch.equal(a, b)
    _, *saves = fwd
    bwd = ops.fully_fused_mlp_bwd(dy, x, weights, *saves, activation, "gelu", True)
    dy_off, x_off, *saves_off = (one_past_16_bytes(t) for t in (dy, x, *saves))
    bwd_off = ops.fully_fused_mlp_bwd(dy_off, x_off, weights, *saves_off, activation, "gelu", True)
    grad_x, grad_w, grad_b = bwd
    grad_x_off, grad_w_off, grad_b_off = bwd_off
    # At width 64 the backward kernel sums the weight gradients too: every output the same bits.
    for g, g_off in zip(
        [grad_x, *grad_w, *grad_b], [grad_x_off, *grad_w_off, *grad_b_off], strict=True
    ):
        assert torch.equal(g, g_off)


@pytest.mark.cuda
def test_cuda_deterministic(cuda_device):
    mlp = FullyFusedMLP(32, 16, 64, 4).to(cuda_device, torch.bfloat16)
    x = torch.randn(50000, 32, device=cuda_device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(50000, 16, device=cuda_device, dtype=torch.bfloat16)
    runs = [torch.autograd.grad(mlp(x), [x, *mlp.parameters()], dy) for _ in range(2)]
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.cuda
def test_cuda_graph(cuda_device):
    mlp = FullyFusedMLP(32, 16, 64, 2).to(cuda_device, torch.float16)
    x = torch.randn(300, 32, device=cuda_device, dtype=torch.float16, requires_grad=True)

    def step():
        x.grad = None
        for p in mlp.parameters():
            p.grad = None
        y = mlp(x)
        y.sum().backward()
        return y

    expected = step().detach().clone()
    grads = [x.grad.clone()] + [p.grad.clone() for p in mlp.parameters()]
    graph, out = capture_cuda_graph(step)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x.grad, grads[0])
