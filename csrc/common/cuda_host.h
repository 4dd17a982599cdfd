// Host-side glue between ATen and the torch-free kernel files: the current device's
// DeviceInfo, output allocation, and the CUDA type behind each ATen scalar type.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/device_info.h"

namespace fusedops {

inline DeviceInfo current_device_info() {
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  return {prop->multiProcessorCount, prop->major, static_cast<int>(prop->sharedMemPerBlockOptin),
          static_cast<int>(prop->sharedMemPerMultiprocessor)};
}

// New CUDA tensors straight from the caching allocator, as torch's own CUDA kernels allocate
// their outputs: at::empty / at::empty_like would take one or two more trips through the
// dispatcher, a measurable part of a tiny call's host cost.
inline at::Tensor cuda_empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::detail::empty_cuda(sizes, options);
}

// at::empty_like for a dense `t`: its strides too, which for size-1 and size-0 dimensions
// differ from the standard ones and decide the strides of a softmax output moved back in place.
inline at::Tensor cuda_empty_like(const at::Tensor& t) {
  return at::detail::empty_strided_cuda(t.sizes(), t.strides(), t.options());
}

// Whether p can be read or written in 16-byte vectors (the kernels' vectorized paths).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// cuda_t<at::BFloat16> is __nv_bfloat16: same bits, the type kernel files use.
template <typename T>
struct CudaType {
  using type = T;
};
template <>
struct CudaType<at::Half> {
  using type = __half;
};
template <>
struct CudaType<at::BFloat16> {
  using type = __nv_bfloat16;
};
template <typename T>
using cuda_t = typename CudaType<T>::type;

template <typename T>
const cuda_t<T>* cuda_ptr(const at::Tensor& t) {
  return reinterpret_cast<const cuda_t<T>*>(t.const_data_ptr<T>());
}
template <typename T>
cuda_t<T>* cuda_mut_ptr(at::Tensor& t) {
  return reinterpret_cast<cuda_t<T>*>(t.mutable_data_ptr<T>());
}

}  // namespace fusedops
