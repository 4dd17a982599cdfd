// The autograd kernels' shortcut: when autograd has nothing to record, an op goes straight to its
// backend below the Autograd key, as torch's generated autograd kernels do, instead of through
// torch::autograd::Function::apply, which builds a graph node and wraps every output even then
// (a few microseconds per call, most of a tiny inference call's host cost).
#pragma once

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <optional>

namespace fusedops {
namespace autograd_detail {

// A forward-mode tangent goes through Function::apply, which raises for it (no jvp).
inline bool tracked(const at::Tensor& t, bool grad_mode) {
  return t.defined() && ((grad_mode && t.requires_grad()) || t._fw_grad(/*level=*/0).defined());
}
inline bool tracked(const std::optional<at::Tensor>& t, bool grad_mode) {
  return t.has_value() && tracked(*t, grad_mode);
}
inline bool tracked(at::TensorList ts, bool grad_mode) {
  for (const at::Tensor& t : ts) {
    if (tracked(t, grad_mode)) return true;
  }
  return false;
}
template <typename NotATensor>
bool tracked(const NotATensor&, bool) {
  return false;
}

}  // namespace autograd_detail

// True when no tensor argument needs a graph node: grad mode is off or none requires grad, and
// none carries a forward-mode tangent. Other arguments are ignored.
template <typename... Args>
bool autograd_records_nothing(const Args&... args) {
  const bool grad_mode = at::GradMode::is_enabled();
  return !(autograd_detail::tracked(args, grad_mode) || ...);
}

// The Autograd kernel of a backward op, which has no derivative: straight to the backend below
// the Autograd key, unboxed (without one, torch's boxed autograd fallback runs on every call);
// an argument that requires grad (create_graph=True) raises instead of recording a node.
template <typename Op, typename... Args>
auto backward_below_autograd(const char* name, const Op& op, const Args&... args) {
  TORCH_CHECK(autograd_records_nothing(args...), "fusedops.", name,
              ": double backward is not supported (an argument requires grad)");
  const at::AutoDispatchBelowADInplaceOrView guard;
  return op(args...);
}

}  // namespace fusedops
