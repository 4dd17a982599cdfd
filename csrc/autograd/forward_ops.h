// The functional forwards' ops, called through the dispatcher; defined beside their autograd in
// csrc/autograd/. The autograd kernels call them below the Autograd key, python_module.cpp's
// direct calls from the top.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>
#include <tuple>

namespace fusedops {

at::Tensor softmax_fwd_op(const at::Tensor& input, int64_t dim, bool log);

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd_op(
    const at::Tensor& input, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps);

std::tuple<at::Tensor, at::Tensor> rms_norm_fwd_op(const at::Tensor& input,
                                                   at::IntArrayRef normalized_shape,
                                                   const std::optional<at::Tensor>& weight,
                                                   std::optional<double> eps);

at::Tensor bias_gelu_fwd_op(const at::Tensor& input, const at::Tensor& bias,
                            c10::string_view approximate);

// out, and pre / act where save_pre / save_act (what the backward takes).
using MlpFwdOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
MlpFwdOutputs mlp_fwd_op(const at::Tensor& x, const at::Tensor& w1,
                         const std::optional<at::Tensor>& b1, const at::Tensor& w2,
                         const std::optional<at::Tensor>& b2, c10::string_view approximate,
                         bool save_pre, bool save_act);

}  // namespace fusedops
