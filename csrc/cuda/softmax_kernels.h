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

// Many short rows of x, a contiguous [outer, inner, cols], a thread per row (softmax_strided.cu):
// a block stages the rows of up to softmax_tile_rows() positions in shared memory (a padded
// tile), and writes y either as x's layout or, `transposed`, as a contiguous [outer, cols, inner]
// (a dim last in memory but not in the result: the channels of a channels_last [N, C, H, W], as
// torch returns it). Either way one read, one write. 0: the rows are too long for a tile (or
// there are fewer than 32 per outer index, which would leave a warp's threads idle).
inline int softmax_tile_rows(int64_t cols, int64_t inner, int elem_bytes) {
  constexpr int64_t kTileBytes = 48 << 10;  // no opt-in needed
  const int64_t pitch = cols | 1;           // odd: a thread per row, no bank conflicts
  if (cols < 2 || cols > 256 || inner < 32) return 0;
  for (int rows = 128; rows >= 32; rows /= 2) {
    if (rows * pitch * elem_bytes <= kTileBytes) return rows;
  }
  return 0;
}

template <typename T>
cudaError_t softmax_fwd_tile_cuda(const T* x, T* y, int64_t outer, int64_t cols, int64_t inner,
                                  bool transposed, bool log, const DeviceInfo& dev,
                                  cudaStream_t stream);

template <typename T>
cudaError_t softmax_bwd_strided_cuda(const T* dy, const T* y, T* dx, int64_t outer, int64_t cols,
                                     int64_t inner, bool log, const DeviceInfo& dev,
                                     cudaStream_t stream);

}  // namespace fusedops
