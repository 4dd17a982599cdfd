// Host-side logic shared by the CPU, CUDA and MPS softmax: checks, the rows x cols view, and
// how a strided dim is served.
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
// [N, C, H, W]), moving the dim last takes a copy in and another out. Layouts where the dim is
// already last in memory (a transposed tensor over dim 0, channels_last over dim 1) don't.
inline bool softmax_dim_strided(const at::Tensor& t, int64_t dim) {
  return t.dim() > 1 && dim != t.dim() - 1 && !t.movedim(dim, -1).is_contiguous();
}

// A dim last in memory but not in the tensor (the channels of a channels_last [N, C, H, W], a
// transposed [B, C, L]): the rows path reads its rows in place, but the result, contiguous as
// torch returns it, takes a copy to put each row's elements `inner` apart.
inline bool softmax_dim_transposed(const at::Tensor& t, int64_t dim) {
  return t.dim() > 1 && dim != t.dim() - 1 && t.movedim(dim, -1).is_contiguous();
}

// Many short softmaxes down a strided dim: at least kManyColumns of at most kShortCols elements.
// There a GPU reads the dim in place faster than the rows path (a thread per softmax on CUDA,
// torch's kernel on MPS); few long ones keep the rows path, which beats torch's kernel by far.
// H100, fp32, rows path / torch / CUDA's strided kernel: [16, 21, 128, 128] over dim 1 0.113 /
// 0.054 / 0.018 ms, [64, 12, 197, 197] over dim 2 0.565 / 0.324 / 0.257; [4096, 1024] over
// dim 0 0.087 / 2.85 on the rows path.
constexpr int64_t kShortCols = 1024, kManyColumns = 16384;
inline bool many_short_softmaxes(const at::Tensor& t, int64_t dim) {
  const int64_t cols = t.size(dim);
  return cols > 0 && cols <= kShortCols && t.numel() / cols >= kManyColumns;
}

// [outer, cols, inner]: the sizes before, at and after `dim`.
struct StridedSoftmax {
  int64_t outer, cols, inner;
};
inline StridedSoftmax strided_softmax(const at::Tensor& t, int64_t dim) {
  const int64_t cols = t.size(dim);
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < t.dim(); ++d) inner *= t.size(d);
  return {t.numel() / (cols * inner), cols, inner};
}

// torch's own kernel, which reads a strided dim in place: the CPU's answer to every strided dim
// (2 threads, fp32, rows path -> torch: [16, 21, 128, 128] over dim 1 26.4 -> 3.6 ms, [64, 12,
// 197, 197] over dim 2 170 -> 49, [4096, 1024] over dim 0 12.4 -> 5.4), and MPS's to many short
// softmaxes (not measured there).
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
