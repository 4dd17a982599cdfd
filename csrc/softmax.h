// Host-side logic shared by the CPU, CUDA and MPS softmax: checks, the rows x cols view, and
// where torch's own kernel runs instead of the rows kernels.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/_log_softmax.h>
#include <ATen/ops/_log_softmax_backward_data.h>
#include <ATen/ops/_softmax.h>
#include <ATen/ops/_softmax_backward_data.h>

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

// The rows kernels read rows with `dim` last and contiguous. Where t's layout has them some other
// way (a contiguous tensor and a dim other than the last, as softmax over the channels of
// [N, C, H, W]), moving the dim last takes a copy in and another out; torch's own kernel reads
// the strided layout in place. It runs instead on the CPU, and on a GPU for many short
// softmaxes, where its kernel wins; few long ones keep the rows path, where torch's is slow.
// Measured, fp32, rows path / torch: CPU (2 threads) [16, 21, 128, 128] over dim 1 26.4 / 3.7
// ms, [64, 12, 197, 197] over dim 2 170 / 51, [4096, 1024] over dim 0 12.4 / 6.3; H100 0.113 /
// 0.054, 0.565 / 0.324, and 0.087 / 2.85. Layouts where the dim is already last in memory (a
// transposed tensor over dim 0, channels_last over dim 1) keep the rows kernels.
constexpr int64_t kTorchGpuMaxCols = 1024, kTorchGpuMinRows = 16384;
inline bool softmax_runs_torch(const at::Tensor& t, int64_t dim) {
  if (t.dim() <= 1 || dim == t.dim() - 1 || t.movedim(dim, -1).is_contiguous()) return false;
  if (t.device().is_cpu()) return true;
  const int64_t cols = t.size(dim);
  return cols > 0 && cols <= kTorchGpuMaxCols && t.numel() / cols >= kTorchGpuMinRows;
}

inline at::Tensor torch_softmax_fwd(const at::Tensor& input, int64_t dim, bool log) {
  return log ? at::_log_softmax(input, dim, /*half_to_float=*/false)
             : at::_softmax(input, dim, /*half_to_float=*/false);
}

inline at::Tensor torch_softmax_bwd(const at::Tensor& grad_output, const at::Tensor& output,
                                    int64_t dim, bool log) {
  return log ? at::_log_softmax_backward_data(grad_output, output, dim, output.scalar_type())
             : at::_softmax_backward_data(grad_output, output, dim, output.scalar_type());
}

}  // namespace fusedops
