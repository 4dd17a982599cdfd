"""fusedops.fused_mlp / FusedMLP against an fp64 CPU reference and torch at the same dtype."""

import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from reference import (
    ATOL_GEMM,
    assert_close_to_reference,
    assert_compiles_like_eager,
    capture_cuda_graph,
    zero_fills_in_backward,
)
from torch import nn

import fusedops
from fusedops import FusedMLP

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
APPROX = ["none", "tanh"]


def assert_rule(ours, theirs, ref, dtype, what="output"):
    """The tolerance rule with the matrix-product ATOL (tests/reference.py)."""
    assert_close_to_reference(ours, theirs, ref, dtype, what, atol=ATOL_GEMM)


def eager_mlp(x, w1, b1, w2, b2, approximate="none"):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate=approximate), w2, b2)


def params(n_in, hidden, n_out, dtype, device, bias=(True, True)):
    """nn.Linear-scaled weights, biases where asked, all requiring grad."""
    w1 = torch.randn(hidden, n_in, dtype=dtype, device=device) / n_in**0.5
    w2 = torch.randn(n_out, hidden, dtype=dtype, device=device) / hidden**0.5
    b1 = torch.randn(hidden, dtype=dtype, device=device) if bias[0] else None
    b2 = torch.randn(n_out, dtype=dtype, device=device) if bias[1] else None
    return [t.requires_grad_() if t is not None else None for t in (w1, b1, w2, b2)]


def check_block(x, w1, b1, w2, b2, approximate, recompute=False):
    """Forward and every gradient against fp64 and torch at x's dtype, by the tolerance rule."""
    dtype = x.dtype
    args = [x, w1, b1, w2, b2]
    y = fusedops.fused_mlp(x, w1, b1, w2, b2, approximate, recompute_activation=recompute)
    y_torch = eager_mlp(x, w1, b1, w2, b2, approximate)
    ref_args = [a.detach().double().cpu().requires_grad_() if a is not None else None for a in args]
    y_ref = eager_mlp(*ref_args, approximate)
    assert y.shape == y_torch.shape and y.dtype == dtype
    assert_rule(y, y_torch, y_ref, dtype, "out")

    dy = torch.randn_like(y)
    live = [i for i, a in enumerate(args) if a is not None and a.requires_grad]
    grads = torch.autograd.grad(y, [args[i] for i in live], dy)
    grads_torch = torch.autograd.grad(y_torch, [args[i] for i in live], dy)
    grads_ref = torch.autograd.grad(y_ref, [ref_args[i] for i in live], dy.double().cpu())
    for i, g, gt, gr in zip(live, grads, grads_torch, grads_ref, strict=True):
        assert g.shape == args[i].shape and g.dtype == dtype
        assert_rule(g, gt, gr, dtype, ["dx", "dw1", "db1", "dw2", "db2"][i])
    return y, grads


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize(
    "x_shape, hidden, n_out",
    [
        ((16, 32), 128, 32),  # aligned: cuBLASLt epilogue paths on CUDA
        ((2, 3, 64), 256, 48),  # leading batch dims, out != in
        ((5, 7), 13, 5),  # odd feature sizes: fallback paths on CUDA
        ((24,), 40, 24),  # 1-D x
        ((3, 1, 9, 16), 24, 8),
    ],
)
def test_forward_backward(x_shape, hidden, n_out, approximate, dtype, device):
    x = torch.randn(x_shape, dtype=dtype, device=device, requires_grad=True)
    w1, b1, w2, b2 = params(x_shape[-1], hidden, n_out, dtype, device)
    check_block(x, w1, b1, w2, b2, approximate)


@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("bias", [(False, False), (True, False), (False, True)])
def test_bias_none(bias, approximate, device):
    x = torch.randn(6, 32, device=device, requires_grad=True)
    w1, b1, w2, b2 = params(32, 64, 16, torch.float32, device, bias)
    check_block(x, w1, b1, w2, b2, approximate)


def test_partial_requires_grad(device):
    # Only some inputs need gradients: the backward computes just those.
    x = torch.randn(8, 16, device=device)
    w1, b1, w2, b2 = params(16, 32, 16, torch.float32, device)
    w1.requires_grad_(False)
    b2.requires_grad_(False)
    check_block(x, w1, b1, w2, b2, "tanh")


@pytest.mark.parametrize("approximate", APPROX)
def test_recompute_activation_same_grads(approximate, device):
    x = torch.randn(4, 10, 64, device=device, requires_grad=True)
    w1, b1, w2, b2 = params(64, 256, 64, torch.float32, device)
    torch.manual_seed(2)  # the same dy for both
    _, grads = check_block(x, w1, b1, w2, b2, approximate)
    torch.manual_seed(2)
    _, grads_rc = check_block(x, w1, b1, w2, b2, approximate, recompute=True)
    # On CUDA the tanh path saves cuBLASLt's epilogue GELU, whose tanh differs from ours (the
    # recomputed one) in the last bits: same gradients up to fp32 rounding of that difference.
    tol = 1e-6 if device == "cpu" else 1e-4
    for g, g_rc in zip(grads, grads_rc, strict=True):
        torch.testing.assert_close(g_rc, g, atol=tol, rtol=tol)


@pytest.mark.cuda
@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("n_out", [64, 512])
def test_cuda_recompute_activation_16bit(n_out, approximate):
    # recompute_activation on the 16-bit GEMM paths (tanh: fc1 with cuBLASLt's GELU epilogue):
    # every gradient obeys the tolerance rule against fp64 and torch.
    x = torch.randn(4, 32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w1, b1, w2, b2 = params(64, 256, n_out, torch.bfloat16, "cuda")
    check_block(x, w1, b1, w2, b2, approximate, recompute=True)


def saved_activation_bytes(module, x):
    """Bytes of the tensors autograd saves for module(x).sum(), parameters not counted."""
    param_storages = {p.untyped_storage().data_ptr() for p in module.parameters()}
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in param_storages:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x).sum().backward()
    return sum(storages.values())


class RefMLP(nn.Module):
    """The eager block FusedMLP replaces, without nn.Sequential."""

    def __init__(self, n_in, hidden, n_out, approximate="none", bias=True, dtype=None):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden, bias=bias, dtype=dtype)
        self.act = nn.GELU(approximate=approximate)
        self.fc2 = nn.Linear(hidden, n_out, bias=bias, dtype=dtype)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


@pytest.mark.parametrize("approximate", APPROX)
def test_recompute_activation_saves_memory(approximate):
    # A 4x block: eager saves x, pre and act; recompute saves x and pre: (1 + 4) / (1 + 8).
    torch.manual_seed(0)
    ref = RefMLP(256, 1024, 256, approximate)
    x = torch.randn(8, 32, 256, requires_grad=True)
    eager = saved_activation_bytes(ref, x)
    fused = saved_activation_bytes(FusedMLP.from_modules(ref.fc1, ref.act, ref.fc2), x)
    lean = saved_activation_bytes(
        FusedMLP.from_modules(ref.fc1, ref.act, ref.fc2, recompute_activation=True), x
    )
    assert fused <= eager
    assert lean <= 0.6 * eager, (lean, eager)


@pytest.mark.cuda
@pytest.mark.parametrize("approximate", APPROX)
def test_cuda_training_step_peak_memory(approximate, cuda_device):
    # bench_mlp's peak at the shape (T = 8192, D = 768, bf16): what one training step
    # allocates beyond its inputs, after a first step that picked the GEMM algorithms. H200
    # (bench/results/h200-fused_mlp-train-dpre-first.json): eager 213 MiB, fused 173,
    # recompute_activation 129 before its backward wrote act beside dpre (one pass instead of
    # two; what it saves between forward and backward is unchanged: the test above).
    from fusedops.tools import bench_mlp

    sets = bench_mlp.input_sets("train", 8192, 768, torch.bfloat16, torch.device(cuda_device))[:1]
    peak = {}
    for provider in ("eager", "fusedops", "fusedops-recompute"):
        step = bench_mlp.prepare(
            provider, "train", approximate, 8192, 768, torch.bfloat16, cuda_device, sets
        )
        bench_mlp.peak_memory(step)  # the first call: algorithm choice, workspaces
        peak[provider] = bench_mlp.peak_memory(step)
    assert peak["fusedops"] <= peak["eager"], peak
    assert peak["fusedops-recompute"] <= peak["fusedops"], peak


@pytest.mark.parametrize("approximate", APPROX)
def test_inference_no_grad(approximate, device):
    # Without a saved pre-activation the CUDA GELU kernel runs in place over it.
    x = torch.randn(4, 32, device=device)
    w1, b1, w2, b2 = params(32, 64, 32, torch.float32, device)
    y = fusedops.fused_mlp(x, w1, b1, w2, b2, approximate)
    with torch.no_grad():
        y_ng = fusedops.fused_mlp(x, w1, b1, w2, b2, approximate)
    torch.testing.assert_close(y_ng, y.detach())


def test_empty_batch(device):
    x = torch.randn(0, 3, 16, device=device, requires_grad=True)
    w1, b1, w2, b2 = params(16, 32, 8, torch.float32, device)
    y = fusedops.fused_mlp(x, w1, b1, w2, b2)
    assert y.shape == (0, 3, 8)
    grads = torch.autograd.grad(y.sum(), (x, w1, b1, w2, b2))
    for g, p in zip(grads, (x, w1, b1, w2, b2), strict=True):
        assert g.shape == p.shape and not g.any()


@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(requires_grad, approximate, device):
    x = torch.randn(2, 5, 16, device=device, requires_grad=requires_grad)
    w1, b1, w2, b2 = (
        t.detach().requires_grad_(requires_grad) for t in params(16, 24, 8, torch.float32, device)
    )
    fwd, bwd = torch.ops.fusedops.mlp_fwd.default, torch.ops.fusedops.mlp_bwd.default
    # save_pre=False is for inference only: the backward needs the pre-activation.
    saves = [(True, True), (True, False)] + ([] if requires_grad else [(False, False)])
    for save in saves:
        torch.library.opcheck(fwd, (x, w1, b1, w2, b2, approximate, *save))
    torch.library.opcheck(fwd, (x, w1, None, w2, None, approximate, True, True))
    _, pre, act = fwd(
        x.detach(), w1.detach(), b1.detach(), w2.detach(), b2.detach(), approximate, True, True
    )
    dy = torch.randn(2, 5, 8, device=device)
    detached = (x.detach(), w1.detach(), w2.detach(), pre)
    for saved_act in (act, act.new_empty(0)):
        for mask in (
            [True] * 5,
            [False, True, False, True, False],
            [True, False, False, False, True],
        ):
            torch.library.opcheck(bwd, (dy, *detached, saved_act, approximate, mask))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("approximate", APPROX)
def test_transposed_weights_get_column_major_grads(approximate, dtype, device):
    """Weights stored [in, out] (GPT-2's Conv1D) and passed as .t(): the backward writes their
    gradients column-major, so that the stored weights get contiguous gradients without a copy;
    the values are those of row-major weights (to the GEMMs' rounding)."""
    if dtype == torch.bfloat16 and device == "cpu":
        pytest.skip("the CUDA GEMM paths are what differ; fp32 covers the composed CPU path")
    ops = torch.ops.fusedops
    x = torch.randn(64, 256, dtype=dtype, device=device)
    dy = torch.randn(64, 256, dtype=dtype, device=device)
    w1, b1, w2, b2 = (t.detach() for t in params(256, 512, 256, dtype, device))
    stored = [w.t().contiguous() for w in (w1, w2)]  # [in, hidden], [hidden, out]
    saved = ops.mlp_fwd(x, w1, b1, w2, b2, approximate, True, True)[1:]
    want = ops.mlp_bwd(dy, x, w1, w2, *saved, approximate, [True] * 5)
    got = ops.mlp_bwd(dy, x, stored[0].t(), stored[1].t(), *saved, approximate, [True] * 5)
    assert got[1].t().is_contiguous() and got[3].t().is_contiguous()
    for g, w in zip(got, want, strict=True):  # the transposed GEMMs may sum in another order
        torch.testing.assert_close(g, w)
    torch.library.opcheck(
        ops.mlp_bwd.default,
        (dy, x, stored[0].t(), stored[1].t(), *saved, approximate, [True] * 5),
    )


@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("recompute", [False, True])
def test_gradcheck(recompute, approximate):
    x = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    w1, b1, w2, b2 = params(5, 7, 4, torch.float64, "cpu")

    def f(*args):
        return fusedops.fused_mlp(*args, approximate=approximate, recompute_activation=recompute)

    assert torch.autograd.gradcheck(f, (x, w1, b1, w2, b2))
    assert torch.autograd.gradcheck(lambda x, w1, w2: f(x, w1, None, w2, None), (x, w1, w2))


def test_compile_fullgraph(device):
    torch.manual_seed(0)
    model = FusedMLP(32, 64, approximate="tanh", device=device)
    x = torch.randn(3, 7, 32, device=device, requires_grad=True)
    assert_compiles_like_eager(model, x)


@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("how", ["modules", "sequential"])
def test_from_modules(how, approximate, device):
    fc1, act, fc2 = nn.Linear(48, 96), nn.GELU(approximate=approximate), nn.Linear(96, 40)
    block = nn.Sequential(fc1, act, fc2).to(device)
    fused = FusedMLP.from_modules(block) if how == "sequential" else FusedMLP.from_modules(*block)
    assert fused.fc1 is block[0] and fused.fc2 is block[2]
    assert fused.approximate == approximate
    x = torch.randn(5, 48, device=device, requires_grad=True)
    ref = copy.deepcopy(block).double().cpu()(x.detach().double().cpu())
    assert_rule(fused(x), block(x), ref, torch.float32)


def test_from_modules_rejects():
    fc1, fc2 = nn.Linear(8, 16), nn.Linear(16, 8)
    with pytest.raises(TypeError, match="act must be a torch.nn.GELU, got ReLU"):
        FusedMLP.from_modules(fc1, nn.ReLU(), fc2)
    with pytest.raises(TypeError, match="exactly"):
        FusedMLP.from_modules(nn.Sequential(fc1, nn.GELU()))
    with pytest.raises(ValueError, match="fc1 has 16 output features but fc2 expects 12"):
        FusedMLP.from_modules(fc1, nn.GELU(), nn.Linear(12, 8))
    with pytest.raises(ValueError, match="fc1 is torch.float32 on cpu but fc2 is torch.float64"):
        FusedMLP.from_modules(fc1, nn.GELU(), nn.Linear(16, 8, dtype=torch.float64))


def test_init_and_state_dict_round_trip():
    torch.manual_seed(1)
    ref = RefMLP(20, 80, 12, approximate="tanh")
    torch.manual_seed(1)
    fused = FusedMLP(20, 80, 12, approximate="tanh")
    assert list(fused.state_dict()) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    # The same initialization as nn.Linear, parameter for parameter.
    for (k, v), (k_ref, v_ref) in zip(
        fused.state_dict().items(), ref.state_dict().items(), strict=True
    ):
        assert k == k_ref and torch.equal(v, v_ref)
    other = RefMLP(20, 80, 12, approximate="tanh")
    fused.load_state_dict(other.state_dict())
    x = torch.randn(3, 20)
    ref_out = copy.deepcopy(other).double()(x.double())
    assert_rule(fused(x), other(x), ref_out, torch.float32)
    back = RefMLP(20, 80, 12, approximate="tanh")
    back.load_state_dict(fused.state_dict())
    assert torch.equal(back(x), other(x))
    assert FusedMLP(8, 16, bias=False).fc1.bias is None
    assert FusedMLP(8, 16).fc2.out_features == 8


def test_bad_inputs():
    x = torch.randn(4, 16)
    w1, b1, w2, b2 = (t.detach() for t in params(16, 32, 8, torch.float32, "cpu"))
    mlp = fusedops.fused_mlp
    with pytest.raises(ValueError, match=r"x has 15 features \(last dimension\) but w1 of shape"):
        mlp(x[:, :15], w1, b1, w2, b2)
    with pytest.raises(ValueError, match="w2 of shape .* expects 31 hidden features"):
        mlp(x, w1, b1, w2[:, :31], b2)
    with pytest.raises(ValueError, match=r"b1 must have shape \[32\]"):
        mlp(x, w1, b1[:5], w2, b2)
    with pytest.raises(ValueError, match=r"b2 must have shape \[8\]"):
        mlp(x, w1, b1, w2, b1)
    with pytest.raises(ValueError, match="w1 must be 2-D"):
        mlp(x, w1[0], b1, w2, b2)
    with pytest.raises(TypeError, match="w2 has dtype Half but x has dtype Float"):
        mlp(x, w1, b1, w2.half(), b2)
    with pytest.raises(TypeError, match="x must be float32, float16, bfloat16 or float64"):
        mlp(x.long(), w1.long(), None, w2.long(), None)
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh', got 'quick'"):
        mlp(x, w1, b1, w2, b2, "quick")
    with pytest.raises(ValueError, match="at least one dimension"):
        mlp(torch.tensor(1.0), w1, b1, w2, b2)
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        FusedMLP(4, 8, approximate="sigmoid")


@pytest.mark.cuda
def test_bad_device():
    x = torch.randn(4, 16, device="cuda")
    w1, b1, w2, b2 = (t.detach() for t in params(16, 32, 8, torch.float32, "cuda"))
    with pytest.raises(RuntimeError, match="w2 is on cpu but x is on cuda"):
        fusedops.fused_mlp(x, w1, b1, w2.cpu(), b2)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", APPROX)
def test_cuda_epilogue_vs_fallback(approximate, dtype):
    # The same block on 16-byte-aligned tensors (cuBLASLt epilogues) and on tensors shifted by
    # one element (every GEMM that touches x falls back): both obey the tolerance rule.
    x = torch.randn(64, 256, dtype=dtype, device="cuda")
    shifted = torch.empty(x.numel() + 1, dtype=dtype, device="cuda")[1:].view_as(x).copy_(x)
    w1, b1, w2, b2 = params(256, 1024, 256, dtype, "cuda")
    y, grads = check_block(x.requires_grad_(), w1, b1, w2, b2, approximate)
    y_s, grads_s = check_block(shifted.requires_grad_(), w1, b1, w2, b2, approximate)
    tol = (
        {"atol": 2 * ATOL_GEMM[dtype], "rtol": 2 * ATOL_GEMM[dtype]}
        if dtype != torch.float32
        else {}
    )
    torch.testing.assert_close(y_s, y, **tol)


def cuda_kernel_names(fn):
    """Names of the CUDA kernels fn() launches."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.cuda
@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recompute"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("approximate", APPROX)
def test_cuda_epilogues_used(approximate, dtype, recompute):
    # Aligned 16-bit training block, tanh: the forward's GELU runs in the first GEMM's epilogue.
    # exact: the erf GELU kernel (inference may run a CUTLASS GEMM: below). The backward's GELU'
    # always runs in the bias_gelu backward kernel, which sums db1 too and, with
    # recompute_activation, writes act for dW2 (no second GELU kernel). fp32 always runs the GELU
    # kernels (cuBLASLt's GELU epilogues are not fp32-accurate).
    model = FusedMLP(
        256,
        1024,
        512,
        approximate=approximate,
        recompute_activation=recompute,
        device="cuda",
        dtype=dtype,
    )
    x = torch.randn(128, 256, device="cuda", dtype=dtype, requires_grad=True)
    model(x).sum().backward()
    names = cuda_kernel_names(lambda: model(x).sum().backward())
    fwd = sum("bias_gelu_fwd_kernel" in n for n in names)
    bwd = sum("bias_gelu_bwd_kernel" in n for n in names)
    fused_fwd = approximate == "tanh" and dtype != torch.float32
    assert (fwd, bwd) == (int(not fused_fwd), 1), names
    if dtype != torch.float32:  # db2 from the dW2 GEMM's epilogue; the one ATen reduction: the loss
        assert not any("column_sum_kernel" in n for n in names), names
        assert sum("reduce_kernel" in n for n in names) == 1, names


def skip_without_cutlass_gemm():
    if fusedops.build_info().get("cutlass") != "1":
        pytest.skip("built without CUTLASS (pip install nvidia-cutlass, then rebuild)")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the CUTLASS GEMM is built for sm_90a (H100/H200)")


def inference_block(n_in, dtype, bias=True):
    """x [300, n_in] and detached params of an n_in -> 1032 -> 200 block: rows and hidden are not
    multiples of the CUTLASS GEMM's 128x256 tile."""
    x = torch.randn(300, n_in, dtype=dtype, device="cuda")
    params_ = params(n_in, 1032, 200, dtype, "cuda", bias=(bias, bias))
    return x, [t.detach() if t is not None else None for t in params_]


@pytest.mark.cuda
@pytest.mark.parametrize("n_in", [256, 1032])
def test_cuda_exact_inference_epilogues_used(n_in):
    # Inference with the exact GELU on compute capability 9.0, in_features <= 1024: fc1 is one
    # CUTLASS GEMM with the erf GELU in its epilogue where the build holds it (build_info's
    # cutlass=1); wider inputs: cuBLASLt and the bias_gelu kernel.
    skip_without_cutlass_gemm()
    x, w = inference_block(n_in, torch.bfloat16)
    with torch.no_grad():
        names = cuda_kernel_names(lambda: fusedops.fused_mlp(x, *w))
    cutlass = any("cutlass" in n and "device_kernel" in n for n in names)  # may stay mangled
    assert cutlass == (n_in <= 1024), names
    assert any("bias_gelu_fwd_kernel" in n for n in names) == (n_in > 1024), names


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_cuda_exact_inference_gemm_epilogue(bias, dtype):
    # The CUTLASS GEMM's output (the test above shows it runs) obeys the tolerance rule.
    skip_without_cutlass_gemm()
    x, w = inference_block(256, dtype, bias)
    with torch.no_grad():
        out = fusedops.fused_mlp(x, *w)
    ref = eager_mlp(*(t.double().cpu() if t is not None else None for t in (x, *w)))
    assert_rule(out, eager_mlp(x, *w), ref, dtype)


@pytest.mark.cuda
def test_cuda_tf32_respected():
    x = torch.randn(256, 1024, device="cuda")
    w1, b1, w2, b2 = (t.detach() for t in params(1024, 1024, 1024, torch.float32, "cuda"))
    ref = eager_mlp(*(t.double().cpu() for t in (x, w1, b1, w2, b2)))
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for allow in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = allow
            out = fusedops.fused_mlp(x, w1, b1, w2, b2)
            assert_rule(out, eager_mlp(x, w1, b1, w2, b2), ref, torch.float32, f"tf32={allow}")
            if not allow:  # TF32 (10-bit mantissa) would be far off at K=1024
                assert (out.double().cpu() - ref).abs().max() < 1e-3
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.cuda
@pytest.mark.parametrize("approximate", APPROX)
def test_cuda_db1_deterministic(approximate):
    model = FusedMLP(256, 1024, approximate=approximate, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(4096, 256, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(4096, 256, device="cuda", dtype=torch.bfloat16)
    runs = [torch.autograd.grad(model(x), list(model.parameters()), dy) for _ in range(3)]
    for grads in runs[1:]:
        assert all(torch.equal(g, g0) for g, g0 in zip(grads, runs[0], strict=True))


# A training step whose GEMMs (fc1 with the GELU epilogue, dact) cuBLASLt's first heuristic
# does not always run fastest: its outputs and gradients, saved by tuning_run().
TUNING_SHAPE = (4096, 768, 3072)


def tuning_run(path):
    torch.manual_seed(0)
    rows, d, hidden = TUNING_SHAPE
    model = FusedMLP(d, hidden, approximate="tanh", device="cuda", dtype=torch.bfloat16)
    x = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = model(x)
    grads = torch.autograd.grad(y, [x, *model.parameters()], torch.ones_like(y))
    torch.save([t.cpu() for t in (y, *grads)], path)


@pytest.mark.cuda
def test_cuda_gemm_tuning_off_is_reproducible(tmp_path):
    # With GEMM tuning off (FUSEDOPS_GEMM_TUNING=0 in a fresh process) and under
    # torch.use_deterministic_algorithms(True), every GEMM runs the heuristic's first choice: the
    # same bits in both. Tuned (this process's default), the results obey the tolerance rule
    # (every other CUDA test here runs tuned).
    checkout = os.path.dirname(os.path.dirname(fusedops.__file__))
    env = {
        **os.environ,
        "FUSEDOPS_GEMM_TUNING": "0",
        "PYTHONPATH": os.pathsep.join([checkout, os.environ.get("PYTHONPATH", "")]),
    }
    child = tmp_path / "off.pt"
    proc = subprocess.run(
        [sys.executable, __file__, str(child)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    saved = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        tuning_run(tmp_path / "deterministic.pt")
    finally:
        torch.use_deterministic_algorithms(saved)
    off, deterministic = torch.load(child), torch.load(tmp_path / "deterministic.pt")
    for a, b in zip(off, deterministic, strict=True):
        assert torch.equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("recompute", [False, True])
def test_cuda_graph(recompute, approximate):
    model = FusedMLP(
        256,
        1024,
        approximate=approximate,
        device="cuda",
        dtype=torch.bfloat16,
        recompute_activation=recompute,
    )
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    params_ = [x, *model.parameters()]

    def step():
        y = model(x)
        return (y, *torch.autograd.grad(y, params_, dy))

    graph, static = capture_cuda_graph(step)
    with torch.no_grad():
        for t in (x, dy, *model.parameters()):
            t.copy_(torch.randn_like(t) * 0.1)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(static, step(), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("recompute", [False, True])
def test_backward_fills_no_zero_gradients(device, recompute):
    """pre and act, the op's non-differentiable outputs, get no zero-filled gradient buffers in
    the backward ([rows, hidden] each: 96 MiB per step at 8192 tokens x 3072 on a GPU)."""
    x = torch.randn(6, 8, device=device, requires_grad=True)
    w1, b1, w2, b2 = params(8, 24, 5, torch.float32, device)
    y = fusedops.fused_mlp(x, w1, b1, w2, b2, recompute_activation=recompute)
    assert zero_fills_in_backward(y.square().sum()) == []
    assert x.grad is not None and w1.grad is not None and b2.grad is not None


if __name__ == "__main__":
    tuning_run(sys.argv[1])
