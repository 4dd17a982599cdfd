// Host side of the CUDA fully fused MLP: fp16/bf16 problems the kernels serve (sm_80+, features up
// to 128, every layer's weights in one block's shared memory) run fully_fused_mlp_kernels.cu;
// everything else runs the composed path. A second small kernel adds the backward kernel's
// partial sums of the weight and bias gradients (where the plan has it sum the weight gradients:
// up to width 64) or of the bias gradients (elsewhere, where the weight gradients are ATen GEMMs
// over the pre-activation gradients it writes).
#include "fully_fused_mlp.h"

#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "common/cuda_host.h"
#include "cuda/fully_fused_mlp_kernels.h"

namespace fusedops {
namespace {

FfmShape shape_of(const FfmProblem& p) {
  return {p.rows, int(p.in), int(p.hidden), int(p.out), int(p.hidden_layers + 1),
          p.act,  p.out_act, p.has_bias};
}

// t's data for a kernel: t itself when contiguous, else a contiguous copy that `keep` holds until
// the launch is queued.
template <typename S>
const cuda_t<S>* contiguous_ptr(const at::Tensor& t, std::vector<at::Tensor>& keep) {
  keep.push_back(t.contiguous());
  return cuda_ptr<S>(keep.back());
}

// Whether the fused kernels take this problem (the composed path does otherwise).
bool fused_ok(const FfmProblem& p, const at::Tensor& x) {
  const auto dtype = x.scalar_type();
  if (dtype != at::kHalf && dtype != at::kBFloat16) return false;
  if (p.in > kFfmMaxFeatures || p.out > kFfmMaxFeatures || p.hidden > kFfmMaxFeatures ||
      p.hidden_layers + 1 > kFfmMaxMatrices) {
    return false;
  }
  return ffm_supported(shape_of(p), current_device_info());
}

FfmFwdOutputs fully_fused_mlp_fwd(const at::Tensor& x, at::TensorList weights,
                                  at::TensorList biases, c10::string_view activation,
                                  c10::string_view output_activation, bool save_for_backward) {
  const FfmProblem p =
      check_ffm("fully_fused_mlp", x, weights, biases, activation, output_activation);
  const c10::cuda::CUDAGuard guard(x.device());
  if (!fused_ok(p, x)) return ffm_fwd_composed(p, x, weights, biases, save_for_backward);
  auto [hidden_act, hidden_pre, out_pre] = ffm_empty_saves(p, x, save_for_backward);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = p.out;
  at::Tensor y = at::empty(shape, x.options());
  if (p.rows == 0) return {y, hidden_act, hidden_pre, out_pre};
  const at::Tensor xc = x.contiguous();
  std::vector<at::Tensor> keep;
  AT_DISPATCH_REDUCED_FLOATING_TYPES(x.scalar_type(), "fully_fused_mlp_fwd", [&] {
    using T = cuda_t<scalar_t>;
    FfmForward<T> f{};
    f.s = shape_of(p);
    f.x = cuda_ptr<scalar_t>(xc);
    for (size_t l = 0; l < weights.size(); ++l) {
      f.w[l] = contiguous_ptr<scalar_t>(weights[l], keep);
      if (p.has_bias) {
        f.b[l] = contiguous_ptr<scalar_t>(biases[l], keep);
      }
    }
    f.y = cuda_mut_ptr<scalar_t>(y);
    // Absent saves are empty [0] tensors: null for the kernel.
    const auto save = [](at::Tensor& t) {
      return t.numel() > 0 ? cuda_mut_ptr<scalar_t>(t) : nullptr;
    };
    f.hidden_act = save(hidden_act);
    f.hidden_pre = save(hidden_pre);
    f.out_pre = save(out_pre);
    C10_CUDA_CHECK(ffm_forward_cuda(f, current_device_info(), at::cuda::getCurrentCUDAStream()));
  });
  return {y, hidden_act, hidden_pre, out_pre};
}

FfmBwdOutputs fully_fused_mlp_bwd(const at::Tensor& grad_out, const at::Tensor& x,
                                  at::TensorList weights, const at::Tensor& hidden_act,
                                  const at::Tensor& hidden_pre, const at::Tensor& out_pre,
                                  c10::string_view activation, c10::string_view output_activation,
                                  bool has_bias) {
  const FfmProblem p = check_ffm_bwd(grad_out, x, weights, hidden_act, hidden_pre, out_pre,
                                     activation, output_activation, has_bias);
  const c10::cuda::CUDAGuard guard(x.device());
  if (!fused_ok(p, x)) {
    return ffm_bwd_composed(p, grad_out, x, weights, hidden_act, hidden_pre, out_pre);
  }
  const at::Tensor go = grad_out.contiguous();
  const at::Tensor xc = x.contiguous();
  const bool out_grad_differs = p.out_act != MlpActivation::kNone;
  const DeviceInfo dev = current_device_info();
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  // What the weight GEMMs read, when they run: the pre-activation gradients and the hidden layers'
  // outputs (the saved ones, or the GELU's as the kernel recomputes them).
  at::Tensor grad_out_pre = go, grad_hidden_pre, hidden_out = hidden_act;
  // fp32 partial sums: [blocks, weight and bias elements] where the kernel sums the weight
  // gradients, else [warps, matrices, width] of the bias gradients.
  at::Tensor bias_partial, weight_partial;
  FfmBackwardPlan plan{};
  std::vector<at::Tensor> grad_w, grad_b;
  std::vector<at::Tensor> keep;
  AT_DISPATCH_REDUCED_FLOATING_TYPES(x.scalar_type(), "fully_fused_mlp_bwd", [&] {
    using T = cuda_t<scalar_t>;
    FfmBackward<T> b{};
    b.s = shape_of(p);
    plan = ffm_backward_plan<T>(b.s, dev);
    b.grad_out = cuda_ptr<scalar_t>(go);
    for (size_t l = 0; l < weights.size(); ++l) {
      b.w[l] = contiguous_ptr<scalar_t>(weights[l], keep);
    }
    if (is_gelu(p.act)) {
      b.hidden_pre = contiguous_ptr<scalar_t>(hidden_pre, keep);
    } else {
      b.hidden_act = contiguous_ptr<scalar_t>(hidden_act, keep);
    }
    if (out_grad_differs) {
      b.out_pre = contiguous_ptr<scalar_t>(out_pre, keep);
    }
    b.grad_x = cuda_mut_ptr<scalar_t>(grad_x);
    const auto f32 = x.options().dtype(at::kFloat);
    if (plan.weight_grads) {
      b.x = cuda_ptr<scalar_t>(xc);
      weight_partial = at::empty({plan.weight_partial}, f32);
      b.weight_partial = weight_partial.mutable_data_ptr<float>();
    } else {
      if (out_grad_differs) {
        grad_out_pre = at::empty({p.rows, p.out}, x.options());
        b.grad_out_pre = cuda_mut_ptr<scalar_t>(grad_out_pre);
      }
      grad_hidden_pre = at::empty({p.hidden_layers, p.rows, p.hidden}, x.options());
      b.grad_hidden_pre = cuda_mut_ptr<scalar_t>(grad_hidden_pre);
      if (is_gelu(p.act)) {
        hidden_out = at::empty({p.hidden_layers, p.rows, p.hidden}, x.options());
        b.hidden_out = cuda_mut_ptr<scalar_t>(hidden_out);
      }
    }
    if (has_bias && !plan.weight_grads) {
      bias_partial = at::empty({plan.bias_partial}, f32);
      b.bias_partial = bias_partial.mutable_data_ptr<float>();
    }
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (p.rows > 0) C10_CUDA_CHECK(ffm_backward_cuda(b, dev, stream));
    // The partial sums, added in a fixed order (deterministic) by one kernel that writes each
    // gradient in x's dtype. No rows: no partials, zeros.
    const int64_t width = ffm_width(b.s);
    FfmSumSegments<T> seg{};
    const auto segment = [&](int64_t col, int64_t n, std::vector<at::Tensor>& grads,
                             at::IntArrayRef shape) {
      grads.push_back(at::empty(shape, x.options()));
      seg.col[seg.count] = int(col);
      seg.n[seg.count] = int(n);
      seg.dst[seg.count++] = cuda_mut_ptr<scalar_t>(grads.back());
    };
    if (plan.weight_grads) {  // [blocks, each weight then its bias]
      int64_t col = 0;
      for (const at::Tensor& w : weights) {
        segment(col, w.numel(), grad_w, w.sizes());
        col += w.numel();
        if (has_bias) {
          segment(col, w.size(0), grad_b, {w.size(0)});
          col += w.size(0);
        }
      }
      C10_CUDA_CHECK(ffm_sum_partials(weight_partial.const_data_ptr<float>(),
                                      plan.weight_partial / col, col, seg, stream));
    } else if (has_bias) {  // [warps, matrices, width]
      for (size_t l = 0; l < weights.size(); ++l) {
        segment(int64_t(l) * width, weights[l].size(0), grad_b, {weights[l].size(0)});
      }
      const int64_t cols = int64_t(weights.size()) * width;
      C10_CUDA_CHECK(ffm_sum_partials(bias_partial.const_data_ptr<float>(),
                                      plan.bias_partial / cols, cols, seg, stream));
    }
  });
  if (!plan.weight_grads) {
    FfmProblem weights_only = p;
    weights_only.has_bias = false;
    std::tie(grad_w, std::ignore) = ffm_param_grads(weights_only, x, hidden_out, grad_hidden_pre,
                                                    grad_out_pre.reshape({p.rows, p.out}));
  }
  return {grad_x, grad_w, grad_b};
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, CUDA, m) {
  m.impl("fully_fused_mlp_fwd", &fully_fused_mlp_fwd);
  m.impl("fully_fused_mlp_bwd", &fully_fused_mlp_bwd);
}

}  // namespace fusedops
