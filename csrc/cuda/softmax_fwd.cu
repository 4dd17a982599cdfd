// Softmax / log_softmax forward: y = exp(x - max) / sum(exp(x - max)), or x - max - log(sum).
// On sm_90+, 16-byte-aligned rows of 8 KB and more go through the staged row engine
// (row_stage.cuh, SoftmaxFwdStaged below). Other rows that fit on chip use the register tiers of
// softmax_rows.cuh (one read of x, one write of y, one fused max/sum reduction); longer rows and
// fp64 stream twice through the online kernel below. Statistics in fp32 (fp64 for double).
#include <climits>

#include "cuda/row_stage.cuh"
#include "cuda/softmax_kernels.h"
#include "cuda/softmax_rows.cuh"

namespace fusedops {
namespace {

using namespace softmax_rows;

// One CTA per row (strided): pass 1 folds each pack into a running (max, sum), pass 2 re-reads
// x and writes y. No limit on cols.
template <typename T, int VEC>
__global__ void __launch_bounds__(kOnlineThreads)
    softmax_fwd_online_kernel(const T* x, T* y, int64_t rows, int64_t npacks, bool log) {
  sm90::grid_dependency_wait();
  using A = acc_t<T>;
  __shared__ MaxSum<A> scratch[32];
  const int64_t cols = npacks * VEC;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    MaxSum<A> stat = MaxSumOp::identity<MaxSum<A>>();
    for (int64_t p = threadIdx.x; p < npacks; p += blockDim.x) {
      const Pack<T, VEC> in = load_pack<T, VEC>(xr + p * VEC);
      A m = -INFINITY;
#pragma unroll
      for (int k = 0; k < VEC; ++k) m = acc_max(m, to_acc(in.v[k]));
      A s = 0;
#pragma unroll
      for (int k = 0; k < VEC; ++k) s += acc_exp(to_acc(in.v[k]) - exp_ref(m));
      stat = MaxSumOp()(stat, MaxSum<A>{m, s});
    }
    stat = block_allreduce(stat, MaxSumOp(), scratch);
    const A log_sum = acc_log(stat.s), inv = A(1) / stat.s;
    for (int64_t p = threadIdx.x; p < npacks; p += blockDim.x) {
      const Pack<T, VEC> in = load_pack<T, VEC>(xr + p * VEC);
      Pack<T, VEC> out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A v = to_acc(in.v[k]);
        out.v[k] = from_acc<T>(log ? (v - stat.m) - log_sum : acc_exp(v - stat.m) * inv);
      }
      store_pack<T, VEC>(yr + p * VEC, out);
    }
  }
}

// The largest element of N packs (NaN only where all are), widened; a tree of maxes. 16-bit
// pairs are compared as stored (max.bf16x2 / max.f16x2 take the non-NaN operand, as fmaxf does),
// then the last pair's halves.
__device__ __forceinline__ float max2(float a, float b) { return fmaxf(a, b); }
template <typename V>
__device__ __forceinline__ V max2(V a, V b) {
  return __hmax2(a, b);
}
template <int H, typename V, int N>  // v[0] = the max of v[0, 2H), a level at a time
__device__ __forceinline__ V max_levels(V (&v)[N]) {
  if constexpr (H == 0) {
    return v[0];
  } else {
#pragma unroll
    for (int i = 0; i < H; ++i) v[i] = max2(v[i], v[i + H]);
    return max_levels<H / 2>(v);
  }
}
template <typename V, int N>
__device__ __forceinline__ V tree_max(V (&v)[N]) {
  static_assert(N > 0 && (N & (N - 1)) == 0, "tree_max: a power of two");
  return max_levels<N / 2>(v);
}
template <typename T, int VEC, int N>
__device__ __forceinline__ float max_of(const Pack<T, VEC> (&pk)[N]) {
  if constexpr (sizeof(T) == 2 && VEC % 2 == 0) {
    using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
    T2 pairs[N * VEC / 2];
#pragma unroll
    for (int j = 0; j < N; ++j) {
#pragma unroll
      for (int i = 0; i < VEC / 2; ++i)
        memcpy(&pairs[j * VEC / 2 + i], &pk[j].v[2 * i], sizeof(T2));
    }
    const T2 m = tree_max(pairs);
    return fmaxf(to_acc(m.x), to_acc(m.y));
  } else {
    float v[N * VEC];
#pragma unroll
    for (int j = 0; j < N; ++j) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[j * VEC + k] = to_acc(pk[j].v[k]);
    }
    return tree_max(v);
  }
}

// Forward through the staged row engine (row_stage.cuh, sm_90+): each thread's (max, sum of
// exp) over its part of the row, merged as the register tiers do.
template <typename T_, int VEC>
struct SoftmaxFwdStaged : row_stage::Defaults<T_> {
  using T = T_;
  using Args = typename SoftmaxFwd<T>::Args;
  // Fewer threads per row than the norms: measured on an H100 (bf16, % of copy), 256 bytes per
  // thread against 128: 1024x131072 87 / 80, 512x262144 83 / 78.
  static constexpr int kBytesPerThread = 256;

  static constexpr int kInputs = 1;
  __device__ static const T* input(const Args& a, int) { return a.x; }

  template <typename Reduce>
  __device__ static void row(const Args& a, const T* const* in, const row_stage::Slice& sl,
                             Reduce&& reduce) {
    const T* x = in[0];
    // The max and the sum of exps in one pass over the staged row: each group of packs takes
    // its max first (16-bit pairs compared as they are stored), and the sum so far is rescaled
    // to it where it moved, as MaxSumOp merges two sets. Against a pass for each (bf16: 252 ->
    // 199 instructions per four packs), H200, kernel-only % of copy, bf16 softmax 1024x131072 /
    // 512x262144 88.4 / 85.3 -> 90.4 / 88.2, log_softmax 90.7 / 88.5 -> 91.6 / 90.3; fp32 level
    // (bench/results/h200-row-stage-pack-groups-softmax-one-pass.txt).
    MaxSum<float> part{-INFINITY, 0.f};
    row_stage::for_pack_groups<row_stage::kPassGroup>(sl, [&](int p, auto g) {
      constexpr int kPacks = decltype(g)::value;
      Pack<T, VEC> pk[kPacks];
#pragma unroll
      for (int j = 0; j < kPacks; ++j) pk[j] = load_pack<T, VEC>(x + (p + j * sl.n) * VEC);
      const float m = fmaxf(part.m, max_of(pk));
      const float ref = exp_ref(m);
      float s = part.s * (part.m == -INFINITY ? 0.f : acc_exp(part.m - ref));
#pragma unroll
      for (int j = 0; j < kPacks; ++j) {
        float v[VEC];
        widen(pk[j], v);
#pragma unroll
        for (int k = 0; k < VEC; ++k) s += acc_exp(v[k] - ref);
      }
      part = {m, s};
    });
    const MaxSum<float> total = reduce(part, MaxSumOp());
    const float log_sum = logf(total.s), inv = 1.f / total.s;
    row_stage::for_packs(sl, [&](int p) {
      float v[VEC], out[VEC];
      widen(load_pack<T, VEC>(x + p * VEC), v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        out[k] = a.log ? (v[k] - total.m) - log_sum : acc_exp(v[k] - total.m) * inv;
      }
      store_pack_global<T, VEC>(a.y + sl.offset + int64_t(p) * VEC, pack_from_acc<T, VEC>(out));
    });
  }
};

// softmax (not log_softmax) takes SoftmaxFwd's one-exp form in the warp tier, where the row's
// max is known before its exps (H100, 262144 rows, us: bf16 32 / 256 / 197 columns 9.9 / 108.6 /
// 96.1 -> 8.0 / 103.7 / 88.6, fp32 197 164.6 -> 153.8, no cell slower), and for 16-bit T in
// rows one CTA of at most this many threads holds (see SoftmaxFwd; fp32, and longer rows, lost
// 1-4 points of copy in it on an H100).
constexpr int kExpOnceMaxThreads = 256;

template <typename T, int VEC>
bool exp_once(int64_t cols, bool log, const DeviceInfo& dev) {
  if (log) return false;
  const Plan p = plan(cols / VEC, VEC, SoftmaxFwd<T, true>::kItemsMax, dev);
  return p.tier == Tier::kWarp || (sizeof(T) == 2 && p.tier == Tier::kBlock && p.ranks == 1 &&
                                   p.threads <= kExpOnceMaxThreads);
}

template <typename T, int VEC>
cudaError_t launch_fwd(const T* x, T* y, int64_t rows, int64_t cols, bool log,
                       const DeviceInfo& dev, cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, double>) {
    cudaError_t err = cudaSuccess;
    if constexpr (VEC > 1) {
      if (row_stage::try_launch<SoftmaxFwdStaged<T, VEC>, VEC>({x, y, log}, rows, cols, dev, stream,
                                                               &err)) {
        return err;
      }
    }
    if (cols <= INT_MAX &&
        (exp_once<T, VEC>(cols, log, dev) ? launch_register_tiers<SoftmaxFwd<T, true>, VEC>(
                                                {x, y, log}, rows, cols, dev, stream, &err)
                                          : launch_register_tiers<SoftmaxFwd<T>, VEC>(
                                                {x, y, log}, rows, cols, dev, stream, &err))) {
      return err;
    }
  }
  const int64_t grid = std::min<int64_t>(rows, int64_t(dev.sm_count) * 4);
  return launch(softmax_fwd_online_kernel<T, VEC>, {grid, kOnlineThreads, 0, 1}, dev, stream, x, y,
                rows, cols / VEC, log);
}

}  // namespace

template <typename T>
cudaError_t softmax_fwd_cuda(const T* x, T* y, int64_t rows, int64_t cols, bool log,
                             const DeviceInfo& dev, cudaStream_t stream) {
  constexpr int kVec = kVec16<T>;
  if (cols % kVec == 0 && is_aligned16(x) && is_aligned16(y)) {
    return launch_fwd<T, kVec>(x, y, rows, cols, log, dev, stream);
  }
  return launch_fwd<T, 1>(x, y, rows, cols, log, dev, stream);
}

template cudaError_t softmax_fwd_cuda<float>(const float*, float*, int64_t, int64_t, bool,
                                             const DeviceInfo&, cudaStream_t);
template cudaError_t softmax_fwd_cuda<__half>(const __half*, __half*, int64_t, int64_t, bool,
                                              const DeviceInfo&, cudaStream_t);
template cudaError_t softmax_fwd_cuda<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, int64_t,
                                                     int64_t, bool, const DeviceInfo&,
                                                     cudaStream_t);
template cudaError_t softmax_fwd_cuda<double>(const double*, double*, int64_t, int64_t, bool,
                                              const DeviceInfo&, cudaStream_t);

}  // namespace fusedops
