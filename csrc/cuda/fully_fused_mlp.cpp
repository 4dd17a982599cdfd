// Host side of the CUDA fully fused MLP: fp16/bf16 problems the kernels serve (sm_80+, features up
// to 128, every layer's weights in one block's shared memory) run fully_fused_mlp_kernels.cu;
// everything else runs the composed path. Where the backward kernel sums the weight gradients (up
// to width 64) it runs once; elsewhere once per chunk of rows, each launch followed by cuBLASLt
// GEMMs that take that chunk's weight gradients in fp32 from the pre-activation gradients it
// wrote (so those are live one chunk at a time). A small kernel then adds the partial sums in a
// fixed order and writes the gradients.
#include "fully_fused_mlp.h"

#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "common/cuda_host.h"
#include "cuda/fully_fused_mlp_kernels.h"
#include "cuda/gemm.h"

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
  const bool gelu = is_gelu(p.act), out_grad_differs = p.out_act != MlpActivation::kNone;
  const at::Tensor go = grad_out.contiguous().view({p.rows, p.out});
  const at::Tensor xc = x.contiguous().view({p.rows, p.in});
  const at::Tensor saved = (gelu ? hidden_pre : hidden_act).contiguous();
  const DeviceInfo dev = current_device_info();
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  std::vector<at::Tensor> grad_w, grad_b;
  std::vector<at::Tensor> keep;
  AT_DISPATCH_REDUCED_FLOATING_TYPES(x.scalar_type(), "fully_fused_mlp_bwd", [&] {
    using T = cuda_t<scalar_t>;
    FfmBackward<T> b{};
    b.s = shape_of(p);
    const FfmBackwardPlan plan = ffm_backward_plan<T>(b.s, dev);
    b.grad_out = cuda_ptr<scalar_t>(go);
    for (size_t l = 0; l < weights.size(); ++l) {
      b.w[l] = contiguous_ptr<scalar_t>(weights[l], keep);
    }
    (gelu ? b.hidden_pre : b.hidden_act) = cuda_ptr<scalar_t>(saved);
    b.saved_layer_stride = p.rows * p.hidden;
    if (out_grad_differs) {
      b.out_pre = contiguous_ptr<scalar_t>(out_pre, keep);
    }
    b.grad_x = cuda_mut_ptr<scalar_t>(grad_x);
    const auto f32 = x.options().dtype(at::kFloat);
    // fp32 partial sums: where the kernel sums the weight gradients, [blocks, each weight and its
    // bias]; else [chunks, every weight] from the GEMMs and [warps, matrices, width] of the bias
    // gradients, which every chunk's launch adds to.
    at::Tensor weight_partial, bias_partial;
    // The GEMMs' inputs the kernel writes, one chunk's rows at a time (flat: a shorter last chunk
    // takes the front of each).
    at::Tensor grad_out_pre, grad_hidden_pre, hidden_out;
    const int64_t chunk = plan.chunk_rows;
    if (plan.weight_grads) {
      b.x = cuda_ptr<scalar_t>(xc);
      weight_partial = at::empty({plan.weight_partial}, f32);
      b.weight_partial = weight_partial.mutable_data_ptr<float>();
    } else {
      const int64_t chunks = chunk > 0 ? (p.rows + chunk - 1) / chunk : 0;
      int64_t weight_elems = 0;
      for (const at::Tensor& w : weights) weight_elems += w.numel();
      weight_partial = at::empty({chunks, weight_elems}, f32);
      if (out_grad_differs) grad_out_pre = at::empty({chunk * p.out}, x.options());
      grad_hidden_pre = at::empty({p.hidden_layers * chunk * p.hidden}, x.options());
      if (gelu) hidden_out = at::empty({p.hidden_layers * chunk * p.hidden}, x.options());
      if (has_bias) {
        bias_partial = at::empty({plan.bias_partial}, f32);
        b.bias_partial = bias_partial.mutable_data_ptr<float>();
      }
    }
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const auto offset = [](auto* ptr, int64_t elems) { return ptr ? ptr + elems : ptr; };
    const auto front = [](const at::Tensor& flat, int64_t layers, int64_t rows, int64_t cols) {
      return flat.defined() ? flat.narrow(0, 0, layers * rows * cols).view({layers, rows, cols})
                            : at::Tensor();
    };
    for (int64_t i = 0, r0 = 0; r0 < p.rows; ++i, r0 += chunk) {
      const int64_t rows = std::min(chunk, p.rows - r0);
      FfmBackward<T> c = b;
      c.s.rows = rows;
      c.grad_out = offset(b.grad_out, r0 * p.out);
      c.hidden_act = offset(b.hidden_act, r0 * p.hidden);
      c.hidden_pre = offset(b.hidden_pre, r0 * p.hidden);
      c.out_pre = offset(b.out_pre, r0 * p.out);
      c.x = offset(b.x, r0 * p.in);
      c.grad_x = offset(b.grad_x, r0 * p.in);
      if (plan.weight_grads) {
        C10_CUDA_CHECK(ffm_backward_cuda(c, dev, stream));
        continue;
      }
      const at::Tensor g_out =
          out_grad_differs ? front(grad_out_pre, 1, rows, p.out)[0] : go.narrow(0, r0, rows);
      const at::Tensor g_hidden = front(grad_hidden_pre, p.hidden_layers, rows, p.hidden);
      const at::Tensor h_hidden =
          gelu ? front(hidden_out, p.hidden_layers, rows, p.hidden) : saved.narrow(1, r0, rows);
      if (out_grad_differs) c.grad_out_pre = cuda_mut_ptr<scalar_t>(grad_out_pre);
      c.grad_hidden_pre = cuda_mut_ptr<scalar_t>(grad_hidden_pre);
      if (gelu) c.hidden_out = cuda_mut_ptr<scalar_t>(hidden_out);
      c.bias_partial_adds = i > 0;
      C10_CUDA_CHECK(ffm_backward_cuda(c, dev, stream));
      // This chunk's weight gradients, fp32, into row i of weight_partial.
      int64_t col = 0;
      for (int64_t l = 0; l <= p.hidden_layers; ++l) {
        const int64_t n = weights[l].size(0), k = weights[l].size(1);
        at::Tensor d = weight_partial[i].narrow(0, col, n * k).view({n, k});
        mm_f32_out(d, l < p.hidden_layers ? g_hidden[l] : g_out, true,
                   l == 0 ? xc.narrow(0, r0, rows) : h_hidden[l - 1], false);
        col += n * k;
      }
    }
    // The partial sums, added in a fixed order (deterministic) by one kernel per layout that
    // writes each gradient in x's dtype. No rows: no partials, zeros.
    FfmSumSegments<T> seg{};
    const auto segment = [&](int64_t col, int64_t n, std::vector<at::Tensor>& grads,
                             at::IntArrayRef shape) {
      grads.push_back(at::empty(shape, x.options()));
      seg.col[seg.count] = int(col);
      seg.n[seg.count] = int(n);
      seg.dst[seg.count++] = cuda_mut_ptr<scalar_t>(grads.back());
    };
    const auto sum = [&](const at::Tensor& partial, int64_t cols) {
      C10_CUDA_CHECK(ffm_sum_partials(partial.const_data_ptr<float>(), partial.numel() / cols, cols,
                                      seg, stream));
      seg = {};
    };
    int64_t col = 0;
    for (const at::Tensor& w : weights) {  // each weight, then (in the kernel's sums) its bias
      segment(col, w.numel(), grad_w, w.sizes());
      col += w.numel();
      if (plan.weight_grads && has_bias) {
        segment(col, w.size(0), grad_b, {w.size(0)});
        col += w.size(0);
      }
    }
    sum(weight_partial, col);
    if (!plan.weight_grads && has_bias) {  // [warps, matrices, width]
      const int64_t width = ffm_width(b.s);
      for (size_t l = 0; l < weights.size(); ++l) {
        segment(int64_t(l) * width, weights[l].size(0), grad_b, {weights[l].size(0)});
      }
      sum(bias_partial, int64_t(weights.size()) * width);
    }
  });
  return {grad_x, grad_w, grad_b};
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, CUDA, m) {
  m.impl("fully_fused_mlp_fwd", &fully_fused_mlp_fwd);
  m.impl("fully_fused_mlp_bwd", &fully_fused_mlp_bwd);
}

}  // namespace fusedops
