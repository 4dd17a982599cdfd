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

inline SoftmaxProblem check_softmax_fwd(const at::Tensor& input, int64_t dim) {
  check_floating("softmax", "input", input);
  return softmax_problem("softmax", input, dim);
}

inline SoftmaxProblem check_softmax_bwd(const at::Tensor& grad_output, const at::Tensor& output,
                                        int64_t dim) {
  check_floating("softmax_backward", "output", output);
  check_like("softmax_backward", "grad_output", grad_output, "output", output);
  return softmax_problem("softmax_backward", output, dim);
}

}  // namespace fusedops
