// MPS layer_norm / rms_norm: checks and statistics from norms.h (through NormOps),
// kernels from metal/kernels/norms.metal. Weight and bias are widened to fp32 [cols] (a no-op for
// fp32 parameters); their gradients are summed in fp32 and returned in the parameters' dtype.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <optional>
#include <tuple>

#include "mps/metal_host.h"
#include "norm_ops.h"
#include "norms.h"

namespace fusedops {
namespace {

using OptTensor = std::optional<at::Tensor>;

// Threadgroups of the backward, each summing its rows' weight/bias gradients into one partial
// row: enough to fill an Apple GPU, few enough that the partials stay small. Depends only on the
// shape, so gradients are bitwise reproducible.
constexpr int64_t kBwdChunks = 256;

at::Tensor param_f32(const OptTensor& p) {
  return has_tensor(p) ? p->to(at::kFloat).contiguous() : at::Tensor();
}

// The backend of NormOps (norm_ops.h).
struct MpsNorms {
  template <bool kRms>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> fwd(const char* op, const at::Tensor& input,
                                                            at::IntArrayRef normalized_shape,
                                                            const OptTensor& weight,
                                                            const OptTensor& bias, double eps) {
    const NormProblem p = norm_problem(op, input, normalized_shape);
    check_norm_params(op, input, normalized_shape, weight, bias);
    const char* type = mps::metal_type(op, input);
    mps::check_fits_u32(op, p.rows, p.cols);
    const at::Tensor x = input.contiguous();
    at::Tensor out = at::empty_like(x);
    at::Tensor mean = kRms ? at::Tensor() : norm_stat_empty(input, p);
    at::Tensor rstd = norm_stat_empty(input, p);
    if (p.rows == 0) return {out, mean, rstd};
    if (p.cols == 0) {
      fill_empty_row_stats(mean, rstd);
      return {out, mean, rstd};
    }
    const at::Tensor w = param_f32(weight), b = param_f32(bias);
    // rows, cols, eps, has_weight, has_bias; the backward's fields stay 0.
    const NormParams params{static_cast<uint32_t>(p.rows), static_cast<uint32_t>(p.cols),
                            static_cast<float>(eps), w.defined(), b.defined()};
    const mps::RowPlan plan = mps::row_plan(kRms ? "rms_norm_fwd" : "layer_norm_fwd", type, p.cols);
    // Absent inputs and rms_norm's mean are bound to a tensor the kernel never touches there.
    mps::launch(*plan.kernel,
                {x, w.defined() ? w : rstd, b.defined() ? b : rstd, out, kRms ? rstd : mean, rstd},
                params, params.rows, plan.threads);
    return {out, mean, rstd};
  }

  template <bool kRms>
  static std::tuple<OptTensor, OptTensor, OptTensor> bwd(
      const char* op, const at::Tensor& grad_out, const at::Tensor& input,
      at::IntArrayRef normalized_shape, const at::Tensor* mean, const at::Tensor& rstd,
      const OptTensor& weight, const OptTensor& bias, std::array<bool, 3> output_mask) {
    const NormProblem p =
        check_norm_bwd(op, grad_out, input, normalized_shape, mean, rstd, weight, bias);
    const char* type = mps::metal_type(op, input);
    mps::check_fits_u32(op, p.rows, p.cols);
    const bool want_dw = output_mask[1] && has_tensor(weight);
    const bool want_db = output_mask[2] && has_tensor(bias);
    const at::Tensor x = input.contiguous(), dy = grad_out.contiguous();
    at::Tensor dx = output_mask[0] ? at::empty_like(x) : at::Tensor();
    const std::optional<at::Tensor> no;
    if (x.numel() == 0) {  // no rows: parameter gradients are sums of nothing
      return {dx.defined() ? OptTensor(dx) : no, want_dw ? OptTensor(at::zeros_like(*weight)) : no,
              want_db ? OptTensor(at::zeros_like(*bias)) : no};
    }
    const at::Tensor mean_c = kRms ? rstd.contiguous() : mean->contiguous();
    const at::Tensor rstd_c = rstd.contiguous();
    const at::Tensor w = param_f32(weight);
    const int64_t chunks = std::min(p.rows, kBwdChunks);
    const auto f32 = x.options().dtype(at::kFloat);
    const at::Tensor dw_part = want_dw ? at::empty({chunks, p.cols}, f32) : at::Tensor();
    const at::Tensor db_part = want_db ? at::empty({chunks, p.cols}, f32) : at::Tensor();
    // rows, cols, eps (unused), has_weight, has_bias (unused), want_dx, want_dw, want_db, chunks.
    const NormParams params{static_cast<uint32_t>(p.rows),
                            static_cast<uint32_t>(p.cols),
                            0.0f,
                            w.defined(),
                            false,
                            dx.defined(),
                            want_dw,
                            want_db,
                            static_cast<uint32_t>(chunks)};
    const mps::RowPlan plan = mps::row_plan(kRms ? "rms_norm_bwd" : "layer_norm_bwd", type, p.cols);
    // Outputs not wanted and absent inputs are bound to a tensor the kernel never touches there.
    mps::launch(*plan.kernel,
                {dy, x, mean_c, rstd_c, w.defined() ? w : rstd_c, dx.defined() ? dx : x,
                 want_dw ? dw_part : rstd_c, want_db ? db_part : rstd_c},
                params, params.chunks, plan.threads);
    auto grad_of = [&](const at::Tensor& part, const OptTensor& param) -> OptTensor {
      if (!part.defined()) return std::nullopt;
      return mps::colsum(part).to(param->scalar_type()).view(param->sizes());
    };
    return {dx.defined() ? OptTensor(dx) : no, grad_of(dw_part, weight), grad_of(db_part, bias)};
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, MPS, m) { NormOps<MpsNorms>::register_into(m); }

}  // namespace fusedops
