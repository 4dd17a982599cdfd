// Autograd for fully_fused_mlp, in C++ like the other ops: the forward redispatches below the
// Autograd key and saves x, the weights and the activations the forward returned for it; the
// backward op returns every gradient (x, weights, biases). Double backward is not supported.
// Autocast: runs as a stack of aten::linear would (in the autocast dtype).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>
#include <string>
#include <tuple>
#include <vector>

#include "common/autocast.h"
#include "common/autograd.h"

namespace fusedops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using FwdOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using BwdOutputs = std::tuple<at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>>;

FwdOutputs fwd_op(const at::Tensor& x, at::TensorList weights, at::TensorList biases,
                  c10::string_view activation, c10::string_view output_activation, bool save) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fusedops::fully_fused_mlp_fwd", "")
                       .typed<FwdOutputs(const at::Tensor&, at::TensorList, at::TensorList,
                                         c10::string_view, c10::string_view, bool)>();
  return op.call(x, weights, biases, activation, output_activation, save);
}

BwdOutputs bwd_op(const at::Tensor& grad_out, const at::Tensor& x, at::TensorList weights,
                  const at::Tensor& hidden_act, const at::Tensor& hidden_pre,
                  const at::Tensor& out_pre, c10::string_view activation,
                  c10::string_view output_activation, bool has_bias) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fusedops::fully_fused_mlp_bwd", "")
                       .typed<BwdOutputs(const at::Tensor&, const at::Tensor&, at::TensorList,
                                         const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         c10::string_view, c10::string_view, bool)>();
  return op.call(grad_out, x, weights, hidden_act, hidden_pre, out_pre, activation,
                 output_activation, has_bias);
}

class FullyFusedMlpFunction : public torch::autograd::Function<FullyFusedMlpFunction> {
 public:
  // The saved activations leave through `acts`, not as outputs of the Function: outputs marked
  // non-differentiable make compiled autograd fail (CppNode asserts there are none).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights,
                            at::TensorList biases, const std::string& activation,
                            const std::string& output_activation, bool save,
                            std::array<at::Tensor, 3>* acts) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, hidden_act, hidden_pre, out_pre] =
        fwd_op(x, weights, biases, activation, output_activation, save);
    ctx->set_materialize_grads(false);
    variable_list saved = {x, hidden_act, hidden_pre, out_pre};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["activation"] = activation;
    ctx->saved_data["output_activation"] = output_activation;
    ctx->saved_data["save"] = save;
    ctx->saved_data["biases"] = int64_t(biases.size());
    *acts = {hidden_act, hidden_pre, out_pre};
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(ctx->saved_data["save"].toBool(),
                "fusedops.fully_fused_mlp: backward needs the saved activations, but the forward "
                "ran with save_for_backward=False (call fusedops.fully_fused_mlp, which sets it "
                "when a gradient is needed)");
    const variable_list saved = ctx->get_saved_variables();
    const std::vector<at::Tensor> weights(saved.begin() + 4, saved.end());
    const int64_t nbias = ctx->saved_data["biases"].toInt();
    // One entry per forward argument: x, each weight, each bias, the four non-tensors.
    variable_list out(1 + weights.size() + nbias + 4);
    if (!grads[0].defined()) return out;
    for (const at::Tensor& t : saved) {
      TORCH_CHECK(!at::GradMode::is_enabled() || !t.defined() || !t.requires_grad(),
                  "fusedops.fully_fused_mlp: double backward is not supported (backward was "
                  "called with create_graph=True)");
    }
    auto [grad_x, grad_w, grad_b] =
        bwd_op(grads[0], saved[0], weights, saved[1], saved[2], saved[3],
               ctx->saved_data["activation"].toStringRef(),
               ctx->saved_data["output_activation"].toStringRef(), nbias > 0);
    size_t i = 0;
    out[i++] = grad_x;
    for (auto& g : grad_w) out[i++] = g;
    for (auto& g : grad_b) out[i++] = g;
    for (size_t e = 0; e + 4 < out.size(); ++e) {
      if (!ctx->needs_input_grad(e)) out[e] = at::Tensor();
    }
    return out;
  }
};

FwdOutputs fwd_autograd(const at::Tensor& x, at::TensorList weights, at::TensorList biases,
                        c10::string_view activation, c10::string_view output_activation,
                        bool save) {
  if (autograd_records_nothing(x, weights, biases)) {
    const at::AutoDispatchBelowADInplaceOrView guard;
    return fwd_op(x, weights, biases, activation, output_activation, save);
  }
  std::array<at::Tensor, 3> acts;
  at::Tensor out = FullyFusedMlpFunction::apply(x, weights, biases, std::string(activation),
                                                std::string(output_activation), save, &acts);
  return {std::move(out), acts[0], acts[1], acts[2]};
}

BwdOutputs bwd_autograd(const at::Tensor& grad_out, const at::Tensor& x, at::TensorList weights,
                        const at::Tensor& hidden_act, const at::Tensor& hidden_pre,
                        const at::Tensor& out_pre, c10::string_view activation,
                        c10::string_view output_activation, bool has_bias) {
  return backward_below_autograd("fully_fused_mlp_backward", bwd_op, grad_out, x, weights,
                                 hidden_act, hidden_pre, out_pre, activation, output_activation,
                                 has_bias);
}

template <c10::DeviceType D>
FwdOutputs fwd_autocast(const at::Tensor& x, at::TensorList weights, at::TensorList biases,
                        c10::string_view activation, c10::string_view output_activation,
                        bool save) {
  static const bool low = torch_autocasts("aten::linear", "", D);
  const AutocastExclude<D> exclude;
  if (!low) return fwd_op(x, weights, biases, activation, output_activation, save);
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(D);
  auto cast = [dtype](at::TensorList ts) {
    std::vector<at::Tensor> out;
    for (const auto& t : ts) out.push_back(at::autocast::cached_cast(dtype, t, D));
    return out;
  };
  return fwd_op(at::autocast::cached_cast(dtype, x, D), cast(weights), cast(biases), activation,
                output_activation, save);
}

template <c10::DeviceType D>
void register_autocast(torch::Library& m) {
  m.impl("fully_fused_mlp_fwd", &fwd_autocast<D>);
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, Autograd, m) {
  m.impl("fully_fused_mlp_fwd", &fwd_autograd);
  m.impl("fully_fused_mlp_bwd", &bwd_autograd);
}

FUSEDOPS_AUTOCAST_IMPL(register_autocast)

}  // namespace fusedops
