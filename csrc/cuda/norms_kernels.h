// Launchers for the layer_norm / rms_norm CUDA kernels (norms_kernels.cu). Torch-free: raw
// pointers, int64 sizes, the device's DeviceInfo and a stream. kRms selects rms_norm (no mean,
// no bias). T is float, __half, __nv_bfloat16 or double; W (weight/bias) is T, or float for
// __half / __nv_bfloat16. Statistics, accumulation and dweight/dbias partials are NormAcc<T>:
// fp64 for double, else fp32. Every launcher returns the launch's cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/device_info.h"

namespace fusedops {

template <typename T>
using NormAcc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T, typename W>
struct NormFwdArgs {
  const T* x;        // [rows, cols]
  const W* w;        // [cols] or null
  const W* b;        // [cols] or null (always null for rms_norm)
  T* y;              // [rows, cols]
  NormAcc<T>* mean;  // [rows] (null for rms_norm)
  NormAcc<T>* rstd;  // [rows]
  int64_t rows;      // > 0
  int64_t cols;      // > 0
  NormAcc<T> eps;
};

// y = (x - mean) * rstd * w + b row by row; writes mean and rstd.
template <typename T, typename W, bool kRms>
cudaError_t norm_fwd_cuda(const NormFwdArgs<T, W>& a, const DeviceInfo& info, cudaStream_t stream);

template <typename T, typename W>
struct NormBwdArgs {
  const T* dy;             // [rows, cols]
  const T* x;              // [rows, cols]
  const NormAcc<T>* mean;  // [rows] (null for rms_norm)
  const NormAcc<T>* rstd;  // [rows]
  const W* w;              // [cols] or null
  T* dx;                   // [rows, cols] or null when not wanted
  W* dw;                   // [cols] or null when not wanted
  W* db;                   // [cols] or null when not wanted (always null for rms_norm)
  int64_t rows;            // > 0
  int64_t cols;            // > 0
  float inv_cols = 0.f;    // 1 / cols: norm_bwd_cuda sets it (kernels read it as a parameter)
};

// NormAcc<T> elements of scratch norm_bwd_cuda needs for these arguments (0 when dw and db are
// null, or when one block or cluster covers every row and writes them itself).
template <typename T, typename W, bool kRms>
int64_t norm_bwd_workspace_size(const NormBwdArgs<T, W>& a, const DeviceInfo& info);

// dx, and dw/db through per-block partial rows in `workspace` (norm_bwd_workspace_size
// elements, no initial contents needed) summed in a fixed order: bitwise reproducible.
template <typename T, typename W, bool kRms>
cudaError_t norm_bwd_cuda(const NormBwdArgs<T, W>& a, NormAcc<T>* workspace, const DeviceInfo& info,
                          cudaStream_t stream);

}  // namespace fusedops
