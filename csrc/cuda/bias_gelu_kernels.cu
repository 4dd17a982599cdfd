// CUDA bias + GELU over row-major [rows, cols] (bias [cols]), forward and backward, one pass.
// A block is bx x by threads: bx threads span 16-byte packs of a row segment (one warp wide at
// most), by rows at a time; each thread keeps its bias pack in registers and walks kUnroll rows
// with all loads issued before the math. Scalar packs (VEC=1) cover odd or unaligned sizes.
// Math in fp32 (fp64 for double). dbias: per-block fp32 column partials in a workspace, then
// partial_rows::sum adds them in a fixed order: deterministic, no atomics; a grid of one block row
// writes dbias itself. (Adding 8 block rows' sums in a cluster first cut the partial rows 8x,
// but its barriers cost the main kernel 7% and the sum's time hardly moved: H100, bf16
// 16384x4096 93.2 -> 88.5% of copy, bench/results/h100-bias_gelu-bwd-cluster-sums-rejected.txt.)
// The same backward body without the GELU is a column sum (a bias gradient alone).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "common/device_info.h"
#include "common/kernel_registry.h"
#include "common/launch.h"
#include "common/math.h"
#include "common/vec.cuh"
#include "cuda/bias_gelu_kernels.h"
#include "cuda/partial_rows.cuh"
#include "cuda/sm90.cuh"

namespace fusedops {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlockX = 32;  // packs per row segment: one warp, 512 contiguous bytes
constexpr int kUnroll = 4;      // rows per thread whose loads are in flight together
// Backward: rows per thread when there is enough work. The partials cost 8 bytes of extra
// traffic per column per block row: ~2% of the 6 bytes/element the kernel must move at 8 rows,
// but twice the blocks of 16 rows won more (H100, % of copy, 16384x4096 / 8192x8192 bf16 91.5 /
// 91.2 -> 92.7 / 92.8, fp32 95.3 -> 96.1; longer rows within 0.3); 32 rows lost 1-4 points, 4
// rows 0.5-1 (16-bit).
constexpr int kBwdRowsPerThread = 8;
constexpr int kBlocksPerSm = 8;  // "one wave" for kThreads-thread blocks at full occupancy
constexpr int64_t kMaxGridY = 65535;

struct Tiling {
  dim3 block, grid;
};

// rows_per_thread: rows one thread walks when the grid is large enough to fill the device.
Tiling make_tiling(int64_t rows, int64_t packs_per_row, int64_t rows_per_thread,
                   const DeviceInfo& dev) {
  int bx = 1;
  while (bx < kMaxBlockX && bx < packs_per_row) bx *= 2;
  const int by = kThreads / bx;
  const int64_t gx = ceil_div(packs_per_row, bx);
  const int64_t wave = int64_t(dev.sm_count) * kBlocksPerSm;
  // Fewer rows per thread (down to kUnroll) when that is what it takes to fill a wave.
  const int64_t gy_fill = std::min(ceil_div(rows, by * kUnroll), ceil_div(wave, gx));
  const int64_t gy = std::min(std::max(ceil_div(rows, by * rows_per_thread), gy_fill), kMaxGridY);
  return {dim3(bx, by),
          dim3(static_cast<unsigned>(gx), static_cast<unsigned>(std::max<int64_t>(gy, 1)))};
}

// The backward's tiling. Where one block row covers every row at kBwdRowsPerThread rows per
// thread, it runs alone, even where more block rows would fill more of a wave: its column sums
// are then dbias itself, without partial rows or the sum's launch (small batches, e.g. an MLP's
// bias gradient over a few tokens).
Tiling bwd_tiling(int64_t rows, int64_t packs_per_row, const DeviceInfo& dev) {
  Tiling t = make_tiling(rows, packs_per_row, kBwdRowsPerThread, dev);
  if (rows <= int64_t(t.block.y) * kBwdRowsPerThread) t.grid.y = 1;
  return t;
}

template <typename T, int VEC>
bool use_vec(int64_t cols, std::initializer_list<const void*> ptrs) {
  if (VEC == 1 || cols % VEC != 0) return false;
  for (const void* p : ptrs) {
    if (p != nullptr && !is_aligned16(p)) return false;
  }
  return true;
}

// GELU (kGrad: GELU') in acc_t<T>: fp16/bf16 take math.h's branch-free erf, whose error (< 2e-5
// relative) their rounding hides and which needs fewer instructions than erff (this kernel was
// issue-bound with erff on an H200), and its sigmoid form of the tanh GELU (H100, bf16 forward
// kernel-only 4096x1024 63.5 -> 68.3% of copy, longer rows +0.3-0.7 points; the backward, DRAM-
// bound, within 0.4); fp32 and fp64 keep erff / erf and tanhf / tanh.
template <typename T, GeluApprox kApprox, bool kGrad>
__device__ __forceinline__ acc_t<T> gelu_of(acc_t<T> v) {
  if constexpr (kApprox == GeluApprox::kNone && sizeof(T) == 2) {
    return kGrad ? gelu_erf_grad_fast(v) : gelu_erf_fast(v);
  } else if constexpr (kApprox == GeluApprox::kTanh && sizeof(T) == 2) {
    return kGrad ? gelu_tanh_grad_fast(v) : gelu_tanh_fast(v);
  } else {
    return kGrad ? gelu_grad<kApprox>(v) : gelu<kApprox>(v);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void load_bias(const T* bias, int64_t col, acc_t<T> (&b)[VEC]) {
  if (bias != nullptr) {
    widen(load_pack<T, VEC>(bias + col), b);
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) b[j] = acc_t<T>(0);
  }
}

// y may be x (written in place: each element is read, then written, by the same thread), so
// neither is __restrict__.
template <typename T, int VEC, GeluApprox kApprox>
__global__ void __launch_bounds__(kThreads)
    bias_gelu_fwd_kernel(const T* x,                  // [rows, cols]
                         const T* __restrict__ bias,  // [cols] or null
                         T* y,                        // [rows, cols]
                         int64_t rows, int64_t cols) {
  sm90::grid_dependency_wait();
  const int64_t col = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  if (col >= cols) return;  // no barriers below
  acc_t<T> b[VEC];
  load_bias<T, VEC>(bias, col, b);
  const int64_t stride = int64_t(gridDim.y) * blockDim.y;
  for (int64_t r0 = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r0 < rows;
       r0 += stride * kUnroll) {
    Pack<T, VEC> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t r = r0 + u * stride;
      if (r < rows) v[u] = load_pack<T, VEC>(x + r * cols + col);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t r = r0 + u * stride;
      if (r < rows) {
        acc_t<T> xv[VEC], out[VEC];
        widen(v[u], xv);
#pragma unroll
        for (int j = 0; j < VEC; ++j) out[j] = gelu_of<T, kApprox, false>(xv[j] + b[j]);
        store_pack<T, VEC>(y + r * cols + col, pack_from_acc<T, VEC>(out));
      }
    }
  }
}

// The backward's body. Where dbias is not null, this block's column sums of dx go to
// partial[blockIdx.y * ld + col], or straight to dbias where the grid is one block row. kOutput:
// the forward's output gelu(x + bias) goes to y too (the same GELU terms: the compiler shares them
// between the value and its derivative); a template parameter, not a test of y, since the kernel
// that may write y needs 101 registers where the one that never does needs 80 (sm_90, bf16):
// three blocks per SM instead of two. dx may be dy (written in place: each element is read, then
// written, by the same thread), so neither is __restrict__. kSumOnly: dx = dy, of which only the
// column sums are made (x, bias, dx and y unused).
template <typename T, int VEC, GeluApprox kApprox, bool kSumOnly, bool kOutput>
__device__ __forceinline__ void bias_gelu_bwd_rows(
    const T* dy,                     // [rows, cols]
    const T* __restrict__ x,         // [rows, cols]
    const T* __restrict__ bias,      // [cols] or null
    T* dx,                           // [rows, cols]
    T* dbias,                        // [cols] or null
    T* __restrict__ y,               // [rows, cols] or null
    acc_t<T>* __restrict__ partial,  // [gridDim.y, ld]; unused where gridDim.y is 1
    int64_t ld, int64_t rows, int64_t cols) {
  using Acc = acc_t<T>;
  __shared__ Acc red[kThreads * VEC];  // [blockDim.y][blockDim.x * VEC]
  const int64_t col = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  Acc sum[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) sum[j] = Acc(0);
  // Threads past the last column still take part in the block reduction below.
  if (col < cols) {
    Acc b[VEC];
    if constexpr (!kSumOnly) load_bias<T, VEC>(bias, col, b);
    const int64_t stride = int64_t(gridDim.y) * blockDim.y;
    for (int64_t r0 = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r0 < rows;
         r0 += stride * kUnroll) {
      Pack<T, VEC> g[kUnroll], v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = r0 + u * stride;
        if (r < rows) {
          g[u] = load_pack<T, VEC>(dy + r * cols + col);
          if constexpr (!kSumOnly) v[u] = load_pack<T, VEC>(x + r * cols + col);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = r0 + u * stride;
        if (r < rows) {
          Acc d[VEC], xv[VEC];
          widen(g[u], d);
          if constexpr (!kSumOnly) {
            widen(v[u], xv);
            if constexpr (kOutput) {
              Acc out[VEC];
#pragma unroll
              for (int j = 0; j < VEC; ++j) {
                out[j] = gelu_of<T, kApprox, false>(xv[j] + b[j]);
                d[j] *= gelu_of<T, kApprox, true>(xv[j] + b[j]);
              }
              store_pack<T, VEC>(y + r * cols + col, pack_from_acc<T, VEC>(out));
            } else {
#pragma unroll
              for (int j = 0; j < VEC; ++j) d[j] *= gelu_of<T, kApprox, true>(xv[j] + b[j]);
            }
          }
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            sum[j] += d[j];  // unrounded: dbias sums the exact per-element gradients
          }
          if constexpr (!kSumOnly) {
            store_pack<T, VEC>(dx + r * cols + col, pack_from_acc<T, VEC>(d));
          }
        }
      }
    }
  }
  if (dbias == nullptr) return;  // uniform over the grid: no thread skips a barrier alone
  // The partial-row sum may launch now (it waits for this grid to complete). H200, kernel-only,
  // µs: bf16 / fp32 4096x1024 12.3 / 17.9 -> 11.9 / 17.5, bf16 4096x4096 32.2 -> 31.7.
  sm90::launch_dependents();
  const int seg = blockDim.x * VEC;  // columns this block covers
#pragma unroll
  for (int j = 0; j < VEC; ++j) red[threadIdx.y * seg + threadIdx.x * VEC + j] = sum[j];
  __syncthreads();
  for (int c = threadIdx.y * blockDim.x + threadIdx.x; c < seg; c += kThreads) {
    Acc s = Acc(0);
    for (int ty = 0; ty < int(blockDim.y); ++ty) s += red[ty * seg + c];  // fixed order
    const int64_t gcol = int64_t(blockIdx.x) * seg + c;
    if (gcol >= cols) continue;
    if (gridDim.y == 1) {
      dbias[gcol] = from_acc<T>(s);
    } else {
      partial[int64_t(blockIdx.y) * ld + gcol] = s;
    }
  }
}

template <typename T, int VEC, GeluApprox kApprox, bool kOutput>
__global__ void __launch_bounds__(kThreads)
    bias_gelu_bwd_kernel(const T* dy, const T* __restrict__ x, const T* __restrict__ bias, T* dx,
                         T* dbias, T* __restrict__ y, acc_t<T>* __restrict__ partial, int64_t ld,
                         int64_t rows, int64_t cols) {
  sm90::grid_dependency_wait();
  bias_gelu_bwd_rows<T, VEC, kApprox, false, kOutput>(dy, x, bias, dx, dbias, y, partial, ld, rows,
                                                      cols);
}

// A bias gradient alone (fused_mlp's db2 where no epilogue sums it):
// the column sums of dy.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    column_sum_kernel(const T* dy, T* sum, acc_t<T>* __restrict__ partial, int64_t ld, int64_t rows,
                      int64_t cols) {
  sm90::grid_dependency_wait();
  bias_gelu_bwd_rows<T, VEC, GeluApprox::kNone, true, false>(dy, nullptr, nullptr, nullptr, sum,
                                                             nullptr, partial, ld, rows, cols);
}

template <typename T, int VEC, GeluApprox kApprox>
cudaError_t launch_fwd(const T* x, const T* bias, T* y, int64_t rows, int64_t cols,
                       const DeviceInfo& dev, cudaStream_t stream) {
  const Tiling t = make_tiling(rows, cols / VEC, kUnroll, dev);
  return launch(bias_gelu_fwd_kernel<T, VEC, kApprox>, t.grid, t.block, dev, stream, x, bias, y,
                rows, cols);
}

template <typename T, int VEC, GeluApprox kApprox>
cudaError_t launch_bwd(const T* dy, const T* x, const T* bias, T* dx, T* dbias, T* y,
                       acc_t<T>* partial, int64_t rows, int64_t cols, const DeviceInfo& dev,
                       cudaStream_t stream) {
  const Tiling t = bwd_tiling(rows, cols / VEC, dev);
  const int64_t ld = partial_rows::ld(cols);
  const auto kernel = y != nullptr ? bias_gelu_bwd_kernel<T, VEC, kApprox, true>
                                   : bias_gelu_bwd_kernel<T, VEC, kApprox, false>;
  const cudaError_t err = launch(kernel, t.grid, t.block, dev, stream, dy, x, bias, dx, dbias, y,
                                 partial, ld, rows, cols);
  if (err != cudaSuccess || dbias == nullptr || t.grid.y == 1) return err;
  return partial_rows::sum<acc_t<T>, T>(partial, dbias, nullptr, nullptr, t.grid.y, ld, cols, dev,
                                        stream);
}

template <typename T, int VEC>
cudaError_t launch_column_sum(const T* x, T* sum, acc_t<T>* partial, int64_t rows, int64_t cols,
                              const DeviceInfo& dev, cudaStream_t stream) {
  const Tiling t = bwd_tiling(rows, cols / VEC, dev);
  const int64_t ld = partial_rows::ld(cols);
  const cudaError_t err = launch(column_sum_kernel<T, VEC>, t.grid, t.block, dev, stream, x, sum,
                                 partial, ld, rows, cols);
  if (err != cudaSuccess || t.grid.y == 1) return err;
  return partial_rows::sum<acc_t<T>, T>(partial, sum, nullptr, nullptr, t.grid.y, ld, cols, dev,
                                        stream);
}

}  // namespace

template <typename T>
cudaError_t bias_gelu_fwd_cuda(const T* input, const T* bias, T* output, int64_t rows, int64_t cols,
                               GeluApprox approx, const DeviceInfo& dev, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  constexpr int kVec = kVec16<T>;
  const bool vec = use_vec<T, kVec>(cols, {input, bias, output});
  if (approx == GeluApprox::kTanh) {
    return vec ? launch_fwd<T, kVec, GeluApprox::kTanh>(input, bias, output, rows, cols, dev,
                                                        stream)
               : launch_fwd<T, 1, GeluApprox::kTanh>(input, bias, output, rows, cols, dev, stream);
  }
  return vec ? launch_fwd<T, kVec, GeluApprox::kNone>(input, bias, output, rows, cols, dev, stream)
             : launch_fwd<T, 1, GeluApprox::kNone>(input, bias, output, rows, cols, dev, stream);
}

template <typename T>
size_t bias_gelu_bwd_workspace_bytes(int64_t rows, int64_t cols, const DeviceInfo& dev) {
  if (rows == 0 || cols == 0) return 0;
  // The scalar path has the same grid.y as the vector one only by accident: size for the larger
  // (nothing where both are one block row, which writes the sums itself).
  int64_t gy = std::max(bwd_tiling(rows, ceil_div(cols, kVec16<T>), dev).grid.y,
                        bwd_tiling(rows, cols, dev).grid.y);
  if (gy == 1) gy = 0;
  return static_cast<size_t>(gy * partial_rows::ld(cols)) * sizeof(acc_t<T>);
}

template <typename T>
cudaError_t bias_gelu_bwd_cuda(const T* grad_output, const T* input, const T* bias, T* grad_input,
                               T* grad_bias, T* output, void* workspace, int64_t rows, int64_t cols,
                               GeluApprox approx, const DeviceInfo& dev, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  constexpr int kVec = kVec16<T>;
  auto* partial = static_cast<acc_t<T>*>(workspace);
  const bool vec = use_vec<T, kVec>(cols, {grad_output, input, bias, grad_input, output});
  if (approx == GeluApprox::kTanh) {
    return vec ? launch_bwd<T, kVec, GeluApprox::kTanh>(grad_output, input, bias, grad_input,
                                                        grad_bias, output, partial, rows, cols, dev,
                                                        stream)
               : launch_bwd<T, 1, GeluApprox::kTanh>(grad_output, input, bias, grad_input,
                                                     grad_bias, output, partial, rows, cols, dev,
                                                     stream);
  }
  return vec ? launch_bwd<T, kVec, GeluApprox::kNone>(grad_output, input, bias, grad_input,
                                                      grad_bias, output, partial, rows, cols, dev,
                                                      stream)
             : launch_bwd<T, 1, GeluApprox::kNone>(grad_output, input, bias, grad_input, grad_bias,
                                                   output, partial, rows, cols, dev, stream);
}

template <typename T>
cudaError_t column_sum_cuda(const T* input, T* sum, void* workspace, int64_t rows, int64_t cols,
                            const DeviceInfo& dev, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  constexpr int kVec = kVec16<T>;
  auto* partial = static_cast<acc_t<T>*>(workspace);
  return use_vec<T, kVec>(cols, {input})
             ? launch_column_sum<T, kVec>(input, sum, partial, rows, cols, dev, stream)
             : launch_column_sum<T, 1>(input, sum, partial, rows, cols, dev, stream);
}

#define FUSEDOPS_INSTANTIATE_BIAS_GELU(T)                                                          \
  template cudaError_t bias_gelu_fwd_cuda<T>(const T*, const T*, T*, int64_t, int64_t, GeluApprox, \
                                             const DeviceInfo&, cudaStream_t);                     \
  template size_t bias_gelu_bwd_workspace_bytes<T>(int64_t, int64_t, const DeviceInfo&);           \
  template cudaError_t bias_gelu_bwd_cuda<T>(const T*, const T*, const T*, T*, T*, T*, void*,      \
                                             int64_t, int64_t, GeluApprox, const DeviceInfo&,      \
                                             cudaStream_t);                                        \
  template cudaError_t column_sum_cuda<T>(const T*, T*, void*, int64_t, int64_t,                   \
                                          const DeviceInfo&, cudaStream_t);

FUSEDOPS_INSTANTIATE_BIAS_GELU(float)
FUSEDOPS_INSTANTIATE_BIAS_GELU(double)
FUSEDOPS_INSTANTIATE_BIAS_GELU(__half)
FUSEDOPS_INSTANTIATE_BIAS_GELU(__nv_bfloat16)
#undef FUSEDOPS_INSTANTIATE_BIAS_GELU

}  // namespace fusedops
