// CPU fused_mlp: ATen's GEMMs (addmm / mm, as nn.Linear uses) around the vectorized bias_gelu
// row kernels, so the GELU and its backward (with the fc1 bias gradient) take one pass each.
#include <torch/library.h>

#include "common/bias_gelu_host.h"
#include "common/mlp_host.h"

namespace fusedops {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> mlp_fwd(const at::Tensor& x, const at::Tensor& w1,
                                                       const c10::optional<at::Tensor>& b1,
                                                       const at::Tensor& w2,
                                                       const c10::optional<at::Tensor>& b2,
                                                       c10::string_view approximate, bool save_pre,
                                                       bool save_act) {
  const MlpProblem p = check_mlp("fused_mlp", x, w1, b1, w2, b2, approximate);
  auto [out, pre, act] =
      mlp_fwd_composed(p, x.reshape({p.rows, p.in}), w1, b1.value_or(at::Tensor()), w2,
                       b2.value_or(at::Tensor()), bias_gelu_rows_fwd_cpu);
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
                          pre2, act2, output_mask, bias_gelu_rows_fwd_cpu, bias_gelu_rows_bwd_cpu));
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, CPU, m) {
  m.impl("mlp_fwd", &mlp_fwd);
  m.impl("mlp_bwd", &mlp_bwd);
}

}  // namespace fusedops
