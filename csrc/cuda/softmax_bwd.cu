// Softmax / log_softmax backward in one kernel per row:
//   softmax:     dx = y * (dy - sum(dy * y))
//   log_softmax: dx = dy - exp(y) * sum(dy)
// On sm_90+, 16-byte-aligned rows of 8 KB and more go through the staged row engine with y and
// dy both staged (row_stage.cuh, SoftmaxBwdStaged below). Other rows that fit on chip keep y and
// dy in registers (softmax_rows.cuh); either way one read of each and one write of dx. Longer
// rows and fp64 stream twice through the online kernel. Sums in fp32.
#include <climits>

#include "cuda/row_stage.cuh"
#include "cuda/softmax_kernels.h"
#include "cuda/softmax_rows.cuh"

namespace fusedops {
namespace {

using namespace softmax_rows;

template <typename T, int VEC>
__global__ void __launch_bounds__(kOnlineThreads)
    softmax_bwd_online_kernel(const T* dy, const T* y, T* dx, int64_t rows, int64_t npacks,
                              bool log) {
  sm90::grid_dependency_wait();
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const int64_t cols = npacks * VEC;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t offset = r * cols;
    A s = 0;
    for (int64_t p = threadIdx.x; p < npacks; p += blockDim.x) {
      const Pack<T, VEC> g = load_pack<T, VEC>(dy + offset + p * VEC);
      const Pack<T, VEC> o = load_pack<T, VEC>(y + offset + p * VEC);
#pragma unroll
      for (int k = 0; k < VEC; ++k) s += log ? to_acc(g.v[k]) : to_acc(g.v[k]) * to_acc(o.v[k]);
    }
    s = block_allreduce(s, SumOp(), scratch);
    for (int64_t p = threadIdx.x; p < npacks; p += blockDim.x) {
      const Pack<T, VEC> g = load_pack<T, VEC>(dy + offset + p * VEC);
      const Pack<T, VEC> o = load_pack<T, VEC>(y + offset + p * VEC);
      Pack<T, VEC> out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A gk = to_acc(g.v[k]), ok = to_acc(o.v[k]);
        out.v[k] = from_acc<T>(log ? gk - acc_exp(ok) * s : ok * (gk - s));
      }
      store_pack<T, VEC>(dx + offset + p * VEC, out);
    }
  }
}

// The backward through the staged row engine (row_stage.cuh, sm_90+): y and dy both staged, the
// row's sum reduced once, dx written from shared memory.
template <typename T_, int VEC>
struct SoftmaxBwdStaged : row_stage::Defaults<T_> {
  using T = T_;
  using Args = typename SoftmaxBwd<T>::Args;
  static constexpr int kInputs = 2;
  static constexpr int kBytesPerThread = 256;  // of y and dy together

  __device__ static const T* input(const Args& a, int i) { return i == 0 ? a.y : a.dy; }

  template <typename Reduce>
  __device__ static void row(const Args& a, const T* const* in, const row_stage::Slice& sl,
                             Reduce&& reduce) {
    const T *y = in[0], *dy = in[1];
    float s = 0.f;
    row_stage::for_packs(sl, [&](int p) {
      float yk[VEC], dyk[VEC];
      widen(load_pack<T, VEC>(y + p * VEC), yk);
      widen(load_pack<T, VEC>(dy + p * VEC), dyk);
#pragma unroll
      for (int k = 0; k < VEC; ++k) s += a.log ? dyk[k] : dyk[k] * yk[k];
    });
    s = reduce(s, SumOp());
    row_stage::for_packs(sl, [&](int p) {
      float yk[VEC], dyk[VEC], out[VEC];
      widen(load_pack<T, VEC>(y + p * VEC), yk);
      widen(load_pack<T, VEC>(dy + p * VEC), dyk);
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        out[k] = a.log ? dyk[k] - acc_exp(yk[k]) * s : yk[k] * (dyk[k] - s);
      store_pack_global<T, VEC>(a.dx + sl.offset + int64_t(p) * VEC, pack_from_acc<T, VEC>(out));
    });
  }
};

template <typename T, int VEC>
cudaError_t launch_bwd(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols, bool log,
                       const DeviceInfo& dev, cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, double>) {
    cudaError_t err = cudaSuccess;
    if constexpr (VEC > 1) {
      if (row_stage::try_launch<SoftmaxBwdStaged<T, VEC>, VEC>({dy, y, dx, log}, rows, cols, dev,
                                                               stream, &err)) {
        return err;
      }
    }
    if (cols <= INT_MAX && launch_register_tiers<SoftmaxBwd<T>, VEC>({dy, y, dx, log}, rows, cols,
                                                                     dev, stream, &err)) {
      return err;
    }
  }
  const int64_t grid = std::min<int64_t>(rows, int64_t(dev.sm_count) * 4);
  return launch(softmax_bwd_online_kernel<T, VEC>, {grid, kOnlineThreads, 0, 1}, dev, stream, dy, y,
                dx, rows, cols / VEC, log);
}

}  // namespace

template <typename T>
cudaError_t softmax_bwd_cuda(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols, bool log,
                             const DeviceInfo& dev, cudaStream_t stream) {
  constexpr int kVec = kVec16<T>;
  if (cols % kVec == 0 && is_aligned16(dy) && is_aligned16(y) && is_aligned16(dx)) {
    return launch_bwd<T, kVec>(dy, y, dx, rows, cols, log, dev, stream);
  }
  return launch_bwd<T, 1>(dy, y, dx, rows, cols, log, dev, stream);
}

template cudaError_t softmax_bwd_cuda<float>(const float*, const float*, float*, int64_t, int64_t,
                                             bool, const DeviceInfo&, cudaStream_t);
template cudaError_t softmax_bwd_cuda<__half>(const __half*, const __half*, __half*, int64_t,
                                              int64_t, bool, const DeviceInfo&, cudaStream_t);
template cudaError_t softmax_bwd_cuda<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                     __nv_bfloat16*, int64_t, int64_t, bool,
                                                     const DeviceInfo&, cudaStream_t);
template cudaError_t softmax_bwd_cuda<double>(const double*, const double*, double*, int64_t,
                                              int64_t, bool, const DeviceInfo&, cudaStream_t);

}  // namespace fusedops
