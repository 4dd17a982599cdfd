// MPS softmax / log_softmax: checks and layout from softmax.h, kernels from
// metal/kernels/softmax.metal. A softmax over a dim other than the last is made contiguous with
// that dim last first, but many short softmaxes down a strided dim run torch's kernel (softmax.h).
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "mps/metal_host.h"
#include "softmax.h"

namespace fusedops {
namespace {

at::Tensor softmax_fwd(const at::Tensor& input, int64_t dim, bool log) {
  const SoftmaxProblem p = check_softmax_fwd(input, dim, log);
  const char* type = mps::metal_type("softmax", input);
  mps::check_fits_u32("softmax", p.rows, p.cols);
  if (softmax_dim_strided(input, p.dim) && many_short_softmaxes(input, p.dim))
    return torch_softmax_fwd(input, p.dim, log);
  const at::Tensor x = to_rows(input, p.dim);
  at::Tensor y = at::empty_like(x);
  if (p.rows == 0) return from_rows(y, p.dim, input);
  const mps::RowPlan plan = mps::row_plan("softmax_fwd", type, p.cols);
  const SoftmaxParams params{static_cast<uint32_t>(p.rows), static_cast<uint32_t>(p.cols),
                             log ? 1u : 0u};
  mps::launch(*plan.kernel, {x, y}, params, params.rows, plan.threads);
  return from_rows(y, p.dim, input);
}

at::Tensor softmax_bwd(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                       bool log) {
  const SoftmaxProblem p = check_softmax_bwd(grad_output, output, dim, log);
  const char* type = mps::metal_type("softmax_backward", output);
  mps::check_fits_u32("softmax_backward", p.rows, p.cols);
  if (softmax_dim_strided(output, p.dim) && many_short_softmaxes(output, p.dim))
    return torch_softmax_bwd(grad_output, output, p.dim, log);
  const at::Tensor dy = to_rows(grad_output, p.dim);
  const at::Tensor y = to_rows(output, p.dim);
  at::Tensor dx = at::empty_like(y);
  if (p.rows == 0) return from_rows(dx, p.dim, output);
  const mps::RowPlan plan = mps::row_plan("softmax_bwd", type, p.cols);
  const SoftmaxParams params{static_cast<uint32_t>(p.rows), static_cast<uint32_t>(p.cols),
                             log ? 1u : 0u};
  mps::launch(*plan.kernel, {dy, y, dx}, params, params.rows, plan.threads);
  return from_rows(dx, p.dim, output);
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, MPS, m) {
  m.impl("softmax_fwd", &softmax_fwd);
  m.impl("softmax_bwd", &softmax_bwd);
}

}  // namespace fusedops
