// The one place where fusedops' operator schemas live. Backends add kernels with
// TORCH_LIBRARY_IMPL in their own files; fusedops/_ops.py registers the fake kernels.
#include <torch/library.h>
#include <torch/version.h>

#include <string>

#ifdef FUSEDOPS_WITH_CUDA
#include <cuda_runtime_api.h>

#include "common/kernel_registry.h"
#endif

#define FUSEDOPS_STR2(x) #x
#define FUSEDOPS_STR(x) FUSEDOPS_STR2(x)

namespace fusedops {

// "key=value;..." describing this build; parsed by fusedops.build_info().
std::string build_info() {
  std::string info = "torch=" FUSEDOPS_STR(TORCH_VERSION_MAJOR) "." FUSEDOPS_STR(
      TORCH_VERSION_MINOR) "." FUSEDOPS_STR(TORCH_VERSION_PATCH);
#ifdef FUSEDOPS_WITH_CUDA
  info += ";cuda=" + std::to_string(CUDART_VERSION / 1000) + "." +
          std::to_string(CUDART_VERSION % 1000 / 10);
  info += ";cuda_archs=" FUSEDOPS_STR(FUSEDOPS_CUDA_ARCHS);
#ifdef FUSEDOPS_WITH_CUTLASS
  info += ";cutlass=1";  // fused_mlp's Hopper GEMM (csrc/cuda/gemm_gelu_sm90.h) is built
#else
  info += ";cutlass=0";
#endif
#endif
  return info;
}

TORCH_LIBRARY(fusedops, m) {
  // softmax (log=false) or log_softmax (log=true) along `dim`.
  m.def("softmax_fwd(Tensor input, int dim, bool log) -> Tensor");
  m.def("softmax_bwd(Tensor grad_output, Tensor output, int dim, bool log) -> Tensor");
  // layer_norm / rms_norm over the trailing `normalized_shape` dims; statistics (one per row) in
  // fp32 (fp64 for fp64 input). The _bwd ops compute only what output_mask asks for.
  // clang-format off: one line per schema, so each op greps as one line
  m.def("layer_norm_fwd(Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> (Tensor out, Tensor mean, Tensor rstd)");
  m.def("layer_norm_bwd(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor mean, Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask) -> (Tensor? grad_input, Tensor? grad_weight, Tensor? grad_bias)");
  m.def("rms_norm_fwd(Tensor input, int[] normalized_shape, Tensor? weight, float? eps) -> (Tensor out, Tensor rstd)");
  m.def("rms_norm_bwd(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor rstd, Tensor? weight, bool[2] output_mask) -> (Tensor? grad_input, Tensor? grad_weight)");
  // clang-format on
  // gelu(input + bias), bias [input.size(-1)]; approximate is "none" (erf) or "tanh".
  m.def("bias_gelu_fwd(Tensor input, Tensor bias, str approximate) -> Tensor");
  m.def(
      "bias_gelu_bwd(Tensor grad_output, Tensor input, Tensor bias, str approximate) -> "
      "(Tensor grad_input, Tensor grad_bias)");
  // out = gelu(x @ w1.T + b1) @ w2.T + b2 over x [..., in]; w1 [hidden, in], w2 [out, hidden].
  // pre = x @ w1.T + b1 and act = gelu(pre), both [..., hidden], are returned for the backward
  // when save_pre / save_act, else as empty [0] tensors.
  m.def(
      "mlp_fwd(Tensor x, Tensor w1, Tensor? b1, Tensor w2, Tensor? b2, str approximate, "
      "bool save_pre, bool save_act) -> (Tensor out, Tensor pre, Tensor act)");
  // Gradients for (x, w1, b1, w2, b2) where output_mask says so, else empty [0] tensors. act may
  // be an empty [0] tensor: it is then recomputed from pre.
  m.def(
      "mlp_bwd(Tensor grad_out, Tensor x, Tensor w1, Tensor w2, Tensor pre, Tensor act, "
      "str approximate, bool[5] output_mask) -> (Tensor grad_x, Tensor grad_w1, Tensor grad_b1, "
      "Tensor grad_w2, Tensor grad_b2)");
  // The fully fused small-width MLP (fusedops.nn.FullyFusedMLP): weights[l] [out_l, in_l], biases
  // empty or one per weight; activation after every hidden layer, output_activation after the
  // last; the saves for the backward are empty [0] tensors unless save_for_backward.
  // clang-format off
  m.def("fully_fused_mlp_fwd(Tensor x, Tensor[] weights, Tensor[] biases, str activation, str output_activation, bool save_for_backward) -> (Tensor out, Tensor hidden_act, Tensor hidden_pre, Tensor out_pre)");
  m.def("fully_fused_mlp_bwd(Tensor grad_out, Tensor x, Tensor[] weights, Tensor hidden_act, Tensor hidden_pre, Tensor out_pre, str activation, str output_activation, bool has_bias) -> (Tensor grad_x, Tensor[] grad_weights, Tensor[] grad_biases)");
  // clang-format on
  m.def("build_info() -> str", &build_info);
#ifdef FUSEDOPS_WITH_CUDA
  // The kernel resource report (fusedops.tools.kernels): record launch configurations while on,
  // then one line per configuration with the runtime's attributes and occupancy on `device`.
  m.def("cuda_kernel_recording(bool on) -> ()", &kernel_registry::set_recording);
  m.def("cuda_kernel_report(int device) -> str", &kernel_registry::cuda_kernel_report);
#endif
}

}  // namespace fusedops
