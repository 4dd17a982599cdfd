// fully_fused_mlp's checks and composed path (see fully_fused_mlp.h), registered as the
// CompositeExplicitAutograd kernel: CPU, MPS and every device without its own kernel run it.
#include "fully_fused_mlp.h"

#include <ATen/ops/addmm.h>
#include <ATen/ops/clamp_min.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/threshold_backward.h>
#include <torch/library.h>

#include <string>

#include "common/checks.h"

namespace fusedops {
namespace {

MlpActivation parse_activation(const char* op, const char* arg, c10::string_view name) {
  if (name == "none") return MlpActivation::kNone;
  if (name == "relu") return MlpActivation::kRelu;
  if (name == "gelu") return MlpActivation::kGelu;
  if (name == "gelu_tanh") return MlpActivation::kGeluTanh;
  TORCH_CHECK_VALUE(false, "fusedops.", op, ": ", arg,
                    " must be 'gelu', 'gelu_tanh', 'relu' or 'none', got '", name, "'");
}

void check_matrix(const char* op, const char* arg, size_t l, const at::Tensor& t,
                  const at::Tensor& x, at::IntArrayRef shape) {
  const std::string name = std::string(arg) + "[" + std::to_string(l) + "]";
  TORCH_CHECK(t.device() == x.device(), "fusedops.", op, ": ", name, " is on ", t.device(),
              " but x is on ", x.device());
  TORCH_CHECK_TYPE(t.scalar_type() == x.scalar_type(), "fusedops.", op, ": ", name, " has dtype ",
                   t.scalar_type(), " but x has dtype ", x.scalar_type());
  TORCH_CHECK_VALUE(t.sizes() == shape, "fusedops.", op, ": ", name, " must have shape ",
                    to_text(shape), ", got ", to_text(t.sizes()));
}

// act applied out of place (ATen's own kernels, so the composed path is eager's arithmetic).
at::Tensor activate(MlpActivation act, const at::Tensor& pre) {
  switch (act) {
    case MlpActivation::kRelu:
      return at::clamp_min(pre, 0);
    case MlpActivation::kGelu:
      return at::gelu(pre, "none");
    case MlpActivation::kGeluTanh:
      return at::gelu(pre, "tanh");
    default:
      return pre;
  }
}

// grad * act'(pre); ReLU's derivative is read from its output (same sign as pre).
at::Tensor activate_backward(MlpActivation act, const at::Tensor& grad, const at::Tensor& pre,
                             const at::Tensor& output) {
  switch (act) {
    case MlpActivation::kRelu:
      return at::threshold_backward(grad, output, 0);
    case MlpActivation::kGelu:
      return at::gelu_backward(grad, pre, "none");
    case MlpActivation::kGeluTanh:
      return at::gelu_backward(grad, pre, "tanh");
    default:
      return grad;
  }
}

at::Tensor linear(const at::Tensor& h, const at::Tensor& w, at::TensorList biases, size_t l) {
  return biases.empty() ? at::mm(h, w.t()) : at::addmm(biases[l], h, w.t());
}

}  // namespace

FfmProblem check_ffm(const char* op, const at::Tensor& x, at::TensorList weights,
                     at::TensorList biases, c10::string_view activation,
                     c10::string_view output_activation) {
  const MlpActivation act = parse_activation(op, "activation", activation);
  const MlpActivation out_act = parse_activation(op, "output_activation", output_activation);
  check_floating(op, "x", x);
  TORCH_CHECK_VALUE(x.dim() >= 1, "fusedops.", op,
                    ": x must have at least one dimension (features last), got a 0-dim tensor");
  TORCH_CHECK_VALUE(weights.size() >= 2, "fusedops.", op,
                    ": weights must hold at least 2 matrices (one hidden layer), got ",
                    to_text(int64_t(weights.size())));
  TORCH_CHECK_VALUE(weights[0].dim() == 2, "fusedops.", op, ": weights[0] must be 2-D, got shape ",
                    to_text(weights[0].sizes()));
  const int64_t in = x.size(-1), hidden = weights[0].size(0), out = weights.back().size(0);
  for (size_t l = 0; l < weights.size(); ++l) {
    const int64_t n = l + 1 == weights.size() ? out : hidden;
    check_matrix(op, "weights", l, weights[l], x, {n, l == 0 ? in : hidden});
  }
  TORCH_CHECK_VALUE(biases.empty() || biases.size() == weights.size(), "fusedops.", op,
                    ": biases must be empty or hold one per weight (",
                    to_text(int64_t(weights.size())), "), got ", to_text(int64_t(biases.size())));
  for (size_t l = 0; l < biases.size(); ++l) {
    check_matrix(op, "biases", l, biases[l], x, {weights[l].size(0)});
  }
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  return {rows, in, hidden, out, int64_t(weights.size()) - 1, act, out_act, !biases.empty()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ffm_empty_saves(const FfmProblem& p,
                                                               const at::Tensor& x, bool save) {
  const auto opts = x.options();
  // Each absent save its own empty tensor: outputs must not alias.
  const auto save_if = [&](bool keep, at::IntArrayRef shape) {
    return at::empty(keep && save ? shape : at::IntArrayRef{0}, opts);
  };
  const std::vector<int64_t> hidden = {p.hidden_layers, p.rows, p.hidden};
  return {save_if(!is_gelu(p.act), hidden), save_if(is_gelu(p.act), hidden),
          save_if(p.out_act != MlpActivation::kNone, {p.rows, p.out})};
}

FfmFwdOutputs ffm_fwd_composed(const FfmProblem& p, const at::Tensor& x, at::TensorList weights,
                               at::TensorList biases, bool save_for_backward) {
  auto [hidden_act, hidden_pre, out_pre] = ffm_empty_saves(p, x, save_for_backward);
  at::Tensor h = x.reshape({p.rows, p.in});
  for (int64_t l = 0; l < p.hidden_layers; ++l) {
    const at::Tensor pre = linear(h, weights[l], biases, l);
    h = activate(p.act, pre);
    if (save_for_backward && is_gelu(p.act)) {
      hidden_pre[l].copy_(pre);
    } else if (save_for_backward) {
      hidden_act[l].copy_(h);
    }
  }
  const at::Tensor pre = linear(h, weights.back(), biases, p.hidden_layers);
  if (out_pre.numel() > 0) out_pre.copy_(pre);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = p.out;
  return {activate(p.out_act, pre).reshape(shape), hidden_act, hidden_pre, out_pre};
}

at::Tensor ffm_hidden_outputs(const FfmProblem& p, const at::Tensor& hidden_act,
                              const at::Tensor& hidden_pre) {
  return is_gelu(p.act) ? activate(p.act, hidden_pre) : hidden_act;
}

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> ffm_param_grads(
    const FfmProblem& p, const at::Tensor& x, const at::Tensor& hidden_out,
    const at::Tensor& grad_hidden_pre, const at::Tensor& grad_out_pre) {
  std::vector<at::Tensor> grad_w, grad_b;
  const at::Tensor x2 = x.reshape({p.rows, p.in});
  for (int64_t l = 0; l < p.hidden_layers; ++l) {
    grad_w.push_back(at::mm(grad_hidden_pre[l].t(), l == 0 ? x2 : hidden_out[l - 1]));
  }
  grad_w.push_back(at::mm(grad_out_pre.t(), hidden_out[p.hidden_layers - 1]));
  if (p.has_bias) {
    // One reduction for every hidden layer; outputs of an op must not alias: small copies.
    for (const at::Tensor& g : at::sum(grad_hidden_pre, 1).unbind(0)) grad_b.push_back(g.clone());
    grad_b.push_back(at::sum(grad_out_pre, 0));
  }
  return {grad_w, grad_b};
}

FfmProblem check_ffm_bwd(const at::Tensor& grad_out, const at::Tensor& x, at::TensorList weights,
                         const at::Tensor& hidden_act, const at::Tensor& hidden_pre,
                         const at::Tensor& out_pre, c10::string_view activation,
                         c10::string_view output_activation, bool has_bias) {
  const char* op = "fully_fused_mlp_backward";
  FfmProblem p = check_ffm(op, x, weights, {}, activation, output_activation);
  p.has_bias = has_bias;
  const auto check = [&](const char* arg, const at::Tensor& t, at::IntArrayRef shape) {
    TORCH_CHECK_VALUE(
        t.sizes() == shape, "fusedops.", op, ": ", arg, " must have shape ", to_text(shape),
        " (as the forward saved it with save_for_backward=True), got ", to_text(t.sizes()));
  };
  // The save every activation has: its derivative's input.
  const at::Tensor& saved = is_gelu(p.act) ? hidden_pre : hidden_act;
  TORCH_CHECK(grad_out.device() == saved.device(), "fusedops.", op, ": grad_out is on ",
              grad_out.device(), " but the saved tensors are on ", saved.device());
  TORCH_CHECK_TYPE(grad_out.scalar_type() == saved.scalar_type(), "fusedops.", op,
                   ": grad_out has dtype ", grad_out.scalar_type(), " but the output has dtype ",
                   saved.scalar_type());
  TORCH_CHECK_VALUE(grad_out.numel() == p.rows * p.out && grad_out.size(-1) == p.out, "fusedops.",
                    op, ": grad_out has shape ", to_text(grad_out.sizes()), " but the output has ",
                    to_text(p.rows), " rows of ", to_text(p.out), " features");
  const std::vector<int64_t> hidden = {p.hidden_layers, p.rows, p.hidden};
  if (is_gelu(p.act)) {
    check("hidden_pre", hidden_pre, hidden);
  } else {
    check("hidden_act", hidden_act, hidden);
  }
  if (p.out_act != MlpActivation::kNone) check("out_pre", out_pre, {p.rows, p.out});
  return p;
}

FfmBwdOutputs ffm_bwd_composed(const FfmProblem& p, const at::Tensor& grad_out, const at::Tensor& x,
                               at::TensorList weights, const at::Tensor& hidden_act,
                               const at::Tensor& hidden_pre, const at::Tensor& out_pre) {
  const at::Tensor out_act = p.out_act == MlpActivation::kRelu
                                 ? activate(p.out_act, out_pre)  // its sign, for ReLU's derivative
                                 : at::Tensor();
  const at::Tensor grad_out_pre =
      activate_backward(p.out_act, grad_out.reshape({p.rows, p.out}), out_pre, out_act);
  at::Tensor grad_hidden_pre = at::empty({p.hidden_layers, p.rows, p.hidden}, x.options());
  at::Tensor grad = grad_out_pre;  // of the pre-activation above the current layer
  for (int64_t l = p.hidden_layers - 1; l >= 0; --l) {
    const at::Tensor grad_act = at::mm(grad, weights[l + 1]);
    grad_hidden_pre[l].copy_(is_gelu(p.act)
                                 ? activate_backward(p.act, grad_act, hidden_pre[l], at::Tensor())
                                 : activate_backward(p.act, grad_act, at::Tensor(), hidden_act[l]));
    grad = grad_hidden_pre[l];
  }
  auto [grad_w, grad_b] = ffm_param_grads(p, x, ffm_hidden_outputs(p, hidden_act, hidden_pre),
                                          grad_hidden_pre, grad_out_pre);
  return {at::mm(grad, weights[0]).reshape(x.sizes()), grad_w, grad_b};
}

namespace {

FfmFwdOutputs fully_fused_mlp_fwd(const at::Tensor& x, at::TensorList weights,
                                  at::TensorList biases, c10::string_view activation,
                                  c10::string_view output_activation, bool save_for_backward) {
  const FfmProblem p =
      check_ffm("fully_fused_mlp", x, weights, biases, activation, output_activation);
  return ffm_fwd_composed(p, x, weights, biases, save_for_backward);
}

FfmBwdOutputs fully_fused_mlp_bwd(const at::Tensor& grad_out, const at::Tensor& x,
                                  at::TensorList weights, const at::Tensor& hidden_act,
                                  const at::Tensor& hidden_pre, const at::Tensor& out_pre,
                                  c10::string_view activation, c10::string_view output_activation,
                                  bool has_bias) {
  const FfmProblem p = check_ffm_bwd(grad_out, x, weights, hidden_act, hidden_pre, out_pre,
                                     activation, output_activation, has_bias);
  return ffm_bwd_composed(p, grad_out, x, weights, hidden_act, hidden_pre, out_pre);
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, CompositeExplicitAutograd, m) {
  m.impl("fully_fused_mlp_fwd", &fully_fused_mlp_fwd);
  m.impl("fully_fused_mlp_bwd", &fully_fused_mlp_bwd);
}

}  // namespace fusedops
