// The baseline the planted bugs are made from: y[row] = sum(x[row, :]) in float, one threadgroup
// per row; each thread sums a strided slice, simd_sum per SIMD group, the group sums meet in
// threadgroup memory (one float per group) and SIMD group 0 adds them up. Correct as written;
// test_planted.py builds it with -DPLANTED_BUG=<n> to plant one bug of each kind:
#define MISSING_BARRIER 1     // group 0 reads the other groups' sums before they are written
#define EARLY_RETURN 2        // threads with no column leave before the barrier
#define OUT_OF_BOUNDS_READ 3  // reads one element past the row
#define UNINIT_SCRATCH 4      // group 0 reads all 32 scratch slots, written or not
#define DIVERGENT_SIMD 5      // a simd_sum that half the lanes of a SIMD group skip
#ifndef PLANTED_BUG
#define PLANTED_BUG 0
#endif
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
#if PLANTED_BUG == EARLY_RETURN
  if (tid >= p.cols) return;
#endif
  const device T* row = x + tg * p.cols;
  float acc = 0.0f;
#if PLANTED_BUG == OUT_OF_BOUNDS_READ
  for (uint i = tid; i <= p.cols; i += tg_size) {
#else
  for (uint i = tid; i < p.cols; i += tg_size) {
#endif
    acc += float(row[i]);
  }
#if PLANTED_BUG == DIVERGENT_SIMD
  if (lane < 16) acc = simd_sum(acc);  // half the lanes: the emulator wants all live lanes
#else
  acc = simd_sum(acc);
#endif
  if (lane == 0) {
    scratch[simd] = acc;
  }
#if PLANTED_BUG != MISSING_BARRIER
  threadgroup_barrier(mem_flags::mem_threadgroup);
#endif
  if (simd == 0) {
    const uint groups = (tg_size + 31) / 32;
#if PLANTED_BUG == UNINIT_SCRATCH
    acc = simd_sum(scratch[lane]);
#else
    acc = simd_sum(lane < groups ? scratch[lane] : 0.0f);
#endif
    if (lane == 0) {
      y[tg] = acc;
    }
  }
}

template [[host_name("row_sum_float")]] kernel void row_sum<float>(device const float*,
                                                                   device float*,
                                                                   constant RowSumParams&,
                                                                   threadgroup float*, uint, uint,
                                                                   uint, uint, uint);
template [[host_name("row_sum_half")]] kernel void row_sum<half>(device const half*, device float*,
                                                                 constant RowSumParams&,
                                                                 threadgroup float*, uint, uint,
                                                                 uint, uint, uint);
#if __METAL_VERSION__ >= 310
template [[host_name("row_sum_bfloat")]] kernel void row_sum<bfloat>(device const bfloat*,
                                                                     device float*,
                                                                     constant RowSumParams&,
                                                                     threadgroup float*, uint, uint,
                                                                     uint, uint, uint);
#endif
