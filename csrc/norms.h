// Host-side shape logic shared by the CPU and CUDA layer_norm / rms_norm: argument checks, the
// rows x cols view, the statistics' shape and dtype, and rms_norm's default eps.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/irange.h>

#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>

#include "common/checks.h"

namespace fusedops {

inline bool has_tensor(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

struct NormProblem {
  int64_t rows;  // product of the leading (batch) dims
  int64_t cols;  // product of normalized_shape
  int64_t axis;  // first normalized dim
};

// normalized_shape must be the trailing dims of `input`, as in torch.nn.functional.layer_norm.
inline NormProblem norm_problem(const char* op, const at::Tensor& input,
                                at::IntArrayRef normalized_shape) {
  check_floating(op, "input", input);
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK_VALUE(k >= 1, "fusedops.", op,
                    ": normalized_shape must have at least one dimension, got ",
                    to_text(normalized_shape));
  TORCH_CHECK_VALUE(input.dim() >= k && input.sizes().slice(input.dim() - k) == normalized_shape,
                    "fusedops.", op, ": normalized_shape=", to_text(normalized_shape),
                    " does not match the trailing dimensions of input of shape ",
                    to_text(input.sizes()));
  const int64_t axis = input.dim() - k;
  int64_t rows = 1, cols = 1;
  for (const int64_t d : c10::irange(axis)) rows *= input.size(d);
  for (const int64_t s : normalized_shape) cols *= s;
  return {rows, cols, axis};
}

// A weight or bias: normalized_shape, input's device, and input's dtype or fp32 (the latter for
// fp16/bf16 activations with fp32 parameters). Weight and bias share one dtype.
inline void check_norm_param(const char* op, const char* arg, const std::optional<at::Tensor>& p,
                             const at::Tensor& input, at::IntArrayRef normalized_shape) {
  if (!has_tensor(p)) return;
  TORCH_CHECK(p->device() == input.device(), "fusedops.", op, ": ", arg, " is on ", p->device(),
              " but input is on ", input.device());
  TORCH_CHECK_VALUE(p->sizes() == normalized_shape, "fusedops.", op, ": ", arg, " has shape ",
                    to_text(p->sizes()), " but normalized_shape is ", to_text(normalized_shape));
  const auto s = p->scalar_type(), x = input.scalar_type();
  TORCH_CHECK_TYPE(s == x || (s == at::kFloat && (x == at::kHalf || x == at::kBFloat16)),
                   "fusedops.", op, ": ", arg, " has dtype ", s, " but input has dtype ", x,
                   " (expected ", x, x == at::kHalf || x == at::kBFloat16 ? " or float32)" : ")");
}

inline void check_norm_params(const char* op, const at::Tensor& input,
                              at::IntArrayRef normalized_shape,
                              const std::optional<at::Tensor>& weight,
                              const std::optional<at::Tensor>& bias) {
  check_norm_param(op, "weight", weight, input, normalized_shape);
  check_norm_param(op, "bias", bias, input, normalized_shape);
  if (has_tensor(weight) && has_tensor(bias)) {
    TORCH_CHECK_TYPE(weight->scalar_type() == bias->scalar_type(), "fusedops.", op,
                     ": weight has dtype ", weight->scalar_type(), " but bias has dtype ",
                     bias->scalar_type(), " (they must match)");
  }
}

// The parameters' dtype: weight's, else bias's (check_norm_params makes them match); none
// when neither is given.
inline std::optional<at::ScalarType> norm_param_dtype(const at::Tensor& weight,
                                                      const at::Tensor& bias) {
  if (weight.defined()) return weight.scalar_type();
  if (bias.defined()) return bias.scalar_type();
  return std::nullopt;
}

// Calls f(T*, W*) (null type tags), T the backend's type for the input's dtype and W that of the
// parameters: float when they are fp32 beside fp16/bf16 input, else T (check_norm_param allows
// nothing else). The kernels read the parameters as they are: no converted copy per call.
template <typename T, typename F>
void with_norm_param_type(std::optional<at::ScalarType> param_dtype, F& f) {
  if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, double>) {
    if (param_dtype == at::kFloat) return f(static_cast<T*>(nullptr), static_cast<float*>(nullptr));
  }
  f(static_cast<T*>(nullptr), static_cast<T*>(nullptr));
}

// Per-row statistics are accumulated and saved in fp32 (fp64 for fp64 input).
inline at::ScalarType norm_stat_dtype(const at::Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Statistics have the leading (batch) dims of input: one value per normalized row.
inline at::IntArrayRef norm_stat_sizes(const at::Tensor& input, const NormProblem& p) {
  return input.sizes().slice(0, p.axis);
}

inline at::Tensor norm_stat_empty(const at::Tensor& input, const NormProblem& p) {
  return at::empty(norm_stat_sizes(input, p), input.options().dtype(norm_stat_dtype(input)));
}

// Statistics of rows with no elements, as torch's layer_norm gives them: mean 0, rstd NaN.
inline void fill_empty_row_stats(at::Tensor& mean, at::Tensor& rstd) {
  if (mean.defined()) mean.zero_();
  rstd.fill_(std::numeric_limits<double>::quiet_NaN());
}

inline void check_norm_stat(const char* op, const char* arg, const at::Tensor& stat,
                            const at::Tensor& input, const NormProblem& p) {
  TORCH_CHECK(stat.device() == input.device(), "fusedops.", op, ": ", arg, " is on ", stat.device(),
              " but input is on ", input.device());
  TORCH_CHECK_TYPE(stat.scalar_type() == norm_stat_dtype(input), "fusedops.", op, ": ", arg,
                   " has dtype ", stat.scalar_type(), " (expected ", norm_stat_dtype(input), ")");
  TORCH_CHECK_VALUE(stat.numel() == p.rows, "fusedops.", op, ": ", arg, " has ",
                    to_text(stat.numel()), " elements but input has ", to_text(p.rows), " rows");
}

// eps is added to the variance: a negative, NaN or infinite one gives NaN or zeros silently.
inline void check_norm_eps(const char* op, double eps) {
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0, "fusedops.", op,
                    ": eps must be a finite number >= 0, got ", to_text(eps));
}

// torch.rms_norm's eps=None: the epsilon of the accumulation type (fp32 for fp16/bf16/fp32).
inline double rms_norm_eps(const at::Tensor& input, std::optional<double> eps) {
  if (eps.has_value()) return *eps;
  return input.scalar_type() == at::kDouble ? std::numeric_limits<double>::epsilon()
                                            : std::numeric_limits<float>::epsilon();
}

// Checks shared by layer_norm_bwd and rms_norm_bwd; `mean` is absent for rms_norm.
inline NormProblem check_norm_bwd(const char* op, const at::Tensor& grad_out,
                                  const at::Tensor& input, at::IntArrayRef normalized_shape,
                                  const at::Tensor* mean, const at::Tensor& rstd,
                                  const std::optional<at::Tensor>& weight,
                                  const std::optional<at::Tensor>& bias) {
  const NormProblem p = norm_problem(op, input, normalized_shape);
  check_like(op, "grad_out", grad_out, "input", input);
  if (mean != nullptr) check_norm_stat(op, "mean", *mean, input, p);
  check_norm_stat(op, "rstd", rstd, input, p);
  check_norm_params(op, input, normalized_shape, weight, bias);
  return p;
}

}  // namespace fusedops
