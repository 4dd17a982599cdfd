// Autograd for softmax / log_softmax, registered in C++ so that a call costs one dispatcher
// trip and no Python (torchvision's pattern): the forward redispatches below the Autograd key
// to the device kernel and saves what the backward needs. Autocast: as torch's autocast runs
// aten::softmax / aten::log_softmax on that device (common/autocast.h).
#include <ATen/TensorOperators.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "autograd/forward_ops.h"
#include "common/autocast.h"
#include "common/autograd.h"

namespace fusedops {

at::Tensor softmax_fwd_op(const at::Tensor& input, int64_t dim, bool log) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fusedops::softmax_fwd", "")
                       .typed<at::Tensor(const at::Tensor&, int64_t, bool)>();
  return op.call(input, dim, log);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor softmax_bwd_op(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                          bool log) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fusedops::softmax_bwd", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, bool)>();
  return op.call(grad_output, output, dim, log);
}

class SoftmaxFunction : public torch::autograd::Function<SoftmaxFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, int64_t dim, bool log) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor output = softmax_fwd_op(input, dim, log);
    ctx->save_for_backward({output});
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["log"] = log;
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor output = ctx->get_saved_variables()[0];
    // softmax_bwd is itself differentiable (SoftmaxBackwardFunction), so double backward works.
    return {softmax_bwd_op(grads[0], output, ctx->saved_data["dim"].toInt(),
                           ctx->saved_data["log"].toBool()),
            at::Tensor(), at::Tensor()};
  }
};

// Derivatives of dx = softmax_bwd(g, y) for a gradient gg flowing into dx:
//   softmax:     dx = y * (g - sum(g*y))     d/dg = softmax_bwd(gg, y)
//                                            d/dy = gg * (g - sum(g*y)) - g * sum(gg*y)
//   log_softmax: dx = g - exp(y) * sum(g)    d/dg = gg - sum(gg*exp(y))
//                                            d/dy = -gg * exp(y) * sum(g)
class SoftmaxBackwardFunction : public torch::autograd::Function<SoftmaxBackwardFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad_output,
                            const at::Tensor& output, int64_t dim, bool log) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({grad_output, output});
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["log"] = log;
    return softmax_bwd_op(grad_output, output, dim, log);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &g = saved[0], &y = saved[1], &gg = grads[0];
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const bool log = ctx->saved_data["log"].toBool();
    const int64_t d = y.dim() == 0 ? 0 : at::maybe_wrap_dim(dim, y.dim());
    auto rowsum = [&](const at::Tensor& t) { return y.dim() == 0 ? t : t.sum(d, true); };
    at::Tensor grad_g, grad_y;
    if (log) {
      const at::Tensor p = y.exp();
      grad_g = gg - rowsum(gg * p);
      grad_y = -gg * p * rowsum(g);
    } else {
      grad_g = softmax_bwd_op(gg, y, dim, false);
      grad_y = gg * (g - rowsum(g * y)) - g * rowsum(gg * y);
    }
    return {grad_g, grad_y, at::Tensor(), at::Tensor()};
  }
};

at::Tensor softmax_fwd_autograd(const at::Tensor& input, int64_t dim, bool log) {
  if (autograd_records_nothing(input)) {
    const at::AutoDispatchBelowADInplaceOrView guard;
    return softmax_fwd_op(input, dim, log);
  }
  return SoftmaxFunction::apply(input, dim, log);
}

at::Tensor softmax_bwd_autograd(const at::Tensor& grad_output, const at::Tensor& output,
                                int64_t dim, bool log) {
  if (autograd_records_nothing(grad_output, output)) {
    const at::AutoDispatchBelowADInplaceOrView guard;
    return softmax_bwd_op(grad_output, output, dim, log);
  }
  return SoftmaxBackwardFunction::apply(grad_output, output, dim, log);
}

// torch's "fp32_set_opt_dtype" policy where it has one: low-precision input runs with an fp32
// result (torch.softmax(x, dim, dtype=torch.float32)), which is softmax of x cast to fp32.
template <c10::DeviceType D>
at::Tensor softmax_fwd_autocast(const at::Tensor& input, int64_t dim, bool log) {
  static const bool fp32_softmax = torch_autocasts("aten::softmax", "int", D);
  static const bool fp32_log_softmax = torch_autocasts("aten::log_softmax", "int", D);
  const AutocastExclude<D> exclude;
  const bool fp32 = log ? fp32_log_softmax : fp32_softmax;
  return softmax_fwd_op(fp32 ? at::autocast::cached_cast(at::kFloat, input, D) : input, dim, log);
}

template <c10::DeviceType D>
void register_autocast(torch::Library& m) {
  m.impl("softmax_fwd", &softmax_fwd_autocast<D>);
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, Autograd, m) {
  m.impl("softmax_fwd", &softmax_fwd_autograd);
  m.impl("softmax_bwd", &softmax_bwd_autograd);
}

FUSEDOPS_AUTOCAST_IMPL(register_autocast)

}  // namespace fusedops
