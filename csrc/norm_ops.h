// The four norm schemas (csrc/ops.cpp) adapted onto one backend's shared implementation, and
// their registration, so each backend writes only its two templates:
//   struct Backend {
//     template <bool kRms> static std::tuple<Tensor, Tensor, Tensor>           // out, mean, rstd
//     fwd(op, input, normalized_shape, weight, bias, eps);
//     template <bool kRms> static std::tuple<OptTensor, OptTensor, OptTensor>  // dx, dw, db
//     bwd(op, grad_out, input, normalized_shape, mean (nullptr for rms), rstd, weight, bias, mask);
//   };
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <tuple>

#include "norms.h"

namespace fusedops {

template <typename Backend>
struct NormOps {
  using Tensor = at::Tensor;
  using OptTensor = std::optional<at::Tensor>;

  static std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd(const Tensor& input,
                                                           at::IntArrayRef normalized_shape,
                                                           const OptTensor& weight,
                                                           const OptTensor& bias, double eps) {
    check_norm_eps("layer_norm", eps);
    return Backend::template fwd<false>("layer_norm", input, normalized_shape, weight, bias, eps);
  }

  static std::tuple<Tensor, Tensor> rms_norm_fwd(const Tensor& input,
                                                 at::IntArrayRef normalized_shape,
                                                 const OptTensor& weight,
                                                 std::optional<double> eps) {
    if (eps.has_value()) check_norm_eps("rms_norm", *eps);
    auto [out, mean, rstd] = Backend::template fwd<true>(
        "rms_norm", input, normalized_shape, weight, std::nullopt, rms_norm_eps(input, eps));
    return {out, rstd};
  }

  static std::tuple<OptTensor, OptTensor, OptTensor> layer_norm_bwd(
      const Tensor& grad_out, const Tensor& input, at::IntArrayRef normalized_shape,
      const Tensor& mean, const Tensor& rstd, const OptTensor& weight, const OptTensor& bias,
      std::array<bool, 3> output_mask) {
    return Backend::template bwd<false>("layer_norm_backward", grad_out, input, normalized_shape,
                                        &mean, rstd, weight, bias, output_mask);
  }

  static std::tuple<OptTensor, OptTensor> rms_norm_bwd(const Tensor& grad_out, const Tensor& input,
                                                       at::IntArrayRef normalized_shape,
                                                       const Tensor& rstd, const OptTensor& weight,
                                                       std::array<bool, 2> output_mask) {
    auto [dx, dw, db] = Backend::template bwd<true>(
        "rms_norm_backward", grad_out, input, normalized_shape, nullptr, rstd, weight, std::nullopt,
        std::array<bool, 3>{output_mask[0], output_mask[1], false});
    return {dx, dw};
  }

  static void register_into(torch::Library& m) {
    m.impl("layer_norm_fwd", &layer_norm_fwd);
    m.impl("layer_norm_bwd", &layer_norm_bwd);
    m.impl("rms_norm_fwd", &rms_norm_fwd);
    m.impl("rms_norm_bwd", &rms_norm_bwd);
  }
};

}  // namespace fusedops
