// Host side of the CUDA softmax: checks, layout, dtype dispatch and the dispatcher registration.
// The kernels live in softmax_fwd.cu, softmax_bwd.cu and softmax_strided.cu.
#include "softmax.h"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/cuda_host.h"
#include "cuda/softmax_kernels.h"

namespace fusedops {
namespace {

// Many rows of the last dim that the register tiers would read in single elements (a length or
// address not a multiple of 16 bytes) take the tile kernel, whose thread per row walks it alone,
// up to these lengths: the tile's time grows with the elements a thread walks. Kernel-only on an
// H100, 262144 rows, softmax, us, register tiers / tile (torch): fp32 21 columns 41.4 / 15.8
// (27.1), 50 43.4 / 42.0 (40.1); bf16 21 41.0 / 13.8 (23.7), 65 45.2 / 43.4 (51.1), 81 46.2 / 53.5
// (51.4), 100 47.8 / 61.8 (56.4); earlier, past 200 bytes the tile lost to torch at 127 columns
// (fp32 139 / 93, bf16 86 / 60).
constexpr int64_t kTileRowMaxCols = 72, kTileRowMaxBytes = 200;

at::Tensor softmax_fwd(const at::Tensor& input, int64_t dim, bool log) {
  const SoftmaxProblem p = check_softmax_fwd(input, dim, log);
  const c10::cuda::CUDAGuard guard(input.device());
  const DeviceInfo dev = current_device_info();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (softmax_dim_strided(input, p.dim) && many_short_softmaxes(input, p.dim)) {
    const at::Tensor x = input.contiguous();
    at::Tensor y = cuda_empty_like(x);
    const StridedSoftmax c = strided_softmax(x, p.dim);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "softmax_fwd", [&] {
      C10_CUDA_CHECK(softmax_fwd_strided_cuda(cuda_ptr<scalar_t>(x), cuda_mut_ptr<scalar_t>(y),
                                              c.outer, c.cols, c.inner, log, dev, stream));
    });
    return y;
  }
  // Many short rows (a thread per row through a shared-memory tile): those of a dim last in
  // memory only go straight into torch's layout; the last dim's where they are short enough.
  const int elem_bytes = static_cast<int>(input.element_size());
  if (softmax_dim_transposed(input, p.dim) && many_short_softmaxes(input, p.dim)) {
    const StridedSoftmax c = strided_softmax(input, p.dim);
    if (softmax_tile_rows(c.cols, c.inner, elem_bytes) > 0) {
      at::Tensor y = cuda_empty(input.sizes(), input.options());
      AT_DISPATCH_FLOATING_TYPES_AND2(
          at::kHalf, at::kBFloat16, input.scalar_type(), "softmax_fwd", [&] {
            C10_CUDA_CHECK(softmax_fwd_tile_cuda(cuda_ptr<scalar_t>(input),
                                                 cuda_mut_ptr<scalar_t>(y), c.outer, c.cols,
                                                 c.inner, /*transposed=*/true, log, dev, stream));
          });
      return y;
    }
  }
  const at::Tensor x = to_rows(input, p.dim);
  at::Tensor y = cuda_empty_like(x);
  if (p.rows == 0) return from_rows(y, p.dim, input);
  const bool single_elements = (p.cols * elem_bytes) % 16 != 0 || !aligned16(x.const_data_ptr()) ||
                               !aligned16(y.const_data_ptr());
  const bool tile = single_elements && p.rows >= kManyColumns && p.cols <= kTileRowMaxCols &&
                    p.cols * elem_bytes <= kTileRowMaxBytes &&
                    softmax_tile_rows(p.cols, p.rows, elem_bytes) > 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "softmax_fwd", [&] {
    C10_CUDA_CHECK(tile ? softmax_fwd_tile_cuda(cuda_ptr<scalar_t>(x), cuda_mut_ptr<scalar_t>(y), 1,
                                                p.cols, p.rows, /*transposed=*/false, log, dev,
                                                stream)
                        : softmax_fwd_cuda(cuda_ptr<scalar_t>(x), cuda_mut_ptr<scalar_t>(y), p.rows,
                                           p.cols, log, dev, stream));
  });
  return from_rows(y, p.dim, input);
}

at::Tensor softmax_bwd(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                       bool log) {
  const SoftmaxProblem p = check_softmax_bwd(grad_output, output, dim, log);
  const c10::cuda::CUDAGuard guard(output.device());
  const DeviceInfo dev = current_device_info();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (softmax_dim_strided(output, p.dim) && many_short_softmaxes(output, p.dim)) {
    const at::Tensor dy = grad_output.contiguous(), y = output.contiguous();
    at::Tensor dx = cuda_empty_like(y);
    const StridedSoftmax c = strided_softmax(y, p.dim);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "softmax_bwd", [&] {
      C10_CUDA_CHECK(softmax_bwd_strided_cuda(cuda_ptr<scalar_t>(dy), cuda_ptr<scalar_t>(y),
                                              cuda_mut_ptr<scalar_t>(dx), c.outer, c.cols, c.inner,
                                              log, dev, stream));
    });
    return dx;
  }
  const at::Tensor dy = to_rows(grad_output, p.dim);
  const at::Tensor y = to_rows(output, p.dim);
  at::Tensor dx = cuda_empty_like(y);
  if (p.rows == 0) return from_rows(dx, p.dim, output);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "softmax_bwd", [&] {
    C10_CUDA_CHECK(softmax_bwd_cuda(cuda_ptr<scalar_t>(dy), cuda_ptr<scalar_t>(y),
                                    cuda_mut_ptr<scalar_t>(dx), p.rows, p.cols, log, dev, stream));
  });
  return from_rows(dx, p.dim, output);
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, CUDA, m) {
  m.impl("softmax_fwd", &softmax_fwd);
  m.impl("softmax_bwd", &softmax_bwd);
}

}  // namespace fusedops
