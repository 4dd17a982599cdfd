// Softmax / log_softmax over contiguous rows: the kernel tiers shared by forward and backward.
// A Policy (SoftmaxFwd, SoftmaxBwd) says what a thread loads, which per-row statistic it
// reduces and what it stores; the tiers say who owns a row:
//   warp:   1..32 lanes per row, the row in registers, shuffles only        (cols <= 32*4 packs)
//   block:  one CTA, or a cluster of up to 8 CTAs on sm_90+ (DSMEM), per row, in registers
//   online: one CTA per row, streaming: statistics in one pass, outputs in a second (any cols)
// Statistics and math in fp32 (fp64 for double); outputs rounded once.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/device_info.h"
#include "common/kernel_registry.h"
#include "common/launch.h"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "cuda/sm90.cuh"

namespace fusedops {
namespace softmax_rows {

constexpr int kWarpTierBlockThreads = 128;
// Packs per lane before a row moves to the block tier. Scalar packs (odd or misaligned rows,
// e.g. attention over 197 tokens) get twice as many: 8 two-byte loads per lane keep ~16 B in
// flight, where a 64-thread CTA per row would pay a block barrier for 400 bytes of work.
constexpr int kWarpTierMaxPacks = 4;
constexpr int kWarpTierMaxScalarPacks = 8;
constexpr int kBlockTargetThreads = 512;
constexpr int kTargetPacks = 4;
constexpr int kBlockMaxThreads = 1024;
constexpr int kOnlineThreads = 512;
constexpr int kRowRegisterWords = 32;  // 32-bit registers per thread for row data
constexpr int kMaxPacks = 8;           // per thread; more spills under the 64-register cap

// exp(v) = 2^(v * log2(e)) in one MUFU.EX2: ex2.approx.ftz is within ~2 ulp, maps -inf to 0,
// +inf to inf and NaN to NaN, and flushes results below 2^-126 to 0. expf / exp2f without
// fast-math cost several times more, enough to make the forward compute-bound.
__device__ __forceinline__ float acc_exp(float v) {
  float out;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(v * 1.4426950408889634f));
  return out;
}
__device__ __forceinline__ double acc_exp(double v) { return exp(v); }
__device__ __forceinline__ float acc_log(float v) { return logf(v); }
__device__ __forceinline__ double acc_log(double v) { return log(v); }
__device__ __forceinline__ float acc_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double acc_max(double a, double b) { return fmax(a, b); }

// Running max m of a set of values and s = sum(exp(v - m)). A set whose max is -inf holds no
// mass: its s is 0, or NaN if it saw a NaN, and merging scales it by 0 so NaN survives.
template <typename A>
struct MaxSum {
  A m, s;
};

struct MaxSumOp {
  template <typename A>
  __device__ __forceinline__ MaxSum<A> operator()(MaxSum<A> a, MaxSum<A> b) const {
    const A m = acc_max(a.m, b.m);
    const A ea = a.m == -INFINITY ? A(0) : acc_exp(a.m - m);
    const A eb = b.m == -INFINITY ? A(0) : acc_exp(b.m - m);
    return {m, a.s * ea + b.s * eb};
  }
  template <typename S>
  __device__ static S identity() {
    return {-INFINITY, 0};
  }
};

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  template <typename S>
  __device__ static S identity() {
    return -INFINITY;
  }
};

// Reference point for exp(v - ref) inside one set: its max, or 0 when that is -inf so that
// -inf values give 0 and NaN values give NaN rather than every value giving NaN.
template <typename A>
__device__ __forceinline__ A exp_ref(A m) {
  return m == -INFINITY ? A(0) : m;
}

// ---------------------------------------------------------------- forward policy

// kExpOnce (softmax only: log_softmax takes no exp after the reduction): the row is kept in
// fp32 as e = exp(x - m), m the reference its exps took (the thread's own max in the block tier,
// the row's max in the warp tier), so each element costs one exp; otherwise x stays in T (half
// the registers for fp16/bf16) and softmax takes exp again after the reduction. Measured on an
// H100, bf16 (softmax_fwd.cu picks): in the block tier one exp is ahead for rows one CTA of
// <= 256 threads holds (16384x4096: 72 -> 85% of copy), behind for longer rows, whose fp32 row
// spills at 64 registers or, given more, halves the CTAs per SM (4096x32768: 78 -> 52-54%).
template <typename T, bool kExpOnce = false>
struct SoftmaxFwd {
  using Stat = MaxSum<float>;
  using Op = MaxSumOp;
  // The warp tier reduces the row's max, then its sum of exp(x - max) (fetch_max, exp_sum),
  // instead of merging (max, sum) pairs: a merge takes two exps per shuffle step, most of the
  // exps of a row of a few elements per lane.
  static constexpr bool kTwoReductions = true;
  struct Args {
    const T* x;  // [rows, cols]
    T* y;        // [rows, cols]
    bool log;
  };
  static constexpr int kItemsMax = kRowRegisterWords * 4 / int(kExpOnce ? 4 : sizeof(T));

  // The packs p = j * G + g (j < PACKS) of one row that thread g of a G-thread group owns.
  template <int VEC, int PACKS>
  struct Row {
    Pack<T, VEC> x[PACKS];
    float e[kExpOnce ? PACKS : 1][VEC];  // kExpOnce: exp(x - m)
    float m;                             // kExpOnce: the reference of e's exps

    // Loads the row and returns this thread's (max, sum of exp(x - max)), for Op's merge.
    __device__ __forceinline__ Stat load(const Args& a, int64_t offset, int g, int G, int npacks,
                                         bool valid) {
      const float mx = fetch_max(a, offset, g, G, npacks, valid);
      return {mx, exp_sum(mx, g, G, npacks, valid)};
    }

    // Loads the row (all loads in flight before the first use); returns this thread's max.
    __device__ __forceinline__ float fetch_max(const Args& a, int64_t offset, int g, int G,
                                               int npacks, bool valid) {
#pragma unroll
      for (int j = 0; j < PACKS; ++j) {
        const int p = j * G + g;
        if (valid && p < npacks) x[j] = load_pack<T, VEC>(a.x + offset + int64_t(p) * VEC);
      }
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < PACKS; ++j) {
        if (!valid || j * G + g >= npacks) continue;
        float v[VEC];
        widen(x[j], v);
#pragma unroll
        for (int k = 0; k < VEC; ++k) mx = fmaxf(mx, v[k]);
      }
      return mx;
    }

    // This thread's sum of exp(x - max), max its own or the row's (kExpOnce: each kept in e).
    __device__ __forceinline__ float exp_sum(float max, int g, int G, int npacks, bool valid) {
      if constexpr (kExpOnce) m = max;
      const float ref = exp_ref(max);
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < PACKS; ++j) {
        if (!valid || j * G + g >= npacks) continue;
        float v[VEC];
        widen(x[j], v);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float ek = acc_exp(v[k] - ref);
          if constexpr (kExpOnce) e[j][k] = ek;
          s += ek;
        }
      }
      return s;
    }

    __device__ __forceinline__ void store(const Args& a, int64_t offset, int g, int G, int npacks,
                                          bool valid, Stat row) const {
      // kExpOnce softmax: y = e * exp(m - M) / S (m = M in the warp tier). A thread whose max
      // is -inf holds e = 0 (or NaN): 0 / S makes its y 0, or NaN where torch's is (S is NaN for
      // a row with NaN, 0 for a row of all -inf).
      const float log_sum = logf(row.s), inv = 1.f / row.s;
      [[maybe_unused]] const float scale =
          kExpOnce ? (m != -INFINITY ? acc_exp(m - row.m) * inv : 0.f / row.s) : 0.f;
#pragma unroll
      for (int j = 0; j < PACKS; ++j) {
        const int p = j * G + g;
        if (!valid || p >= npacks) continue;
        float out[VEC];
        if constexpr (kExpOnce) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) out[k] = e[j][k] * scale;
        } else {
          float v[VEC];
          widen(x[j], v);
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            out[k] = a.log ? (v[k] - row.m) - log_sum : acc_exp(v[k] - row.m) * inv;
          }
        }
        store_pack<T, VEC>(a.y + offset + int64_t(p) * VEC, pack_from_acc<T, VEC>(out));
      }
    }
  };
};

// ---------------------------------------------------------------- backward policy
//   softmax:     dx = y * (dy - sum(dy * y))
//   log_softmax: dx = dy - exp(y) * sum(dy)

template <typename T>
struct SoftmaxBwd {
  using Stat = float;
  using Op = SumOp;
  static constexpr bool kTwoReductions = false;
  struct Args {
    const T* dy;  // [rows, cols]
    const T* y;   // [rows, cols]
    T* dx;        // [rows, cols]
    bool log;
  };
  // y and dy stay in their own type: two arrays in kRowRegisterWords registers.
  static constexpr int kItemsMax = kRowRegisterWords * 4 / (2 * int(sizeof(T)));

  template <int VEC, int PACKS>
  struct Row {
    Pack<T, VEC> y[PACKS], dy[PACKS];

    __device__ __forceinline__ Stat load(const Args& a, int64_t offset, int g, int G, int npacks,
                                         bool valid) {
#pragma unroll
      for (int j = 0; j < PACKS; ++j) {
        const int p = j * G + g;
        if (valid && p < npacks) {
          y[j] = load_pack<T, VEC>(a.y + offset + int64_t(p) * VEC);
          dy[j] = load_pack<T, VEC>(a.dy + offset + int64_t(p) * VEC);
        }
      }
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < PACKS; ++j) {
        if (!valid || j * G + g >= npacks) continue;
        float yk[VEC], dyk[VEC];
        widen(y[j], yk);
        widen(dy[j], dyk);
#pragma unroll
        for (int k = 0; k < VEC; ++k) s += a.log ? dyk[k] : dyk[k] * yk[k];
      }
      return s;
    }

    __device__ __forceinline__ void store(const Args& a, int64_t offset, int g, int G, int npacks,
                                          bool valid, Stat s) const {
#pragma unroll
      for (int j = 0; j < PACKS; ++j) {
        const int p = j * G + g;
        if (!valid || p >= npacks) continue;
        float yk[VEC], dyk[VEC], out[VEC];
        widen(y[j], yk);
        widen(dy[j], dyk);
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          out[k] = a.log ? dyk[k] - acc_exp(yk[k]) * s : yk[k] * (dyk[k] - s);
        store_pack<T, VEC>(a.dx + offset + int64_t(p) * VEC, pack_from_acc<T, VEC>(out));
      }
    }
  };
};

// ---------------------------------------------------------------- tiers

// LANES lanes per row, 128 / LANES rows per block, rows strided over the grid. The loop runs
// warp-uniformly (shuffles need every lane), so lanes past the last row just idle along.
template <typename Policy, int VEC, int LANES, int PACKS>
__global__ void __launch_bounds__(kWarpTierBlockThreads)
    softmax_warp_kernel(typename Policy::Args args, int64_t rows, int npacks) {
  sm90::grid_dependency_wait();
  constexpr int kRowsPerWarp = 32 / LANES;
  const int lane = threadIdx.x % LANES;
  const int64_t cols = int64_t(npacks) * VEC;
  const int64_t first =
      (int64_t(blockIdx.x) * (kWarpTierBlockThreads / 32) + threadIdx.x / 32) * kRowsPerWarp;
  const int64_t stride = int64_t(gridDim.x) * kWarpTierBlockThreads / LANES;
  for (int64_t base = first; base < rows; base += stride) {
    const int64_t r = base + (threadIdx.x % 32) / LANES;
    const bool valid = r < rows;
    typename Policy::template Row<VEC, PACKS> row;
    typename Policy::Stat stat;
    if constexpr (Policy::kTwoReductions) {
      const float row_max = group_allreduce<LANES>(
          row.fetch_max(args, r * cols, lane, LANES, npacks, valid), MaxOp());
      stat = {row_max,
              group_allreduce<LANES>(row.exp_sum(row_max, lane, LANES, npacks, valid), SumOp())};
    } else {
      stat = group_allreduce<LANES>(row.load(args, r * cols, lane, LANES, npacks, valid),
                                    typename Policy::Op());
    }
    row.store(args, r * cols, lane, LANES, npacks, valid, stat);
  }
}

// One row per CTA, or per cluster of CTAs (launched with a cluster dimension on sm_90+): thread t
// of rank q owns the packs of thread g = q * blockDim.x + t in a group of G = ranks * blockDim.x.
template <typename Policy, int VEC, int PACKS>
__global__ void __launch_bounds__(kBlockMaxThreads)
    softmax_block_kernel(typename Policy::Args args, int64_t rows, int npacks) {
  using Stat = typename Policy::Stat;
  using Op = typename Policy::Op;
  __shared__ Stat scratch[32];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const cooperative_groups::cluster_group group = cooperative_groups::this_cluster();
  const int ranks = int(group.num_blocks());
  const int rank = int(group.block_rank());
#else
  constexpr int ranks = 1, rank = 0;
#endif
  sm90::ClusterExchange cluster(ranks);
  sm90::grid_dependency_wait();
  const int g = rank * blockDim.x + threadIdx.x, G = ranks * blockDim.x;
  const int64_t cols = int64_t(npacks) * VEC;
  for (int64_t r = blockIdx.x / ranks; r < rows; r += gridDim.x / ranks) {
    typename Policy::template Row<VEC, PACKS> row;
    Stat stat = block_allreduce(row.load(args, r * cols, g, G, npacks, true), Op(), scratch);
    stat = cluster.exchange(stat, Op());
    row.store(args, r * cols, g, G, npacks, true, stat);
  }
  cluster.close();
}

// ---------------------------------------------------------------- host-side plan

enum class Tier { kWarp, kBlock, kOnline };

struct Plan {
  Tier tier;
  int lanes;    // warp tier
  int packs;    // packs per thread (warp and block tiers)
  int threads;  // per CTA
  int ranks;    // CTAs per row (block tier; > 1 only as a cluster)
};

inline int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// items_max: elements a thread can keep in registers (Policy::kItemsMax).
inline Plan plan(int64_t npacks, int vec, int items_max, const DeviceInfo& dev) {
  const int max_packs = std::clamp(items_max / vec, 1, kMaxPacks);
  if (npacks <= 32) return {Tier::kWarp, next_pow2(npacks), 1, kWarpTierBlockThreads, 1};
  const int warp_packs = vec == 1 ? kWarpTierMaxScalarPacks : kWarpTierMaxPacks;
  if (npacks <= 32 * std::min(warp_packs, max_packs)) {
    return {Tier::kWarp, 32, next_pow2(ceil_div(npacks, 32)), kWarpTierBlockThreads, 1};
  }
  // Several packs per thread keep loads in flight (kTargetPacks, more only when needed); <= 512
  // threads per CTA let two CTAs share an SM, one reducing while the other loads. Longer rows
  // split over a cluster first, and only then do CTAs grow to 1024 threads.
  const int max_ranks = dev.has_clusters() ? kPortableClusterRanks : 1;
  for (int threads_cap : {kBlockTargetThreads, kBlockMaxThreads}) {
    for (int ranks = 1; ranks <= max_ranks; ranks *= 2) {
      const int64_t per_rank = ceil_div(npacks, ranks);
      const int packs =
          std::max(std::min(kTargetPacks, max_packs), next_pow2(ceil_div(per_rank, threads_cap)));
      if (packs > max_packs) continue;
      const int threads = int(ceil_div(ceil_div(per_rank, packs), 32) * 32);
      return {Tier::kBlock, 0, packs, threads, ranks};
    }
  }
  return {Tier::kOnline, 0, 0, kOnlineThreads, 1};
}

// Calls f(std::integral_constant<int, N>{}) for the N in Ns equal to n; false if none is.
template <int... Ns, typename F>
bool dispatch_int(int n, F&& f) {
  return ((n == Ns ? (f(std::integral_constant<int, Ns>{}), true) : false) || ...);
}

// The grid for `groups` row groups (a CTA's rows, or a cluster's row). Two waves of CTAs and
// more: a CTA per group, handed out by the hardware as others finish; CTAs that fit on the GPU
// at once, each striding over many groups, ran 8-12% slower (H100, us: fp32 262144x128 100.1 ->
// 90.5, bf16 262144x256 102.8 -> 90.0, warp tier). Fewer, and clusters: a persistent grid, as
// many as fit at once, striding over the groups (a striding grid larger than that runs in
// waves whose last one starts only after whole CTAs of the first have finished all their rows;
// seen: 1.6 waves, ~20% lost). Occupancy is queried once per device, kernel, block size and
// cluster size; a failed query counts one (the launch reports any error).
template <auto kKernel>
int64_t grid_for(int threads, int ranks, int64_t groups, const DeviceInfo& dev) {
  const int fit = std::max(resident(kKernel, {ranks, threads, 0, ranks}, dev), 1);
  if (ranks == 1 && groups >= 2 * int64_t(fit)) return std::min<int64_t>(groups, INT_MAX);
  return std::min<int64_t>(groups, fit) * ranks;
}

// Runs Policy over rows with the register tiers; returns false when the row needs the online
// tier (the caller's), true once launched (error in *err).
template <typename Policy, int VEC>
bool launch_register_tiers(const typename Policy::Args& args, int64_t rows, int64_t cols,
                           const DeviceInfo& dev, cudaStream_t stream, cudaError_t* err) {
  const int64_t npacks = cols / VEC;
  const Plan p = plan(npacks, VEC, Policy::kItemsMax, dev);
  if (p.tier == Tier::kWarp) {
    auto go = [&](auto lanes, auto packs) {
      constexpr auto kernel = softmax_warp_kernel<Policy, VEC, lanes, packs>;
      const int64_t blocks = ceil_div(rows * p.lanes, kWarpTierBlockThreads);
      *err = launch(kernel, {grid_for<kernel>(p.threads, 1, blocks, dev), p.threads, 0, 1}, dev,
                    stream, args, rows, int(npacks));
    };
    if (p.packs == 1) {
      return dispatch_int<1, 2, 4, 8, 16, 32>(
          p.lanes, [&](auto lanes) { go(lanes, std::integral_constant<int, 1>{}); });
    }
    return dispatch_int<2, 4, kWarpTierMaxScalarPacks>(p.packs, [&](auto packs) {
      if constexpr (VEC == 1 || packs <= kWarpTierMaxPacks)
        go(std::integral_constant<int, 32>{}, packs);
    });
  }
  if (p.tier == Tier::kBlock) {
    auto go = [&](auto packs) {
      if constexpr (packs * VEC <= Policy::kItemsMax) {
        constexpr auto kernel = softmax_block_kernel<Policy, VEC, packs>;
        const int64_t grid = grid_for<kernel>(p.threads, p.ranks, rows, dev);
        *err = launch(kernel, {grid, p.threads, 0, p.ranks}, dev, stream, args, rows, int(npacks));
      }
    };
    return dispatch_int<1, 2, 4, kMaxPacks>(p.packs, go);
  }
  return false;
}

}  // namespace softmax_rows
}  // namespace fusedops
