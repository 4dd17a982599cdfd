// layer_norm / rms_norm forward and backward (kRms: rms_norm, i.e. mean 0 and no bias).
// On sm_90+, 16-byte-aligned rows of 8 KB and more: forward, the staged row engine
// (row_stage.cuh, NormFwdStaged below); backward, persistent teams that stage the next rows in
// shared memory (norm_bwd_staged_kernel). Otherwise: each row belongs to a team of
// threads that holds it in registers, kPacks packs of VEC elements per thread (16-byte accesses
// when VEC = kVec16<T>), so x is read once and y written once: a warp (short rows, several per
// block, shuffles only), a block or part of one, or the blocks of a cluster (sm_90+, partial sums
// exchanged through distributed shared memory). Rows too long even for a cluster, and fp64 rows,
// take looping kernels that read them twice, the second time mostly from L2. Numerics: fp32
// throughout (fp64 for fp64 input, A below); mean and variance in two passes over the registers
// (Welford per pack in the looping kernel, merged by Chan's formula). Backward: each team sums its
// rows' dweight/dbias in shared memory into one A partial row; partial_rows::sum adds the
// partial rows in a fixed order: deterministic, no float atomics (a grid of one partial row
// writes dweight/dbias itself). Preconditions (the launchers
// check them): rows, cols > 0; VEC > 1 only when cols % VEC == 0 and every pointer is 16-byte
// aligned.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "common/kernel_registry.h"
#include "common/launch.h"
#include "common/query_cache.h"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "cuda/norms_kernels.h"
#include "cuda/partial_rows.cuh"
#include "cuda/row_stage.cuh"
#include "cuda/sm90.cuh"

namespace fusedops {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarp = 32;
constexpr int kMaxBwdClusterRanks = 16;  // backward, where the GPU allows this many (H100 does)
static_assert(kMaxBwdClusterRanks <= sm90::kMaxRanks, "a cluster mailbox slot per block");
constexpr int kFwdPacks = 4;     // per thread in forward teams (16-byte packs of x),
constexpr int kFwdScalars = 16;  // or elements when rows aren't 16-byte aligned
constexpr int kFwdWarpRowsPerBlock = 4;
constexpr int kFwdClusterThreads = 512;  // per block of a forward cluster team (see norm_fwd_vec)
constexpr int kBwdMaxThreads = 512;      // per block; backward teams hold 16 elements per thread
constexpr int kBwdScalars = 8;           // (x and dy), 8 when rows aren't aligned,
constexpr int kBwdMidElems = 24;         // 24 in a warp's rows of 17-24 per lane,
constexpr int kBwdLongElems = 32;        // 32 in a warp's rows of 25-32 per lane, and in rows a
                                         // cluster of 16-element teams can't hold
constexpr int kLoopThreads = 512;
constexpr int kLoopUnroll = 4;  // packs in flight per thread in the looping kernels

// Two sums reduced together: float2 or double2.
template <typename A>
using Pair = std::conditional_t<std::is_same_v<A, double>, double2, float2>;

struct Sum2Op {
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return V{a.x + b.x, a.y + b.y};
  }
  template <typename V>
  __device__ static V identity() {
    return V{0, 0};
  }
};

__device__ __forceinline__ float acc_rsqrt(float v) { return rsqrtf(v); }
__device__ __forceinline__ double acc_rsqrt(double v) { return rsqrt(v); }

// Count, mean and sum of squared deviations of a set of values; merged with Chan's formula.
template <typename A>
struct Welford {
  A n, mean, m2;
};

// Written symmetric in a and b (bitwise: op(a, b) == op(b, a)), so every lane of a butterfly
// all-reduce ends with the same statistics.
struct WelfordOp {
  template <typename A>
  __device__ __forceinline__ Welford<A> operator()(const Welford<A>& a, const Welford<A>& b) const {
    const A n = a.n + b.n;
    if (n == A(0)) return a;
    const A d = b.mean - a.mean;
    return {n, (a.n * a.mean + b.n * b.mean) / n, (a.m2 + b.m2) + d * d * (a.n * b.n / n)};
  }
  template <typename V>
  __device__ static V identity() {
    return V{0, 0, 0};
  }
};

// The threads that own one row (TeamKind): a warp or a power-of-two part of one (several per
// block; rows of fewer packs than a warp's lanes leave no lane idle), a block or an equal part
// of one (several per block for short rows), or all blocks of a cluster (sm_90+; the kernel was
// launched with a cluster dimension). Thread t owns the packs at columns (p * g + t) * VEC.
// Whole warps keep their size a compile-time constant: as a kernel parameter, the index math
// cost 16-bit layer_norm 4-10% (H100, bf16 4096x1024 kernel-only 5.37 -> 5.92 us).
enum class TeamKind { kBlock, kWarp, kWarpPart };
struct Team {
  int g;          // threads in the team
  int t;          // this thread's rank in it
  int per_block;  // teams per block (1 for a cluster team)
  int index;      // this thread's team within its block
  int ranks;      // blocks per team: > 1 only for a cluster
};

template <TeamKind kTeam>
__device__ __forceinline__ Team make_team(int group) {
  const int tid = threadIdx.x, threads = blockDim.x;
  if constexpr (kTeam == TeamKind::kWarp) {
    return {kWarp, tid % kWarp, threads / kWarp, tid / kWarp, 1};
  } else if constexpr (kTeam == TeamKind::kWarpPart) {  // group: a power of two below kWarp
    return {group, tid % group, threads / group, tid / group, 1};
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const cg::cluster_group cluster = cg::this_cluster();
    const int ranks = static_cast<int>(cluster.num_blocks());
    if (ranks > 1) {
      return {ranks * threads, static_cast<int>(cluster.block_rank()) * threads + tid, 1, 0, ranks};
    }
#endif
    return {group, tid % group, threads / group, tid / group, 1};
  }
}

// First row of this thread's team and the step between its rows. Every thread of a block runs
// the same iterations (rows past the end idle), so the block's barriers stay matched.
__device__ __forceinline__ int64_t team_first_row(const Team& team) {
  return int64_t(blockIdx.x / team.ranks) * team.per_block;
}
__device__ __forceinline__ int64_t team_row_step(const Team& team) {
  return int64_t(gridDim.x / team.ranks) * team.per_block;
}

// All-reduce over a team; every thread of the block (of the cluster) must call it. scratch: 32
// slots of shared memory; a cluster team's blocks then exchange their totals through `cluster`.
// The order of additions is fixed: deterministic.
template <TeamKind kTeam, typename V, typename Op>
__device__ __forceinline__ V team_allreduce(V v, Op op, const Team& team, V* scratch,
                                            sm90::ClusterExchange& cluster) {
  if constexpr (kTeam == TeamKind::kWarp) {
    v = group_allreduce<kWarp>(v, op);
  } else if constexpr (kTeam == TeamKind::kWarpPart) {        // g lanes aligned in the warp: xor
    for (int offset = team.g / 2; offset > 0; offset /= 2) {  // offsets below g stay in it
      v = op(v, shuffle_xor<kWarp>(v, offset));
    }
  } else {
    v = group_allreduce<kWarp>(v, op);
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    // This block's warps in the team, from the first: no division by a runtime count (one ran
    // at every row of the staged backward).
    const int warps = (team.ranks > 1 ? static_cast<int>(blockDim.x) : team.g) / kWarp;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = partials_allreduce(scratch + team.index * warps, warps, op);
    __syncthreads();  // scratch is rewritten by the next reduction
    v = cluster.exchange(v, op);
  }
  return v;
}

// VEC elements at p as stored, moved in accesses of at most 16 bytes (an fp32 weight beside
// bf16 activations takes two).
template <int VEC, typename S>
__device__ __forceinline__ Pack<S, VEC> load_narrow(const S* p) {
  constexpr int kSub = VEC < kVec16<S> ? VEC : kVec16<S>;
  if constexpr (kSub == VEC) {
    return load_pack<S, VEC>(p);
  } else {
    Pack<S, VEC> out;
#pragma unroll
    for (int s = 0; s < VEC; s += kSub) {
      const Pack<S, kSub> pk = load_pack<S, kSub>(p + s);
#pragma unroll
      for (int j = 0; j < kSub; ++j) out.v[s + j] = pk.v[j];
    }
    return out;
  }
}

// A pack widened to A (fp32, or fp64 for fp64).
template <int VEC, typename S, typename A>
__device__ __forceinline__ void widen_to(const Pack<S, VEC>& pk, A (&out)[VEC]) {
  if constexpr (std::is_same_v<A, acc_t<S>>) {
    widen(pk, out);
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = to_acc(pk.v[j]);
  }
}

// VEC elements at p widened to A.
template <int VEC, typename S, typename A>
__device__ __forceinline__ void load_acc(const S* p, A (&out)[VEC]) {
  widen_to(load_narrow<VEC>(p), out);
}

template <int VEC, typename S>
__device__ __forceinline__ void store_acc(S* p, const acc_t<S> (&in)[VEC]) {  // p: global
  constexpr int kSub = VEC < kVec16<S> ? VEC : kVec16<S>;
  if constexpr (kSub == VEC) {
    store_pack_global<S, VEC>(p, pack_from_acc<S, VEC>(in));
  } else {
#pragma unroll
    for (int s = 0; s < VEC; s += kSub) {
      Pack<S, kSub> pk;
#pragma unroll
      for (int j = 0; j < kSub; ++j) pk.v[j] = from_acc<S>(in[s + j]);
      store_pack_global<S, kSub>(p + s, pk);
    }
  }
}

// One pack's weight and bias as stored, loaded ahead of their use: every store_pack_global is
// a compiler barrier, so a load left beside its use waits for the previous pack's store, and a
// thread had one pack's params in flight at a time, an L2 round trip each (SASS of the staged
// layer_norm forward: LDG w, LDG b, STG y per pack).
template <typename W, int VEC>
struct PackParams {
  Pack<W, VEC> w, b;  // each read only where its pointer is non-null
};

template <int VEC, typename W>
__device__ __forceinline__ PackParams<W, VEC> load_params(const W* w, const W* b, int64_t col) {
  PackParams<W, VEC> pp;
  if (w != nullptr) pp.w = load_narrow<VEC>(w + col);
  if (b != nullptr) pp.b = load_narrow<VEC>(b + col);
  return pp;
}

// out = (v - mu) * rs * w + b for one pack; kW / kB: whether w / b are there (with_params).
// Known at compile time, the params are widened by words and x-hat * w + b is one FFMA, where
// per-element predicates kept the multiply and the add apart. kFmaXHat: x-hat = v * rs - mu * rs
// in one FMA (its rounding, ~2^-24 |mu| rs, far below a 16-bit output's).
template <int VEC, bool kW, bool kB, bool kFmaXHat = false, typename A, typename W>
__device__ __forceinline__ void normalize_pack(const A (&v)[VEC], A mu, A rs,
                                               const PackParams<W, VEC>& pp, A (&out)[VEC]) {
  A wv[VEC], bv[VEC];
  if constexpr (kW) widen_to(pp.w, wv);
  if constexpr (kB) widen_to(pp.b, bv);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const A xhat = kFmaXHat ? fma(v[j], rs, -mu * rs) : (v[j] - mu) * rs;
    if constexpr (kW && kB) {
      out[j] = xhat * wv[j] + bv[j];
    } else if constexpr (kW) {
      out[j] = xhat * wv[j];
    } else if constexpr (kB) {
      out[j] = xhat + bv[j];
    } else {
      out[j] = xhat;
    }
  }
}

// f(kW, kB) (std::bool_constant) for the params present: a loop for each combination.
template <bool kRms, typename W, typename F>
__device__ __forceinline__ void with_params(const W* w, const W* b, F&& f) {
  using Yes = std::true_type;
  using No = std::false_type;
  if constexpr (kRms) {
    w != nullptr ? f(Yes(), No()) : f(No(), No());
  } else if (w != nullptr) {
    b != nullptr ? f(Yes(), Yes()) : f(Yes(), No());
  } else {
    b != nullptr ? f(No(), Yes()) : f(No(), No());
  }
}

// A backward team's fp32 dweight (dbias) sums in shared memory: for each thread, kPacks x VEC
// floats, stored [pack][group of 4 elements][thread] as float4 (scalars: [pack][thread]) so that
// a warp's accesses are contiguous and conflict-free. Block teams stride the slots by
// kBwdMaxThreads: their addresses are then immediates off one register, where a stride of
// blockDim.x kept one register per slot live through the row loop (spills at 64 registers).
__host__ __device__ constexpr int bwd_acc_chunk(int vec) { return vec % 4 == 0 ? 4 : 1; }
__host__ __device__ constexpr int bwd_acc_stride(int threads, bool fixed_stride) {
  return fixed_stride ? kBwdMaxThreads : threads;
}
// Floats of one sum for a block of `threads`.
__host__ __device__ constexpr int bwd_acc_floats(int threads, int packs, int vec,
                                                 bool fixed_stride) {
  const int slots = packs * vec / bwd_acc_chunk(vec);
  return ((slots - 1) * bwd_acc_stride(threads, fixed_stride) + threads) * bwd_acc_chunk(vec);
}
template <int VEC, int kPacks, bool kFixedStride = false>
struct BwdAcc {
  static constexpr int kChunk = bwd_acc_chunk(VEC);
  __device__ static int floats(int threads) {
    return bwd_acc_floats(threads, kPacks, VEC, kFixedStride);
  }
  __device__ static int index(int p, int j, int tid) {
    const int slot = p * (VEC / kChunk) + j / kChunk;
    return (slot * bwd_acc_stride(int(blockDim.x), kFixedStride) + tid) * kChunk + j % kChunk;
  }
  __device__ static void load(const float* acc, int p, float (&v)[VEC]) {
#pragma unroll
    for (int j = 0; j < VEC; j += kChunk) {
      if constexpr (kChunk == 4) {
        const float4 f = *reinterpret_cast<const float4*>(acc + index(p, j, threadIdx.x));
        v[j] = f.x, v[j + 1] = f.y, v[j + 2] = f.z, v[j + 3] = f.w;
      } else {
        v[j] = acc[index(p, j, threadIdx.x)];
      }
    }
  }
  __device__ static void store(float* acc, int p, const float (&v)[VEC]) {
#pragma unroll
    for (int j = 0; j < VEC; j += kChunk) {
      if constexpr (kChunk == 4) {
        *reinterpret_cast<float4*>(acc + index(p, j, threadIdx.x)) =
            make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
      } else {
        acc[index(p, j, threadIdx.x)] = v[j];
      }
    }
  }
};

// Threads per forward block: up to 4 packs, 1024 and so at most 64 registers per thread, which
// keeps occupancy at 50% (left free, the compiler took 92: 31% occupancy, and 16384x4096 bf16
// layer_norm ran at 60% of copy instead of 73%), and two 512-thread blocks per SM; 16 scalars
// need more registers.
constexpr int fwd_max_threads(int packs) { return packs <= kFwdPacks ? 1024 : 512; }

// Forward, row in registers. Each pack index p is one coalesced sweep of the team over the row.
// The packs stay in T (half the registers for fp16/bf16) and are widened at each use.
template <typename T, typename W, bool kRms, int VEC, int kPacks, TeamKind kTeam>
__global__ void __launch_bounds__(fwd_max_threads(kPacks), 1)
    norm_fwd_kernel(NormFwdArgs<T, W> a, int group) {
  __shared__ float scratch[kWarp];
  // Warp rows: the block's copy of w and b (packs [0, kWarp * kPacks) of each), staged with its
  // first rows' loads in flight. Read from global memory, each pack's w and b waited for the
  // previous pack's store (a compiler barrier): four L2 round trips per row. H100, kernel-only
  // % of copy: bf16 4096x1024 layer_norm 66.3 -> 67.4, rms_norm 65.0 -> 69.1, 2048x768 43.0 ->
  // 46.6 / 44.7 -> 46.3. Not for an fp32 weight beside 16-bit rows (32-byte packs): 64.4 -> 59.7.
  constexpr bool kStageParams = kTeam != TeamKind::kBlock && sizeof(Pack<W, VEC>) <= 16;
  constexpr int kRowPacks = kWarp * kPacks;
  __shared__ Pack<W, VEC> staged_params[kStageParams ? 2 : 1][kStageParams ? kRowPacks : 1];
  const Team team = make_team<kTeam>(group);
  sm90::ClusterExchange cluster(team.ranks);
  sm90::grid_dependency_wait();
  const int g = team.g, t = team.t;
  const int cols = static_cast<int>(a.cols);  // < 2^31 in the register tiers
  const int64_t first = team_first_row(team);
  for (int64_t base = first; base < a.rows; base += team_row_step(team)) {
    const int64_t row = base + team.index;
    const bool valid = row < a.rows;
    Pack<T, VEC> x[kPacks];
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int col = (p * g + t) * VEC;
      if (valid && col < cols) {
        x[p] = load_pack<T, VEC>(a.x + row * a.cols + col);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) x[p].v[j] = from_acc<T>(0.f);
      }
    }
    if constexpr (kStageParams) {
      if (base == first) {  // the same on every thread of the block
        for (int i = threadIdx.x; i < cols / VEC; i += blockDim.x) {
          if (a.w != nullptr) staged_params[0][i] = load_narrow<VEC>(a.w + i * VEC);
          if (a.b != nullptr) staged_params[1][i] = load_narrow<VEC>(a.b + i * VEC);
        }
      }
    }
    float mu = 0.f;
    if constexpr (!kRms) {
      float s = 0.f;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        float v[VEC];
        widen(x[p], v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) s += v[j];
      }
      mu = team_allreduce<kTeam>(s, SumOp(), team, scratch, cluster) / cols;
    }
    float q = 0.f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if ((p * g + t) * VEC < cols) {  // padding lanes hold 0, not mu
        float v[VEC];
        widen(x[p], v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) q += (v[j] - mu) * (v[j] - mu);
      }
    }
    q = team_allreduce<kTeam>(q, SumOp(), team, scratch, cluster);
    const float rs = acc_rsqrt(q / cols + a.eps);
    if (kStageParams && base == first) __syncthreads();  // staged_params written
    if (!valid) continue;                                // after the last barrier of this iteration
    if (t == 0) {
      if constexpr (!kRms) a.mean[row] = mu;
      a.rstd[row] = rs;
    }
    with_params<kRms>(a.w, a.b, [&](auto has_w, auto has_b) {
      constexpr bool kW = decltype(has_w)::value, kB = decltype(has_b)::value;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        const int col = (p * g + t) * VEC;
        if (col < cols) {
          float v[VEC], out[VEC];
          widen(x[p], v);
          if constexpr (kStageParams) {
            const int k = p * g + t;
            normalize_pack<VEC, kW, kB>(
                v, mu, rs, PackParams<W, VEC>{staged_params[0][k], staged_params[1][k]}, out);
          } else {
            normalize_pack<VEC, kW, kB>(
                v, mu, rs, load_params<VEC>(kW ? a.w : nullptr, kB ? a.b : nullptr, col), out);
          }
          store_acc<VEC>(a.y + row * a.cols + col, out);
        }
      }
    });
  }
  cluster.close();
}

// Forward through the staged row engine (row_stage.cuh, sm_90+): the numerics of
// norm_fwd_kernel (mean, then the sum of squared deviations, in two reductions), with the row
// read from shared memory in each pass.
template <typename T_, typename W, bool kRms, int VEC>
struct NormFwdStaged {
  using T = T_;
  using Args = NormFwdArgs<T, W>;
  // The weight and bias loads want more threads per row than softmax (H100, bf16, % of copy,
  // 4096x32768: 128 bytes per thread 88 / 93 for layer_norm / rms_norm, 256 bytes 81 / 75).
  // 64 bytes per thread, and blocks of up to one 8 KB row (layer_norm) or 16 KB of rows
  // (rms_norm), against 128 bytes and 32 KB: bf16 / fp32, H100, kernel-only % of copy, layer_norm
  // 16384x4096 92.9 / 96.7 -> 95.8 / 97.5, 8192x8192 93.0 / 95.7 -> 93.6 / 97.7, 32768x2048 92.9
  // / 96.3 -> 95.2 / 97.3; rms_norm bf16 16384x4096 / 8192x8192 94.7 / 94.6 -> 96.0 / 95.6 (Liger
  // in that run: layer_norm 96.9 / 98.3 at 16384x4096, rms_norm bf16 96.1 / 96.3;
  // bench/results/h100-norm-fwd-groups-bwd-flush.txt). fp32 rms_norm keeps 128 bytes: at 64 its
  // 4096x1024 (1024 blocks of four 4 KB rows, 256 threads each instead of 128) fell 87.0 -> 82.2.
  static constexpr int kBytesPerThread = kRms && sizeof(T) == 4 ? 128 : 64;
  static constexpr int kGroupBytes = kRms ? 16 << 10 : 8 << 10;
  // Where DRAM is faster per SM (row_stage::fast_dram), 16-bit rows take 128 bytes per thread
  // and blocks of up to 16 KB: at 64 bytes, 2048 threads per SM hold at most 128 KB in flight.
  // H200, kernel-only % of copy, bf16, H100 sizes -> these (-> 128 bytes in 32 KB blocks):
  // layer_norm 16384x4096 76.9 -> 88.4 (81.7), 8192x8192 73.7 -> 84.9 (85.2), 32768x2048 75.4 ->
  // 87.4 (84.4); rms_norm 86.1-86.8 -> 89.7-89.9 at the same shapes (89.6-90.0); 65536x1024 and
  // rows split over clusters level. fp32 keeps its sizes (layer_norm 16384x4096 94.0, 88.8 at
  // these). bench/results/h200-row-plans-fast-dram.txt.
  static constexpr int kFastDramBytesPerThread = sizeof(T) == 2 ? 128 : 0;
  static constexpr int kFastDramGroupBytes = sizeof(T) == 2 ? 16 << 10 : 0;
  // fp32 rows: three 512-thread blocks per SM, as before the staged params' second write path
  // took 48 registers (H100, fp32 layer_norm, % of copy: 4096x32768 96.9 at three blocks, 92.8
  // at two; bf16 capped for three spilled: 90 -> 78).
  static constexpr int kMinBlocksPerSm = sizeof(T) == 4 ? 3 : 2;
  // layer_norm's rows under 4 KB lost staged even where they made many blocks (H100, bf16 % of
  // copy against its register tier: 65536x1024 89.3 -> 86.7, 32768x1024 85.2 -> 78.1).
  static constexpr int kMinRowBytes = kRms ? 2 << 10 : row_stage::kShortRowBytes;
  // fp32 rows the register tiers ran faster on an H200 (kernel-only % of copy, staged -> register
  // tiers, two rounds each): layer_norm 65536x1024 92.4 / 92.5 -> 95.8 / 95.8 (8 KB rows level,
  // 16 KB 95.0 -> 93.4); rms_norm 65536x1024 93.4 / 93.5 -> 96.1 / 96.1, 16384x4096 93.4 / 93.3 ->
  // 94.3 / 94.4, 8192x8192 92.5 / 92.4 -> 93.9 / 93.9 (8 KB level). Only where the rows make many
  // blocks: at 4096x1024 (a wave of staged blocks) they lost, layer_norm 66.2 / 66.4 -> 63.3 /
  // 63.4, rms_norm 62.4 / 72.2 -> 57.9 / 63.4. 16-bit rows lost in the register tiers (layer_norm
  // 3-5 points, rms_norm 1-2 but at 4 KB +1.5): they stay staged.
  // bench/results/h200-norm-fwd-register-tiers.txt.
  static constexpr int kFastDramRegisterRowBytes = sizeof(T) != 4 ? 0 : kRms ? 32 << 10 : 4 << 10;

  static constexpr int kInputs = 1;
  __device__ static const T* input(const Args& a, int) { return a.x; }
  using Param = W;
  static constexpr int kParams = 2;
  __host__ __device__ static const W* param(const Args& a, int j) { return j == 0 ? a.w : a.b; }
  // Params staged beside a cluster's row slices (row_stage::plan): rms_norm's only. layer_norm's
  // weight or bias alone fit that plan too (16 slices of 32 KB where 8 of 64 hold the row) and
  // ran slower with it than read from global memory: H100, % of copy, staged -> global, bf16 /
  // fp16 512x262144 79 / 81 -> 90 / 92, 1024x131072 89-90 / 89-91 -> 93 / 94.5, fp32 1024x131072
  // 92-93 -> 98 (with both params: 87 / 88.5 / 94 in the same runs).
  static constexpr bool kParamsInClusters = kRms;

  // Packs whose w and b a thread loads from global memory before storing any of them
  // (PackParams). H100, kernel-only % of copy: bf16 layer_norm 4096x32768 90.5 -> 92.7 (two) ->
  // 94.8 (four), 1024x131072 81.4 -> 85.7, 512x262144 77.2 -> 79.1-80.0; fp32 rms_norm 512x262144
  // 89.0 -> 94.6 (two). One for an fp32 weight beside 16-bit rows, and for fp32 layer_norm (capped
  // at 40 registers, its w and b of two packs spilled: 4096x32768 97.4 -> 89.5). Loading the first
  // batch before the reductions spilled too: 8-13 points lower.
  static constexpr int kBatch = sizeof(Pack<W, VEC>) > 16 ? 1 : sizeof(T) == 2 ? 4 : kRms ? 2 : 1;
  // layer_norm's x-hat in one FMA (normalize_pack) for 16-bit rows and params. H200, kernel-only
  // % of copy, bf16, two rounds each: 8192x16384 86.5-86.6 -> 87.5, 1024x131072 76.5-76.9 ->
  // 78.0-78.2, the rest level or within half a point
  // (bench/results/h200-layer_norm-fwd-fma-xhat.txt). fp32 rows read level and keep x - mu;
  // with fp32 params ptxas spilled 24 bytes.
  static constexpr bool kFmaXHat = !kRms && sizeof(T) == 2 && sizeof(W) == 2;

  // layer_norm's statistics of 16-bit rows from one pass over the staged row, where a second
  // pass summed (v - mean)^2 once the mean was reduced: this thread's sums of d = v - k and d^2,
  // k its first element, give its part of the row's sum and, once the mean is known, of the
  // squared deviations: sum (d + e)^2 = s2 + e * (2 * s1 + n * e), e = k - mean. k being one of
  // the thread's own values, (k - their mean)^2 is at most their squared deviations, so s2 is
  // within n + 1 times them: the cancellation costs at most log2(n + 1) bits of the fp32 sum,
  // for rows far from zero too (where a raw sum of squares loses them all). H200, kernel-only %
  // of copy, bf16, two rounds: 1024x131072 78.7-78.8 -> 81.4, 512x262144 75.6-75.7 -> 78.1,
  // 4096x32768 84.2 -> 84.8, the rest level. fp32 rows lost 1-9 points (an 8-byte spill at
  // their 40 registers; 512x262144 74.2 -> 67.7) and keep two passes
  // (bench/results/h200-layer_norm-fwd-shifted-sums.txt).
  static constexpr bool kShiftedSums = !kRms && sizeof(T) == 2;
  struct ShiftedSums {
    float k, n, s1, s2;  // n: the thread's elements (0 past its slice: every term is 0)
    __device__ float sum() const { return s1 + n * k; }
    __device__ float squared_deviations(float mean) const {
      const float e = k - mean;
      return s2 + e * (2.f * s1 + n * e);
    }
  };
  __device__ static ShiftedSums shifted_sums(const T* x, const row_stage::Slice& sl) {
    ShiftedSums s{sl.t < sl.packs ? to_acc(x[sl.t * VEC]) : 0.f, 0.f, 0.f, 0.f};
    row_stage::for_packs(sl, [&](int p) {
      float v[VEC];
      widen(load_pack<T, VEC>(x + p * VEC), v);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float d = v[j] - s.k;
        s.s1 += d;
        s.s2 += d * d;
      }
      s.n += VEC;
    });
    return s;
  }

  // par: the block's staged slices of w and b, or null (then they are read from global memory).
  template <typename Reduce>
  __device__ static void row(const Args& a, const T* const* in, const W* const* par,
                             const row_stage::Slice& sl, Reduce&& reduce) {
    if (par != nullptr) {
      normalize<1>(a, in[0], par[0], par[1], sl, reduce);
    } else {
      normalize<kBatch>(a, in[0], a.w ? a.w + sl.col0 : nullptr, a.b ? a.b + sl.col0 : nullptr, sl,
                        reduce);
    }
  }

  // w, b: the slices' first columns (or null); one instantiation for shared and one for global
  // memory, so that neither makes its loads generic.
  template <int kBatch, typename Reduce>
  __device__ static void normalize(const Args& a, const T* x, const W* w, const W* b,
                                   const row_stage::Slice& sl, Reduce&& reduce) {
    float mu = 0.f, q;
    if constexpr (kShiftedSums) {
      const ShiftedSums s = shifted_sums(x, sl);
      mu = reduce(s.sum(), SumOp()) / a.cols;
      q = s.squared_deviations(mu);
    } else {
      if constexpr (!kRms) {
        auto value = [](float v) { return v; };
        mu = reduce(row_stage::fold<VEC>(x, sl, 0.f, value, SumOp()), SumOp()) / a.cols;
      }
      auto square = [mu](float v) { return (v - mu) * (v - mu); };
      q = row_stage::fold<VEC>(x, sl, 0.f, square, SumOp());
    }
    const float rs = acc_rsqrt(reduce(q, SumOp()) / a.cols + a.eps);
    if (sl.lead) {
      if constexpr (!kRms) a.mean[sl.row] = mu;
      a.rstd[sl.row] = rs;
    }
    auto store = [&](int p, const float(&out)[VEC]) {
      store_pack_global<T, VEC>(a.y + sl.offset + int64_t(p) * VEC, pack_from_acc<T, VEC>(out));
    };
    with_params<kRms>(w, b, [&](auto has_w, auto has_b) {
      constexpr bool kW = decltype(has_w)::value, kB = decltype(has_b)::value;
      const W* wk = kW ? w : nullptr;  // null where absent: load_params skips it
      const W* bk = kB ? b : nullptr;
      // Params loaded at their use (kBatch 1), or kBatch packs' params before any of their math.
      auto normalize_packs = [&](int p0, auto g) {
        constexpr int kPacks = decltype(g)::value;
        PackParams<W, VEC> pp[kPacks];
#pragma unroll
        for (int k = 0; k < kPacks; ++k)
          pp[k] = load_params<VEC>(wk, bk, int64_t(p0 + k * sl.n) * VEC);
#pragma unroll
        for (int k = 0; k < kPacks; ++k) {
          const int p = p0 + k * sl.n;
          float v[VEC], out[VEC];
          widen(load_pack<T, VEC>(x + p * VEC), v);
          normalize_pack<VEC, kW, kB, kFmaXHat>(v, mu, rs, pp[k], out);
          store(p, out);
        }
      };
      if constexpr (kBatch == 1) {
        row_stage::for_packs(sl,
                             [&](int p) { normalize_packs(p, std::integral_constant<int, 1>()); });
      } else {
        row_stage::for_pack_groups<kBatch>(sl, normalize_packs);
      }
    });
  }
};

// Forward for rows that don't fit in registers: a block per row; pass 1 accumulates the
// statistics (Welford per pack, merged across the block), pass 2 re-reads x (recently read, so
// mostly from L2) and writes y.
template <typename T, typename W, bool kRms, int VEC>
__global__ void __launch_bounds__(kLoopThreads, 1) norm_fwd_loop_kernel(NormFwdArgs<T, W> a) {
  sm90::grid_dependency_wait();
  using A = NormAcc<T>;
  __shared__ A scratch[kWarp];
  __shared__ Welford<A> wscratch[kWarp];
  const int64_t cols = a.cols, step = int64_t(blockDim.x) * VEC;
  // kLoopUnroll packs at c0, c0 + step, ... of one row: their loads in flight together.
  auto load_tile = [&](const T* xr, int64_t c0, A(&v)[kLoopUnroll][VEC]) {
#pragma unroll
    for (int u = 0; u < kLoopUnroll; ++u) {
      if (c0 + u * step < cols) load_acc<VEC>(xr + c0 + u * step, v[u]);
    }
  };
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* xr = a.x + row * cols;
    A sq = 0;
    Welford<A> acc{0, 0, 0};
    for (int64_t c0 = int64_t(threadIdx.x) * VEC; c0 < cols; c0 += step * kLoopUnroll) {
      A v[kLoopUnroll][VEC];
      load_tile(xr, c0, v);
#pragma unroll
      for (int u = 0; u < kLoopUnroll; ++u) {
        if (c0 + u * step >= cols) continue;
        if constexpr (kRms) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) sq += v[u][j] * v[u][j];
        } else {
          A m = 0, m2 = 0;
#pragma unroll
          for (int j = 0; j < VEC; ++j) m += v[u][j];
          m /= VEC;
#pragma unroll
          for (int j = 0; j < VEC; ++j) m2 += (v[u][j] - m) * (v[u][j] - m);
          acc = WelfordOp()(acc, Welford<A>{A(VEC), m, m2});
        }
      }
    }
    A mu = 0, var;
    if constexpr (kRms) {
      var = block_allreduce(sq, SumOp(), scratch) / cols;
    } else {
      acc = block_allreduce(acc, WelfordOp(), wscratch);
      mu = acc.mean;
      var = acc.m2 / cols;
    }
    const A rs = acc_rsqrt(var + a.eps);
    if (threadIdx.x == 0) {
      if constexpr (!kRms) a.mean[row] = mu;
      a.rstd[row] = rs;
    }
    with_params<kRms>(a.w, a.b, [&](auto has_w, auto has_b) {
      constexpr bool kW = decltype(has_w)::value, kB = decltype(has_b)::value;
      for (int64_t c0 = int64_t(threadIdx.x) * VEC; c0 < cols; c0 += step * kLoopUnroll) {
        A v[kLoopUnroll][VEC];
        load_tile(xr, c0, v);
#pragma unroll
        for (int u = 0; u < kLoopUnroll; ++u) {
          const int64_t col = c0 + u * step;
          if (col >= cols) continue;
          A out[VEC];
          normalize_pack<VEC, kW, kB>(
              v[u], mu, rs, load_params<VEC>(kW ? a.w : nullptr, kB ? a.b : nullptr, col), out);
          store_acc<VEC>(a.y + row * cols + col, out);
        }
      }
    });
  }
}

// Where a backward kernel puts its dweight/dbias partial sums: row blockIdx.x / (blocks per
// team) of dw / db ([partial rows, ld] of A; either may be null). group: threads per team when
// a team doesn't span a cluster.
template <typename A>
struct PartialRows {
  A* dw;
  A* db;
  int64_t ld;
  int group;
};

// Backward, row in registers (teams as in norm_fwd_kernel; x and dy kept in T). With
// xh = (x - mean) * rstd and g = dy * w:
//   dx = rstd * (g - mean(g) - xh * mean(g * xh))   (rms_norm: no mean(g) term)
// dw += dy * xh and db += dy accumulate in fp32 over the team's rows in shared memory (registers
// would hold 2 * 16 more floats per thread and halve the blocks per SM); at the end the teams of
// a block are summed in a fixed order into the block's partial row, or each block of a cluster
// team writes its columns of the cluster's partial row.
// Two blocks per SM: of 512 threads (<= 64 registers per thread) for 16-element teams, of 384
// (<= 80) for 24-element warp teams; one for the 32-element teams, whose dweight and dbias sums
// take 128 KB of shared memory anyway.
__host__ __device__ constexpr int bwd_min_blocks(int packs, int vec) {
  return packs * vec < kBwdLongElems ? 2 : 1;
}
constexpr int bwd_threads(int packs, int vec) {
  return packs * vec == kBwdMidElems ? 384 : kBwdMaxThreads;
}

template <typename T, typename W, bool kRms, int VEC, int kPacks, TeamKind kTeam>
__global__ void __launch_bounds__(bwd_threads(kPacks, VEC), bwd_min_blocks(kPacks, VEC))
    norm_bwd_kernel(NormBwdArgs<T, W> a, PartialRows<float> part) {
  extern __shared__ float4 acc_smem[];  // Acc::floats(blockDim.x) per sum
  __shared__ float2 scratch[kWarp];
  // Warp rows: the block's copy of w (packs [0, kWarp * kPacks)), read in each pass. Read from
  // global memory, each row's weights were loaded and widened beside its x and dy, up to 16 more
  // live registers at the 64-register cap (spills in the row loop).
  constexpr bool kStageW = kTeam != TeamKind::kBlock;
  __shared__ Pack<W, VEC> staged_w[kStageW ? kWarp * kPacks : 1];
  using Acc = BwdAcc<VEC, kPacks, kTeam == TeamKind::kBlock>;
  const Team team = make_team<kTeam>(part.group);
  sm90::ClusterExchange cluster(team.ranks);
  sm90::grid_dependency_wait();
  const int g = team.g, t = team.t;
  const int cols = static_cast<int>(a.cols);  // < 2^31 in the register tiers
  if constexpr (kStageW) {
    if (a.w != nullptr) {
      for (int i = threadIdx.x; i * VEC < cols; i += blockDim.x) {
        staged_w[i] = load_narrow<VEC>(a.w + i * VEC);
      }
    }
    __syncthreads();
  }
  float* dw_acc = reinterpret_cast<float*>(acc_smem);
  float* db_acc = dw_acc + Acc::floats(blockDim.x);
  const float zero[VEC] = {};
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {  // each thread reads back only its own slots until the flush
    Acc::store(dw_acc, p, zero);
    if constexpr (!kRms) Acc::store(db_acc, p, zero);
  }
  for (int64_t base = team_first_row(team); base < a.rows; base += team_row_step(team)) {
    const int64_t row = base + team.index;
    const bool valid = row < a.rows;
    PackWords<T, VEC> x[kPacks], dy[kPacks];
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int col = (p * g + t) * VEC;
      if (valid && col < cols) {
        x[p] = load_words<T, VEC>(a.x + row * a.cols + col);
        dy[p] = load_words<T, VEC>(a.dy + row * a.cols + col);
      } else {
        x[p] = dy[p] = PackWords<T, VEC>{};  // zero bits: +0, adds 0
      }
    }
    const float mu = kRms || !valid ? 0.f : a.mean[row];
    const float rs = valid ? a.rstd[row] : 0.f;
    // xh and dy of pack p, recomputed for each of the two uses (g = dy * w).
    auto xh_dy = [&](int p, float(&xh)[VEC], float(&d)[VEC]) {
      widen<T, VEC>(x[p], xh);
      widen<T, VEC>(dy[p], d);
#pragma unroll
      for (int j = 0; j < VEC; ++j) xh[j] = (xh[j] - mu) * rs;
    };
    auto weight = [&](int p, float(&wv)[VEC]) {
      const int col = (p * g + t) * VEC;
      if (a.w != nullptr && col < cols) {
        if constexpr (kStageW) {
          widen(staged_w[p * g + t], wv);
        } else {
          load_acc<VEC>(a.w + col, wv);
        }
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) wv[j] = 1.f;
      }
    };
    float2 s{0.f, 0.f};
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      float xh[VEC], d[VEC], wv[VEC], acc[VEC];
      xh_dy(p, xh, d);
      weight(p, wv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        s.x += d[j] * wv[j];
        s.y += d[j] * wv[j] * xh[j];
      }
      Acc::load(dw_acc, p, acc);
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[j] += d[j] * xh[j];
      Acc::store(dw_acc, p, acc);
      if constexpr (!kRms) {
        Acc::load(db_acc, p, acc);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] += d[j];
        Acc::store(db_acc, p, acc);
      }
    }
    if (a.dx == nullptr) continue;  // uniform over the grid: no barrier is skipped unevenly
    s = team_allreduce<kTeam>(s, Sum2Op(), team, scratch, cluster);
    if (!valid) continue;
    const float c1 = kRms ? 0.f : s.x / cols, c2 = s.y / cols;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int col = (p * g + t) * VEC;
      if (col < cols) {
        float xh[VEC], d[VEC], wv[VEC], out[VEC];
        xh_dy(p, xh, d);
        weight(p, wv);
#pragma unroll
        for (int j = 0; j < VEC; ++j) out[j] = rs * (d[j] * wv[j] - c1 - xh[j] * c2);
        store_acc<VEC>(a.dx + row * a.cols + col, out);
      }
    }
  }
  cluster.close();
  // The partial-row sum may launch now (it waits for this grid to complete): in the whole-warp
  // team tiers of two blocks per SM. H200, kernel-only over rotated inputs, 4096 rows, µs: bf16
  // layer_norm 768 / 512 columns 12.9 / 9.3 -> 12.5 / 8.9, rms_norm 768 11.3 -> 10.9, fp32
  // layer_norm 512 11.6 -> 11.2. Elsewhere it cost up to 3% or was level: one block per SM (bf16 /
  // fp32 layer_norm 1024: 13.3 / 19.0 -> 13.7 / 19.6), block teams (layer_norm 2048 25.0 ->
  // 25.4, rms_norm 23.0 -> 22.7), the staged kernel; part-warp teams were not measured alone.
  if constexpr (kTeam == TeamKind::kWarp && bwd_min_blocks(kPacks, VEC) > 1) {
    sm90::launch_dependents();
  }
  // Partial row blockIdx.x / ranks: one per block, or one per cluster (its blocks own disjoint
  // columns). Column c of the block's team r is pack c / (g * VEC), element c % VEC of thread
  // r * g + (c / VEC) % g. Part-warp teams of 16-byte rows first add a warp's teams by
  // butterfly shuffles over each thread's own float4 slots (pairwise, every lane at once),
  // leaving the warp's sums in its first team's slots; then one thread per column adds, in
  // order, the warps' sums (every team's, for the other teams). Walking all 512 one-lane teams
  // of a block that way took a third of fp32 layer_norm's backward at 262144x16.
  constexpr bool kWarpButterfly = kTeam == TeamKind::kWarpPart && Acc::kChunk == 4;
  const int warp_teams = kWarpButterfly ? kWarp / g : 1;
  if constexpr (kWarpButterfly) {
    auto warp_sum = [&](float* acc) {
#pragma unroll 1  // float4 q of the sums is thread q % blockDim.x's: see BwdAcc::index
      for (int i = threadIdx.x * 4; i < Acc::floats(blockDim.x); i += blockDim.x * 4) {
        float4 v = *reinterpret_cast<float4*>(acc + i);
        for (int offset = kWarp / 2; offset >= g; offset /= 2) {
          const float4 o = shuffle_xor<kWarp>(v, offset);
          v.x += o.x, v.y += o.y, v.z += o.z, v.w += o.w;
        }
        *reinterpret_cast<float4*>(acc + i) = v;
      }
    };
    warp_sum(dw_acc);
    if constexpr (!kRms) warp_sum(db_acc);
  }
  __syncthreads();
  // Into this block's (cluster's) partial row, or into dw / db where that is the only one.
  // Teams of a warp or less: a thread takes whole chunks (4 columns as one float4 where the sums
  // are stored so) and adds the block's teams' values in team order, its loads independent of
  // each other; one thread per column, adding 16 warps' scalars a load at a time, took ~20% of
  // bf16 layer_norm's 4096x1024 backward (Nsight Compute warp samples). H100, kernel-only % of
  // copy, bf16 / fp32: layer_norm 4096x1024 48.2 / 61.7 -> 52.8 / 69.0, 4096x768 41.2 / 54.3 ->
  // 44.0 / 61.5; rms_norm 4096x1024 53.4 / 68.2 -> 56.4 / 72.0; 65536 rows +0.3 to +3.2, but fp32
  // layer_norm 65536x768 88.5 -> 86.4 (its row loop's spills grew from 12 to 24 bytes). Block
  // teams (1-4 per block) keep one thread per column: with chunks their row loop spilled (bf16
  // rms_norm 32768x2048, 2 packs per thread, 0 -> 32 bytes: 91.6 -> 84.0).
  const bool only_part = gridDim.x == unsigned(team.ranks);
  constexpr int kChunk = kTeam == TeamKind::kBlock ? 1 : Acc::kChunk;
  constexpr int kSlots = kPacks * VEC / kChunk;  // chunks of a thread's sums
  using Chunk = Pack<float, kChunk>;
  auto flush = [&](const float* acc, float* partial, W* out) {
    partial += int64_t(blockIdx.x / team.ranks) * part.ld;
    const int first = team.ranks > 1 ? team.t - threadIdx.x : 0;  // the block's first column / VEC
    const int span = team.ranks > 1 ? blockDim.x : g;
    if constexpr (kChunk == 1) {
      for (int p = 0; p < kPacks; ++p) {
        for (int e = threadIdx.x; e < span * VEC; e += blockDim.x) {
          const int lane = e / VEC, j = e % VEC, col = (p * g + first + lane) * VEC + j;
          if (col >= cols) continue;
          float sum = 0.f;
          for (int r = 0; r < team.per_block; r += warp_teams) {
            sum += acc[Acc::index(p, j, r * g + lane)];
          }
          if (only_part) {
            out[col] = from_acc<W>(sum);
          } else {
            partial[col] = sum;
          }
        }
      }
    } else {
      for (int e = threadIdx.x; e < kSlots * span; e += blockDim.x) {
        const int lane = e % span, slot = e / span;
        const int p = slot / (VEC / kChunk), j = slot % (VEC / kChunk) * kChunk;
        const int col = (p * g + first + lane) * VEC + j;
        if (col >= cols) continue;
        Chunk sum{};
#pragma unroll 4
        for (int r = 0; r < team.per_block; r += warp_teams) {
          const Chunk v = load_pack<float, kChunk>(acc + Acc::index(p, j, r * g + lane));
#pragma unroll
          for (int k = 0; k < kChunk; ++k) sum.v[k] += v.v[k];
        }
        if (only_part) {
#pragma unroll
          for (int k = 0; k < kChunk; ++k) out[col + k] = from_acc<W>(sum.v[k]);
        } else {
          store_pack<float, kChunk>(partial + col, sum);
        }
      }
    }
  };
  if (a.dw != nullptr) flush(dw_acc, part.dw, a.dw);
  if constexpr (!kRms) {
    if (a.db != nullptr) flush(db_acc, part.db, a.db);
  }
}

// Backward on sm_90+ for 16-byte-aligned rows of 8 KB and more: a persistent team (a block, or
// a cluster whose blocks each take a contiguous slice of the row) walks its rows with the next
// rows' x and dy slices already on their way into shared memory (bulk copies completing on an
// mbarrier per stage; with one stage, the next row's chunks as this row's are read:
// staged_bwd_stages), so DRAM keeps serving this team while it reduces and writes the
// current row; the register tiers above issue a row's loads only once the previous row is done.
// Each thread owns kPacks packs of its block's slice (packs t and t + blockDim.x): their weights
// and dweight/dbias sums live in registers, and at the end the thread writes its columns of the
// team's partial row. Numerics as norm_bwd_kernel. Measured on an H100 (% of copy, layer_norm /
// rms_norm, against the register tiers in another run): bf16 rows one block holds, 16384x4096:
// 80-89 / 92 (83 / 87; layer_norm's GPU time there is close to a backward call's host cost; 94.7 at
// 32768x4096); fp32 in clusters of 2 and 4 blocks, 4096 and 8192 columns: 88.6 / 89.8 and 86.8
// / 88.5 (85 and 84 for layer_norm). Clusters exchange their row sums through mailboxes (sm90.cuh):
// with a cluster barrier per row they had taken the kernel only where four blocks shared an SM
// (bf16 layer_norm, 124 registers, ran 2-block clusters at 70 / 72 against 81 / 86, clusters of
// 8-16 at 60-75 against 71-90); now clusters of up to 16 blocks serve every row they hold:
// 4096x32768 bf16 71.5 / 75.7 -> 88.5 / 87.2 and fp32 90.5 / 89.2 -> 92.8 / 92.7 (register tiers
// with the old exchange -> this kernel). Capping registers to fit more blocks spilled and lost:
// bf16 at 80 registers, 16384x4096, 74 / 77; so did, at 1024x131072, 16 blocks of 1024 threads
// owning one pack each (64 registers) in place of 16 of 512 owning two (100-119): bf16 74.7 / 82.8
// -> 64.2 / 70.9, fp16 73.6 / 79.6 -> 58.4 / 69.6. Writing each row's dx a row late (posting
// row i's sums to the cluster before writing row i - 1, three stages) measured level with this
// loop once bf16 layer_norm's 4-pack kernel no longer spilled on the path from the cluster's
// totals to the dx: what it had gained was that spill (H200,
// bench/results/h200-norm-bwd-params-in-constants.txt).
constexpr int kBwdStages = 2;
// Rows under 8 KB keep the register tiers (the forward's engine starts at 4 KB): staged at 4 KB,
// H100, rms_norm bf16 32768x2048 ran 89.4 -> 82.7 and fp32 65536x1024 87.9 -> 84.6.
constexpr int kBwdStagedMinRowBytes = 8 << 10;
// Teams of blocks of 256 threads owning 2 packs each hold rows of up to 8 x 256 x 2 packs
// (16-bit 32768, fp32 16384 columns; kBwdStagedMaxRanks2Packs), with x and dy held in registers
// between the two passes. Longer rows take blocks of 512 owning 4 packs (up to 16-bit 262144, fp32
// 131072 columns) whose x and dy stay in shared memory: each pass reads them from the stage, which
// is refilled once the row is written (one row ahead, not two), so that the weights and the
// dweight/dbias sums fit in registers (layer_norm: 64 floats of sums, 16-bit weights as stored).
// They replaced blocks of 512 owning 2 packs (16-bit 131072, 1024 threads for fp32 layer_norm) and
// the register cluster tier (16-bit 262144, fp32 rms_norm 131072); H100, % of copy, layer_norm /
// rms_norm before -> after: 1024x131072 bf16 75 / 83 -> 92 / 91, fp16 74 / 80 -> 92 / 91, fp32
// 97 / 88 -> 97 / 98; 512x262144 bf16 58 / 60 -> 85 / 95, fp16 55 / 56 -> 86 / 91. Blocks of 256
// owning 4, twice as many per cluster (two per SM), lost up to 8.5 points (H200, bf16 layer_norm
// 1024x131072 77.5 -> 69.0; bench/results/h200-row-stage-chunks-bwd-256-threads-rejected.txt).
constexpr int kBwdStagedPacks = 2, kBwdStagedThreads = 256;
constexpr int kBwdStagedLongPacks = 4, kBwdStagedLongThreads = 512;
// Rows the 2-pack kernel would split over more blocks than this take the 4-pack kernel, over
// half as many (16-bit 32768-65536 columns, fp32 16384-32768). H200, kernel-only % of copy, 2
// packs x 16 blocks -> 4 packs x 8 or fewer, layer_norm / rms_norm: bf16 2048x65536 71.0 / 74.1 ->
// 81.4 / 88.9, 4096x65536 72.6 / 75.5 -> 85.5 / 94.5, fp32 4096x32768 89.5 / 92.1 -> 94.5 / 94.4.
// A cap of 4 lost where the 2-pack kernel ran 8 blocks: bf16 4096x32768 86.3 / 88.4 -> 83.0 /
// 85.7, fp32 8192x16384 98.7 / 95.2 -> 92.6 / 91.8
// (bench/results/h200-norm-bwd-2pack-rank-cap.txt).
constexpr int kBwdStagedMaxRanks2Packs = 8;
// Longer fp32 rows (up to 262144 columns) take blocks of 512 owning 8 packs (kBwdLongElems per
// thread, as the 16-bit 4 packs) with one stage, whose chunks (pack k of every thread) are
// refilled with the next row's as the second pass reads them: two stages would take 256 KB.
// They replaced the register cluster tier, which issued a row's loads only once the previous
// row was done: H100, % of copy, layer_norm / rms_norm 512x262144 62 / 69 -> 91 / 95
// (kernel-only).
// Two blocks per SM for the 2-pack kernel (its registers allow two; one at 4 packs), and no more:
// each block asks for a third of the SM's shared memory or more, where three or four would have
// fit. H100, % of copy, against as many as fit: fp16 rms_norm (80 registers: three fit) 16384x4096
// / 8192x8192 / 4096x32768 87 / 85 / 88 -> 96 / 96 / 94; fp32 rms_norm (55) 8192x8192 92 -> 99.5,
// 4096x32768 93 -> 95; fp32 layer_norm, which had a 64-register cap for four blocks (now 67),
// 16384x4096 / 8192x8192 / 4096x32768 89 / 89 / 93.5 -> 99 / 97.5 / 92. Nsight Compute timed the
// fp16 kernels alone within 3% of two blocks' time: the third block costs in back-to-back calls.
// A grid of two blocks per SM with three fitting lost where clusters are of 8 or 16 blocks (fp16
// rms_norm 4096x32768 88 -> 85, fp32 layer_norm 94 -> 83): clusters then crowd some SMs.
// Where DRAM is faster per SM (row_stage::fast_dram), three: H200, kernel-only % of copy, fp32
// layer_norm / rms_norm 8192x8192 84.5 / 88.8 -> 96.1 / 96.4, 4096x32768 67.4 / 70.0 -> 83.2 /
// 88.0, 16384x4096 89.9 / 93.9 -> 93.5 / 89.2; 16-bit kernels' registers hold two anyway.
// Clusters of 8 keep that cap (fp32 8192x16384, uncapped: 95.1 / 96.7 -> 94.2 / 92.5; clusters
// of 16, which this kernel ran then, gained without it). More stages (2-6 of 16 KB, as many as the
// shared memory held) lost up to 3 points in the 16-bit backward at two blocks per SM, and 512
// threads of one pack each (twice the warps) 4-14: x and dy in flight are not what holds it back
// (bench/results/h200-norm-bwd-stages-blocks.txt).
constexpr int kBwdStagedBlocksPerSm = 2, kBwdStagedBlocksPerSmFastDram = 3;
constexpr int kBwdStatsInStageMinRanks = 4;  // 16-bit 2-pack rows (staged_bwd_plan)
template <int kPacks>
constexpr int staged_bwd_min_blocks() {
  return kPacks == kBwdStagedPacks ? kBwdStagedBlocksPerSm : 1;
}
__host__ __device__ constexpr int staged_bwd_threads(int packs) {
  return packs == kBwdStagedPacks ? kBwdStagedThreads : kBwdStagedLongThreads;
}
__host__ __device__ constexpr int staged_bwd_stages(int packs) {
  return packs > kBwdStagedLongPacks ? 1 : kBwdStages;
}

template <typename T, typename W, bool kRms, int VEC, int kPacks, bool kStatsInStage>
__global__ void __launch_bounds__(staged_bwd_threads(kPacks), staged_bwd_min_blocks<kPacks>())
    norm_bwd_staged_kernel(NormBwdArgs<T, W> a, PartialRows<float> part) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kStages = staged_bwd_stages(kPacks);
  // Two stages are refilled whole, one chunk by chunk (chunk k: pack k of every thread).
  constexpr int kChunks = kStages == 1 ? kPacks : 1;
  constexpr int kWarps = staged_bwd_threads(kPacks) / kWarp;  // blockDim.x / kWarp
  extern __shared__ __align__(128) unsigned char staged[];    // [stage][x slice, dy slice]
  __shared__ uint64_t landed[kStages][kChunks];
  __shared__ float2 stats[kStages];  // (mean, rstd) of each stage's row, kStatsInStage
  __shared__ float2 scratch[kWarp];
  constexpr bool kRowInRegisters = kPacks == kBwdStagedPacks;  // else read from the stage
  // x-hat = x * rs - mu * rs in one FMA, and dx from x in two FMAs (write_dx): the 4-pack
  // kernel only, where they measured faster. H200, kernel-only % of copy, layer_norm bf16 / fp16:
  // 1024x131072 84.6 / 87.3 -> 90.5 / 90.0, 512x262144 73.0 / 77.6 -> 79.3 / 82.8. In the 2-pack
  // kernel bf16 16384x4096 fell 89.2 -> 84.0, in the 8-pack fp32 512x262144 81.5 -> 78.6.
  constexpr bool kFmaTerms = kPacks == kBwdStagedLongPacks;
  const Team team = make_team<TeamKind::kBlock>(blockDim.x);
  sm90::ClusterExchange cluster(team.ranks);
  sm90::grid_dependency_wait();
  const int rank = team.t / blockDim.x, tid = threadIdx.x;
  const int64_t cols = a.cols;
  const int slice_packs = static_cast<int>(cols / VEC / team.ranks);
  const int chunk_packs = kChunks == 1 ? slice_packs : static_cast<int>(blockDim.x);
  const int64_t col0 = int64_t(rank) * slice_packs * VEC;
  const int64_t first = blockIdx.x / team.ranks, step = gridDim.x / team.ranks;
  auto stage = [&](int s) {
    return reinterpret_cast<T*>(staged) + int64_t(2 * s) * slice_packs * VEC;
  };
  // Each row's mean and rstd. With kStatsInStage (the plan's choice, staged_bwd_plan) they
  // land with the row's x and dy, kStages rows ahead; otherwise each block loads them from global
  // memory: 16-bit rows a row ahead (at their own row's top, the first pass waited on them: bf16
  // layer_norm 16384x4096 81.7 -> 89.3), fp32 rows at the row's top (a row ahead had cost 2-10
  // points: 8192x8192 96.4 -> 87.0).
  constexpr bool kStatsAhead = sizeof(T) == 2;
  float next_mu = 0.f, next_rs = 0.f;
  auto load_stats = [&](int64_t row) {
    if (row < a.rows) next_mu = kRms ? 0.f : a.mean[row], next_rs = a.rstd[row];
  };
  auto chunk_size = [&](int c) {  // packs; 0 for chunks past a short slice (never fetched)
    return max(0, min(chunk_packs, slice_packs - c * chunk_packs));
  };
  auto fetch_chunk = [&](int64_t row, int s, int c) {  // thread 0: chunk c of `row`'s slices
    const unsigned bytes = unsigned(chunk_size(c)) * unsigned(VEC * sizeof(T));
    const int64_t off = int64_t(c) * chunk_packs * VEC;
    if (bytes == 0) return;
    if (c == 0 && kStatsInStage) {  // the row's mean and rstd land with its first chunk
      if constexpr (!kRms) sm90::copy4_async(&stats[s].x, a.mean + row);
      sm90::copy4_async(&stats[s].y, a.rstd + row);
      sm90::mbar_arrive_on_copies(&landed[s][0]);
    }
    sm90::mbar_arrive_expect(&landed[s][c], 2 * bytes);
    sm90::bulk_load(stage(s) + off, a.x + row * cols + col0 + off, bytes, &landed[s][c]);
    sm90::bulk_load(stage(s) + slice_packs * VEC + off, a.dy + row * cols + col0 + off, bytes,
                    &landed[s][c]);
  };
  auto fetch = [&](int64_t row, int s) {  // thread 0: x and dy slices of `row` into stage s
#pragma unroll
    for (int c = 0; c < kChunks; ++c) fetch_chunk(row, s, c);
  };
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      for (int c = 0; c < kChunks; ++c) sm90::mbar_init(&landed[s][c]);
    }
    sm90::fence_mbar_init();
    for (int s = 0; s < kStages && first + s * step < a.rows; ++s) fetch(first + s * step, s);
  }
  // The weights, widened where used: held in fp32 at 2 packs per thread, as stored at 4, where
  // the sums fill the registers (fp16 weights widened at each use cost the 2-pack layer_norm
  // 10% at 4096-8192 columns).
  using HeldW = std::conditional_t<kRowInRegisters, float, W>;
  Pack<HeldW, VEC> w[kPacks];
  float dw[kPacks][VEC] = {}, db[kPacks][VEC] = {};
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = tid + k * blockDim.x;
    if (a.w != nullptr && p < slice_packs) {
      if constexpr (kRowInRegisters) {
        load_acc<VEC>(a.w + col0 + p * VEC, w[k].v);
      } else {
        w[k] = load_narrow<VEC>(a.w + col0 + p * VEC);
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) w[k].v[j] = from_acc<HeldW>(1.f);
    }
  }
  __syncthreads();  // the barriers are initialized before anyone waits on them
  if (!kStatsInStage && kStatsAhead) load_stats(first);

  // c1, c2 by multiplies, not divisions; 1 / cols read from the kernel's parameters, where it
  // holds no register across the row loop (bf16 layer_norm's 4-pack kernel had spilled it).
  const float inv_cols = a.inv_cols;
  // The team's i-th row is in stage i % kStages.
  auto wait = [&](int i, int c) {  // chunk c of the i-th row has landed
    if (chunk_size(c) > 0) sm90::mbar_wait(&landed[i % kStages][c], (i / kStages) & 1);
  };
  auto refill = [&](int64_t next, int s) {  // stage s is no longer read: row next's slices go in
    __syncthreads();
    if (tid == 0 && next < a.rows) fetch(next, s);
  };
  using Words = PackWords<T, VEC>;
  constexpr int kHeld = kRowInRegisters ? kPacks : 1;
  Words held_x[kHeld] = {}, held_dy[kHeld] = {};  // {}: nvcc can't see sum_row fill them first
  // Rows held in registers keep pass 1's x-hat and g for pass 2 (recomputed from the words
  // there, fp16 rows took 14% more instructions per row; bf16 and fp32 compile the same).
  float held_xh[kHeld][VEC], held_g[kHeld][VEC];
  auto load = [&](int s, int k, Words& x, Words& dy) {
    const int p = tid + k * blockDim.x;
    if (p < slice_packs) {
      x = load_words<T, VEC>(stage(s) + p * VEC);
      dy = load_words<T, VEC>(stage(s) + (slice_packs + p) * VEC);
    } else {
      x = dy = Words{};  // zero bits: +0, adds 0
    }
  };
  // Pack k's x-hat, dy and g = dy * w, from the held words or stage s.
  auto pack_terms = [&](int s, int k, float mu, float rs, float(&xh)[VEC], float(&d)[VEC],
                        float(&g)[VEC]) {
    Words x, dy;
    if constexpr (kRowInRegisters) {
      x = held_x[k], dy = held_dy[k];
    } else {
      load(s, k, x, dy);
    }
    widen<T, VEC>(x, xh);
    widen<T, VEC>(dy, d);
    float wv[VEC];
    widen(w[k], wv);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      xh[j] = kFmaTerms && !kRms ? fmaf(xh[j], rs, -mu * rs) : (xh[j] - mu) * rs;
      g[j] = d[j] * wv[j];
    }
  };
  // Pass 1 over the i-th row: its mean and rstd, the dweight / dbias sums, and this thread's
  // part of sum(g) and sum(g * x-hat).
  auto sum_row = [&](int64_t row, int i, float& mu, float& rs) {
    const int s = i % kStages;
    if constexpr (kStatsInStage) {
      wait(i, 0);
      mu = kRms ? 0.f : stats[s].x, rs = stats[s].y;
    } else {
      if (!kStatsAhead) load_stats(row);
      mu = next_mu, rs = next_rs;
      if (kStatsAhead) load_stats(row + step);
    }
    if constexpr (kChunks == 1) wait(i, 0);
    if constexpr (kRowInRegisters) {
#pragma unroll
      for (int k = 0; k < kPacks; ++k) load(s, k, held_x[k], held_dy[k]);
      refill(row + kStages * step, s);
    }
    float2 sum{0.f, 0.f};
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if constexpr (kChunks > 1) wait(i, k);
      float xh[VEC], d[VEC], g[VEC];
      pack_terms(s, k, mu, rs, xh, d, g);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        sum.x += g[j];
        sum.y += g[j] * xh[j];
        dw[k][j] += d[j] * xh[j];
        if constexpr (!kRms) db[k][j] += d[j];
        if constexpr (kRowInRegisters) held_xh[k][j] = xh[j], held_g[k][j] = g[j];
      }
    }
    return sum;
  };
  // Pass 2 over the i-th row: dx, from the team's sum(g) and sum(g * x-hat).
  auto write_dx = [&](int64_t row, int i, float mu, float rs, float2 sum) {
    const int s = i % kStages;
    const int64_t next = row + kStages * step;
    // dx = rs * (g - c1 - xh * c2) = rs * g + (cx * xh + c0): two FMAs per element. With
    // kFmaTerms, from the stage's x: rs * g + (cxr * x + c0x), no x-hat (the mean's products
    // cancel there; their rounding, ~2^-24 |mu| rs, is that of x-hat's own FMA).
    const float c1 = kRms ? 0.f : sum.x * inv_cols, c2 = sum.y * inv_cols;
    const float cx = -rs * c2, c0 = -rs * c1;
    const float cxr = cx * rs, c0x = kRms ? c0 : fmaf(cx, -mu * rs, c0);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int p = tid + k * blockDim.x;
      float xh[VEC], d[VEC], g[VEC], out[VEC];
      if constexpr (kFmaTerms) {
        if (p < slice_packs) {  // no zeroed words for packs past the slice: nothing is stored
          float x[VEC], wv[VEC];
          widen<T, VEC>(load_words<T, VEC>(stage(s) + p * VEC), x);
          widen<T, VEC>(load_words<T, VEC>(stage(s) + (slice_packs + p) * VEC), d);
          widen(w[k], wv);
#pragma unroll
          for (int j = 0; j < VEC; ++j) out[j] = fmaf(rs, d[j] * wv[j], fmaf(cxr, x[j], c0x));
        }
      } else if constexpr (kRowInRegisters) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) xh[j] = held_xh[k][j], g[j] = held_g[k][j];
      } else {
        pack_terms(s, k, mu, rs, xh, d, g);
      }
      if constexpr (kChunks > 1) {  // every thread has read chunk k: the next row's goes in
        __syncthreads();
        if (tid == 0 && next < a.rows) fetch_chunk(next, s, k);
      }
      if (p < slice_packs) {
        if constexpr (!kFmaTerms) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) out[j] = fmaf(rs, g[j], fmaf(cx, xh[j], c0));
        }
        store_acc<VEC>(a.dx + row * cols + col0 + p * VEC, out);
      }
    }
  };
  int i = 0;
  for (int64_t row = first; row < a.rows; row += step, ++i) {
    float mu, rs;
    float2 sum = sum_row(row, i, mu, rs);
    if (a.dx != nullptr) {  // uniform over the grid
      sum = cluster.exchange(block_allreduce(sum, Sum2Op(), scratch, kWarps), Sum2Op());
      write_dx(row, i, mu, rs, sum);
    }
    if constexpr (!kRowInRegisters) {
      if (kChunks == 1 || a.dx == nullptr) refill(row + kStages * step, i % kStages);
    }
  }
  cluster.close();
  // Into this team's partial row, or into dw / db where that is the only one.
  const bool only_part = gridDim.x == unsigned(team.ranks);
  const int64_t part_row = int64_t(blockIdx.x / team.ranks) * part.ld + col0;
  auto flush = [&](const float(&sum)[VEC], float* partial, W* out, int p) {
    if (only_part) {
      store_acc<VEC>(out + col0 + p * VEC, sum);
    } else {
      store_acc<VEC>(partial + part_row + p * VEC, sum);
    }
  };
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = tid + k * blockDim.x;
    if (p >= slice_packs) continue;
    if (a.dw != nullptr) flush(dw[k], part.dw, a.dw, p);
    if constexpr (!kRms) {
      if (a.db != nullptr) flush(db[k], part.db, a.db, p);
    }
  }
#endif
}

// Backward for rows that don't fit in registers: a block per row. Pass 1 reduces sum(g) and
// sum(g * xh); pass 2 re-reads x and dy (mostly from L2), writes dx and adds into the block's
// own partial rows in global memory (zeroed by the launcher; one writer per element).
template <typename T, typename W, bool kRms, int VEC>
__global__ void __launch_bounds__(kLoopThreads, 1)
    norm_bwd_loop_kernel(NormBwdArgs<T, W> a, PartialRows<NormAcc<T>> part) {
  sm90::grid_dependency_wait();
  using A = NormAcc<T>;
  __shared__ Pair<A> scratch[kWarp];
  const int64_t cols = a.cols, step = int64_t(blockDim.x) * VEC;
  A* dwp = part.dw != nullptr ? part.dw + int64_t(blockIdx.x) * part.ld : nullptr;
  A* dbp = part.db != nullptr ? part.db + int64_t(blockIdx.x) * part.ld : nullptr;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* xr = a.x + row * cols;
    const T* dyr = a.dy + row * cols;
    const A mu = kRms ? A(0) : a.mean[row], rs = a.rstd[row];
    // One pass of the row: f(col, xh, g, dy) for each pack.
    auto sweep = [&](auto&& f) {
      for (int64_t c0 = int64_t(threadIdx.x) * VEC; c0 < cols; c0 += step * kLoopUnroll) {
        A xv[kLoopUnroll][VEC], dv[kLoopUnroll][VEC];
#pragma unroll
        for (int u = 0; u < kLoopUnroll; ++u) {
          if (c0 + u * step < cols) {
            load_acc<VEC>(xr + c0 + u * step, xv[u]);
            load_acc<VEC>(dyr + c0 + u * step, dv[u]);
          }
        }
#pragma unroll
        for (int u = 0; u < kLoopUnroll; ++u) {
          const int64_t col = c0 + u * step;
          if (col >= cols) continue;
          A wv[VEC], xh[VEC], gr[VEC];
          if (a.w != nullptr) load_acc<VEC>(a.w + col, wv);
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            xh[j] = (xv[u][j] - mu) * rs;
            gr[j] = a.w != nullptr ? dv[u][j] * wv[j] : dv[u][j];
          }
          f(col, xh, gr, dv[u]);
        }
      }
    };
    A c1 = 0, c2 = 0;
    if (a.dx != nullptr) {
      Pair<A> s{0, 0};
      sweep([&](int64_t, const A(&xh)[VEC], const A(&gr)[VEC], const A(&)[VEC]) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          s.x += gr[j];
          s.y += gr[j] * xh[j];
        }
      });
      s = block_allreduce(s, Sum2Op(), scratch);
      c1 = kRms ? A(0) : s.x / cols;
      c2 = s.y / cols;
    }
    sweep([&](int64_t col, const A(&xh)[VEC], const A(&gr)[VEC], const A(&dy)[VEC]) {
      if (a.dx != nullptr) {
        A out[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) out[j] = rs * (gr[j] - c1 - xh[j] * c2);
        store_acc<VEC>(a.dx + row * cols + col, out);
      }
      A acc[VEC];
      if (dwp != nullptr) {
        load_acc<VEC>(dwp + col, acc);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] += dy[j] * xh[j];
        store_acc<VEC>(dwp + col, acc);
      }
      if (dbp != nullptr) {
        load_acc<VEC>(dbp + col, acc);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] += dy[j];
        store_acc<VEC>(dbp + col, acc);
      }
    });
  }
}

int64_t round_up_warp(int64_t n) { return ceil_div(n, kWarp) * kWarp; }

// Lanes of a warp team for a row of `packs` packs: the power of two that holds them one per
// lane, up to a warp, so that a warp takes several short rows at once (H100 before this, bf16
// 262144 rows of 64 / 128 columns, 8 / 16 packs on 32 lanes: rms_norm forward at 35 / 67% of
// copy).
int row_lanes(int64_t packs) {
  int lanes = 1;
  while (lanes < packs && lanes < kWarp) lanes *= 2;
  return lanes;
}

// The backward's warp teams, whose lanes hold up to lane_packs packs: rows of fewer packs than
// a warp's lanes take as few lanes as hold them (H100, 262144 rows, us: bf16 layer_norm 16 / 64
// / 128 columns 174 / 186 / 190 -> 27 / 51 / 88); longer rows a whole warp, where fewer lanes
// of more packs each lost (fp32 128 columns, 8 lanes of 4 packs: 7-9% slower than 32 of 1;
// fp32 layer_norm 160, 16 lanes of 4: 7.5%), but for layer_norm's 16-bit rows of 32 packs (256
// columns): half warps of 2 packs, bf16 205 -> 155 us (rms_norm 149 -> 155: not taken).
int bwd_row_lanes(int64_t packs, int lane_packs, bool rms) {
  if (packs < kWarp) return row_lanes(ceil_div(packs, lane_packs));
  return !rms && packs == kWarp && lane_packs == 2 ? kWarp / 2 : kWarp;
}

// Blocks for `teams` row teams of `ranks` blocks: enough to fill the device many times over;
// the kernels stride over further rows (which keeps gridDim.x far below its limit).
int64_t stride_blocks(int64_t teams, int ranks, const DeviceInfo& info) {
  const int64_t cap = std::max<int64_t>(1, int64_t(info.sm_count) * 32 / ranks);
  return std::min(teams, cap) * ranks;
}

// The forward's grid for `blocks` blocks of whole-warp or block teams: all of them where they
// fill the device's block slots (32 per SM) twice over, as softmax's grid_for does (the block
// scheduler then balances the rows better than blocks striding over them), else stride_blocks'.
// H100, kernel-only, us, striding -> a block each: fp32 layer_norm 262144x128 / 262144x256 /
// 65536x768 101.6 / 193.9 / 161.3 -> 92.3 / 181.7 / 141.3, rms_norm 262144x128 / x256 98.6 /
// 190.1 -> 91.4 / 180.5, bf16 layer_norm 65536x768 72.8 -> 70.0. Blocks of part-warp teams (8-64
// rows each) keep striding: bf16 layer_norm 262144x64 / x128 read 28.1 / 53.6 -> 29.1 / 57.2 as
// a block each.
int64_t wave_blocks(int64_t blocks, const DeviceInfo& info) {
  if (blocks >= 2 * int64_t(info.sm_count) * 32) return std::min<int64_t>(blocks, INT_MAX);
  return stride_blocks(blocks, 1, info);
}

// Looping kernels re-read a row soon after reading it: keep the rows in flight within half the
// L2, but use at least one block per SM.
int64_t loop_blocks(int64_t rows, int64_t row_bytes, const DeviceInfo& info) {
  const int l2 = query_once(nullptr, 0, 0, [](int device) {
    int bytes = 0;
    if (cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess) {
      cudaGetLastError();
      bytes = 0;
    }
    return bytes;
  });
  const int64_t fit = l2 / 2 / std::max<int64_t>(row_bytes, 1);
  return std::min(rows, std::clamp<int64_t>(fit, info.sm_count, int64_t(info.sm_count) * 4));
}

// The team for a row of `cols`: the fewest packs per thread among `packs_options`, then the
// fewest blocks (ranks, a cluster when > 1), with at most max_threads threads per block. ranks
// is 0 when no such team holds the row in registers.
struct TeamShape {
  int ranks;
  int threads;  // per block
  int packs;
};

TeamShape team_shape(int64_t cols, int vec, std::initializer_list<int> packs_options,
                     int max_threads, int max_ranks) {
  for (const int packs : packs_options) {
    for (int ranks = 1; ranks <= max_ranks; ranks *= 2) {
      const int64_t threads = round_up_warp(ceil_div(ceil_div(cols, vec), int64_t(ranks) * packs));
      if (threads <= max_threads) return {ranks, static_cast<int>(threads), packs};
    }
  }
  return {0, 0, 0};
}

// fp64 rows take the looping kernels only (as softmax's): the register tiers are sized for
// fp32 registers, and fp64 norms serve references and gradcheck, not speed.
template <typename T>
constexpr bool kRegisterTiers = !std::is_same_v<T, double>;

// Warp teams for rows of up to 4 packs per lane, then block and cluster teams, then the
// looping kernel.
template <typename T, typename W, bool kRms, int VEC>
cudaError_t norm_fwd_vec(const NormFwdArgs<T, W>& a, const DeviceInfo& info, cudaStream_t stream) {
  if constexpr (kRegisterTiers<T>) {
    if constexpr (VEC > 1) {
      cudaError_t err = cudaSuccess;
      if (row_stage::try_launch<NormFwdStaged<T, W, kRms, VEC>, VEC>(a, a.rows, a.cols, info,
                                                                     stream, &err)) {
        return err;
      }
    }
    constexpr int kRows = kFwdWarpRowsPerBlock;
    const LaunchShape warp{wave_blocks(ceil_div(a.rows, kRows), info), kWarp * kRows, 0, 1};
    if (a.cols <= kWarp * VEC) {
      const int lanes = row_lanes(ceil_div(a.cols, VEC));
      if (lanes == kWarp) {
        return launch(norm_fwd_kernel<T, W, kRms, VEC, 1, TeamKind::kWarp>, warp, info, stream, a,
                      kWarp);
      }
      const LaunchShape part_rows{stride_blocks(ceil_div(a.rows, kRows * kWarp / lanes), 1, info),
                                  kWarp * kRows, 0, 1};
      return launch(norm_fwd_kernel<T, W, kRms, VEC, 1, TeamKind::kWarpPart>, part_rows, info,
                    stream, a, lanes);
    }
    if (a.cols <= kWarp * VEC * 2) {
      return launch(norm_fwd_kernel<T, W, kRms, VEC, 2, TeamKind::kWarp>, warp, info, stream, a,
                    kWarp);
    }
    if (a.cols <= kWarp * VEC * 4) {
      return launch(norm_fwd_kernel<T, W, kRms, VEC, 4, TeamKind::kWarp>, warp, info, stream, a,
                    kWarp);
    }
    // One block per row where one holds it: its barriers are cheap. Longer rows take clusters
    // of 512-thread blocks first, two per SM, so that one block loads while the other waits at
    // its cluster's barriers, and only then of 1024-thread blocks. Measured on an H100 (bf16 /
    // fp32 % of copy, layer_norm): 4096x32768 bf16 77 as one 1024-thread block, 64 as two
    // 512-thread blocks; fp32 68 as 2 x 1024, 72 as 4 x 512; 1024x131072 bf16 50 as 4 x 1024,
    // 55 as 8 x 512. Clusters of 16 (non-portable) were no faster than 8 x 1024 or the loop.
    constexpr int kPacks = VEC > 1 ? kFwdPacks : kFwdScalars;
    const int max_ranks = info.has_clusters() ? kPortableClusterRanks : 1;
    const std::pair<int, int> caps[] = {// threads per block, blocks per team
                                        {fwd_max_threads(kPacks), 1},
                                        {kFwdClusterThreads, max_ranks},
                                        {fwd_max_threads(kPacks), max_ranks}};
    for (const auto& [max_threads, ranks] : caps) {
      const TeamShape s = team_shape(a.cols, VEC, {kPacks}, max_threads, ranks);
      if (s.ranks == 0) continue;
      const int64_t blocks =
          s.ranks > 1 ? stride_blocks(a.rows, s.ranks, info) : wave_blocks(a.rows, info);
      const LaunchShape team{blocks, s.threads, 0, s.ranks};
      return launch(norm_fwd_kernel<T, W, kRms, VEC, kPacks, TeamKind::kBlock>, team, info, stream,
                    a, s.threads);
    }
  }
  const LaunchShape loop{loop_blocks(a.rows, a.cols * int64_t(sizeof(T)), info), kLoopThreads, 0,
                         1};
  return launch(norm_fwd_loop_kernel<T, W, kRms, VEC>, loop, info, stream, a);
}

template <typename T, typename W>
struct BwdPlan {
  void (*kernel)(NormBwdArgs<T, W>, PartialRows<NormAcc<T>>);
  LaunchShape shape;
  int group;             // threads per team (when not a cluster)
  bool zeroed_partials;  // the kernel adds into its partial rows
  int64_t parts;         // partial rows: one per block, or per cluster

  // One partial row, not added into: the kernel writes dw / db itself (no workspace, no sum).
  bool writes_sums() const { return parts == 1 && !zeroed_partials; }
};

// As many blocks (clusters) as fit on the device at once, each writing one partial row; fewer
// when there aren't enough rows. False when a cluster of this size can't run at all. (resident()
// opts the kernel into shared memory at any size: without it dynamic and static shared memory
// together may not pass 48 KB, and the staged backward's 48 KB of stages, bf16 98304 columns in
// 16-block clusters, had found no room.)
template <typename T, typename W>
bool size_bwd_grid(BwdPlan<T, W>& p, int64_t rows, const DeviceInfo& info) {
  LaunchShape& l = p.shape;
  const int fit = resident(p.kernel, l, info);
  if (fit < 1) return false;
  const int64_t teams = ceil_div(rows, l.ranks > 1 ? 1 : l.threads / p.group);
  p.parts = std::min<int64_t>(teams, fit);
  l.blocks = p.parts * l.ranks;
  return true;
}

// The staged backward's team: the fewest blocks of a cluster that hold the row at 2 packs per
// thread (up to kBwdStagedMaxRanks2Packs blocks), else at 4 (up to kMaxBwdClusterRanks). No kernel
// before sm_90, for rows under 8 KB or that no such team holds, or where the row doesn't split into
// equal slices.
template <typename T, typename W, bool kRms, int VEC>
BwdPlan<T, W> staged_bwd_plan(const NormBwdArgs<T, W>& a, const DeviceInfo& info) {
  if (!info.has_clusters() || a.cols * int64_t(sizeof(T)) < kBwdStagedMinRowBytes) return {};
  constexpr int kPacks = kBwdStagedPacks, kLongPacks = kBwdStagedLongPacks;
  constexpr int kChunkedPacks = kBwdLongElems / VEC;  // fp32: 8; 16-bit: kLongPacks, above
  // Mean and rstd through the stage (kStatsInStage) where that measured faster: the longer
  // rows' kernels, and 16-bit rows split over clusters of kBwdStatsInStageMinRanks or more. H200,
  // kernel-only % of copy, bf16 layer_norm / rms_norm, from global memory -> through the stage:
  // 8192x16384 84.9 / 91.6 -> 94.0 / 94.4, 4096x32768 74.9 / 80.3 -> 86.5 / 88.3, 2048x65536
  // 59.1 / 62.4 -> 70.9 / 74.2, 512x262144 58.9 / 78.9 -> 63.2 / 86.4; fp32 1024x131072 88.5 /
  // 94.0 -> 93.5 / 94.5. Slower through the stage: bf16 8192x8192 (clusters of 2) 88.7 / 89.5 ->
  // 82.4 / 83.7, fp32 rows of the 2-pack kernel (8192x8192 97.0 / 89.9 -> 86.1 / 87.1). One
  // kernel choosing the source at run time lost 18 points where it loaded them as before (bf16
  // layer_norm 16384x4096, one block per row, 87.8 -> 69.8): each source has its own kernel.
  // bench/results/h200-norm-bwd-stats-in-stage.txt.
  void (*kernel)(NormBwdArgs<T, W>, PartialRows<float>) =
      norm_bwd_staged_kernel<T, W, kRms, VEC, kPacks, false>;
  TeamShape s = team_shape(a.cols, VEC, {kPacks}, kBwdStagedThreads, kBwdStagedMaxRanks2Packs);
  if constexpr (sizeof(T) == 2) {
    if (s.ranks >= kBwdStatsInStageMinRanks)
      kernel = norm_bwd_staged_kernel<T, W, kRms, VEC, kPacks, true>;
  }
  if (s.ranks == 0) {
    s = team_shape(a.cols, VEC, {kLongPacks}, kBwdStagedLongThreads, kMaxBwdClusterRanks);
    kernel = norm_bwd_staged_kernel<T, W, kRms, VEC, kLongPacks, true>;
  }
  if constexpr (kChunkedPacks > kLongPacks) {
    if (s.ranks == 0) {
      s = team_shape(a.cols, VEC, {kChunkedPacks}, kBwdStagedLongThreads, kMaxBwdClusterRanks);
      kernel = norm_bwd_staged_kernel<T, W, kRms, VEC, kChunkedPacks, true>;
    }
  }
  if (s.ranks == 0 || a.cols % (int64_t(s.ranks) * VEC) != 0) return {};
  size_t smem = size_t(staged_bwd_stages(s.packs)) * 2 * size_t(a.cols / s.ranks) * sizeof(T);
  const bool fast = row_stage::fast_dram(info);
  if (s.packs == kPacks) {
    // no more than this many blocks per SM
    const int blocks = fast ? kBwdStagedBlocksPerSmFastDram : kBwdStagedBlocksPerSm;
    smem = std::max(smem, size_t(info.smem_per_sm / (blocks + 1)));
  }
  // The kernel's full block, whatever the team's shape asked for (threads past the slice add
  // zeros): its block all-reduce counts the warps at compile time. Blocks of the team's 192 or
  // 320 threads summed stale partials (fp32 rms_norm 6000 columns, bf16 40000).
  const int threads = staged_bwd_threads(s.packs);
  return {kernel, {0, threads, smem, s.ranks}, threads, false, 0};
}

// The staged kernel on sm_90+, then warp teams for short rows, block and cluster teams (x and
// dy in registers), then the looping kernel. Rows of 17-32 elements per lane take a warp each
// (one block of 512 threads per SM) rather than block teams of two 16-element packs: those
// reduce each row through shared memory and two barriers of the whole block, so the block's
// teams load and reduce in step. H100, 65536 rows, µs, block -> warp teams: bf16 layer_norm
// 640 / 768 columns 125.6 / 130.2 -> 112.4 / 123.4, fp32 rms_norm 1024 295.2 -> 286.3, 4096 rows
// of 768 / 1024 8-16% faster; slower: bf16 rms_norm 896 / 1024 131.6 / 144.0 -> 135.8 / 146.4.
// Rows of 17-24 per lane then took warps of 3 (fp32: 6) packs in two 384-thread blocks per SM
// (80 registers; at 64, 18-54 local loads/stores in the row loop): 65536x640 / x768, µs, bf16
// layer_norm 113.2 / 124.3 -> 99.3 / 113.0, fp32 201.5 / 236.2 -> 191.3 / 225.9; slower: fp16
// 65536x768 115.1 / 110.2 -> 121.8 / 117.9 (layer_norm / rms_norm), fp32 layer_norm 4096x768
// 16.3 -> 17.6.
template <typename T, typename W, bool kRms, int VEC>
BwdPlan<T, W> bwd_plan_vec(const NormBwdArgs<T, W>& a, const DeviceInfo& info) {
  BwdPlan<T, W> p{};
  if constexpr (kRegisterTiers<T> && VEC > 1) {
    p = staged_bwd_plan<T, W, kRms, VEC>(a, info);
    if (p.kernel != nullptr && size_bwd_grid(p, a.rows, info)) return p;
    p = {};
  }
  if constexpr (kRegisterTiers<T>) {
    constexpr int kPacks = VEC > 1 ? 16 / VEC : kBwdScalars;
    constexpr int kMidPacks = VEC > 1 ? kBwdMidElems / VEC : kBwdScalars;
    constexpr int kLongPacks = VEC > 1 ? kBwdLongElems / VEC : kBwdScalars;
    // A plan whose blocks of `threads` keep `packs` packs' dweight (and dbias) sums per thread.
    auto team_plan = [](decltype(p.kernel) kernel, int threads, int packs, bool block, int ranks,
                        int group) -> BwdPlan<T, W> {
      const size_t sums = size_t(bwd_acc_floats(threads, packs, VEC, block)) * (kRms ? 1 : 2);
      return {kernel, {0, threads, sums * sizeof(float), ranks}, group, false, 0};
    };
    const int max_ranks = info.has_clusters() ? kMaxBwdClusterRanks : 1;
    const TeamShape s = team_shape(a.cols, VEC, {kPacks, kLongPacks}, kBwdMaxThreads, max_ranks);
    if (a.cols <= kWarp * kPacks * VEC) {
      const int lanes = bwd_row_lanes(ceil_div(a.cols, VEC), kPacks, kRms);
      p = team_plan(lanes == kWarp ? norm_bwd_kernel<T, W, kRms, VEC, kPacks, TeamKind::kWarp>
                                   : norm_bwd_kernel<T, W, kRms, VEC, kPacks, TeamKind::kWarpPart>,
                    kBwdMaxThreads, kPacks, false, 1, lanes);
    } else if (a.cols <= kWarp * kLongPacks * VEC) {
      const int packs = a.cols <= kWarp * kMidPacks * VEC ? kMidPacks : kLongPacks;
      p = team_plan(packs == kMidPacks
                        ? norm_bwd_kernel<T, W, kRms, VEC, kMidPacks, TeamKind::kWarp>
                        : norm_bwd_kernel<T, W, kRms, VEC, kLongPacks, TeamKind::kWarp>,
                    bwd_threads(packs, VEC), packs, false, 1, kWarp);
      if (size_bwd_grid(p, a.rows, info)) return p;
      p = {};  // their 72-128 KB of sums may not fit a block (99 KB on sm_86): block teams next
    }
    if (p.kernel == nullptr && s.ranks > 0) {
      const int threads = s.ranks > 1 ? s.threads : kBwdMaxThreads / s.threads * s.threads;
      p = team_plan(s.packs == kPacks
                        ? norm_bwd_kernel<T, W, kRms, VEC, kPacks, TeamKind::kBlock>
                        : norm_bwd_kernel<T, W, kRms, VEC, kLongPacks, TeamKind::kBlock>,
                    threads, s.packs, true, s.ranks, s.threads);
    }
  }
  if (p.kernel != nullptr && size_bwd_grid(p, a.rows, info)) return p;
  p = {norm_bwd_loop_kernel<T, W, kRms, VEC>, {0, kLoopThreads, 0, 1}, kLoopThreads, true, 0};
  size_bwd_grid(p, a.rows, info);
  return p;
}

template <typename T, typename W, bool kRms>
BwdPlan<T, W> bwd_plan(const NormBwdArgs<T, W>& a, const DeviceInfo& info) {
  constexpr int V = kVec16<T>;
  const bool vec = a.cols % V == 0 && is_aligned16(a.x) && is_aligned16(a.dy) &&
                   (a.dx == nullptr || is_aligned16(a.dx)) && (a.w == nullptr || is_aligned16(a.w));
  return vec ? bwd_plan_vec<T, W, kRms, V>(a, info) : bwd_plan_vec<T, W, kRms, 1>(a, info);
}

}  // namespace

template <typename T, typename W, bool kRms>
cudaError_t norm_fwd_cuda(const NormFwdArgs<T, W>& a, const DeviceInfo& info, cudaStream_t stream) {
  constexpr int V = kVec16<T>;
  const bool vec = a.cols % V == 0 && is_aligned16(a.x) && is_aligned16(a.y) &&
                   (a.w == nullptr || is_aligned16(a.w)) && (a.b == nullptr || is_aligned16(a.b));
  return vec ? norm_fwd_vec<T, W, kRms, V>(a, info, stream)
             : norm_fwd_vec<T, W, kRms, 1>(a, info, stream);
}

template <typename T, typename W, bool kRms>
int64_t norm_bwd_workspace_size(const NormBwdArgs<T, W>& a, const DeviceInfo& info) {
  const int64_t n = (a.dw != nullptr) + (a.db != nullptr);
  if (n == 0) return 0;
  const BwdPlan<T, W> p = bwd_plan<T, W, kRms>(a, info);
  return p.writes_sums() ? 0 : n * p.parts * partial_rows::ld(a.cols);
}

template <typename T, typename W, bool kRms>
cudaError_t norm_bwd_cuda(const NormBwdArgs<T, W>& a, NormAcc<T>* workspace, const DeviceInfo& info,
                          cudaStream_t stream) {
  using A = NormAcc<T>;
  if (a.dx == nullptr && a.dw == nullptr && a.db == nullptr) return cudaSuccess;
  const BwdPlan<T, W> p = bwd_plan<T, W, kRms>(a, info);
  NormBwdArgs<T, W> k = a;
  k.inv_cols = 1.f / static_cast<float>(a.cols);
  const int64_t ld = partial_rows::ld(a.cols), n = (a.dw != nullptr) + (a.db != nullptr);
  PartialRows<A> part{a.dw != nullptr ? workspace : nullptr, nullptr, ld, p.group};
  if (a.db != nullptr) part.db = workspace + (a.dw != nullptr ? p.parts * ld : 0);
  if (n > 0 && p.zeroed_partials) {
    const cudaError_t err =
        cudaMemsetAsync(workspace, 0, size_t(n * p.parts * ld) * sizeof(A), stream);
    if (err != cudaSuccess) return err;
  }
  const cudaError_t err = launch(p.kernel, p.shape, info, stream, k, part);
  if (err != cudaSuccess || n == 0 || p.writes_sums()) return err;
  const A* part0 = part.dw != nullptr ? part.dw : part.db;
  W* out0 = a.dw != nullptr ? a.dw : a.db;
  const bool both = n == 2;
  return partial_rows::sum(part0, out0, both ? part.db : nullptr, both ? a.db : nullptr, p.parts,
                           ld, a.cols, info, stream);
}

#define FUSEDOPS_NORM_INSTANTIATE(T, W, RMS)                                                 \
  template cudaError_t norm_fwd_cuda<T, W, RMS>(const NormFwdArgs<T, W>&, const DeviceInfo&, \
                                                cudaStream_t);                               \
  template int64_t norm_bwd_workspace_size<T, W, RMS>(const NormBwdArgs<T, W>&,              \
                                                      const DeviceInfo&);                    \
  template cudaError_t norm_bwd_cuda<T, W, RMS>(const NormBwdArgs<T, W>&, NormAcc<T>*,       \
                                                const DeviceInfo&, cudaStream_t);
#define FUSEDOPS_NORM_INSTANTIATE_BOTH(T, W) \
  FUSEDOPS_NORM_INSTANTIATE(T, W, false)     \
  FUSEDOPS_NORM_INSTANTIATE(T, W, true)

FUSEDOPS_NORM_INSTANTIATE_BOTH(float, float)
FUSEDOPS_NORM_INSTANTIATE_BOTH(__half, __half)
FUSEDOPS_NORM_INSTANTIATE_BOTH(__half, float)
FUSEDOPS_NORM_INSTANTIATE_BOTH(__nv_bfloat16, __nv_bfloat16)
FUSEDOPS_NORM_INSTANTIATE_BOTH(__nv_bfloat16, float)
FUSEDOPS_NORM_INSTANTIATE_BOTH(double, double)

}  // namespace fusedops
