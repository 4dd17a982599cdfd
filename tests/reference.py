"""fp64 CPU references for the tests, input makers, a CUDA graph capture, and THE tolerance rule
(the one place for it).

The rule (DESIGN.md, section 6)::

    err(fusedops) <= 2 * err(torch at the same dtype) + ATOL[dtype]

Both errors are measured against an fp64 reference computed on the CPU from the *same* inputs
(the low-precision inputs, upcast exactly to fp64). The error metric is the largest error of an
element in units of that element's own scale::

    err(t) = max_i |t_i - ref_i| / scale_i        over the elements where ref is finite

where scale_i is the size of what element i is computed from (the rounding that an exact
algorithm can't avoid is proportional to it), floored at FLOOR[dtype] (below):

    softmax            y_i * (1 + u * |x_i - max|)   relative error; exp's argument x - max is
                                                     rounded in the math precision: u = 1 for
                                                     fp32/fp64, eps(fp32) / eps(dtype) for
                                                     fp16/bf16 (math in fp32)
    log_softmax        1 + |y_i|                     |y_i| = |x_i - max| + log(sum); the 1 is
                                                     log(sum)'s error from sum's rounding
    softmax backward   y_i * (|g_i| + sum_j |g_j y_j|)
    log_softmax bwd    |g_i| + exp(y_i) * sum_j |g_j|
    no scale given     max_j |ref_j| for every element (plain max abs error, relative to the
                       largest value)

So err reads in machine epsilons whatever the element's size: a small probability is checked
as strictly as the largest one, and a wrong or dropped tail element can't hide under the row's
maximum. ATOL (below) covers the case where torch happens to be (nearly) exact.

Non-finite elements are not measured but compared exactly: fusedops must put NaN where the
reference has NaN and the same infinity where it has +-inf, and be finite everywhere else.
"""

from __future__ import annotations

import functools

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# ATOL, in units of scale (see the module docstring), per dtype. fp16/bf16: one machine epsilon;
# torch's error there is at least the output's rounding (half an epsilon), so 2 * err(torch)
# carries the rule. fp32: 8 eps (~1e-6); fp32 rounding is small next to summation error, which
# differs between two correct implementations by luck on small tensors. fp64 is the reference's
# own precision: torch's error there is ~0 (the reference is evaluated as torch evaluates it), so
# ATOL alone carries fp64 and allows for another summation order over rows of ~2^20 elements.
ATOL = {
    torch.float64: 1e-12,  # eps 2.2e-16
    torch.float32: 1e-6,  # eps 1.2e-7
    torch.float16: 9.8e-4,  # eps 9.8e-4
    torch.bfloat16: 7.8e-3,  # eps 7.8e-3
}

# Matrix products (fused_mlp): two correct GEMMs differ by their accumulation order over K, which
# cuBLASLt picks per shape by heuristics, so torch can be luckier than fusedops by more than
# rounding; plain ATOL would then fail a correct kernel.
ATOL_GEMM = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}

# Smallest scale. fp16's subnormals (6e-8 .. 6e-5) are ordinary small probabilities and must
# survive, so its floor is its smallest normal number. For the dtypes with fp32's exponent range,
# results near and below the smallest normal number (tiny, ~1e-38) may be flushed to zero, as
# fast exp instructions do (MUFU.EX2 on CUDA; at::vec's exp_u20 on AVX2 flushes below ~1.4 tiny):
# the floor is 4 * tiny / ATOL, so an error of at most 4 * tiny counts as ATOL.
FLOOR = {d: 4 * torch.finfo(d).tiny / ATOL[d] for d in ATOL}
FLOOR[torch.float16] = torch.finfo(torch.float16).tiny

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Row lengths for the staged row engine's grouped rows (sm_90+; csrc/cuda/row_stage.cuh): several
# rows share a block of up to 32 KB (softmax; rms_norm 16 KB, layer_norm 8 KB: its 8 KB rows one
# to a block); 8 and 4 KB rows always, rows of 2-4 KB only where the input fills three waves of
# 32 KB blocks (layer_norm's from 4 KB only).
STAGED_GROUP_SHAPES = [
    (torch.bfloat16, 4096),
    (torch.float32, 2048),
    (torch.bfloat16, 2048),
    (torch.float32, 1024),
    (torch.bfloat16, 1024),
    (torch.float32, 512),
]


def staged_group_rows(dtype: torch.dtype, cols: int, sms: int) -> int:
    """Rows enough for those groups (short rows: past the three-wave threshold, 3 waves x 4
    blocks x 32 KB per SM), plus 3 that leave the last block partly empty."""
    return (16 if cols * dtype.itemsize >= 4096 else 200) * sms + 3


# --------------------------------------------------------------------------------------------
# References (fp64, CPU)
# --------------------------------------------------------------------------------------------


def _single_threaded(fn):
    """Runs the checking code (not fusedops) on one CPU thread: on a small, busy machine every
    parallel region of a multi-threaded torch op can cost a scheduler time slice, which would
    dominate the suite's runtime. The threads are restored for the code under test."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return wrapper


def _rows_view(t: torch.Tensor, dim: int) -> tuple[torch.Tensor, int]:
    """fp64 CPU copy; a 0-dim tensor counts as one element along dim 0 (as in torch)."""
    t64 = t.detach().to("cpu", torch.float64)
    return (t64.reshape(1), 0) if t.dim() == 0 else (t64, dim)


@_single_threaded
def softmax_ref(x: torch.Tensor, dim: int = -1, log: bool = False) -> torch.Tensor:
    """softmax (log=False) or log_softmax (log=True) of x along dim, in fp64 on the CPU.

    Written out (x - max, exp, sum) rather than calling torch.softmax, so the reference does not
    share code with what it checks. Rows with NaN or +inf, and rows of all -inf, come out NaN as
    in torch.
    """
    x64, d = _rows_view(x, dim)
    if x64.numel() == 0:
        return x64.reshape(x.shape)
    shifted = x64 - x64.amax(dim=d, keepdim=True)  # -inf - -inf = NaN for a row of all -inf
    e = shifted.exp()
    s = e.sum(dim=d, keepdim=True)
    out = shifted - s.log() if log else e / s
    return out.reshape(x.shape)


@_single_threaded
def softmax_scale(x: torch.Tensor, dim: int = -1, log: bool = False) -> torch.Tensor:
    """Per-element scale of softmax / log_softmax for the error metric (module docstring)."""
    x64, d = _rows_view(x, dim)
    if x64.numel() == 0:
        return x64.reshape(x.shape)
    y = softmax_ref(x64, d, log)
    if log:
        scale = 1 + y.abs()
    else:
        u = 1.0 if x.dtype in (torch.float32, torch.float64) else 2**-23 / torch.finfo(x.dtype).eps
        dist = (x64 - x64.amax(dim=d, keepdim=True)).abs()
        scale = torch.where(y > 0, y * (1 + u * dist), torch.zeros_like(y))  # y = 0: no 0 * inf
    return scale.reshape(x.shape)


@_single_threaded
def softmax_backward_ref(
    grad_output: torch.Tensor, output: torch.Tensor, dim: int = -1, log: bool = False
) -> torch.Tensor:
    """Gradient wrt the input of softmax/log_softmax, given its output, in fp64 on the CPU.

    softmax:     dx = y * (dy - sum(dy * y))
    log_softmax: dx = dy - exp(y) * sum(dy)
    """
    g, d = _rows_view(grad_output, dim)
    y, _ = _rows_view(output, dim)
    if y.numel() == 0:
        return y.reshape(output.shape)
    if log:
        dx = g - y.exp() * g.sum(dim=d, keepdim=True)
    else:
        dx = y * (g - (g * y).sum(dim=d, keepdim=True))
    return dx.reshape(output.shape)


@_single_threaded
def softmax_backward_scale(
    grad_output: torch.Tensor, output: torch.Tensor, dim: int = -1, log: bool = False
) -> torch.Tensor:
    """Per-element scale of the backward for the error metric (module docstring)."""
    g, d = _rows_view(grad_output, dim)
    y, _ = _rows_view(output, dim)
    if y.numel() == 0:
        return y.reshape(output.shape)
    if log:
        scale = g.abs() + y.exp() * g.abs().sum(dim=d, keepdim=True)
    else:
        scale = y.abs() * (g.abs() + (g * y).abs().sum(dim=d, keepdim=True))
    return scale.reshape(output.shape)


def _norm_terms(x, normalized_shape, eps, rms):
    """(dims, fp64 x, rstd, xs) for the norm scales: xhat_i = (x_i - mean) * rstd is computed to
    within rounding of xs_i = (|x_i| + mean|x|) * rstd: x - mean cancels, and the mean's own
    rounding is that of the sum of |x| it came from (rms_norm: no mean, xs_i = |xhat_i|).
    eps=None is rms_norm's default (fp32's eps)."""
    dims = tuple(range(-len(normalized_shape), 0))
    x64 = _as64(x)
    eps = torch.finfo(torch.float32).eps if eps is None else eps
    mean = torch.zeros_like(x64) if rms else x64.mean(dims, keepdim=True).expand_as(x64)
    rstd = ((x64 - mean).square().mean(dims, keepdim=True) + eps).rsqrt()
    mean_abs = 0.0 if rms else x64.abs().mean(dims, keepdim=True)
    return dims, x64, rstd, (x64.abs() + mean_abs) * rstd


def rms_norm_default_eps(dtype: torch.dtype) -> float:
    """The running torch's rms_norm eps=None for an input dtype (fusedops follows it): the
    accumulation type's epsilon, or on torch 2.4 the input dtype's."""
    from fusedops.functional import _RMS_EPS_OF_INPUT_DTYPE

    if _RMS_EPS_OF_INPUT_DTYPE:
        return torch.finfo(dtype).eps
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def rms_norm_out_dtype(dtype: torch.dtype, weight_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype rms_norm returns: the input's, or on torch 2.4 an fp32 weight's."""
    from fusedops.functional import _RMS_PROMOTES_TO_WEIGHT

    if _RMS_PROMOTES_TO_WEIGHT and weight_dtype is not None:
        return torch.promote_types(dtype, weight_dtype)
    return dtype


def _param64(p, normalized_shape):
    return torch.ones(normalized_shape, dtype=torch.float64) if p is None else _as64(p)


@_single_threaded
def norm_scale(x, normalized_shape, weight, bias, eps, rms=False):
    """Per-element scale of a layer_norm / rms_norm output: y_i = xhat_i * w_i + b_i, so
    xs_i * |w_i| + |b_i| (_norm_terms) -- a constant row (xhat = 0 exactly) included."""
    _, _, _, xs = _norm_terms(x, normalized_shape, eps, rms)
    scale = xs * _param64(weight, normalized_shape).abs()
    return scale if bias is None else scale + _as64(bias).abs()


@_single_threaded
def norm_backward_scales(x, normalized_shape, weight, grad_output, eps, rms=False):
    """Per-element scales of layer_norm / rms_norm gradients for the error metric: the sizes of
    the terms each one is computed from, which cancel where the gradient is small (a row of one
    element has dx = 0 exactly; max |ref| would then ask for an error below rounding).

        dx_i = rstd * (gw_i - mean(gw) - xhat_i * mean(gw * xhat)),  gw = g * w  (rms_norm: no
               mean(gw) term)
        scale(dx_i) = rstd * (|gw_i| + mean|gw| + xs_i * mean(|gw| * xs))      (xs: _norm_terms)
        scale(dw_j) = sum over rows |g_j| * xs_j,   scale(db_j) = sum over rows |g_j|

    Returns (dx, dw, db) scales, fp64 on the CPU.
    """
    dims, x64, rstd, xs = _norm_terms(x, normalized_shape, eps, rms)
    g = _as64(grad_output)
    gw = (g * _param64(weight, normalized_shape)).abs()
    terms = gw + xs * (gw * xs).mean(dims, keepdim=True)
    if not rms:
        terms = terms + gw.mean(dims, keepdim=True)

    def over_rows(t):  # sum(()) would sum everything
        k = len(normalized_shape)
        return t.sum(tuple(range(x64.dim() - k))) if x64.dim() > k else t

    return rstd * terms, over_rows(g.abs() * xs), over_rows(g.abs())


# --------------------------------------------------------------------------------------------
# The tolerance rule
# --------------------------------------------------------------------------------------------


def _as64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float64)


def _scale_for(ref: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    finite = torch.isfinite(ref)
    if scale is None:
        top = ref[finite].abs().max() if finite.any() else torch.tensor(0.0, dtype=ref.dtype)
        scale = top.expand_as(ref)
    scale = _as64(scale).nan_to_num(0.0, posinf=0.0, neginf=0.0)
    return scale.clamp(min=FLOOR[dtype])


def scaled_err(t: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor) -> tuple[float, tuple]:
    """(max_i |t_i - ref_i| / scale_i over the elements where ref is finite, index of that max);
    inf when t isn't finite where ref is."""
    finite = torch.isfinite(ref)
    if not finite.any():
        return 0.0, ()
    err = ((_as64(t) - ref).abs() / scale).masked_fill(~finite, 0.0)
    if not torch.isfinite(err).all():
        return float("inf"), ()
    flat = int(err.argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), err.shape))
    return err.reshape(-1)[flat].item(), idx


def _check_nonfinite(out64: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    nan_out, nan_ref = torch.isnan(out64), torch.isnan(ref)
    inf_ref = torch.isinf(ref)
    bad = nan_out != nan_ref
    bad |= torch.isinf(out64) != inf_ref
    bad |= inf_ref & (out64 != ref)
    if bad.any():
        where = bad.nonzero()
        first = tuple(where[0].tolist())
        raise AssertionError(
            f"{what}: NaN/inf pattern differs from the reference at {where.shape[0]} element(s), "
            f"first at index {first}: got {out64[first].item()}, reference {ref[first].item()}"
        )


@_single_threaded
def assert_close_to_reference(
    out: torch.Tensor,
    torch_out: torch.Tensor,
    ref: torch.Tensor,
    dtype: torch.dtype | None = None,
    what: str = "output",
    scale: torch.Tensor | None = None,
    torch_ref: torch.Tensor | None = None,
    atol: dict | None = None,
) -> None:
    """Asserts the tolerance rule for fusedops' `out`, given torch's `torch_out` at the same dtype,
    the fp64 reference `ref` and the per-element `scale` (None: max |ref|; module docstring).
    On failure the message holds both errors, the bound and the worst element.

    `atol`: the ATOL table to use (default ATOL; ATOL_GEMM for matrix products).
    `torch_ref`, when given, is the reference for torch's output (default: `ref`): for a backward
    judged on each implementation's own forward output. Also checks that out has torch's shape
    and dtype, and that out's NaN/inf pattern is the reference's (so every element that should be
    finite is).
    """
    dtype = dtype or torch_out.dtype
    assert out.shape == torch_out.shape == ref.shape, (
        f"{what}: shapes differ: fusedops {tuple(out.shape)}, torch {tuple(torch_out.shape)}, "
        f"reference {tuple(ref.shape)}"
    )
    assert out.dtype == torch_out.dtype == dtype, (
        f"{what}: dtypes differ: fusedops {out.dtype}, torch {torch_out.dtype}, expected {dtype}"
    )
    ref = _as64(ref)
    torch_ref = ref if torch_ref is None else _as64(torch_ref)
    _check_nonfinite(_as64(out), ref, f"{what} (fusedops)")
    scale = _scale_for(ref, scale, dtype)
    torch_err, _ = scaled_err(torch_out, torch_ref, scale)
    if torch_err == float("inf"):
        raise AssertionError(
            f"{what}: torch itself is not finite where the fp64 reference is; the tolerance rule "
            "can't be applied to this input"
        )
    err, idx = scaled_err(out, ref, scale)
    atol = (atol or ATOL)[dtype]
    bound = 2.0 * torch_err + atol
    if not err <= bound:
        raise AssertionError(
            f"{what} ({dtype}, shape {tuple(ref.shape)}): err(fusedops) = {err:.3e} > "
            f"2 * err(torch) + atol = 2 * {torch_err:.3e} + {atol:.1e} = {bound:.3e} "
            f"(errors in units of each element's scale); worst element at {idx}: "
            f"fusedops {_as64(out)[idx].item():.9g}, torch {_as64(torch_out)[idx].item():.9g}, "
            f"reference {ref[idx].item():.9g}, scale {scale[idx].item():.3e}"
        )


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def make_input(
    shape,
    dtype: torch.dtype = torch.float32,
    device="cpu",
    scale: float = 3.0,
    shift: float = 0.0,
    requires_grad: bool = False,
) -> torch.Tensor:
    """Fresh random input: randn * scale + shift (never all zeros; spread-out values, so a row's
    softmax is far from uniform). Drawn in fp32 on the CPU from torch's global generator, so the
    same seed gives the same values on every device, then cast and moved."""
    x = torch.randn(shape, dtype=torch.float32) * scale + shift
    x = x.to(device=device, dtype=dtype)
    return x.requires_grad_(requires_grad)


def make_misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t whose data pointer is one element past a fresh allocation, so it is
    not 16-byte aligned (for 2-, 4- and 8-byte dtypes)."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = buf[1:].view(t.shape)
    out.copy_(t)
    assert out.is_contiguous() and out.data_ptr() % 16 != 0
    return out


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fills t in place with NaN (floating) or the dtype's max (integer): anything a kernel
    forgets to write stands out. Returns t."""
    if t.is_floating_point() or t.is_complex():
        return t.fill_(float("nan"))
    return t.fill_(torch.iinfo(t.dtype).max if t.dtype != torch.bool else True)


def poison_allocator(device, nbytes: int) -> None:
    """Allocates nbytes on device, fills them with NaN and frees them, so the caching allocator
    hands that poisoned block to the next allocation of a similar size (the ops allocate their
    own outputs: this is how an unwritten output element becomes visible). A no-op in effect
    where the allocator doesn't cache (CPU)."""
    if torch.device(device).type == "cpu":
        return
    numel = max(1, (nbytes + 3) // 4)
    block = torch.empty(numel, dtype=torch.float32, device=device)
    poison_(block)
    del block


# --------------------------------------------------------------------------------------------
# The rule for softmax / log_softmax, with their references and scales
# --------------------------------------------------------------------------------------------


def assert_softmax_close(out, torch_out, x, dim=-1, log=False, what="forward") -> None:
    """The tolerance rule for softmax / log_softmax outputs of input x."""
    assert_close_to_reference(
        out, torch_out, softmax_ref(x, dim, log), x.dtype, what, softmax_scale(x, dim, log)
    )


def assert_softmax_backward_close(
    dx, torch_dx, grad_output, output, dim=-1, log=False, torch_output=None, what="backward"
) -> None:
    """The tolerance rule for a backward given grad_output and the forward's output. When torch
    ran its backward on its own forward output, pass that as torch_output: each implementation
    is then judged on the output it was given."""
    ref = softmax_backward_ref(grad_output, output, dim, log)
    torch_ref = None
    if torch_output is not None:
        torch_ref = softmax_backward_ref(grad_output, torch_output, dim, log)
    scale = softmax_backward_scale(grad_output, output, dim, log)
    assert_close_to_reference(dx, torch_dx, ref, output.dtype, what, scale, torch_ref)


def capture_cuda_graph(step):
    """Runs step() once on a side stream (warm-up, as torch.cuda.graphs asks), then captures it.
    Returns the graph and what the captured call returned (its static outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    return graph, static


def assert_compiles_like_eager(module: torch.nn.Module, x: torch.Tensor) -> None:
    """torch.compile(module, fullgraph=True) gives eager's output and gradients (x and every
    parameter) for x."""
    compiled = torch.compile(module, fullgraph=True)
    y, y_eager = compiled(x), module(x)
    torch.testing.assert_close(y, y_eager)
    dy = torch.randn_like(y)
    inputs = (x, *module.parameters())
    grads = torch.autograd.grad(y, inputs, dy)
    for g, g_eager in zip(grads, torch.autograd.grad(y_eager, inputs, dy), strict=True):
        torch.testing.assert_close(g, g_eager)


def zero_fills_in_backward(loss: torch.Tensor) -> list[tuple[str, tuple[int, ...]]]:
    """(op, shape) of every zero-filled tensor made while loss.backward() runs: an autograd node
    that materializes zero gradients for outputs nothing used (torch's default for C++ functions)
    shows up here as an aten.zeros of that output's shape."""
    fills = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in ("zeros", "zeros_like", "new_zeros", "zero_", "fill_") and isinstance(
                out, torch.Tensor
            ):
                fills.append((name, tuple(out.shape)))
            return out

    with Record():
        loss.backward()
    return fills
