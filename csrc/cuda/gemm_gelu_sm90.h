// act = gelu_erf(x @ w.T + bias) in one Hopper GEMM (CUTLASS 3, sm_90a), the erf GELU in its
// epilogue: fused_mlp's exact-GELU fc1 for inference. Torch-free: raw device pointers, row-major
// contiguous matrices, the caller's stream. T is __half or __nv_bfloat16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/device_info.h"

namespace fusedops {

// Whether this build holds the kernel: compiled for sm_90a with CUTLASS's headers found (setup.py
// and CMakeLists.txt decide; elsewhere gemm_gelu_sm90 always returns false). It runs on
// compute capability 9.0 only.
bool gemm_gelu_sm90_built();

// Enqueues act = gelu_erf(x @ w.T + bias) (fp32 accumulation and epilogue); false, with nothing
// enqueued, where the kernel can't take the problem (not built, in or hidden not a multiple of 8,
// pointers not 16-byte aligned).
template <typename T>
bool gemm_gelu_sm90(const T* x,     // [rows, in]
                    const T* w,     // [hidden, in]
                    const T* bias,  // [hidden] or null
                    T* act,         // [rows, hidden]
                    int64_t rows, int64_t in, int64_t hidden, const DeviceInfo& dev,
                    cudaStream_t stream);

}  // namespace fusedops
