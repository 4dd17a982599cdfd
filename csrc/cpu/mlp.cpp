// CPU fused_mlp: the same ATen ops as the eager block (addmm / mm as nn.Linear, gelu and
// gelu_backward), so it is never slower than eager. ATen's GELU kernels are used rather than
// fusedops' bias_gelu: torch builds them per ISA (AVX-512 here), and with the bias already in the
// GEMM there is nothing left to fuse; they were measured ~3x faster on bf16 than the extension's.
#include "mlp.h"

#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <torch/library.h>

#include "bias_gelu.h"

namespace fusedops {
namespace {

at::Tensor gelu_rows(const at::Tensor& pre, const at::Tensor& /*no bias*/, GeluApprox approx) {
  return at::gelu(pre, gelu_approx_name(approx));
}

std::tuple<at::Tensor, at::Tensor> gelu_rows_bwd(const at::Tensor& dact, const at::Tensor& pre,
                                                 const at::Tensor& /*no bias*/, GeluApprox approx,
                                                 bool want_db1) {
  at::Tensor dpre = at::gelu_backward(dact, pre, gelu_approx_name(approx));
  at::Tensor db1 = want_db1 ? dpre.sum(0) : at::Tensor();
  return {dpre, db1};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> mlp_fwd(const at::Tensor& x, const at::Tensor& w1,
                                                       const c10::optional<at::Tensor>& b1,
                                                       const at::Tensor& w2,
                                                       const c10::optional<at::Tensor>& b2,
                                                       c10::string_view approximate, bool save_pre,
                                                       bool save_act) {
  const MlpProblem p = check_mlp("fused_mlp", x, w1, b1, w2, b2, approximate);
  auto [out, pre, act] =
      mlp_fwd_composed(p, x.reshape({p.rows, p.in}), w1, b1.value_or(at::Tensor()), w2,
                       b2.value_or(at::Tensor()), gelu_rows);
  return mlp_fwd_outputs(p, x, out, pre, act, save_pre, save_act);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mlp_bwd(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
    const at::Tensor& pre, const at::Tensor& act, c10::string_view approximate,
    std::array<bool, 5> output_mask) {
  const MlpProblem p =
      check_mlp_bwd("fused_mlp_backward", grad_out, x, w1, w2, pre, act, approximate);
  const at::Tensor pre2 = pre.reshape({p.rows, p.hidden}).contiguous();
  const at::Tensor act2 =
      act.sizes() == pre.sizes() ? act.reshape({p.rows, p.hidden}) : at::Tensor();
  return mlp_bwd_outputs(
      x, mlp_bwd_composed(p, grad_out.reshape({p.rows, p.out}), x.reshape({p.rows, p.in}), w1, w2,
                          pre2, act2, output_mask, gelu_rows, gelu_rows_bwd));
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, CPU, m) {
  m.impl("mlp_fwd", &mlp_fwd);
  m.impl("mlp_bwd", &mlp_bwd);
}

}  // namespace fusedops
