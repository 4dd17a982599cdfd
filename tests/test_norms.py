"""fusedops.layer_norm / rms_norm and their modules against an fp64 CPU reference and torch.

Tolerance rule (DESIGN.md 6): err(fusedops) <= 2 * err(torch at the same dtype) + atol, both
measured against fp64 on CPU. CUDA tests skip without a GPU.
"""

import functools
import gc

import pytest
import torch
import torch.nn.functional as F
from reference import (
    STAGED_GROUP_SHAPES,
    capture_cuda_graph,
    rms_norm_default_eps,
    rms_norm_out_dtype,
    staged_group_rows,
    zero_fills_in_backward,
)

import fusedops
from fusedops._ops import ops

HAS_CUDA = torch.cuda.is_available()
HAS_MPS = torch.backends.mps.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else []) + (["mps"] if HAS_MPS else [])
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
GPUS = [
    pytest.param("cuda", marks=cuda_only),
    pytest.param("mps", marks=pytest.mark.skipif(not HAS_MPS, reason="needs an MPS device")),
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# atol of the tolerance rule, per output dtype.
ATOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
OPS = ["layer_norm", "rms_norm"]


def _close(ours, theirs, ref, what):
    """The tolerance rule; `ref` is fp64 on CPU, `theirs` is torch at ours' dtype and device."""
    assert ours.dtype == theirs.dtype, f"{what}: dtype {ours.dtype} != torch's {theirs.dtype}"
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} != torch's {theirs.shape}"
    if ours.numel() == 0:
        return
    ref = ref.double().cpu()
    err = (ours.double().cpu() - ref).abs().max().item()
    err_torch = (theirs.double().cpu() - ref).abs().max().item()
    bound = 2 * err_torch + ATOL[ours.dtype]
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g} (torch: {err_torch:.3g})"


def _poison(device):
    """Fills freed CUDA cache blocks with NaN so that fresh outputs start as garbage."""
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        torch.full((min(free // 8, 2**26),), float("nan"), device=device)
        gc.collect()


def _fused(op):
    return fusedops.layer_norm if op == "layer_norm" else fusedops.rms_norm


def _torch(op):
    return F.layer_norm if op == "layer_norm" else F.rms_norm


def _call(fn, op, x, shape, w, b, eps):
    if op == "layer_norm":
        return fn(x, shape, w, b, eps)
    return fn(x, shape, w, eps)


def _ref_eps(op, dtype, eps):
    """torch's rms_norm eps=None for this dtype, fixed for the fp64 reference."""
    return rms_norm_default_eps(dtype) if op == "rms_norm" and eps is None else eps


def _params(op, mode, shape, dtype, device):
    """(weight, bias) for a parameter mode: none, weight, bias, same (dtype), fp32."""
    pdtype = torch.float32 if mode == "fp32" else dtype

    def make(offset):
        return (torch.randn(shape, dtype=torch.float64) * 0.5 + offset).to(pdtype).to(device)

    w = make(1.0) if mode in ("weight", "same", "fp32") else None
    b = make(0.0) if mode in ("bias", "same", "fp32") and op == "layer_norm" else None
    return w, b


def _check(op, x, shape, w, b, eps, grad=True, unchecked=()):
    """Forward and (optionally) backward of fusedops vs torch vs fp64, same inputs; gradients
    named in `unchecked` are computed but not compared."""
    leaves = [t for t in (x, w, b) if t is not None]
    ref_leaves = [t.detach().double().cpu().requires_grad_(grad) for t in leaves]
    ours_leaves = [t.detach().clone().requires_grad_(grad) for t in leaves]
    # torch at the input's dtype: its CUDA layer_norm takes no fp32 parameters with fp16/bf16 input.
    torch_leaves = [t.detach().to(x.dtype).requires_grad_(grad) for t in leaves]

    def unpack(ls):
        it = iter(ls)
        return [next(it) if t is not None else None for t in (x, w, b)]

    rx, rw, rb = unpack(ref_leaves)
    ox, ow, ob = unpack(ours_leaves)
    tx, tw, tb = unpack(torch_leaves)
    _poison(x.device.type)
    y = _call(_fused(op), op, ox, shape, ow, ob, eps)
    yt = _call(_torch(op), op, tx, shape, tw, tb, eps)
    if op == "rms_norm" and ow is not None:
        yt = yt.to(rms_norm_out_dtype(x.dtype, ow.dtype))  # torch at x's dtype, then as mixed
    yr = _call(_torch(op), op, rx, shape, rw, rb, _ref_eps(op, x.dtype, eps))
    _close(y, yt, yr, f"{op} forward")
    if not grad:
        return
    dy = torch.randn(y.shape, dtype=torch.float64).to(y.dtype)  # all three see the same values
    _poison(x.device.type)
    g = torch.autograd.grad(y, ours_leaves, dy.to(y.device))
    gt = torch.autograd.grad(yt, torch_leaves, dy.to(yt.device))
    gt = [g.to(leaf.dtype) for g, leaf in zip(gt, leaves, strict=True)]  # as the params' dtype
    gr = torch.autograd.grad(yr, ref_leaves, dy.double())
    for name, a, t, r in zip(["dx", "dweight", "dbias"], g, gt, gr, strict=False):
        if name not in unchecked:
            _close(a, t, r, f"{op} {name}")


# Row lengths: 1, odd, non-power-of-two, more than a block holds, the largest.
COLS = [1, 7, 24, 33, 48, 1000, 4097, 8192, 131072]  # 24, 48: the CPU rows' single-vector steps
MODES = ["none", "weight", "bias", "same", "fp32"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("op", OPS)
def test_forward_backward(device, dtype, cols, op):
    rows = max(1, min(37, 2**17 // cols))
    x = (torch.randn(rows, cols, dtype=torch.float64) * 2 + 0.5).to(dtype).to(device)
    for mode in MODES:
        if (mode == "bias" and op == "rms_norm") or (mode == "fp32" and dtype == torch.float32):
            continue
        w, b = _params(op, mode, cols, dtype, device)
        # One column: dx is all cancellation (layer_norm: exactly 0 times rstd = 1/sqrt(eps);
        # rms_norm: g * rstd * eps / (x^2 + eps)), so any two implementations differ by their
        # roundings, amplified up to 1/sqrt(eps) or x^2/eps times.
        unchecked = ("dx",) if cols == 1 else ()
        _check(op, x, [cols], w, b, 1e-5 if op == "layer_norm" else None, unchecked=unchecked)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_multi_dim_shape_and_eps(device, op):
    x = torch.randn(2, 3, 4, 5, device=device)
    w, b = _params(op, "same", (4, 5), torch.float32, device)
    _check(op, x, (4, 5), w, b, 1e-3)
    _check(op, x, [3, 4, 5], None, None, 0.1)
    # normalized_shape as an int
    torch.testing.assert_close(
        _call(_fused(op), op, x, 5, None, None, 1e-5),
        _call(_torch(op), op, x, (5,), None, None, 1e-5),
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_non_contiguous(device, op):
    base = torch.randn(64, 40, 3, device=device)
    w, b = _params(op, "same", 64, torch.float32, device)
    _check(op, base.permute(2, 1, 0), [64], w, b, 1e-5)  # transposed
    _check(op, base[:, ::2, 1].t(), [64], w, b, 1e-5)  # strided
    wide = torch.randn(8, 130, device=device)
    _check(
        op,
        wide[:, 1:129],
        [128],
        w.repeat(2) if w is not None else None,
        b.repeat(2) if b is not None else None,
        1e-5,
    )  # offset rows


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_empty(device, op):
    for shape, norm in [((0, 8), [8]), ((2, 0, 8), [8]), ((3, 0), [0])]:
        x = torch.randn(shape, device=device, requires_grad=True)
        w = torch.randn(norm, device=device, requires_grad=True)
        b = torch.randn(norm, device=device, requires_grad=True) if op == "layer_norm" else None
        y = _call(_fused(op), op, x, norm, w, b, 1e-5)
        assert y.shape == x.shape
        y.sum().backward()
        assert x.grad.shape == x.shape
        assert torch.equal(w.grad, torch.zeros_like(w))
        if b is not None:
            assert torch.equal(b.grad, torch.zeros_like(b))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_constant_rows_and_one_column(device, op):
    # var = 0: the output is bias (layer_norm) and nothing is NaN.
    x = torch.full((4, 16), 3.0, device=device)
    w, b = _params(op, "same", 16, torch.float32, device)
    _check(op, x, [16], w, b, 1e-5)
    one = ("dx",) if op == "rms_norm" else ()  # see test_forward_backward
    _check(op, torch.randn(5, 1, device=device), [1], None, None, 1e-5, unchecked=one)


def test_rms_norm_default_eps_matches_torch():
    # Tiny values make eps dominate: torch uses the fp32 epsilon for fp16/bf16/fp32 input.
    for dtype in DTYPES:
        x = (torch.randn(4, 64) * 1e-3).to(dtype)
        torch.testing.assert_close(fusedops.rms_norm(x, [64]), F.rms_norm(x, [64]))


def _fwd_args(op, requires_grad, device="cpu", dtype=torch.float32):
    x = torch.randn(6, 40, device=device, dtype=dtype, requires_grad=requires_grad)
    w = torch.randn(40, device=device, dtype=dtype, requires_grad=requires_grad)
    if op == "layer_norm":
        b = torch.randn(40, device=device, dtype=dtype, requires_grad=requires_grad)
        return ops.layer_norm_fwd.default, (x, [40], w, b, 1e-5)
    return ops.rms_norm_fwd.default, (x, [40], w, None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("op", OPS)
def test_opcheck_forward(device, requires_grad, op):
    fn, args = _fwd_args(op, requires_grad, device)
    torch.library.opcheck(fn, args)
    x = torch.randn(3, 5, 8, device=device, requires_grad=requires_grad)
    torch.library.opcheck(
        fn, (x, [5, 8], None, None, 1e-5) if op == "layer_norm" else (x, [5, 8], None, 1e-6)
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_opcheck_backward(device, op):
    fn, args = _fwd_args(op, False, device)
    x, shape, w = args[0], args[1], args[2]
    dy = torch.randn_like(x)
    if op == "layer_norm":
        _, mean, rstd = fn(*args)
        for mask in ([True, True, True], [True, False, False], [False, True, True]):
            torch.library.opcheck(
                ops.layer_norm_bwd.default, (dy, x, shape, mean, rstd, w, args[3], mask)
            )
    else:
        _, rstd = fn(*args)
        for mask in ([True, True], [False, True], [True, False]):
            torch.library.opcheck(ops.rms_norm_bwd.default, (dy, x, shape, rstd, w, mask))


@pytest.mark.parametrize("op", OPS)
def test_gradcheck_fp64(op):
    x = torch.randn(4, 3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    if op == "layer_norm":
        assert torch.autograd.gradcheck(
            lambda x, w, b: fusedops.layer_norm(x, (3, 5), w, b), (x, w, b)
        )
        assert torch.autograd.gradcheck(lambda x: fusedops.layer_norm(x, (5,)), (x,))
    else:
        assert torch.autograd.gradcheck(lambda x, w: fusedops.rms_norm(x, (3, 5), w), (x, w))
        assert torch.autograd.gradcheck(lambda x: fusedops.rms_norm(x, (5,), eps=1e-3), (x,))


@pytest.mark.parametrize("op", OPS)
def test_double_backward_raises(op):
    x = torch.randn(3, 8, requires_grad=True)
    y = _call(_fused(op), op, x, [8], None, None, 1e-5)
    with pytest.raises(RuntimeError, match=f"fusedops.{op}: double backward is not supported"):
        torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
    # The backward op itself, called with an argument that requires grad: it has no derivative.
    x = x.detach()
    dy = torch.randn_like(x, requires_grad=True)
    rstd = torch.ones(3)
    with pytest.raises(RuntimeError, match=f"fusedops.{op}_backward: double backward"):
        if op == "layer_norm":
            ops.layer_norm_bwd(dy, x, [8], torch.zeros(3), rstd, None, None, [True, False, False])
        else:
            ops.rms_norm_bwd(dy, x, [8], rstd, None, [True, False])


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    ln = fusedops.nn.LayerNorm(32, device=device)
    rms = fusedops.nn.RMSNorm([4, 32], device=device)

    def f(x):
        return rms(ln(x) * 2).sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=False)
    x = torch.randn(3, 4, 32, device=device, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    loss = compiled(x)
    loss.backward()
    f(x2).backward()
    torch.testing.assert_close(loss, f(x2.detach()))
    torch.testing.assert_close(x.grad, x2.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_modules_leave_the_norm_to_inductor_under_compile(device):
    """Compiled, the modules call torch's norm (inductor fuses it with the residual add); the
    functional ops keep the fused kernel; eager modules call it too."""
    targets = []

    def record(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    def compiled_targets(f, x):
        targets.clear()
        torch._dynamo.reset()
        torch.compile(lambda x: f(x + 1), backend=record, fullgraph=True)(x)
        return list(targets)

    x = torch.randn(3, 32, device=device)
    for module, functional in (
        (fusedops.nn.LayerNorm(32, device=device), fusedops.layer_norm),
        (fusedops.nn.RMSNorm(32, device=device), fusedops.rms_norm),
    ):
        name, weight = functional.__name__, module.weight
        as_module = compiled_targets(module, x)
        assert any(name in t for t in as_module) and not any("fusedops" in t for t in as_module)
        as_function = compiled_targets(
            functools.partial(functional, normalized_shape=[32], weight=weight), x
        )
        assert any(f"fusedops.{name}_fwd" in t for t in as_function), as_function
        with torch.autograd.profiler.profile() as prof:
            module(x)
        assert any(f"fusedops::{name}_fwd" in e.name for e in prof.function_events)


@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
def test_modules_match_torch_and_state_dicts(kind):
    ours_cls, torch_cls = getattr(fusedops.nn, kind), getattr(torch.nn, kind)
    variants = [dict(), dict(elementwise_affine=False), dict(eps=1e-3)]
    variants += [dict(bias=False)] if kind == "LayerNorm" else [dict(eps=None)]
    for kwargs in variants:
        for shape in (16, [3, 16]):
            theirs = torch_cls(shape, **kwargs)
            with torch.no_grad():
                for p in theirs.parameters():
                    p.normal_()
            ours = ours_cls(shape, **kwargs)
            assert isinstance(ours, torch_cls)
            assert ours.state_dict().keys() == theirs.state_dict().keys()
            assert repr(ours).split("(", 1)[1] == repr(theirs).split("(", 1)[1]
            ours.load_state_dict(theirs.state_dict())  # torch -> fusedops
            x = torch.randn(5, 3, 16)
            torch.testing.assert_close(ours(x), theirs(x))
            back = torch_cls(shape, **kwargs)
            back.load_state_dict(ours.state_dict())  # fusedops -> torch
            torch.testing.assert_close(back(x), theirs(x))
    m = ours_cls(8, dtype=torch.bfloat16)
    assert (
        m.weight.dtype == torch.bfloat16
        and m(torch.randn(2, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
def test_autocast_like_torch(device, kind):
    # torch: fp32 under CUDA and MPS autocast, untouched under CPU autocast. The module's
    # parameters are fp32; the input comes from a low-precision matmul as in a real model.
    ours = getattr(fusedops.nn, kind)(64, device=device)
    theirs = getattr(torch.nn, kind)(64, device=device)
    theirs.load_state_dict(ours.state_dict())
    low = torch.bfloat16 if device == "cpu" else torch.float16  # MPS autocast: fp16 on torch 2.5
    lin = torch.nn.Linear(64, 64, device=device)
    x = torch.randn(8, 64, device=device)
    for inp in (lambda: x, lambda: lin(x), lambda: x.to(low)):
        with torch.autocast(device, dtype=low):
            y, yt = ours(inp()), theirs(inp())
        assert y.dtype == yt.dtype, (kind, y.dtype, yt.dtype)
        torch.testing.assert_close(y, yt, atol=2e-2, rtol=2e-2)
        y.float().sum().backward()  # gradients flow through autocast's casts


@pytest.mark.parametrize("op", OPS)
def test_bad_inputs(op):
    fn = _fused(op)
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=rf"fusedops.{op}: normalized_shape=\[3\] does not match"):
        _call(fn, op, x, [3], None, None, 1e-5)
    with pytest.raises(ValueError, match=rf"fusedops.{op}: normalized_shape=\[2, 4, 8\]"):
        _call(fn, op, x, [2, 4, 8], None, None, 1e-5)
    with pytest.raises(ValueError, match=rf"fusedops.{op}: weight has shape \[4\]"):
        _call(fn, op, x, [8], torch.randn(4), None, 1e-5)
    with pytest.raises(TypeError, match=rf"fusedops.{op}: input must be float.*got Long"):
        _call(fn, op, torch.ones(4, 8, dtype=torch.long), [8], None, None, 1e-5)
    with pytest.raises(TypeError, match=rf"fusedops.{op}: weight has dtype Half but input"):
        _call(fn, op, x, [8], torch.randn(8, dtype=torch.half), None, 1e-5)
    if op == "layer_norm":
        with pytest.raises(ValueError, match=r"fusedops.layer_norm: bias has shape \[8, 1\]"):
            fn(x, [8], None, torch.randn(8, 1))
        with pytest.raises(
            TypeError,
            match=r"fusedops.layer_norm: weight has dtype Float but "
            r"bias has dtype BFloat16",
        ):
            fn(x.bfloat16(), [8], torch.randn(8), torch.randn(8).bfloat16())


def test_cpu_determinism():
    x = torch.randn(999, 130, requires_grad=True)
    w = torch.randn(130, requires_grad=True)
    b = torch.randn(130, requires_grad=True)
    dy = torch.randn(999, 130)
    g1 = torch.autograd.grad(fusedops.layer_norm(x, [130], w, b), (w, b), dy)
    g2 = torch.autograd.grad(fusedops.layer_norm(x, [130], w, b), (w, b), dy)
    assert all(torch.equal(a, c) for a, c in zip(g1, g2, strict=True))


# ---- CUDA only -------------------------------------------------------------------------------


@cuda_only
def test_cuda_bad_inputs():
    x = torch.randn(4, 8, device="cuda")
    with pytest.raises(RuntimeError, match=r"fusedops.layer_norm: weight is on cpu but input is"):
        fusedops.layer_norm(x, [8], torch.randn(8))


# Row lengths that reach every kernel tier (bf16 counts; fp32 tiers end at about half):
# forward warp teams (<= 256, 512, 1024), block teams (<= 32768), cluster teams of 2..8 blocks
# of 512 threads (<= 131072), then of up to 1024 (<= 262144), and the looping kernel beyond
# (on sm_90+ the staged forward takes 16-byte-aligned rows of 8 KB up to 8 slices of shared
# memory: fp32 262144 as 8 slices of 128 KB); backward on sm_90+ the staged kernel (bf16 4096
# as one block, 40000 as 4 blocks of 320 threads of 4 packs, 131072 as 8 blocks of 512; fp32
# 4096, 131072, and 262144 in one stage refilled chunk by chunk), else warp teams (<= 512),
# block teams (<= 8192), clusters of up to 16 (<= 131072; 32 elements per thread <= 262144),
# looping;
# and odd lengths, which take the unaligned (scalar) variant of each (forward <= 128 / 8192 /
# 65536, backward <= 256 / 4096 / 65536). Without clusters (before sm_90) the long rows take the
# looping kernels.
TIER_COLS = [8, 200, 500, 1000, 4096, 8200, 20000, 40000, 131072, 140000, 262144, 300000]
TIER_COLS += [33, 1001, 4097, 9001, 70001]
TIER_COLS += [16, 24, 64, 96, 128]  # rows of fewer packs than a warp's lanes: teams of 2-16 lanes
TIER_COLS += [256]  # 16-bit layer_norm backward: half warps of 2 packs
TIER_COLS += [520, 768]  # backward: a warp per row of 17-24 elements per lane (1000: 25-32)


@cuda_only
@pytest.mark.parametrize("dtype", [*DTYPES, torch.float64], ids=str)  # fp64: the looping kernels
@pytest.mark.parametrize("cols", TIER_COLS)
@pytest.mark.parametrize("op", OPS)
def test_cuda_kernel_tiers(dtype, cols, op):
    rows = max(3, min(300, 2**21 // cols))
    x = (torch.randn(rows, cols, dtype=torch.float64) + 1).to(dtype).cuda()
    modes = ["same", "none"] + (["fp32"] if dtype in (torch.float16, torch.bfloat16) else [])
    for mode in modes:
        w, b = _params(op, mode, cols, dtype, "cuda")
        _check(op, x, [cols], w, b, 1e-5)


@cuda_only
@pytest.mark.parametrize(
    "dtype,cols",
    [(torch.bfloat16, 131072), (torch.bfloat16, 262144), (torch.float32, 131072)],
    ids=str,
)
@pytest.mark.parametrize("mode", ["weight", "bias", "same", "fp32"])
@pytest.mark.parametrize("op", OPS)
def test_cuda_staged_params(dtype, cols, mode, op):
    """Rows split over a cluster (sm_90+) stage one weight or bias slice beside the row (into the
    first slot, whichever it is); two, or fp32 parameters beside bf16 rows, read global memory."""
    if op == "rms_norm" and mode == "bias":
        pytest.skip("rms_norm has no bias")
    x = torch.randn(7, cols, dtype=dtype, device="cuda")
    _check(op, x, [cols], *_params(op, mode, cols, dtype, "cuda"), 1e-5)


@cuda_only
@pytest.mark.parametrize(
    "dtype,cols,rows",
    [
        (torch.bfloat16, 98304, 5),
        (torch.float32, 49152, 5),
        (torch.bfloat16, 262144, 40),
        (torch.float16, 262144, 40),
        (torch.float32, 262144, 40),
        (torch.float32, 200000, 40),
    ],
    ids=str,
)
@pytest.mark.parametrize("op", OPS)
def test_cuda_staged_backward_runs_staged(dtype, cols, rows, op):
    """Shapes the staged backward must take. Its shared memory needs the opt-in at any size (48
    KB of stages once found no room without it, and the register tier ran instead; these rows
    take 8 blocks of 384 threads with 96 KB of stages each). 16-bit rows of 262144 take 4 packs
    per thread read from the stage; 40 rows make each cluster refill both stages. fp32 rows
    over 131072 take 8 packs in one stage refilled chunk by chunk (200000: 416 threads, a last
    chunk of 213 packs)."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the staged backward needs sm_90+")
    x = torch.randn(rows, cols, dtype=dtype, device="cuda")
    w, b = _params(op, "same", cols, dtype, "cuda")
    _check(op, x, [cols], w, b, 1e-5)
    x.requires_grad_()
    y = _call(_fused(op), op, x, [cols], w, b, 1e-5)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        y.backward(torch.ones_like(y))
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not names:
        pytest.skip("the profiler sees no CUDA kernels here (under compute-sanitizer, CUPTI)")
    assert any("norm_bwd_staged_kernel" in n for n in names), names


@cuda_only
@pytest.mark.parametrize("op", OPS)
def test_cuda_long_rows_walked_by_clusters(op):
    """fp32 rows of 262140, which don't split into 16 equal 16-byte slices for the staged
    backward (sm_90+: register-tier clusters of 16 blocks, 32 elements per thread): 40 rows make
    each cluster walk several (kernel_tiers gives each cluster one row at most)."""
    x = torch.randn(40, 262140, device="cuda")
    _check(op, x, [262140], *_params(op, "same", 262140, torch.float32, "cuda"), 1e-5)


@cuda_only
@pytest.mark.parametrize(
    "dtype,cols",
    [
        (torch.bfloat16, 40000),
        (torch.float32, 8192),
        (torch.bfloat16, 262144),
        (torch.float32, 262144),
    ],
    ids=str,
)
@pytest.mark.parametrize("op", OPS)
def test_cuda_backward_weight_grad_only(dtype, cols, op):
    """dweight / dbias with no dx: cluster teams (bf16 40000; fp32 8192, bf16 and fp32 262144 on
    sm_90+) that reduce nothing across their blocks must still start and finish together (and
    the staged kernel still refill its stages, fp32 262144's after the first pass)."""
    x = torch.randn(64, cols, dtype=dtype, device="cuda")
    w, b = _params(op, "same", cols, dtype, "cuda")
    params = [t.requires_grad_() for t in (w, b) if t is not None]
    dy = torch.randn_like(x)
    grads = torch.autograd.grad(_call(_fused(op), op, x, [cols], w, b, 1e-5), params, dy)
    ref = [t.detach().double().requires_grad_() for t in params]
    rw, rb = ref if op == "layer_norm" else (ref[0], None)
    yr = _call(_torch(op), op, x.double(), [cols], rw, rb, 1e-5)
    for ours, want in zip(grads, torch.autograd.grad(yr, ref, dy.double()), strict=True):
        torch.testing.assert_close(ours.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max())


@cuda_only
@pytest.mark.parametrize(
    "dtype,cols",
    STAGED_GROUP_SHAPES,
    ids=str,
)
@pytest.mark.parametrize("op", OPS)
def test_cuda_rows_grouped_per_block(dtype, cols, op):
    """The staged forward's blocks of several rows, beside one staged copy of their weight and
    bias, or reading them from global memory (layer_norm's 16-bit pair)
    (reference.STAGED_GROUP_SHAPES)."""
    sms = torch.cuda.get_device_properties("cuda").multi_processor_count
    x = torch.randn(staged_group_rows(dtype, cols, sms), cols, dtype=dtype, device="cuda")
    for mode in ["same", "none", "weight", "bias", "fp32"]:
        _check(op, x, [cols], *_params(op, mode, cols, dtype, "cuda"), 1e-5)


@cuda_only
@pytest.mark.parametrize("cols", [1024, 2048, 8192])
@pytest.mark.parametrize("op", OPS)
def test_cuda_fp32_rows_of_many_blocks(cols, op):
    """fp32 rows of 4-32 KB past the short rows' threshold (3 waves x 4 blocks x 32 KB per SM):
    where DRAM is fast (an H200, not an H100 SXM) layer_norm's 4 KB rows and rms_norm's up to
    32 KB take the forward's register tiers instead of the staged engine (a grid of many waves),
    elsewhere the staged engine's groups: either way every row is checked, the 3 past the
    threshold included."""
    sms = torch.cuda.get_device_properties("cuda").multi_processor_count
    x = torch.randn(3 * 4 * sms * (32 << 10) // (cols * 4) + 3, cols, device="cuda")
    _check(op, x, [cols], *_params(op, "same", cols, torch.float32, "cuda"), 1e-5, grad=False)


@cuda_only
@pytest.mark.parametrize(
    "dtype,cols",
    [
        (torch.bfloat16, 4096),
        (torch.float32, 2048),
        (torch.float32, 4096),
        (torch.float32, 6000),
        (torch.bfloat16, 32768),
        (torch.float32, 16384),
        (torch.float32, 32768),
        (torch.bfloat16, 131072),
        (torch.bfloat16, 262144),
    ],
    ids=str,
)
@pytest.mark.parametrize("op", OPS)
def test_cuda_backward_many_rows_per_team(dtype, cols, op):
    """Rows enough for each persistent team of the staged backward (sm_90+: one block; clusters
    of 2, of 4 whose last threads own one pack of two, of 8, of 16 blocks of 256 (no cap on the
    blocks per SM where DRAM is fast) and of 8 and 16 blocks of 512) to refill its shared-memory
    stages and its cluster mailbox many times over; 16-bit rows with fp32 params too (the 4-pack
    kernels' heaviest registers)."""
    x = torch.randn(3 + 2**24 // cols, cols, dtype=dtype, device="cuda")
    for mode in ["same", "none"] + (["fp32"] if dtype != torch.float32 else []):
        _check(op, x, [cols], *_params(op, mode, cols, dtype, "cuda"), 1e-5)


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cols", [4096, 65536, 262144])
def test_cuda_backward_rows_far_from_zero(dtype, cols):
    """layer_norm rows whose mean is 100 standard deviations from zero, through each staged
    backward kernel (sm_90+: 2, 4 and 8 packs per thread). The 4-pack one (16-bit 65536 and
    262144 columns, fp32 65536) takes x-hat as x * rstd - mean * rstd in one FMA and dx from x,
    not x-hat: the mean's products cancel there, and their rounding must stay within the rule.
    The staged forward of 16-bit rows takes x-hat the same way (the forward is checked too)."""
    x = (torch.randn(max(8, 2**21 // cols), cols, dtype=torch.float64) + 100).to(dtype).cuda()
    _check("layer_norm", x, [cols], *_params("layer_norm", "same", cols, dtype, "cuda"), 1e-5)


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cols", [4096, 32768, 262144])
def test_cuda_forward_rows_with_outliers(dtype, cols):
    """layer_norm rows whose every 64th element is 1000 standard deviations out: the staged
    forward of 16-bit rows sums each thread's d = x - k and d^2 about its first element k, and
    those outliers are where threads start (teams, one block, clusters); a constant row too."""
    rows = max(8, 2**21 // cols)
    x = torch.randn(rows, cols, dtype=torch.float64)
    x[:, ::64] = 1000.0
    x[0] = 3.0
    x = x.to(dtype).cuda()
    _check(
        "layer_norm",
        x,
        [cols],
        *_params("layer_norm", "same", cols, dtype, "cuda"),
        1e-5,
        grad=False,
    )


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cols", [16, 64, 256, 768])
@pytest.mark.parametrize("op", OPS)
def test_cuda_forward_rows_of_many_waves(dtype, cols, op):
    """Rows enough that the forward's warp and block teams take a block each (two waves of the
    device's block slots and more: `wave_blocks`) and its part-warp teams stride over many rows,
    the last block partly filled. Forward only: the backward's grids don't change with rows."""
    x = torch.randn(3 + 2**24 // cols, cols, dtype=dtype, device="cuda")
    _check(op, x, [cols], *_params(op, "same", cols, dtype, "cuda"), 1e-5, grad=False)


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cols", [16, 64, 256, 768])
@pytest.mark.parametrize("op", OPS)
def test_cuda_param_grads_of_many_rows(dtype, cols, op):
    """dweight and dbias summed over 2^20 rows of 16 columns (and as many elements in wider
    rows): each block adds hundreds of one-lane teams, then the partial rows of hundreds of
    blocks. Added in sequence, fp32 layer_norm's dbias at 16 columns erred twice torch's error."""
    x = torch.randn(2**24 // cols, cols, dtype=dtype, device="cuda")
    _check(op, x, [cols], *_params(op, "same", cols, dtype, "cuda"), 1e-5)


@cuda_only
@pytest.mark.parametrize("op", OPS)
def test_cuda_misaligned_pointer_and_many_rows(op):
    buf = torch.randn(64 * 1024 + 1, dtype=torch.bfloat16, device="cuda")
    x = buf[1:].view(64, 1024)  # rows 2 bytes off 16-byte alignment: the scalar path
    w, b = _params(op, "same", 1024, torch.bfloat16, "cuda")
    _check(op, x, [1024], w, b, 1e-5)
    # More rows than one grid covers (the kernels grid-stride), short rows: warp tier.
    x = torch.randn(300_000, 24, device="cuda", dtype=torch.bfloat16)
    _check(op, x, [24], *_params(op, "fp32", 24, torch.bfloat16, "cuda"), 1e-5)


@pytest.mark.parametrize("device", GPUS)
@pytest.mark.parametrize("cols", [64, 1000, 4096, 8192, 40000])
@pytest.mark.parametrize("op", OPS)
def test_gpu_deterministic_param_grads(device, cols, op):
    rows = 2**22 // cols
    x = torch.randn(rows, cols, device=device, dtype=torch.bfloat16, requires_grad=True)
    w, b = _params(op, "fp32", cols, torch.bfloat16, device)
    params = [t.requires_grad_() for t in (w, b) if t is not None]
    dy = torch.randn_like(x)

    def grads():
        y = _call(_fused(op), op, x, [cols], w, b, 1e-5)
        return torch.autograd.grad(y, [x, *params], dy)

    first = grads()
    for _ in range(3):
        again = grads()
        for a, c in zip(first, again, strict=True):
            assert torch.equal(a, c)


@cuda_only
@pytest.mark.parametrize("op", OPS)
def test_cuda_graph_capture(op):
    mod = (fusedops.nn.LayerNorm if op == "layer_norm" else fusedops.nn.RMSNorm)(2048).cuda()
    static_x = torch.randn(256, 2048, device="cuda", requires_grad=True)
    static_dy = torch.randn(256, 2048, device="cuda")

    def step():  # gradients into .grad, allocated afresh (from the graph's pool when captured)
        mod.zero_grad(set_to_none=True)
        static_x.grad = None
        y = mod(static_x)
        y.backward(static_dy)
        return y

    g, static_y = capture_cuda_graph(step)
    for _ in range(2):
        x, dy = torch.randn_like(static_x), torch.randn_like(static_dy)
        static_x.data.copy_(x)
        static_dy.copy_(dy)
        g.replay()
        xe = x.clone().requires_grad_()
        ref = mod(xe)
        ref_grads = torch.autograd.grad(ref, [xe, *mod.parameters()], dy)
        torch.cuda.synchronize()
        torch.testing.assert_close(static_y, ref)
        torch.testing.assert_close(static_x.grad, ref_grads[0])
        torch.testing.assert_close(mod.weight.grad, ref_grads[1])


@cuda_only
@pytest.mark.slow
@pytest.mark.bigmem
@pytest.mark.parametrize("op", OPS)
def test_cuda_more_than_2_31_elements(op):
    cols = 4096
    rows = 2**31 // cols + 3
    need = rows * cols * 2 * 5  # bf16 x, y, dy, dx and slack
    if torch.cuda.mem_get_info()[0] < need:
        pytest.skip("not enough GPU memory")
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w, b = _params(op, "same", cols, torch.bfloat16, "cuda")
    y = _call(_fused(op), op, x, [cols], w, b, 1e-5)
    tail = x.detach()[-5:]  # rows whose offsets pass 2^31
    torch.testing.assert_close(y[-5:], _call(_torch(op), op, tail, [cols], w, b, 1e-5))
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    xt = tail.clone().requires_grad_()
    (dxt,) = torch.autograd.grad(_call(_torch(op), op, xt, [cols], w, b, 1e-5), xt, dy[-5:])
    torch.testing.assert_close(dx[-5:], dxt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_backward_fills_no_zero_gradients(device, op):
    """mean and rstd, the ops' non-differentiable outputs, get no zero-filled gradients."""
    x = torch.randn(6, 8, device=device, requires_grad=True)
    w = torch.randn(8, device=device, requires_grad=True)
    y = fusedops.layer_norm(x, [8], w) if op == "layer_norm" else fusedops.rms_norm(x, [8], w)
    assert zero_fills_in_backward(y.square().sum()) == []
    assert x.grad is not None and w.grad is not None
