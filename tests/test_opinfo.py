"""torch's own OpInfo sample inputs (common_methods_invocations.op_db) run through fusedops, for
every op with a torch counterpart, on every device present and every dtype both support there.

Each sample runs forward and (for differentiable ops) backward through fusedops and through the
OpInfo's torch op at the same dtype, and both are judged under the tolerance rule against torch in
fp64 on the CPU (tests/reference.py). Samples are never skipped silently: the ones fusedops
handles differently on purpose are listed in EXPECTED_ERRORS with the reason and must raise that
clear error.
"""

import pytest
import torch
from reference import (
    assert_close_to_reference,
    assert_softmax_backward_close,
    assert_softmax_close,
    norm_backward_scales,
)

import fusedops
from fusedops._ops import ops

op_db = pytest.importorskip(
    "torch.testing._internal.common_methods_invocations", reason="torch's test internals"
).op_db

# fusedops computes these dtypes; torch's complex (rms_norm) and integer ('with_dtype' variants)
# ones are rejected with a clear error (tests/test_bad_input.py).
FUSEDOPS_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _softmax(log):
    return lambda s: (fusedops.log_softmax if log else fusedops.softmax)(s.input, *s.args)


def _bias_gelu(s):
    # gelu(x) is bias_gelu with a zero bias.
    zero = torch.zeros(s.input.shape[-1], dtype=s.input.dtype, device=s.input.device)
    return fusedops.bias_gelu(s.input, zero, **s.kwargs)


def _softmax_bwd(s):
    output, dim, _ = s.args
    return ops.softmax_bwd(s.input, output, dim, False)


def _half_to_float(s):
    # CUDA samples of torch's half-to-float softmax (fp32 grad, fp16 output): fusedops.softmax
    # returns its input's dtype, so its backward never sees this pair.
    return s.args[0].dtype != s.input.dtype


# OpInfo name -> samples that do not apply to fusedops, with the predicate's reason above.
NOT_APPLICABLE = {"_softmax_backward_data": _half_to_float}


# OpInfo name -> how fusedops computes the sample. The 'with_dtype' variants of softmax and
# log_softmax are not run: fusedops.softmax has no dtype argument (torch.nn.functional's
# signature without it); torch.softmax(x, dtype=d) is fusedops.softmax(x.to(d)).
FUSEDOPS_OF = {
    "softmax": _softmax(log=False),
    "log_softmax": _softmax(log=True),
    "nn.functional.layer_norm": lambda s: fusedops.layer_norm(s.input, *s.args, **s.kwargs),
    "nn.functional.rms_norm": lambda s: fusedops.rms_norm(s.input, *s.args, **s.kwargs),
    "nn.functional.gelu": _bias_gelu,
    "_softmax_backward_data": _softmax_bwd,
}
NORMS = ("nn.functional.layer_norm", "nn.functional.rms_norm")
NOT_DIFFERENTIATED = {"_softmax_backward_data"}  # its own backward is softmax's double backward


def _negative_eps(s):
    eps = s.kwargs.get("eps")
    return eps is not None and eps < 0


# (OpInfo name, predicate on a sample) -> (exception, message, reason). torch accepts a negative
# eps (the variance may still exceed |eps|); fusedops rejects it, as issue 13 asks: an eps that
# can make the variance negative gives NaN without a word.
EXPECTED_ERRORS = {
    op: (_negative_eps, ValueError, "eps must be a finite number >= 0") for op in NORMS
}

OPINFOS = [o for o in op_db if o.name in FUSEDOPS_OF and o.variant_test_name == ""]


def _cases():
    for opinfo in OPINFOS:
        for dtype in FUSEDOPS_DTYPES:
            yield pytest.param(opinfo, dtype, id=f"{opinfo.name}-{str(dtype)[6:]}")


def _to64(t):
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.float64).requires_grad_(t.requires_grad)
    return torch.float64 if isinstance(t, torch.dtype) else t


def _grad_inputs(s):
    return [t for t in (s.input, *s.args, *s.kwargs.values()) if _requires_grad(t)]


def _requires_grad(t):
    return isinstance(t, torch.Tensor) and t.requires_grad


def _run(fn, s, grad_out):
    """fn's output on sample s and, if grad_out is given, the gradients of its tensor inputs."""
    out = fn(s)
    if grad_out is None:
        return out.detach(), []
    inputs = _grad_inputs(s)
    grads = torch.autograd.grad(out, inputs, grad_out.to(out.device, out.dtype), allow_unused=True)
    return out.detach(), list(grads)


def _check_sample(opinfo, s, dtype):
    name = opinfo.name
    log = name == "log_softmax"
    s64 = s.transform(_to64)
    differentiable = name not in NOT_DIFFERENTIATED and bool(_grad_inputs(s))
    torch_op = lambda s: opinfo.op(s.input, *s.args, **s.kwargs)  # noqa: E731
    ref, _ = _run(torch_op, s64, None)
    grad_out = torch.randn(ref.shape, dtype=torch.float64) if differentiable else None
    ref, ref_grads = _run(torch_op, s64, grad_out)
    theirs, their_grads = _run(torch_op, s, grad_out)
    ours, our_grads = _run(FUSEDOPS_OF[name], s, grad_out)
    if name in ("softmax", "log_softmax"):
        dim = s.args[0]
        assert_softmax_close(ours, theirs, s.input, dim, log)
        if differentiable:
            g = grad_out.to(ours.dtype)
            assert_softmax_backward_close(
                our_grads[0], their_grads[0], g, ours, dim, log, torch_output=theirs
            )
        return
    assert_close_to_reference(ours, theirs, ref, dtype)
    scales = [None] * len(ref_grads)
    if name in NORMS:
        normalized_shape, weight = s.args[0], s.args[1] if len(s.args) > 1 else None
        eps = s.kwargs.get("eps", 1e-5 if name == NORMS[0] else None)
        by_arg = norm_backward_scales(
            s.input, normalized_shape, weight, grad_out, eps, rms=name == NORMS[1]
        )
        scales = list(by_arg[: len(ref_grads)])
    for i, (g, gt, gr, sc) in enumerate(
        zip(our_grads, their_grads, ref_grads, scales, strict=True)
    ):
        assert_close_to_reference(g, gt, gr, dtype, f"gradient of tensor input {i}", sc)


@pytest.mark.parametrize(("opinfo", "dtype"), list(_cases()))
def test_opinfo_samples(device, opinfo, dtype):
    torch_dtypes = opinfo.supported_dtypes(torch.device(device).type)
    if dtype not in torch_dtypes:
        pytest.skip(f"torch's {opinfo.name} does not support {dtype} on {device}")
    if device == "mps" and dtype == torch.float64:
        pytest.skip("MPS has no float64")
    expected = EXPECTED_ERRORS.get(opinfo.name)
    failures, count = [], 0
    for s in opinfo.sample_inputs(device, dtype, requires_grad=True):
        if NOT_APPLICABLE.get(opinfo.name, lambda s: False)(s):
            continue
        count += 1
        try:
            if expected is not None and expected[0](s):
                with pytest.raises(expected[1], match=expected[2]):
                    FUSEDOPS_OF[opinfo.name](s)
            else:
                _check_sample(opinfo, s, dtype)
        except (AssertionError, RuntimeError, ValueError, TypeError, pytest.fail.Exception) as e:
            failures.append(f"{s.summary() if hasattr(s, 'summary') else s}: {e}")
    assert count > 0, f"{opinfo.name} gave no samples for {dtype} on {device}"
    assert not failures, f"{len(failures)} of {count} samples failed:\n" + "\n".join(failures)


def test_every_fusedops_op_with_a_torch_counterpart_is_covered():
    """If torch renames or drops an OpInfo, this fails instead of the suite silently shrinking."""
    assert {o.name for o in OPINFOS} == set(FUSEDOPS_OF)
