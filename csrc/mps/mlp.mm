// MPS fused_mlp: the composed path of mlp.h, GEMMs through ATen's MPS matmul
// (nn.Linear's addmm / mm) and bias + GELU forward and backward through the Metal kernels of
// bias_gelu.mm.
#include <torch/library.h>

#include "bias_gelu.h"
#include "mlp.h"
#include "mps/metal_host.h"

namespace fusedops {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> mlp_fwd(const at::Tensor& x, const at::Tensor& w1,
                                                       const c10::optional<at::Tensor>& b1,
                                                       const at::Tensor& w2,
                                                       const c10::optional<at::Tensor>& b2,
                                                       c10::string_view approximate, bool save_pre,
                                                       bool save_act) {
  const MlpProblem p = check_mlp("fused_mlp", x, w1, b1, w2, b2, approximate);
  mps::metal_type("fused_mlp", x);  // before any GEMM: MPS has no float64
  auto [out, pre, act] =
      mlp_fwd_composed(p, x.reshape({p.rows, p.in}), w1, b1.value_or(at::Tensor()), w2,
                       b2.value_or(at::Tensor()), bias_gelu_rows_fwd_mps);
  return mlp_fwd_outputs(p, x, out, pre, act, save_pre, save_act);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mlp_bwd(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
    const at::Tensor& pre, const at::Tensor& act, c10::string_view approximate,
    std::array<bool, 5> output_mask) {
  const MlpProblem p =
      check_mlp_bwd("fused_mlp_backward", grad_out, x, w1, w2, pre, act, approximate);
  mps::metal_type("fused_mlp_backward", x);
  const at::Tensor pre2 = pre.reshape({p.rows, p.hidden}).contiguous();
  const at::Tensor act2 =
      act.sizes() == pre.sizes() ? act.reshape({p.rows, p.hidden}) : at::Tensor();
  return mlp_bwd_outputs(
      x, mlp_bwd_composed(p, grad_out.reshape({p.rows, p.out}), x.reshape({p.rows, p.in}), w1, w2,
                          pre2, act2, output_mask, bias_gelu_rows_fwd_mps, bias_gelu_rows_bwd_mps));
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, MPS, m) {
  m.impl("mlp_fwd", &mlp_fwd);
  m.impl("mlp_bwd", &mlp_bwd);
}

}  // namespace fusedops
