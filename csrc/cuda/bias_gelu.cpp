// Host side of the CUDA bias + GELU: checks, allocation, dtype dispatch and launch of the kernels
// in bias_gelu_kernels.cu, plus the row entry points fused_mlp composes with its GEMMs.
#include "bias_gelu.h"

#include <ATen/Dispatch.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <tuple>

#include "common/cuda_host.h"
#include "cuda/bias_gelu_kernels.h"

namespace fusedops {

at::Tensor bias_gelu_rows_fwd_cuda(const at::Tensor& input, const at::Tensor& bias,
                                   GeluApprox approx, bool overwrite_input) {
  const c10::cuda::CUDAGuard guard(input.device());
  const int64_t rows = input.size(0), cols = input.size(1);
  at::Tensor y = overwrite_input ? input : cuda_empty({rows, cols}, input.options());
  if (y.numel() == 0) return y;
  const DeviceInfo dev = current_device_info();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "bias_gelu_fwd_cuda", [&] {
        C10_CUDA_CHECK(bias_gelu_fwd_cuda(
            cuda_ptr<scalar_t>(input), bias.defined() ? cuda_ptr<scalar_t>(bias) : nullptr,
            cuda_mut_ptr<scalar_t>(y), rows, cols, approx, dev, stream));
      });
  return y;
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_rows_bwd_cuda(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& bias,
    GeluApprox approx, bool want_dbias, bool overwrite_grad_output, at::Tensor output) {
  const c10::cuda::CUDAGuard guard(input.device());
  const int64_t rows = input.size(0), cols = input.size(1);
  at::Tensor dx = overwrite_grad_output ? grad_output : cuda_empty({rows, cols}, input.options());
  at::Tensor db;
  if (want_dbias) {
    db = rows == 0 ? at::zeros({cols}, input.options()) : cuda_empty({cols}, input.options());
  }
  if (dx.numel() == 0) return {dx, db};
  const DeviceInfo dev = current_device_info();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "bias_gelu_bwd_cuda", [&] {
        using T = cuda_t<scalar_t>;
        // From the caching allocator on the current stream: freed back to it when this returns,
        // reused only by work queued after these launches.
        at::Tensor workspace;
        if (want_dbias) {
          const auto bytes =
              static_cast<int64_t>(bias_gelu_bwd_workspace_bytes<T>(rows, cols, dev));
          workspace = cuda_empty({bytes}, input.options().dtype(at::kByte));
        }
        C10_CUDA_CHECK(bias_gelu_bwd_cuda(
            cuda_ptr<scalar_t>(grad_output), cuda_ptr<scalar_t>(input),
            bias.defined() ? cuda_ptr<scalar_t>(bias) : nullptr, cuda_mut_ptr<scalar_t>(dx),
            want_dbias ? cuda_mut_ptr<scalar_t>(db) : nullptr,
            output.defined() ? cuda_mut_ptr<scalar_t>(output) : nullptr,
            want_dbias ? workspace.mutable_data_ptr() : nullptr, rows, cols, approx, dev, stream));
      });
  return {dx, db};
}

at::Tensor column_sum_rows_cuda(const at::Tensor& input) {
  const c10::cuda::CUDAGuard guard(input.device());
  const int64_t rows = input.size(0), cols = input.size(1);
  if (rows == 0) return at::zeros({cols}, input.options());
  at::Tensor sum = cuda_empty({cols}, input.options());
  if (cols == 0) return sum;
  const DeviceInfo dev = current_device_info();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "column_sum_cuda", [&] {
        using T = cuda_t<scalar_t>;
        // From the caching allocator on the current stream, as in bias_gelu_rows_bwd_cuda.
        const auto bytes = static_cast<int64_t>(bias_gelu_bwd_workspace_bytes<T>(rows, cols, dev));
        const at::Tensor workspace = cuda_empty({bytes}, input.options().dtype(at::kByte));
        C10_CUDA_CHECK(column_sum_cuda(cuda_ptr<scalar_t>(input), cuda_mut_ptr<scalar_t>(sum),
                                       workspace.mutable_data_ptr(), rows, cols, dev, stream));
      });
  return sum;
}

namespace {

at::Tensor bias_gelu_fwd(const at::Tensor& input, const at::Tensor& bias,
                         c10::string_view approximate) {
  const auto p = check_bias_gelu("bias_gelu", input, bias, approximate);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor y = bias_gelu_rows_fwd_cuda(input.contiguous().view({p.rows, p.cols}),
                                               bias.contiguous(), p.approx);
  return y.view(input.sizes());
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_bwd(const at::Tensor& grad_output,
                                                 const at::Tensor& input, const at::Tensor& bias,
                                                 c10::string_view approximate) {
  const auto p = check_bias_gelu("bias_gelu_backward", input, bias, approximate);
  check_like("bias_gelu_backward", "grad_output", grad_output, "input", input);
  const c10::cuda::CUDAGuard guard(input.device());
  auto [dx, db] = bias_gelu_rows_bwd_cuda(grad_output.contiguous().view({p.rows, p.cols}),
                                          input.contiguous().view({p.rows, p.cols}),
                                          bias.contiguous(), p.approx, true);
  return {dx.view(input.sizes()), db};
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, CUDA, m) {
  m.impl("bias_gelu_fwd", &bias_gelu_fwd);
  m.impl("bias_gelu_bwd", &bias_gelu_bwd);
}

}  // namespace fusedops
