// MPS bias + GELU: checks from bias_gelu.h, kernels from
// metal/kernels/bias_gelu.metal, plus the row entry points fused_mlp composes with its GEMMs.
// dbias: per-chunk fp32 partials summed in chunk order (colsum), returned in bias' dtype.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>

#include "bias_gelu.h"
#include "mps/metal_host.h"

namespace fusedops {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Threadgroups of up to 256 threads over column blocks, each thread walking one column down
// rows_per_chunk rows: at least 16 rows per thread (the bias load and the dbias partial are
// amortized over them) and at most 1024 chunks (the dbias partials stay small). Depends only on
// the shape, so dbias is bitwise reproducible. col_blocks * chunks < 2^32 below 2^44 elements.
struct GeluLaunch {
  BiasGeluParams params;
  uint32_t groups;
  uint32_t threads;
  int64_t chunks;
};

GeluLaunch gelu_launch(const char* op, const mps::Kernel& k, int64_t rows, int64_t cols,
                       GeluApprox approx, bool has_bias, bool want_dbias) {
  mps::check_fits_u32(op, rows, cols);
  const int64_t threads = std::min<int64_t>({256, ceil_div(cols, 32) * 32, k.max_threads});
  const int64_t col_blocks = ceil_div(cols, threads);
  const int64_t rows_per_chunk = std::max<int64_t>(16, ceil_div(rows, 1024));
  const int64_t chunks = ceil_div(rows, rows_per_chunk);
  const BiasGeluParams params{static_cast<uint32_t>(rows),
                              static_cast<uint32_t>(cols),
                              approx == GeluApprox::kTanh ? 1u : 0u,
                              has_bias,
                              want_dbias,
                              static_cast<uint32_t>(rows_per_chunk),
                              static_cast<uint32_t>(col_blocks)};
  return {params, static_cast<uint32_t>(col_blocks * chunks), static_cast<uint32_t>(threads),
          chunks};
}

}  // namespace

at::Tensor bias_gelu_rows_fwd_mps(const at::Tensor& input, const at::Tensor& bias,
                                  GeluApprox approx) {
  TORCH_INTERNAL_ASSERT(input.dim() == 2 && input.is_contiguous());
  const char* type = mps::metal_type("bias_gelu", input);
  const int64_t rows = input.size(0), cols = input.size(1);
  at::Tensor y = at::empty({rows, cols}, input.options());
  if (y.numel() == 0) return y;
  const mps::Kernel& k = mps::kernel(std::string("bias_gelu_fwd_rows_") + type);
  const GeluLaunch l = gelu_launch("bias_gelu", k, rows, cols, approx, bias.defined(), false);
  // No bias: the kernel never reads its slot.
  mps::launch(k, {input, bias.defined() ? bias : input, y}, l.params, l.groups, l.threads);
  return y;
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_rows_bwd_mps(const at::Tensor& grad_output,
                                                          const at::Tensor& input,
                                                          const at::Tensor& bias, GeluApprox approx,
                                                          bool want_dbias) {
  TORCH_INTERNAL_ASSERT(input.dim() == 2 && input.is_contiguous() && grad_output.is_contiguous());
  const char* type = mps::metal_type("bias_gelu_backward", input);
  const int64_t rows = input.size(0), cols = input.size(1);
  at::Tensor dx = at::empty({rows, cols}, input.options());
  if (dx.numel() == 0) {
    return {dx, want_dbias ? at::zeros({cols}, input.options()) : at::Tensor()};
  }
  const mps::Kernel& k = mps::kernel(std::string("bias_gelu_bwd_rows_") + type);
  const GeluLaunch l =
      gelu_launch("bias_gelu_backward", k, rows, cols, approx, bias.defined(), want_dbias);
  const at::Tensor part =
      want_dbias ? at::empty({l.chunks, cols}, input.options().dtype(at::kFloat)) : at::Tensor();
  // No bias / no dbias: the kernel never touches those slots.
  mps::launch(k, {grad_output, input, bias.defined() ? bias : input, dx, want_dbias ? part : dx},
              l.params, l.groups, l.threads);
  return {dx, want_dbias ? mps::colsum(part).to(input.scalar_type()) : at::Tensor()};
}

namespace {

at::Tensor bias_gelu_fwd(const at::Tensor& input, const at::Tensor& bias,
                         c10::string_view approximate) {
  const auto p = check_bias_gelu("bias_gelu", input, bias, approximate);
  const at::Tensor y = bias_gelu_rows_fwd_mps(input.contiguous().view({p.rows, p.cols}),
                                              bias.contiguous(), p.approx);
  return y.view(input.sizes());
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_bwd(const at::Tensor& grad_output,
                                                 const at::Tensor& input, const at::Tensor& bias,
                                                 c10::string_view approximate) {
  const auto p = check_bias_gelu("bias_gelu_backward", input, bias, approximate);
  check_like("bias_gelu_backward", "grad_output", grad_output, "input", input);
  auto [dx, db] = bias_gelu_rows_bwd_mps(grad_output.contiguous().view({p.rows, p.cols}),
                                         input.contiguous().view({p.rows, p.cols}),
                                         bias.contiguous(), p.approx, true);
  return {dx.view(input.sizes()), db};
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, MPS, m) {
  m.impl("bias_gelu_fwd", &bias_gelu_fwd);
  m.impl("bias_gelu_bwd", &bias_gelu_bwd);
}

}  // namespace fusedops
