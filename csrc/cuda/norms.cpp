// CUDA host side of layer_norm / rms_norm: checks, allocation and dtype dispatch around the
// torch-free launchers of norms_kernels.cu, and the CUDA kernel registrations.
#include "norms.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <tuple>
#include <type_traits>

#include "common/cuda_host.h"
#include "cuda/norms_kernels.h"
#include "norm_ops.h"

namespace fusedops {
namespace {

using OptTensor = std::optional<at::Tensor>;

template <typename F>
void dispatch_norm(at::ScalarType x, std::optional<at::ScalarType> w, F&& f) {
  switch (x) {
    case at::kFloat:
      return with_norm_param_type<float>(w, f);
    case at::kHalf:
      return with_norm_param_type<__half>(w, f);
    case at::kBFloat16:
      return with_norm_param_type<__nv_bfloat16>(w, f);
    case at::kDouble:
      return with_norm_param_type<double>(w, f);
    default:  // check_floating lets nothing else through
      TORCH_CHECK(false, "fusedops: no CUDA norm kernel for dtype ", x);
  }
}

// The backend of NormOps (norm_ops.h).
struct CudaNorms {
  template <bool kRms>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> fwd(const char* op, const at::Tensor& input,
                                                            at::IntArrayRef normalized_shape,
                                                            const OptTensor& weight,
                                                            const OptTensor& bias, double eps) {
    const NormProblem p = norm_problem(op, input, normalized_shape);
    check_norm_params(op, input, normalized_shape, weight, bias);
    const c10::cuda::CUDAGuard guard(input.device());
    const at::Tensor x = input.contiguous();
    const at::Tensor w = contiguous_or_undefined(weight), b = contiguous_or_undefined(bias);
    const at::TensorOptions stat_options = x.options().dtype(norm_stat_dtype(x));
    at::Tensor out = cuda_empty_like(x);
    at::Tensor mean = kRms ? at::Tensor() : cuda_empty(norm_stat_sizes(x, p), stat_options);
    at::Tensor rstd = cuda_empty(norm_stat_sizes(x, p), stat_options);
    if (p.rows == 0) return {out, mean, rstd};
    if (p.cols == 0) {
      fill_empty_row_stats(mean, rstd);
      return {out, mean, rstd};
    }
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const DeviceInfo info = current_device_info();
    dispatch_norm(x.scalar_type(), norm_param_dtype(w, b), [&](auto* t_tag, auto* w_tag) {
      using T = std::remove_pointer_t<decltype(t_tag)>;
      using W = std::remove_pointer_t<decltype(w_tag)>;
      const NormFwdArgs<T, W> args{ptr_or_null<T>(x),
                                   ptr_or_null<W>(w),
                                   ptr_or_null<W>(b),
                                   mut_ptr_or_null<T>(out),
                                   mut_ptr_or_null<NormAcc<T>>(mean),
                                   mut_ptr_or_null<NormAcc<T>>(rstd),
                                   p.rows,
                                   p.cols,
                                   static_cast<NormAcc<T>>(eps)};
      C10_CUDA_CHECK((norm_fwd_cuda<T, W, kRms>(args, info, stream)));
    });
    return {out, mean, rstd};
  }

  template <bool kRms>
  static std::tuple<OptTensor, OptTensor, OptTensor> bwd(
      const char* op, const at::Tensor& grad_out, const at::Tensor& input,
      at::IntArrayRef normalized_shape, const at::Tensor* mean, const at::Tensor& rstd,
      const OptTensor& weight, const OptTensor& bias, std::array<bool, 3> output_mask) {
    const NormProblem p =
        check_norm_bwd(op, grad_out, input, normalized_shape, mean, rstd, weight, bias);
    const c10::cuda::CUDAGuard guard(input.device());
    const at::Tensor x = input.contiguous(), dy = grad_out.contiguous();
    const at::Tensor mean_c = mean != nullptr ? mean->contiguous() : at::Tensor();
    const at::Tensor rstd_c = rstd.contiguous();
    const at::Tensor w = contiguous_or_undefined(weight), b = contiguous_or_undefined(bias);
    at::Tensor dx = output_mask[0] ? cuda_empty_like(x) : at::Tensor();
    at::Tensor dw = output_mask[1] && w.defined() ? cuda_empty_like(w) : at::Tensor();
    at::Tensor db = output_mask[2] && b.defined() ? cuda_empty_like(b) : at::Tensor();
    auto result = [&]() -> std::tuple<OptTensor, OptTensor, OptTensor> {
      return {dx.defined() ? OptTensor(dx) : std::nullopt,
              dw.defined() ? OptTensor(dw) : std::nullopt,
              db.defined() ? OptTensor(db) : std::nullopt};
    };
    if (x.numel() == 0) {  // no rows: parameter gradients are sums of nothing
      if (dw.defined()) dw.zero_();
      if (db.defined()) db.zero_();
      return result();
    }
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const DeviceInfo info = current_device_info();
    dispatch_norm(x.scalar_type(), norm_param_dtype(w, b), [&](auto* t_tag, auto* w_tag) {
      using T = std::remove_pointer_t<decltype(t_tag)>;
      using W = std::remove_pointer_t<decltype(w_tag)>;
      const NormBwdArgs<T, W> args{ptr_or_null<T>(dy),
                                   ptr_or_null<T>(x),
                                   ptr_or_null<NormAcc<T>>(mean_c),
                                   ptr_or_null<NormAcc<T>>(rstd_c),
                                   ptr_or_null<W>(w),
                                   mut_ptr_or_null<T>(dx),
                                   mut_ptr_or_null<W>(dw),
                                   mut_ptr_or_null<W>(db),
                                   p.rows,
                                   p.cols};
      at::Tensor workspace = cuda_empty({norm_bwd_workspace_size<T, W, kRms>(args, info)},
                                        x.options().dtype(norm_stat_dtype(input)));
      C10_CUDA_CHECK(
          (norm_bwd_cuda<T, W, kRms>(args, mut_ptr_or_null<NormAcc<T>>(workspace), info, stream)));
    });
    return result();
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, CUDA, m) { NormOps<CudaNorms>::register_into(m); }

}  // namespace fusedops
