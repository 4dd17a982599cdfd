// Launchers for the CUDA softmax kernels (softmax_fwd.cu, softmax_bwd.cu, softmax_strided.cu).
// Torch-free so that kernel files compile fast; the host code in softmax.cpp calls these with raw
// pointers. T: float, __half, __nv_bfloat16, double. Rows are contiguous; log selects log_softmax.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/device_info.h"

namespace fusedops {

template <typename T>
cudaError_t softmax_fwd_cuda(const T* x,  // [rows, cols]
                             T* y,        // [rows, cols]
                             int64_t rows, int64_t cols, bool log, const DeviceInfo& dev,
                             cudaStream_t stream);

template <typename T>
cudaError_t softmax_bwd_cuda(const T* dy,  // [rows, cols]
                             const T* y,   // [rows, cols]
                             T* dx,        // [rows, cols]
                             int64_t rows, int64_t cols, bool log, const DeviceInfo& dev,
                             cudaStream_t stream);

// Over the middle dim of a contiguous [outer, cols, inner] (softmax_strided.cu).
template <typename T>
cudaError_t softmax_fwd_strided_cuda(const T* x, T* y, int64_t outer, int64_t cols, int64_t inner,
                                     bool log, const DeviceInfo& dev, cudaStream_t stream);

template <typename T>
cudaError_t softmax_bwd_strided_cuda(const T* dy, const T* y, T* dx, int64_t outer, int64_t cols,
                                     int64_t inner, bool log, const DeviceInfo& dev,
                                     cudaStream_t stream);

}  // namespace fusedops
