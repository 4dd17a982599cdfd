// Softmax / log_softmax, forward and backward, over the middle dim of a contiguous
// [outer, cols, inner] tensor (a dim with elements after it in memory: the channels of
// [N, C, H, W]), read in place. A thread owns VEC adjacent inner positions of one outer index, a
// column of cols elements each, `inner` apart: a warp's loads at each step are contiguous. Three
// passes over the column (max, sum, write; backward: sum, write), the later ones mostly from
// L2, with the numerics of the online kernels (softmax_fwd.cu, softmax_bwd.cu).
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
    A m[VEC], s[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) m[k] = -INFINITY, s[k] = A(0);
#pragma unroll 4
    for (int64_t j = 0; j < c.cols; ++j) {
      const Pack<T, VEC> v = load_pack<T, VEC>(x + base + j * c.inner);
#pragma unroll
      for (int k = 0; k < VEC; ++k) m[k] = acc_max(m[k], to_acc(v.v[k]));
    }
#pragma unroll 4
    for (int64_t j = 0; j < c.cols; ++j) {
      const Pack<T, VEC> v = load_pack<T, VEC>(x + base + j * c.inner);
#pragma unroll
      for (int k = 0; k < VEC; ++k) s[k] += acc_exp(to_acc(v.v[k]) - exp_ref(m[k]));
    }
    A post[VEC];  // log_softmax: log(sum); softmax: 1 / sum
#pragma unroll
    for (int k = 0; k < VEC; ++k) post[k] = log ? acc_log(s[k]) : A(1) / s[k];
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
    A s[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) s[k] = A(0);
#pragma unroll 4
    for (int64_t j = 0; j < c.cols; ++j) {
      const Pack<T, VEC> g = load_pack<T, VEC>(dy + base + j * c.inner);
      const Pack<T, VEC> o = load_pack<T, VEC>(y + base + j * c.inner);
#pragma unroll
      for (int k = 0; k < VEC; ++k) s[k] += log ? to_acc(g.v[k]) : to_acc(g.v[k]) * to_acc(o.v[k]);
    }
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

// A block per tile of up to blockDim.x positions (grid-stride over the tiles): the tile's rows,
// contiguous in x, are staged in shared memory with a padded pitch (16-byte loads where VEC > 1),
// then a thread per row makes the strided kernel's three passes over it there and writes the
// result, each element `inner` apart: a warp's stores at each step are contiguous.
template <typename T, int VEC>
__global__ void __launch_bounds__(128)
    softmax_fwd_transposed_kernel(const T* __restrict__ x, T* __restrict__ y, Columns c, int pitch,
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
    const T* src = x + (o * c.inner + i0) * c.cols;
    // Element e of the tile is row e / cols (one multiply-high: e < 2^15, inv_cols =
    // ceil(2^32 / cols)), column e % cols.
    auto put = [&](int e, T v) {
      const int r = static_cast<int>(__umulhi(unsigned(e), inv_cols));
      tile[r * pitch + e - r * cols] = v;
    };
    __syncthreads();  // the previous tile's rows are read
    const int count = n * cols, packs = count / VEC;
#pragma unroll 4
    for (int p = threadIdx.x; p < packs; p += rows) {
      const Pack<T, VEC> v = load_pack<T, VEC>(src + p * VEC);
#pragma unroll
      for (int k = 0; k < VEC; ++k) put(p * VEC + k, v.v[k]);
    }
    for (int e = packs * VEC + threadIdx.x; e < count; e += rows) put(e, src[e]);
    __syncthreads();
    if (threadIdx.x >= n) continue;
    const T* row = tile + threadIdx.x * pitch;
    A m = -INFINITY, s = A(0);
#pragma unroll 4
    for (int j = 0; j < cols; ++j) m = acc_max(m, to_acc(row[j]));
    const A ref = exp_ref(m);
#pragma unroll 4
    for (int j = 0; j < cols; ++j) s += acc_exp(to_acc(row[j]) - ref);
    const A post = log ? acc_log(s) : A(1) / s;  // as the strided kernel: the same bits
    T* out = y + o * c.cols * c.inner + i0 + threadIdx.x;
#pragma unroll 4
    for (int j = 0; j < cols; ++j) {
      const A d = to_acc(row[j]) - m;
      out[j * c.inner] = from_acc<T>(log ? d - post : acc_exp(d) * post);
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
cudaError_t softmax_fwd_transposed_cuda(const T* x, T* y, int64_t outer, int64_t cols,
                                        int64_t inner, bool log, const DeviceInfo& dev,
                                        cudaStream_t stream) {
  const Columns c{outer, cols, inner};
  const int rows = transposed_tile_rows(cols, inner, sizeof(T));
  const int pitch = static_cast<int>(cols | 1);
  const unsigned inv_cols = static_cast<unsigned>(((uint64_t(1) << 32) + cols - 1) / cols);
  const LaunchShape shape{
      std::min<int64_t>(outer * ceil_div(inner, rows), int64_t(dev.sm_count) * (2048 / rows)), rows,
      size_t(rows) * pitch * sizeof(T), 1};
  // Whole 16-byte packs in every tile: x aligned, and every tile starts a multiple of VEC in.
  if (strided_vec<T>(inner * cols, {x})) {
    return launch(softmax_fwd_transposed_kernel<T, kVec16<T>>, shape, dev, stream, x, y, c, pitch,
                  inv_cols, log);
  }
  return launch(softmax_fwd_transposed_kernel<T, 1>, shape, dev, stream, x, y, c, pitch, inv_cols,
                log);
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
  template cudaError_t softmax_fwd_transposed_cuda<T>(const T*, T*, int64_t, int64_t, int64_t,    \
                                                      bool, const DeviceInfo&, cudaStream_t);     \
  template cudaError_t softmax_bwd_strided_cuda<T>(                                               \
      const T*, const T*, T*, int64_t, int64_t, int64_t, bool, const DeviceInfo&, cudaStream_t);
FUSEDOPS_INSTANTIATE_STRIDED(float)
FUSEDOPS_INSTANTIATE_STRIDED(double)
FUSEDOPS_INSTANTIATE_STRIDED(__half)
FUSEDOPS_INSTANTIATE_STRIDED(__nv_bfloat16)
#undef FUSEDOPS_INSTANTIATE_STRIDED

}  // namespace fusedops
