// Autocast for fusedops' ops: each op follows the policy torch's autocast applies to its torch
// counterpart on that device, looked up in torch's dispatcher at run time rather than restated
// here, because it differs between devices and torch versions (aten::rms_norm runs in fp32 under
// CUDA autocast in recent torch and untouched in older ones; MPS has no rms_norm policy; the CPU
// has no softmax or norm policy).
#pragma once

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch/version.h>

namespace fusedops {

// Whether torch's autocast has a kernel for the aten op `name.overload` on `device`.
inline bool torch_autocasts(const char* name, const char* overload, c10::DeviceType device) {
  const auto op = c10::Dispatcher::singleton().findOp({name, overload});
  const auto key = at::autocast::get_autocast_dispatch_key_from_device_type(device);
  return op.has_value() && op->hasKernelForDispatchKey(key);
}

// Excludes `D`'s autocast key while an autocast kernel redispatches to its op.
template <c10::DeviceType D>
struct AutocastExclude {
  c10::impl::ExcludeDispatchKeyGuard guard{
      at::autocast::get_autocast_dispatch_key_from_device_type(D)};
};

// Registers `register_fn<D>(m)` under the autocast key of each device fusedops runs on (torch 2.4
// has no MPS autocast key).
#define FUSEDOPS_AUTOCAST_IMPL_CPU_CUDA(register_fn)                                     \
  TORCH_LIBRARY_IMPL(fusedops, AutocastCPU, m) { register_fn<c10::DeviceType::CPU>(m); } \
  TORCH_LIBRARY_IMPL(fusedops, AutocastCUDA, m) { register_fn<c10::DeviceType::CUDA>(m); }
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 5
#define FUSEDOPS_AUTOCAST_IMPL(register_fn)    \
  FUSEDOPS_AUTOCAST_IMPL_CPU_CUDA(register_fn) \
  TORCH_LIBRARY_IMPL(fusedops, AutocastMPS, m) { register_fn<c10::DeviceType::MPS>(m); }
#else
#define FUSEDOPS_AUTOCAST_IMPL(register_fn) FUSEDOPS_AUTOCAST_IMPL_CPU_CUDA(register_fn)
#endif

}  // namespace fusedops
