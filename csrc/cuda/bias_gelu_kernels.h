// Launchers for the CUDA bias + GELU kernels (bias_gelu_kernels.cu). Torch-free: raw device
// pointers, row-major contiguous [rows, cols] matrices, the caller's stream. T is float, double,
// __half or __nv_bfloat16. Each returns cudaGetLastError() after its launches.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/device_info.h"
#include "common/math.h"

namespace fusedops {

// output = gelu(input + bias); bias may be null (no bias); output may be input (in place).
template <typename T>
cudaError_t bias_gelu_fwd_cuda(const T* input,  // [rows, cols]
                               const T* bias,   // [cols] or null
                               T* output,       // [rows, cols]
                               int64_t rows, int64_t cols, GeluApprox approx, const DeviceInfo& dev,
                               cudaStream_t stream);

// Bytes of device workspace bias_gelu_bwd_cuda needs to produce grad_bias, and column_sum_cuda
// (0 when rows or cols is 0, or when one block row of the kernel covers every row). The workspace
// must stay valid until the launches on `stream` have run.
template <typename T>
size_t bias_gelu_bwd_workspace_bytes(int64_t rows, int64_t cols, const DeviceInfo& dev);

// grad_input = grad_output * gelu'(input + bias) (grad_input may be grad_output); grad_bias[c] =
// sum over rows of grad_input[:, c] (fp32 sums, deterministic); output, where not null, =
// gelu(input + bias), the forward's output recomputed from the input this pass reads anyway
// (fused_mlp's recompute_activation). bias may be null; grad_bias may be null (then workspace
// may be too).
template <typename T>
cudaError_t bias_gelu_bwd_cuda(const T* grad_output,  // [rows, cols]
                               const T* input,        // [rows, cols]
                               const T* bias,         // [cols] or null
                               T* grad_input,         // [rows, cols]
                               T* grad_bias,          // [cols] or null
                               T* output,             // [rows, cols] or null
                               void* workspace,       // bias_gelu_bwd_workspace_bytes<T>()
                               int64_t rows, int64_t cols, GeluApprox approx, const DeviceInfo& dev,
                               cudaStream_t stream);

// sum[c] = sum over rows of input[:, c] (fp32 sums, deterministic): bias_gelu_bwd_cuda's grad_bias
// without the GELU, for a bias gradient alone.
template <typename T>
cudaError_t column_sum_cuda(const T* input,   // [rows, cols]
                            T* sum,           // [cols]
                            void* workspace,  // bias_gelu_bwd_workspace_bytes<T>()
                            int64_t rows, int64_t cols, const DeviceInfo& dev, cudaStream_t stream);

}  // namespace fusedops
