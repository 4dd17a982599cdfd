// Host-side pieces shared by the backends' bias_gelu and fused_mlp: argument checks, the
// rows x cols view, and the CUDA and MPS row kernels that fused_mlp composes with its GEMMs.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <tuple>

#include "common/checks.h"
#include "common/math.h"

namespace fusedops {

inline GeluApprox parse_gelu_approx(const char* op, c10::string_view approximate) {
  TORCH_CHECK_VALUE(approximate == "none" || approximate == "tanh", "fusedops.", op,
                    ": approximate must be 'none' or 'tanh', got '", approximate, "'");
  return approximate == "tanh" ? GeluApprox::kTanh : GeluApprox::kNone;
}

inline const char* gelu_approx_name(GeluApprox approx) {
  return approx == GeluApprox::kTanh ? "tanh" : "none";
}

struct BiasGeluProblem {
  int64_t rows;  // product of all sizes but the last
  int64_t cols;  // input.size(-1) == bias.size(0)
  GeluApprox approx;
};

inline BiasGeluProblem check_bias_gelu(const char* op, const at::Tensor& input,
                                       const at::Tensor& bias, c10::string_view approximate) {
  const GeluApprox approx = parse_gelu_approx(op, approximate);
  check_floating(op, "input", input);
  TORCH_CHECK_VALUE(input.dim() >= 1, "fusedops.", op,
                    ": input must have at least one dimension (features last), got a 0-dim tensor");
  TORCH_CHECK(bias.device() == input.device(), "fusedops.", op, ": bias is on ", bias.device(),
              " but input is on ", input.device());
  TORCH_CHECK_TYPE(bias.scalar_type() == input.scalar_type(), "fusedops.", op, ": bias has dtype ",
                   bias.scalar_type(), " but input has dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(bias.dim() == 1 && bias.size(0) == input.size(-1), "fusedops.", op,
                    ": bias must have shape [", to_text(input.size(-1)),
                    "] (the size of input's last dimension), got ", to_text(bias.sizes()));
  const int64_t cols = input.size(-1);
  return {cols == 0 ? 0 : input.numel() / cols, cols, approx};
}

#ifdef FUSEDOPS_WITH_CUDA
// CUDA row kernels over contiguous [rows, cols] tensors, bias [cols] or undefined (no bias), for
// fused_mlp's fallback and exact-GELU paths. The backward's dbias (undefined unless want_dbias)
// is d/dbias of a bias added to input, so a caller whose input already holds its bias (the MLP's
// pre-activation) still gets that bias' gradient. overwrite_input / overwrite_grad_output: the
// kernel writes its output into that argument's memory (a caller's temporary, dead after the
// call) and returns it. The backward's output, where defined ([rows, cols], input's dtype),
// receives the forward's output gelu(input + bias) from the same pass.
at::Tensor bias_gelu_rows_fwd_cuda(const at::Tensor& input, const at::Tensor& bias,
                                   GeluApprox approx, bool overwrite_input = false);
std::tuple<at::Tensor, at::Tensor> bias_gelu_rows_bwd_cuda(const at::Tensor& grad_output,
                                                           const at::Tensor& input,
                                                           const at::Tensor& bias,
                                                           GeluApprox approx, bool want_dbias,
                                                           bool overwrite_grad_output = false,
                                                           at::Tensor output = at::Tensor());
// The column sums of a contiguous [rows, cols] tensor, [cols] in its dtype (fp32 sums, a fixed
// order): a bias gradient where no kernel above makes it.
at::Tensor column_sum_rows_cuda(const at::Tensor& input);
#endif

#ifdef FUSEDOPS_WITH_MPS
// The same row kernels on MPS (metal/kernels/bias_gelu.metal), same contract.
at::Tensor bias_gelu_rows_fwd_mps(const at::Tensor& input, const at::Tensor& bias,
                                  GeluApprox approx);
std::tuple<at::Tensor, at::Tensor> bias_gelu_rows_bwd_mps(const at::Tensor& grad_output,
                                                          const at::Tensor& input,
                                                          const at::Tensor& bias, GeluApprox approx,
                                                          bool want_dbias);
#endif

}  // namespace fusedops
