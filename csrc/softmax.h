// Host-side shape logic shared by the CPU and CUDA softmax: checks, and the rows x cols view.
#pragma once

#include <ATen/core/Tensor.h>

#include "common/checks.h"

namespace fusedops {

struct SoftmaxProblem {
  int64_t dim;   // wrapped
  int64_t rows;  // product of all sizes but dim
  int64_t cols;  // size of dim
};

inline SoftmaxProblem softmax_problem(const char* op, const at::Tensor& t, int64_t dim) {
  const int64_t d = wrap_dim(op, dim, t.dim());
  const int64_t cols = t.dim() == 0 ? 1 : t.size(d);
  return {d, cols == 0 ? 0 : t.numel() / cols, cols};
}

// Errors name the function the user called: one op serves softmax and log_softmax.
inline SoftmaxProblem check_softmax_fwd(const at::Tensor& input, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_floating(op, "input", input);
  return softmax_problem(op, input, dim);
}

inline SoftmaxProblem check_softmax_bwd(const at::Tensor& grad_output, const at::Tensor& output,
                                        int64_t dim, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_floating(op, "output", output);
  check_like(op, "grad_output", grad_output, "output", output);
  return softmax_problem(op, output, dim);
}

}  // namespace fusedops
