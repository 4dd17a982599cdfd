// Autograd and autocast for layer_norm / rms_norm, the dispatch keys above the backends.
// Autograd (C++, as softmax): the forward redispatches below the Autograd key and saves input,
// parameters and the fp32 statistics; the backward runs the *_bwd op for just the gradients
// autograd needs. Double backward is not implemented and raises rather than return wrong values.
// Autocast: as torch's autocast runs aten::layer_norm / aten::rms_norm on that device
// (common/autocast.h): in fp32 where it has a policy for them, else untouched.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <tuple>

#include "autograd/forward_ops.h"
#include "common/autocast.h"
#include "common/autograd.h"

namespace fusedops {

using at::IntArrayRef;
using at::Tensor;
using OptTensor = std::optional<Tensor>;

std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd_op(const Tensor& input,
                                                     IntArrayRef normalized_shape,
                                                     const OptTensor& weight, const OptTensor& bias,
                                                     double eps) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fusedops::layer_norm_fwd", "")
          .typed<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, IntArrayRef, const OptTensor&,
                                                    const OptTensor&, double)>();
  return op.call(input, normalized_shape, weight, bias, eps);
}

std::tuple<Tensor, Tensor> rms_norm_fwd_op(const Tensor& input, IntArrayRef normalized_shape,
                                           const OptTensor& weight, std::optional<double> eps) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fusedops::rms_norm_fwd", "")
                       .typed<std::tuple<Tensor, Tensor>(
                           const Tensor&, IntArrayRef, const OptTensor&, std::optional<double>)>();
  return op.call(input, normalized_shape, weight, eps);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::tuple<OptTensor, OptTensor, OptTensor> layer_norm_bwd_op(
    const Tensor& grad_out, const Tensor& input, IntArrayRef normalized_shape, const Tensor& mean,
    const Tensor& rstd, const OptTensor& weight, const OptTensor& bias,
    std::array<bool, 3> output_mask) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fusedops::layer_norm_bwd", "")
                       .typed<std::tuple<OptTensor, OptTensor, OptTensor>(
                           const Tensor&, const Tensor&, IntArrayRef, const Tensor&, const Tensor&,
                           const OptTensor&, const OptTensor&, std::array<bool, 3>)>();
  return op.call(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask);
}

std::tuple<OptTensor, OptTensor> rms_norm_bwd_op(const Tensor& grad_out, const Tensor& input,
                                                 IntArrayRef normalized_shape, const Tensor& rstd,
                                                 const OptTensor& weight,
                                                 std::array<bool, 2> output_mask) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fusedops::rms_norm_bwd", "")
                       .typed<std::tuple<OptTensor, OptTensor>(
                           const Tensor&, const Tensor&, IntArrayRef, const Tensor&,
                           const OptTensor&, std::array<bool, 2>)>();
  return op.call(grad_out, input, normalized_shape, rstd, weight, output_mask);
}

OptTensor opt(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

// A backward run with create_graph=True whose result could be differentiated again.
void check_no_double_backward(const char* op, const variable_list& tensors) {
  if (!at::GradMode::is_enabled()) return;
  for (const Tensor& t : tensors) {
    TORCH_CHECK(!t.defined() || !t.requires_grad(), "fusedops.", op,
                ": double backward is not supported (backward was called with "
                "create_graph=True and an input that requires grad)");
  }
}

// Autograd's edges are the tensor arguments that were given: input, then weight and bias if
// not None. needs[i] says whether the gradient of forward argument tensor i is wanted.
template <size_t N>
std::array<bool, N> needs_grads(AutogradContext* ctx, const std::array<bool, N>& given) {
  std::array<bool, N> needs{};
  size_t edge = 0;
  for (size_t i = 0; i < N; ++i) {
    if (given[i]) needs[i] = ctx->needs_input_grad(edge++);
  }
  return needs;
}

// The statistics leave the forward through `stats`, not as outputs of the Function: compiled
// autograd refuses a C++ Function with outputs marked non-differentiable (CppNode asserts there
// are none), and every output costs a wrapping per call.
class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& input, IntArrayRef normalized_shape,
                        const OptTensor& weight, const OptTensor& bias, double eps,
                        std::tuple<Tensor, Tensor>* stats) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, mean, rstd] = layer_norm_fwd_op(input, normalized_shape, weight, bias, eps);
    ctx->save_for_backward({input, weight.value_or(Tensor()), bias.value_or(Tensor()), mean, rstd});
    ctx->saved_data["normalized_shape"] = normalized_shape.vec();
    ctx->set_materialize_grads(false);  // an undefined gradient needs no zero-filled one
    *stats = {mean, rstd};
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(6);  // out took no part in the loss
    const variable_list saved = ctx->get_saved_variables();
    const Tensor &input = saved[0], &weight = saved[1], &bias = saved[2];
    check_no_double_backward("layer_norm", {grads[0], input, weight, bias});
    const auto needs = needs_grads<3>(ctx, {true, weight.defined(), bias.defined()});
    auto [dx, dw, db] =
        layer_norm_bwd_op(grads[0], input, ctx->saved_data["normalized_shape"].toIntVector(),
                          saved[3], saved[4], opt(weight), opt(bias), needs);
    return {dx.value_or(Tensor()), Tensor(), dw.value_or(Tensor()),
            db.value_or(Tensor()), Tensor(), Tensor()};
  }
};

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& input, IntArrayRef normalized_shape,
                        const OptTensor& weight, std::optional<double> eps, Tensor* rstd_out) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, rstd] = rms_norm_fwd_op(input, normalized_shape, weight, eps);
    ctx->save_for_backward({input, weight.value_or(Tensor()), rstd});
    ctx->saved_data["normalized_shape"] = normalized_shape.vec();
    ctx->set_materialize_grads(false);
    *rstd_out = rstd;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(5);
    const variable_list saved = ctx->get_saved_variables();
    const Tensor &input = saved[0], &weight = saved[1];
    check_no_double_backward("rms_norm", {grads[0], input, weight});
    const auto needs = needs_grads<2>(ctx, {true, weight.defined()});
    auto [dx, dw] =
        rms_norm_bwd_op(grads[0], input, ctx->saved_data["normalized_shape"].toIntVector(),
                        saved[2], opt(weight), needs);
    return {dx.value_or(Tensor()), Tensor(), dw.value_or(Tensor()), Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd_autograd(const Tensor& input,
                                                           IntArrayRef normalized_shape,
                                                           const OptTensor& weight,
                                                           const OptTensor& bias, double eps) {
  if (autograd_records_nothing(input, weight, bias)) {
    const at::AutoDispatchBelowADInplaceOrView guard;
    return layer_norm_fwd_op(input, normalized_shape, weight, bias, eps);
  }
  std::tuple<Tensor, Tensor> stats;
  Tensor out = LayerNormFunction::apply(input, normalized_shape, weight, bias, eps, &stats);
  return {std::move(out), std::get<0>(stats), std::get<1>(stats)};
}

std::tuple<Tensor, Tensor> rms_norm_fwd_autograd(const Tensor& input, IntArrayRef normalized_shape,
                                                 const OptTensor& weight,
                                                 std::optional<double> eps) {
  if (autograd_records_nothing(input, weight)) {
    const at::AutoDispatchBelowADInplaceOrView guard;
    return rms_norm_fwd_op(input, normalized_shape, weight, eps);
  }
  Tensor rstd;
  Tensor out = RmsNormFunction::apply(input, normalized_shape, weight, eps, &rstd);
  return {std::move(out), std::move(rstd)};
}

std::tuple<OptTensor, OptTensor, OptTensor> layer_norm_bwd_autograd(
    const Tensor& grad_out, const Tensor& input, IntArrayRef normalized_shape, const Tensor& mean,
    const Tensor& rstd, const OptTensor& weight, const OptTensor& bias,
    std::array<bool, 3> output_mask) {
  return backward_below_autograd("layer_norm_backward", layer_norm_bwd_op, grad_out, input,
                                 normalized_shape, mean, rstd, weight, bias, output_mask);
}

std::tuple<OptTensor, OptTensor> rms_norm_bwd_autograd(const Tensor& grad_out, const Tensor& input,
                                                       IntArrayRef normalized_shape,
                                                       const Tensor& rstd, const OptTensor& weight,
                                                       std::array<bool, 2> output_mask) {
  return backward_below_autograd("rms_norm_backward", rms_norm_bwd_op, grad_out, input,
                                 normalized_shape, rstd, weight, output_mask);
}

// torch's "fp32" autocast policy where it has one for the op: every floating argument on `D` but
// fp64 runs as fp32, so the output is fp32 too.
template <c10::DeviceType D>
std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd_autocast(const Tensor& input,
                                                           IntArrayRef normalized_shape,
                                                           const OptTensor& weight,
                                                           const OptTensor& bias, double eps) {
  static const bool fp32 = torch_autocasts("aten::layer_norm", "", D);
  const AutocastExclude<D> exclude;
  if (!fp32) return layer_norm_fwd_op(input, normalized_shape, weight, bias, eps);
  using at::autocast::cached_cast;
  return layer_norm_fwd_op(cached_cast(at::kFloat, input, D), normalized_shape,
                           cached_cast(at::kFloat, weight, D), cached_cast(at::kFloat, bias, D),
                           eps);
}

template <c10::DeviceType D>
std::tuple<Tensor, Tensor> rms_norm_fwd_autocast(const Tensor& input, IntArrayRef normalized_shape,
                                                 const OptTensor& weight,
                                                 std::optional<double> eps) {
  static const bool fp32 = torch_autocasts("aten::rms_norm", "", D);
  const AutocastExclude<D> exclude;
  if (!fp32) return rms_norm_fwd_op(input, normalized_shape, weight, eps);
  using at::autocast::cached_cast;
  return rms_norm_fwd_op(cached_cast(at::kFloat, input, D), normalized_shape,
                         cached_cast(at::kFloat, weight, D), eps);
}

template <c10::DeviceType D>
void register_autocast(torch::Library& m) {
  m.impl("layer_norm_fwd", &layer_norm_fwd_autocast<D>);
  m.impl("rms_norm_fwd", &rms_norm_fwd_autocast<D>);
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, Autograd, m) {
  m.impl("layer_norm_fwd", &layer_norm_fwd_autograd);
  m.impl("rms_norm_fwd", &rms_norm_fwd_autograd);
  m.impl("layer_norm_bwd", &layer_norm_bwd_autograd);
  m.impl("rms_norm_bwd", &rms_norm_bwd_autograd);
}

FUSEDOPS_AUTOCAST_IMPL(register_autocast)

}  // namespace fusedops
