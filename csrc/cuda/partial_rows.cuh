// Column sums of partial rows, for the backward kernels that reduce over rows (the norms'
// dweight and dbias, bias_gelu's dbias): each block (or team) writes one fp32 (fp64) partial row,
// then sum_kernel adds them in a fixed order: the same bits every run, no atomics.
//   out[c] = sum over r < parts of part[r * ld + c], cast to W   (ld: whole 4-column groups)
// A block is lanes x slices = kThreads threads: lanes 4-column groups side by side, slices
// threads down the parts, each adding every slices-th row; the slices' sums are then added as a
// tree within each warp (shuffles) and the warps' in turn.
// The partials were just written and sit in L2, so the time is load latency: slices are many
// enough that a thread adds at most kRowsPerThread parts, all its loads in flight at once. H100,
// bf16, % of copy (two rounds), against 8 parts per thread in two rounds of loads and the slices
// added in series with compensation (6.6 us of bias_gelu's 16384x4096 backward, 5% of it):
// bias_gelu 16384x4096 92.5-92.6 -> 93.0-93.3, layer_norm 8192x8192 90.2-90.8 -> 91.1-91.2, its
// 4096x768 kernel-only 12.5-13.0 -> 11.9-12.0 us. 4 parts per thread (up to twice the blocks)
// lost 1.3-1.8 points to 8 at layer_norm 16384x4096 (264 parts of two outputs), though it was
// 0.4-1.6 us faster at 65536x768.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/kernel_registry.h"
#include "common/launch.h"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "cuda/sm90.cuh"

namespace fusedops {
namespace partial_rows {

constexpr int kThreads = 256;
constexpr int kMinSlices = 8, kMaxSlices = kThreads;
constexpr int kRowsPerThread = 8;

inline int slices_for(int64_t parts) {
  int s = kMinSlices;
  while (s < kMaxSlices && int64_t(s) * kRowsPerThread < parts) s *= 2;
  return s;
}

// The row stride of a partial buffer: whole 4-column groups, so that every group is one
// aligned load.
inline int64_t ld(int64_t cols) { return ceil_div(cols, 4) * 4; }

// blockIdx.y picks (part0, out0) or (part1, out1). blockDim: (lanes, slices).
template <typename A, typename W>
__global__ void __launch_bounds__(kThreads)
    sum_kernel(const A* part0, W* out0, const A* part1, W* out1, int64_t parts, int64_t ld,
               int64_t cols) {
  sm90::grid_dependency_wait();
  using Quad = Pack<A, 4>;
  constexpr int kWarps = kThreads / 32;
  __shared__ Quad red[kWarps][kThreads / kMinSlices];  // [warp][lane]: each warp's sums
  const int lanes = blockDim.x, slices = blockDim.y;
  const int tid = threadIdx.y * lanes + threadIdx.x;
  const A* part = blockIdx.y == 0 ? part0 : part1;
  W* out = blockIdx.y == 0 ? out0 : out1;
  for (int64_t tile = blockIdx.x; tile * lanes * 4 < cols; tile += gridDim.x) {
    const int64_t c = (tile * lanes + threadIdx.x) * 4;
    Quad s{};
    // The last group of a row whose cols is not a multiple of 4 reads only its written columns
    // (the padding is never initialized).
    const int valid = cols - c < 4 ? int(cols - c) : 4;
    if (valid == 4) {
#pragma unroll kRowsPerThread  // every load of a thread in flight at once
      for (int64_t r = threadIdx.y; r < parts; r += slices) {
        const Quad v = load_pack<A, 4>(part + r * ld + c);
#pragma unroll
        for (int j = 0; j < 4; ++j) s.v[j] += v.v[j];
      }
    } else if (valid > 0) {
      for (int64_t r = threadIdx.y; r < parts; r += slices) {
        for (int j = 0; j < valid; ++j) s.v[j] += part[r * ld + c + j];
      }
    }
    // A warp holds 32 / lanes slices of each lane's columns: xor offsets >= lanes pair them.
    for (int offset = 16; offset >= lanes; offset /= 2) {
      const Quad o = shuffle_xor<32>(s, offset);
#pragma unroll
      for (int j = 0; j < 4; ++j) s.v[j] += o.v[j];
    }
    if (tid % 32 < lanes) red[tid / 32][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
      Quad sum = red[0][threadIdx.x];
      for (int w = 1; w < kWarps; ++w) {
#pragma unroll
        for (int j = 0; j < 4; ++j) sum.v[j] += red[w][threadIdx.x].v[j];
      }
      for (int j = 0; j < 4 && c + j < cols; ++j) out[c + j] = from_acc<W>(sum.v[j]);
    }
    __syncthreads();  // red is rewritten by the next tile
  }
}

// out0 (and out1, when not null) from parts partial rows of stride ld.
template <typename A, typename W>
cudaError_t sum(const A* part0, W* out0, const A* part1, W* out1, int64_t parts, int64_t ld,
                int64_t cols, const DeviceInfo& dev, cudaStream_t stream) {
  const int slices = slices_for(parts), lanes = kThreads / slices;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(cols, lanes * 4), 1 << 20)),
                  out1 != nullptr ? 2u : 1u);
  return launch(sum_kernel<A, W>, grid, dim3(lanes, slices), dev, stream, part0, out0, part1, out1,
                parts, ld, cols);
}

}  // namespace partial_rows
}  // namespace fusedops
