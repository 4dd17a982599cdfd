// A thread per softmax. Down the middle dim of a contiguous [outer, cols, inner] tensor (a dim
// with elements after it in memory: the channels of [N, C, H, W]), read in place: a thread owns
// VEC adjacent inner positions of one outer index, a column of cols elements each, `inner` apart,
// so a warp's loads at each step are contiguous; three passes over the column (max, sum, write;
// backward: sum, write), the later ones mostly from L2. And many short rows through a tile in
// shared memory (forward): written back as rows, or into torch's layout for a dim last in memory
// only. The numerics of the online kernels (softmax_fwd.cu, softmax_bwd.cu).
#include <algorithm>
#include <initializer_list>

#include "cuda/softmax_kernels.h"
#include "cuda/softmax_rows.cuh"

namespace fusedops {
namespace {

using namespace softmax_rows;

constexpr int kStridedThreads = 256;
constexpr int kStridedBlocksPerSm = 8;  // a wave of full occupancy, grid-stride beyond it

struct Columns {
  int64_t outer, cols, inner;
  __host__ __device__ int64_t count(int vec) const { return outer * (inner / vec); }
};

// f(j, u) for j < n with u = j % kParts, a compile-time index: each sum a thread makes down its
// column or row goes into kParts interleaved partial sums, added pairwise at the end (sum_parts).
// A serial fp32 sum of n terms errs by up to ~n / 2 ulp: a float32 emulation of softmaxes of 1024
// elements erred by 3.1e-6 (scaled) where the tolerance rule allows twice torch's 5.3e-7 plus
// 1e-6, and rows of 200 failed it on an H100; four parts err by 1.3e-6 at 1024. fp16 / bf16
// results round that error away: one part, half the registers.
template <typename T>
constexpr int kSumParts = sizeof(T) >= 4 ? 4 : 1;

template <int kParts, typename F>
__device__ __forceinline__ void for_each_part(int64_t n, F&& f) {
  int64_t j = 0;
  for (; j + kParts <= n; j += kParts) {
#pragma unroll
    for (int u = 0; u < kParts; ++u) f(j + u, u);
  }
#pragma unroll
  for (int u = 0; u < kParts; ++u) {
    if (j + u < n) f(j + u, u);
  }
}

template <typename A, int kParts>
__device__ __forceinline__ A sum_parts(const A (&part)[kParts]) {
  if constexpr (kParts == 1) {
    return part[0];
  } else {
    static_assert(kParts == 4, "pairwise over four parts");
    return (part[0] + part[1]) + (part[2] + part[3]);
  }
}

// f(base) for each column (VEC-wide) this thread owns, grid-stride; base: its first element.
template <int VEC, typename F>
__device__ __forceinline__ void for_each_column(const Columns& c, F&& f) {
  const int64_t packs = c.inner / VEC, n = c.count(VEC);
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    f(idx / packs * c.cols * c.inner + idx % packs * VEC);
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kStridedThreads)
    softmax_fwd_strided_kernel(const T* __restrict__ x, T* __restrict__ y, Columns c, bool log) {
  sm90::grid_dependency_wait();
  using A = acc_t<T>;
  for_each_column<VEC>(c, [&](int64_t base) {
    A m[VEC], part[VEC][kSumParts<T>] = {};
#pragma unroll
    for (int k = 0; k < VEC; ++k) m[k] = -INFINITY;
#pragma unroll 4
    for (int64_t j = 0; j < c.cols; ++j) {
      const Pack<T, VEC> v = load_pack<T, VEC>(x + base + j * c.inner);
#pragma unroll
      for (int k = 0; k < VEC; ++k) m[k] = acc_max(m[k], to_acc(v.v[k]));
    }
    for_each_part<kSumParts<T>>(c.cols, [&](int64_t j, int u) {
      const Pack<T, VEC> v = load_pack<T, VEC>(x + base + j * c.inner);
#pragma unroll
      for (int k = 0; k < VEC; ++k) part[k][u] += acc_exp(to_acc(v.v[k]) - exp_ref(m[k]));
    });
    A post[VEC];  // log_softmax: log(sum); softmax: 1 / sum
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const A s = sum_parts(part[k]);
      post[k] = log ? acc_log(s) : A(1) / s;
    }
#pragma unroll 4
    for (int64_t j = 0; j < c.cols; ++j) {
      const Pack<T, VEC> v = load_pack<T, VEC>(x + base + j * c.inner);
      Pack<T, VEC> out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A d = to_acc(v.v[k]) - m[k];
        out.v[k] = from_acc<T>(log ? d - post[k] : acc_exp(d) * post[k]);
      }
      store_pack<T, VEC>(y + base + j * c.inner, out);
    }
  });
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kStridedThreads)
    softmax_bwd_strided_kernel(const T* __restrict__ dy, const T* __restrict__ y,
                               T* __restrict__ dx, Columns c, bool log) {
  sm90::grid_dependency_wait();
  using A = acc_t<T>;
  for_each_column<VEC>(c, [&](int64_t base) {
    A part[VEC][kSumParts<T>] = {}, s[VEC];
    for_each_part<kSumParts<T>>(c.cols, [&](int64_t j, int u) {
      const Pack<T, VEC> g = load_pack<T, VEC>(dy + base + j * c.inner);
      const Pack<T, VEC> o = load_pack<T, VEC>(y + base + j * c.inner);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        part[k][u] += log ? to_acc(g.v[k]) : to_acc(g.v[k]) * to_acc(o.v[k]);
      }
    });
#pragma unroll
    for (int k = 0; k < VEC; ++k) s[k] = sum_parts(part[k]);
#pragma unroll 4
    for (int64_t j = 0; j < c.cols; ++j) {
      const Pack<T, VEC> g = load_pack<T, VEC>(dy + base + j * c.inner);
      const Pack<T, VEC> o = load_pack<T, VEC>(y + base + j * c.inner);
      Pack<T, VEC> out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A gk = to_acc(g.v[k]), ok = to_acc(o.v[k]);
        out.v[k] = from_acc<T>(log ? gk - acc_exp(ok) * s[k] : ok * (gk - s[k]));
      }
      store_pack<T, VEC>(dx + base + j * c.inner, out);
    }
  });
}

// A block per tile of up to blockDim.x rows of x, a contiguous [outer, inner, cols] (grid-stride
// over the tiles): the tile, contiguous in x, is staged in shared memory with a padded pitch
// (16-byte loads where VEC > 1), then a thread per row makes the strided kernel's three passes
// over it there. kTransposed: each thread writes its row's elements `inner` apart into y, a
// contiguous [outer, cols, inner] (a warp's stores at each step are contiguous); else the rows go
// back into the tile and the block stores it as x's layout (16-byte stores where VEC > 1).
template <typename T, int VEC, bool kTransposed>
__global__ void __launch_bounds__(128)
    softmax_fwd_tile_kernel(const T* __restrict__ x, T* __restrict__ y, Columns c, int pitch,
                            unsigned inv_cols, bool log) {
  sm90::grid_dependency_wait();
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char staged[];
  T* tile = reinterpret_cast<T*>(staged);
  const int rows = blockDim.x, cols = static_cast<int>(c.cols);
  const int64_t tiles_per_outer = (c.inner + rows - 1) / rows;
  for (int64_t tile_idx = blockIdx.x; tile_idx < c.outer * tiles_per_outer; tile_idx += gridDim.x) {
    const int64_t o = tile_idx / tiles_per_outer, i0 = tile_idx % tiles_per_outer * rows;
    const int n = static_cast<int>(c.inner - i0 < rows ? c.inner - i0 : rows);
    const int64_t first = (o * c.inner + i0) * c.cols;  // the tile's first element in x
    // Element e of the tile is at row e / cols (one multiply-high: e < 2^15, inv_cols =
    // ceil(2^32 / cols)), column e % cols.
    auto at = [&](int e) -> T& {
      const int r = static_cast<int>(__umulhi(unsigned(e), inv_cols));
      return tile[r * pitch + e - r * cols];
    };
    const int count = n * cols, packs = count / VEC;
    __syncthreads();  // the previous tile is read
#pragma unroll 4
    for (int p = threadIdx.x; p < packs; p += rows) {
      const Pack<T, VEC> v = load_pack<T, VEC>(x + first + p * VEC);
#pragma unroll
      for (int k = 0; k < VEC; ++k) at(p * VEC + k) = v.v[k];
    }
    for (int e = packs * VEC + threadIdx.x; e < count; e += rows) at(e) = x[first + e];
    __syncthreads();
    if (threadIdx.x < n) {
      T* row = tile + threadIdx.x * pitch;
      A m = -INFINITY, part[kSumParts<T>] = {};
#pragma unroll 4
      for (int j = 0; j < cols; ++j) m = acc_max(m, to_acc(row[j]));
      const A ref = exp_ref(m);
      for_each_part<kSumParts<T>>(
          cols, [&](int64_t j, int u) { part[u] += acc_exp(to_acc(row[j]) - ref); });
      const A s = sum_parts(part);
      const A post = log ? acc_log(s) : A(1) / s;  // as the strided kernel: the same bits
      T* out = kTransposed ? y + o * c.cols * c.inner + i0 + threadIdx.x : row;
      const int64_t step = kTransposed ? c.inner : 1;
#pragma unroll 4
      for (int j = 0; j < cols; ++j) {
        const A d = to_acc(row[j]) - m;
        out[j * step] = from_acc<T>(log ? d - post : acc_exp(d) * post);
      }
    }
    if constexpr (!kTransposed) {
      __syncthreads();
#pragma unroll 4
      for (int p = threadIdx.x; p < packs; p += rows) {
        Pack<T, VEC> v;
#pragma unroll
        for (int k = 0; k < VEC; ++k) v.v[k] = at(p * VEC + k);
        store_pack<T, VEC>(y + first + p * VEC, v);
      }
      for (int e = packs * VEC + threadIdx.x; e < count; e += rows) y[first + e] = at(e);
    }
  }
}

// 16-byte packs along inner where it and every pointer allow, else single elements.
template <typename T>
bool strided_vec(int64_t inner, std::initializer_list<const void*> ptrs) {
  if (inner % kVec16<T> != 0) return false;
  for (const void* p : ptrs) {
    if (!is_aligned16(p)) return false;
  }
  return true;
}

template <typename K, typename... Args>
cudaError_t launch_columns(K kernel, int64_t columns, const DeviceInfo& dev, cudaStream_t stream,
                           Args... args) {
  const int64_t blocks = std::min<int64_t>(ceil_div(columns, kStridedThreads),
                                           int64_t(dev.sm_count) * kStridedBlocksPerSm);
  return launch(kernel, {std::max<int64_t>(blocks, 1), kStridedThreads, 0, 1}, dev, stream,
                args...);
}

}  // namespace

template <typename T>
cudaError_t softmax_fwd_strided_cuda(const T* x, T* y, int64_t outer, int64_t cols, int64_t inner,
                                     bool log, const DeviceInfo& dev, cudaStream_t stream) {
  const Columns c{outer, cols, inner};
  if (strided_vec<T>(inner, {x, y})) {
    constexpr int V = kVec16<T>;
    return launch_columns(softmax_fwd_strided_kernel<T, V>, c.count(V), dev, stream, x, y, c, log);
  }
  return launch_columns(softmax_fwd_strided_kernel<T, 1>, c.count(1), dev, stream, x, y, c, log);
}

template <typename T>
cudaError_t softmax_fwd_tile_cuda(const T* x, T* y, int64_t outer, int64_t cols, int64_t inner,
                                  bool transposed, bool log, const DeviceInfo& dev,
                                  cudaStream_t stream) {
  const Columns c{outer, cols, inner};
  const int rows = softmax_tile_rows(cols, inner, sizeof(T));
  const int pitch = static_cast<int>(cols | 1);
  const unsigned inv_cols = static_cast<unsigned>(((uint64_t(1) << 32) + cols - 1) / cols);
  const LaunchShape shape{
      std::min<int64_t>(outer * ceil_div(inner, rows), int64_t(dev.sm_count) * (2048 / rows)), rows,
      size_t(rows) * pitch * sizeof(T), 1};
  // Whole 16-byte packs in every tile: aligned pointers, every tile a multiple of VEC in.
  constexpr int V = kVec16<T>;
  if (transposed) {
    return strided_vec<T>(inner * cols, {x}) ? launch(softmax_fwd_tile_kernel<T, V, true>, shape,
                                                      dev, stream, x, y, c, pitch, inv_cols, log)
                                             : launch(softmax_fwd_tile_kernel<T, 1, true>, shape,
                                                      dev, stream, x, y, c, pitch, inv_cols, log);
  }
  return strided_vec<T>(inner * cols, {x, y}) ? launch(softmax_fwd_tile_kernel<T, V, false>, shape,
                                                       dev, stream, x, y, c, pitch, inv_cols, log)
                                              : launch(softmax_fwd_tile_kernel<T, 1, false>, shape,
                                                       dev, stream, x, y, c, pitch, inv_cols, log);
}

template <typename T>
cudaError_t softmax_bwd_strided_cuda(const T* dy, const T* y, T* dx, int64_t outer, int64_t cols,
                                     int64_t inner, bool log, const DeviceInfo& dev,
                                     cudaStream_t stream) {
  const Columns c{outer, cols, inner};
  if (strided_vec<T>(inner, {dy, y, dx})) {
    constexpr int V = kVec16<T>;
    return launch_columns(softmax_bwd_strided_kernel<T, V>, c.count(V), dev, stream, dy, y, dx, c,
                          log);
  }
  return launch_columns(softmax_bwd_strided_kernel<T, 1>, c.count(1), dev, stream, dy, y, dx, c,
                        log);
}

#define FUSEDOPS_INSTANTIATE_STRIDED(T)                                                           \
  template cudaError_t softmax_fwd_strided_cuda<T>(const T*, T*, int64_t, int64_t, int64_t, bool, \
                                                   const DeviceInfo&, cudaStream_t);              \
  template cudaError_t softmax_fwd_tile_cuda<T>(const T*, T*, int64_t, int64_t, int64_t, bool,    \
                                                bool, const DeviceInfo&, cudaStream_t);           \
  template cudaError_t softmax_bwd_strided_cuda<T>(                                               \
      const T*, const T*, T*, int64_t, int64_t, int64_t, bool, const DeviceInfo&, cudaStream_t);
FUSEDOPS_INSTANTIATE_STRIDED(float)
FUSEDOPS_INSTANTIATE_STRIDED(double)
FUSEDOPS_INSTANTIATE_STRIDED(__half)
FUSEDOPS_INSTANTIATE_STRIDED(__nv_bfloat16)
#undef FUSEDOPS_INSTANTIATE_STRIDED

}  // namespace fusedops
