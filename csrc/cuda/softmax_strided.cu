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
  template cudaError_t softmax_bwd_strided_cuda<T>(                                               \
      const T*, const T*, T*, int64_t, int64_t, int64_t, bool, const DeviceInfo&, cudaStream_t);
FUSEDOPS_INSTANTIATE_STRIDED(float)
FUSEDOPS_INSTANTIATE_STRIDED(double)
FUSEDOPS_INSTANTIATE_STRIDED(__half)
FUSEDOPS_INSTANTIATE_STRIDED(__nv_bfloat16)
#undef FUSEDOPS_INSTANTIATE_STRIDED

}  // namespace fusedops
