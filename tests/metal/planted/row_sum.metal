// The baseline the planted bugs are made from: y[row] = sum(x[row, :]) in float, one threadgroup
// per row; each thread sums a strided slice, simd_sum per SIMD group, the group sums meet in
// threadgroup memory (one float per group) and SIMD group 0 adds them up. Correct as written.
#include <metal_stdlib>

#include "params.h"
using namespace metal;

template <typename T>
kernel void row_sum(device const T* x [[buffer(0)]],  // [rows, cols]
                    device float* y [[buffer(1)]],    // [rows]
                    constant RowSumParams& p [[buffer(2)]],
                    threadgroup float* scratch [[threadgroup(0)]],  // [tg_size / 32]
                    uint tg [[threadgroup_position_in_grid]],
                    uint tid [[thread_position_in_threadgroup]],
                    uint tg_size [[threads_per_threadgroup]],
                    uint lane [[thread_index_in_simdgroup]],
                    uint simd [[simdgroup_index_in_threadgroup]]) {
  const device T* row = x + tg * p.cols;
  float acc = 0.0f;
  for (uint i = tid; i < p.cols; i += tg_size) {
    acc += float(row[i]);
  }
  acc = simd_sum(acc);
  if (lane == 0) {
    scratch[simd] = acc;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (simd == 0) {
    const uint groups = (tg_size + 31) / 32;
    acc = simd_sum(lane < groups ? scratch[lane] : 0.0f);
    if (lane == 0) {
      y[tg] = acc;
    }
  }
}

template [[host_name("row_sum_float")]] kernel void row_sum<float>(
    device const float*, device float*, constant RowSumParams&, threadgroup float*, uint, uint,
    uint, uint, uint);
template [[host_name("row_sum_half")]] kernel void row_sum<half>(
    device const half*, device float*, constant RowSumParams&, threadgroup float*, uint, uint,
    uint, uint, uint);
#if __METAL_VERSION__ >= 310
template [[host_name("row_sum_bfloat")]] kernel void row_sum<bfloat>(
    device const bfloat*, device float*, constant RowSumParams&, threadgroup float*, uint, uint,
    uint, uint, uint);
#endif
