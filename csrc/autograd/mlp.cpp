// Autograd for bias_gelu and fused_mlp, registered in C++ (one dispatcher trip, no Python):
// the forward redispatches below the Autograd key to the device kernel and saves what the
// backward op needs. fused_mlp saves x, the weights, the pre-activation and, unless the caller
// asked to recompute it, the GELU output. Double backward is not supported.
// Autocast: fused_mlp runs as torch's autocast runs aten::linear (in the autocast dtype);
// bias_gelu promotes input and bias to one dtype, as gelu(input + bias) does.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>
#include <string>
#include <tuple>

#include "autograd/forward_ops.h"
#include "common/autocast.h"
#include "common/autograd.h"

namespace fusedops {

at::Tensor bias_gelu_fwd_op(const at::Tensor& input, const at::Tensor& bias,
                            c10::string_view approximate) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fusedops::bias_gelu_fwd", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op.call(input, bias, approximate);
}

MlpFwdOutputs mlp_fwd_op(const at::Tensor& x, const at::Tensor& w1,
                         const std::optional<at::Tensor>& b1, const at::Tensor& w2,
                         const std::optional<at::Tensor>& b2, c10::string_view approximate,
                         bool save_pre, bool save_act) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fusedops::mlp_fwd", "")
          .typed<MlpFwdOutputs(const at::Tensor&, const at::Tensor&,
                               const std::optional<at::Tensor>&, const at::Tensor&,
                               const std::optional<at::Tensor>&, c10::string_view, bool, bool)>();
  return op.call(x, w1, b1, w2, b2, approximate, save_pre, save_act);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = c10::optional<at::Tensor>;

std::tuple<at::Tensor, at::Tensor> bias_gelu_bwd_op(const at::Tensor& grad_output,
                                                    const at::Tensor& input, const at::Tensor& bias,
                                                    c10::string_view approximate) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fusedops::bias_gelu_bwd", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&, c10::string_view)>();
  return op.call(grad_output, input, bias, approximate);
}

using MlpBwdOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

MlpBwdOutputs mlp_bwd_op(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& w1,
                         const at::Tensor& w2, const at::Tensor& pre, const at::Tensor& act,
                         c10::string_view approximate, std::array<bool, 5> output_mask) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fusedops::mlp_bwd", "")
                       .typed<MlpBwdOutputs(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                            const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                            c10::string_view, std::array<bool, 5>)>();
  return op.call(grad_out, x, w1, w2, pre, act, approximate, output_mask);
}

class BiasGeluFunction : public torch::autograd::Function<BiasGeluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& bias,
                            const std::string& approximate) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({input, bias});
    ctx->saved_data["approximate"] = approximate;
    return bias_gelu_fwd_op(input, bias, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dinput, dbias] = bias_gelu_bwd_op(grads[0], saved[0], saved[1],
                                            ctx->saved_data["approximate"].toStringRef());
    return {dinput, dbias, at::Tensor()};
  }
};

class MlpFunction : public torch::autograd::Function<MlpFunction> {
 public:
  // b1 and b2 are optional: absent ones have no autograd edge (see backward). pre and act leave
  // through `saved`, not as outputs of the Function: outputs marked non-differentiable make
  // compiled autograd fail (CppNode asserts there are none).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w1,
                            const OptTensor& b1, const at::Tensor& w2, const OptTensor& b2,
                            const std::string& approximate, bool save_pre, bool save_act,
                            std::tuple<at::Tensor, at::Tensor>* saved) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, pre, act] = mlp_fwd_op(x, w1, b1, w2, b2, approximate, save_pre, save_act);
    ctx->set_materialize_grads(false);  // an undefined gradient needs no zero-filled one
    ctx->save_for_backward({x, w1, w2, pre, act});
    ctx->saved_data["approximate"] = approximate;
    ctx->saved_data["save_pre"] = save_pre;
    ctx->saved_data["has_b1"] = b1.has_value() && b1->defined();
    ctx->saved_data["has_b2"] = b2.has_value() && b2->defined();
    *saved = {pre, act};
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(
        ctx->saved_data["save_pre"].toBool(),
        "fusedops.fused_mlp: backward needs the pre-activation, but the forward ran with "
        "save_pre=False (call fusedops.fused_mlp, which sets it when a gradient is needed)");
    const auto saved = ctx->get_saved_variables();
    const bool has_b1 = ctx->saved_data["has_b1"].toBool();
    const bool has_b2 = ctx->saved_data["has_b2"].toBool();
    // Autograd edges exist only for tensor inputs that are present: x, w1, [b1], w2, [b2].
    const int w2_edge = has_b1 ? 3 : 2;
    const std::array<bool, 5> mask = {
        ctx->needs_input_grad(0), ctx->needs_input_grad(1), has_b1 && ctx->needs_input_grad(2),
        ctx->needs_input_grad(w2_edge), has_b2 && ctx->needs_input_grad(w2_edge + 1)};
    // One entry per forward argument, bias or not: x, w1, b1, w2, b2, approximate, save_*, saved.
    variable_list out(9);
    if (!grads[0].defined() || !(mask[0] || mask[1] || mask[2] || mask[3] || mask[4])) return out;
    auto g = mlp_bwd_op(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4],
                        ctx->saved_data["approximate"].toStringRef(), mask);
    const at::Tensor all[5] = {std::get<0>(g), std::get<1>(g), std::get<2>(g), std::get<3>(g),
                               std::get<4>(g)};
    for (int i = 0; i < 5; ++i) {
      if (mask[i]) out[i] = all[i];
    }
    return out;
  }
};

at::Tensor bias_gelu_fwd_autograd(const at::Tensor& input, const at::Tensor& bias,
                                  c10::string_view approximate) {
  if (autograd_records_nothing(input, bias)) {
    const at::AutoDispatchBelowADInplaceOrView guard;
    return bias_gelu_fwd_op(input, bias, approximate);
  }
  return BiasGeluFunction::apply(input, bias, std::string(approximate));
}

MlpFwdOutputs mlp_fwd_autograd(const at::Tensor& x, const at::Tensor& w1, const OptTensor& b1,
                               const at::Tensor& w2, const OptTensor& b2,
                               c10::string_view approximate, bool save_pre, bool save_act) {
  if (autograd_records_nothing(x, w1, b1, w2, b2)) {
    const at::AutoDispatchBelowADInplaceOrView guard;
    return mlp_fwd_op(x, w1, b1, w2, b2, approximate, save_pre, save_act);
  }
  std::tuple<at::Tensor, at::Tensor> saved;
  at::Tensor out =
      MlpFunction::apply(x, w1, b1, w2, b2, std::string(approximate), save_pre, save_act, &saved);
  return {std::move(out), std::get<0>(saved), std::get<1>(saved)};
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_bwd_autograd(const at::Tensor& grad_output,
                                                          const at::Tensor& input,
                                                          const at::Tensor& bias,
                                                          c10::string_view approximate) {
  return backward_below_autograd("bias_gelu_backward", bias_gelu_bwd_op, grad_output, input, bias,
                                 approximate);
}

MlpBwdOutputs mlp_bwd_autograd(const at::Tensor& grad_out, const at::Tensor& x,
                               const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& pre,
                               const at::Tensor& act, c10::string_view approximate,
                               std::array<bool, 5> output_mask) {
  return backward_below_autograd("fused_mlp_backward", mlp_bwd_op, grad_out, x, w1, w2, pre, act,
                                 approximate, output_mask);
}

// Type promotion as in gelu(input + bias), which autocast leaves alone: a bf16 input with an fp32
// bias gives fp32. (nn.BiasGELU casts its bias to the input's dtype under autocast first: there
// it stands for a Linear's bias, which autocast casts.)
template <c10::DeviceType D>
at::Tensor bias_gelu_fwd_autocast(const at::Tensor& input, const at::Tensor& bias,
                                  c10::string_view approximate) {
  const AutocastExclude<D> exclude;
  if (!input.is_floating_point() || !bias.is_floating_point()) {
    return bias_gelu_fwd_op(input, bias, approximate);  // the op names the bad dtype
  }
  const auto dtype = at::promote_types(input.scalar_type(), bias.scalar_type());
  using at::autocast::cached_cast;
  return bias_gelu_fwd_op(cached_cast(dtype, input, D), cached_cast(dtype, bias, D), approximate);
}

// torch's "lower_precision_fp" policy for aten::linear: every floating argument on `D` but fp64
// runs in the autocast dtype.
template <c10::DeviceType D>
MlpFwdOutputs mlp_fwd_autocast(const at::Tensor& x, const at::Tensor& w1, const OptTensor& b1,
                               const at::Tensor& w2, const OptTensor& b2,
                               c10::string_view approximate, bool save_pre, bool save_act) {
  static const bool low = torch_autocasts("aten::linear", "", D);
  const AutocastExclude<D> exclude;
  if (!low) return mlp_fwd_op(x, w1, b1, w2, b2, approximate, save_pre, save_act);
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(D);
  auto cast = [dtype](const auto& t) { return at::autocast::cached_cast(dtype, t, D); };
  return mlp_fwd_op(cast(x), cast(w1), cast(b1), cast(w2), cast(b2), approximate, save_pre,
                    save_act);
}

template <c10::DeviceType D>
void register_autocast(torch::Library& m) {
  m.impl("bias_gelu_fwd", &bias_gelu_fwd_autocast<D>);
  m.impl("mlp_fwd", &mlp_fwd_autocast<D>);
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, Autograd, m) {
  m.impl("bias_gelu_fwd", &bias_gelu_fwd_autograd);
  m.impl("mlp_fwd", &mlp_fwd_autograd);
  m.impl("bias_gelu_bwd", &bias_gelu_bwd_autograd);
  m.impl("mlp_bwd", &mlp_bwd_autograd);
}

FUSEDOPS_AUTOCAST_IMPL(register_autocast)

}  // namespace fusedops
