// Softmax / log_softmax backward in one kernel per row:
//   softmax:     dx = y * (dy - sum(dy * y))
//   log_softmax: dx = dy - exp(y) * sum(dy)
// Rows that fit on chip keep y and dy in registers (softmax_rows.cuh: one read of each, one
// write of dx); longer rows and fp64 stream twice through the online kernel. Sums in fp32.
#include <climits>

#include "cuda/softmax_kernels.h"
#include "cuda/softmax_rows.cuh"

namespace fusedops {
namespace {

using namespace softmax_rows;

template <typename T, int VEC>
__global__ void __launch_bounds__(kOnlineThreads)
    softmax_bwd_online_kernel(const T* dy, const T* y, T* dx, int64_t rows, int64_t npacks,
                              bool log) {
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

template <typename T, int VEC>
cudaError_t launch_bwd(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols, bool log,
                       const DeviceInfo& dev, cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, double>) {
    cudaError_t err = cudaSuccess;
    if (cols <= INT_MAX && launch_register_tiers<SoftmaxBwd<T>, VEC>({dy, y, dx, log}, rows, cols,
                                                                     dev, stream, &err)) {
      return err;
    }
  }
  const unsigned grid = unsigned(std::min<int64_t>(rows, int64_t(dev.sm_count) * 4));
  record_launch(softmax_bwd_online_kernel<T, VEC>, kOnlineThreads);
  softmax_bwd_online_kernel<T, VEC>
      <<<grid, kOnlineThreads, 0, stream>>>(dy, y, dx, rows, cols / VEC, log);
  return cudaGetLastError();
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
