// Row engine for sm_90+, shared by the forwards of softmax, log_softmax, layer_norm and rms_norm
// and the softmax / log_softmax backward. Each block stages its rows in shared memory with one
// bulk copy per input (cp.async.bulk, completing on an mbarrier), then reduces and writes them; a
// row too long for one block is split over a cluster, each block staging its slice and the partial
// results exchanged through distributed shared memory. Shared memory, not registers, bounds the
// rows in flight: an SM holds two or three 64 KB rows where the register tiers hold one, and the
// hardware scheduler hands rows to whichever SM is free. Measured on an H100 (bf16, % of copy,
// 4096x32768 softmax / rms_norm): 96 / 94 in this non-persistent form, 85 / 88 in a persistent grid
// of one block per SM with the next rows prefetched two or three stages deep (each SM's fixed share
// of rows: the slowest SMs finish last), 77 / 82 in the register tiers. A Policy stages kInputs
// row-major inputs of the same shape (input(a, i): x; or y and dy for the softmax backward); its
// row() reads its row (slice) of each from shared memory in as many passes as it needs and
// all-reduces through the engine's reduce(), which every thread of the block must call the same
// number of times. A Policy with kParams > 0 also has per-column vectors of type Param
// (param(a, j): a norm's weight and bias, or null); where plan() makes room (rows split over a
// cluster, or several rows to a block) row() gets the block's slice of each staged beside the
// rows (null for a null param), else a null array and reads them from global memory itself (one
// pointer for both would make every load a generic one). Preconditions: contiguous rows; every
// input, output and weight 16-byte aligned and the row length a multiple of VEC (the callers'
// vectorized path); plan() checks the rest.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/device_info.h"
#include "common/kernel_registry.h"
#include "common/launch.h"
#include "common/query_cache.h"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "cuda/sm90.cuh"

namespace fusedops {
namespace row_stage {

constexpr int kMaxThreads = 512;      // per block
constexpr int kMaxReductions = 2;     // per row (layer_norm: mean, then variance)
constexpr int kStaticSmem = 4 << 10;  // beside the staged rows: barrier, scratch
// Bytes per bulk copy instruction: 64 KB measured level, 8 KB up to 4.7 points lower (H200,
// bench/results/h200-row-stage-copy-size-rejected.txt).
constexpr unsigned kMaxCopyBytes = 32 << 10;
// Rows of kShortRowBytes and more are staged; shorter ones, down to a Policy's kMinRowBytes,
// where they fill kShortRowWaves waves of kGroupBytes blocks (kMinBlocksPerSm per SM: 52 MB on
// an H100); else the register tiers run them.
constexpr int kShortRowBytes = 4 << 10;
constexpr int kShortRowWaves = 3;
// Sizes measured on an H100 (bf16 and fp32, 2048-262144 columns, % of copy): slices of up to
// 64 KB, three blocks per SM (32 KB slices: 4096x32768 softmax 88 instead of 95), short rows
// grouped into blocks of up to 32 KB (16 KB: up to a point lower) while there are at least
// kMinBlocksPerSm blocks per SM. Rows from 4 KB: the engine from 4 KB instead of 8 KB took bf16
// 32768x2048 rms_norm / layer_norm / softmax from 67 / 69 / 83 to 94 / 90 / 93 (the register
// tiers' 4 KB rows lose to a block's eight rows in flight), fp32 65536x1024 from 85-89 to 96-97.
// Rows of 2-4 KB won where they make many blocks and lost where they make few: bf16 1024 columns,
// 65536 / 131072 rows (4096 / 8192 blocks of 16 rows), softmax 85 / 87 -> 92 / 96, rms_norm 80 ->
// 95 / 98, fp32 65536x768 82-86 -> 96-97 (all three ops); 16384x1024 (1024 blocks, two waves)
// softmax 80 -> 73, layer_norm 77 -> 68; at 32768x1024 (2048 blocks) softmax 82 -> 85, rms_norm
// 77 -> 89. A size in bytes, not in blocks: the softmax backward's blocks hold half the rows (y
// and dy), so a count of blocks let it in at half the size.
constexpr int kSliceBytes = 64 << 10;
constexpr int kGroupBytes = 32 << 10;  // a Policy may set its own (Defaults::kGroupBytes)
constexpr int kMinThreads = 128;
constexpr int kRegsPerSm = 64 << 10;  // every sm_90+ GPU
constexpr int kMinBlocksPerSm = 4;
// GB/s of DRAM bandwidth per SM (dram_gbps) from which a plan keeps more bytes in flight per SM
// (a Policy's kFastDram sizes): an H100 SXM has 25, an H200 36, whose faster DRAM the sizes
// measured on the H100 left waiting on the SMs.
constexpr int kFastDramGbpsPerSm = 30;

inline bool fast_dram(const DeviceInfo& dev) {
  return dram_gbps() >= kFastDramGbpsPerSm * dev.sm_count;
}

// Where a thread's part of a row is. A thread past the last row has packs == 0: its passes
// read and write nothing, but it still joins the reductions.
struct Slice {
  int64_t row;     // row index
  int64_t col0;    // first column of this block's slice
  int64_t offset;  // of that column in x and y: row * cols + col0
  int t, n;        // this thread's rank in the row's team, and the team's size
  int packs;       // packs of VEC in the slice of each input (0 past the last row)
  bool lead;       // the thread that writes per-row statistics
};

// A Policy's kMinBlocksPerSm (for __launch_bounds__), kMinRowBytes and params, where it has
// none: derive from Defaults<T> (a Policy declaring its own hides these).
template <typename T>
struct Defaults {
  static constexpr int kMinBlocksPerSm = 2;  // 512-thread blocks: at most 64 registers
  static constexpr int kMinRowBytes = 2 << 10;
  static constexpr int kGroupBytes = row_stage::kGroupBytes;  // rows of a block, at most
  // kBytesPerThread and kGroupBytes where fast_dram() (0: the same).
  static constexpr int kFastDramBytesPerThread = 0, kFastDramGroupBytes = 0;
  // Where fast_dram() and the rows make many blocks (as short rows must), rows of kShortRowBytes
  // up to this many bytes are left to the register tiers (0: none).
  static constexpr int kFastDramRegisterRowBytes = 0;
  using Param = T;
  static constexpr int kParams = 0;
  static constexpr bool kParamsInClusters = false;  // params staged beside cluster slices (plan())
  template <typename Args>
  __host__ __device__ static const Param* param(const Args&, int) {
    return nullptr;
  }
};

struct Plan {
  int threads;      // per block
  int ranks;        // blocks per row: > 1 is a cluster; 0 when the engine can't take the rows
  int teams;        // rows per block (1 in a cluster)
  int slice_packs;  // packs of VEC per row slice (a block's part of a row) of each input
  int params;       // non-null params staged beside the rows (0: row() reads global memory)
  int smem;         // teams * kInputs * slice bytes + the staged params' slices
};

// ------------------------------------------------------------------ kernel

// A pass over this thread's packs t, t + n, ... of its slice: f(p, g) takes packs p, p + n,
// ..., p + (g - 1) * n, g (a std::integral_constant) being kGroup while that many are left, then
// 1. One bound check per group: an unrolled loop over a runtime count checked every pack.
template <int kGroup, typename F>
__device__ __forceinline__ void for_pack_groups(const Slice& sl, F&& f) {
  int p = sl.t;
#pragma unroll 1
  for (; p + (kGroup - 1) * sl.n < sl.packs; p += kGroup * sl.n)
    f(p, std::integral_constant<int, kGroup>());
#pragma unroll 1
  for (; p < sl.packs; p += sl.n) f(p, std::integral_constant<int, 1>());
}

// Packs per bound check in a pass over a staged row. Against one check per pack, H200,
// kernel-only % of copy: bf16 layer_norm 1024x131072 / 512x262144 73.9 / 72.9 -> 75.4 / 74.7,
// rms_norm 88.2 / 80.6 -> 89.2 / 82.6, fp32 rms_norm 1024x131072 81.0 -> 88.8; bf16 softmax
// 4096x32768 91.7 -> 90.7 (bench/results/h200-row-stage-pack-groups-softmax-one-pass.txt).
constexpr int kPassGroup = 4;

// f(p) for each of this thread's packs p of its slice.
template <typename F>
__device__ __forceinline__ void for_packs(const Slice& sl, F&& f) {
  for_pack_groups<kPassGroup>(sl, [&](int p, auto g) {
#pragma unroll
    for (int k = 0; k < decltype(g)::value; ++k) f(p + k * sl.n);
  });
}

// The op-fold of f(v) over the elements v (widened to float) of this thread's packs of its
// slice, starting from init: one pass over the staged row.
template <int VEC, typename T, typename F, typename Op>
__device__ __forceinline__ float fold(const T* x, const Slice& sl, float init, F f, Op op) {
  float acc = init;
  for_packs(sl, [&](int p) {
    acc_t<T> v[VEC];
    widen(load_pack<T, VEC>(x + p * VEC), v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc = op(acc, f(v[k]));
  });
  return acc;
}

// Block b (rank q of cluster c when rows are split) takes rows c * teams ... c * teams + teams
// - 1, or slice q of row c. Thread t of a team owns the packs t, t + n, ...: consecutive
// 16-byte words across a warp, so shared-memory reads have no bank conflicts.
template <typename Policy, int VEC>
__global__ void __launch_bounds__(kMaxThreads, Policy::kMinBlocksPerSm)
    staged_rows_kernel(typename Policy::Args a, int64_t rows, int64_t cols, Plan p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using T = typename Policy::T;
  namespace cg = cooperative_groups;
  extern __shared__ __align__(128) unsigned char staged[];
  __shared__ uint64_t landed;
  __shared__ float4 scratch[kMaxReductions][kMaxThreads / 32];  // a team's warp partials

  const int rank = p.ranks > 1 ? static_cast<int>(cg::this_cluster().block_rank()) : 0;
  sm90::ClusterExchange cluster(p.ranks);
  sm90::grid_dependency_wait();
  const int team_threads = p.threads / p.teams;
  const int team = threadIdx.x / team_threads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t slice = int64_t(p.slice_packs) * VEC;
  const int64_t row0 = int64_t(blockIdx.x / p.ranks) * p.teams;
  // Input i's slices of the block's rows: p.teams of them from staged_input(i).
  auto staged_input = [&](int i) { return reinterpret_cast<T*>(staged) + i * p.teams * slice; };

  // The k-th non-null param's slice, staged after the inputs' (one for all the teams).
  using P = typename Policy::Param;
  auto staged_param = [&](int k) {
    return reinterpret_cast<P*>(staged_input(Policy::kInputs)) + k * slice;
  };
  if (threadIdx.x == 0) {
    sm90::mbar_init(&landed);
    sm90::fence_mbar_init();
    const int64_t n = rows - row0 < p.teams ? rows - row0 : p.teams;  // the last block: fewer
    const unsigned bytes = unsigned(n * slice * int64_t(sizeof(T)));  // per input
    const unsigned param_bytes = unsigned(slice * int64_t(sizeof(P)));
    // One barrier for all of it. Chunks of 16 or 8 KB on barriers of their own, the first pass
    // starting on each as it landed, were slower in every cell (H200, bf16 layer_norm 4096x32768
    // 81.0 -> 78.0 / 72.1; bench/results/h200-row-stage-chunks-bwd-256-threads-rejected.txt).
    sm90::mbar_arrive_expect(&landed, bytes * Policy::kInputs + p.params * param_bytes);
    auto copy = [&](void* to, const void* from, unsigned size) {
      for (unsigned off = 0; off < size; off += kMaxCopyBytes) {
        sm90::bulk_load(static_cast<unsigned char*>(to) + off,
                        static_cast<const unsigned char*>(from) + off,
                        size - off < kMaxCopyBytes ? size - off : kMaxCopyBytes, &landed);
      }
    };
#pragma unroll
    for (int i = 0; i < Policy::kInputs; ++i) {
      copy(staged_input(i), Policy::input(a, i) + row0 * cols + rank * slice, bytes);
    }
    for (int j = 0, k = 0; j < Policy::kParams && k < p.params; ++j) {
      if (Policy::param(a, j))
        copy(staged_param(k++), Policy::param(a, j) + rank * slice, param_bytes);
    }
  }
  __syncthreads();  // the barrier is initialized before anyone waits on it
  sm90::mbar_wait(&landed, 0);

  const int64_t row = row0 + team;
  const bool valid = row < rows;
  const Slice sl{row,
                 rank * slice,
                 row * cols + rank * slice,
                 static_cast<int>(threadIdx.x % team_threads),
                 team_threads,
                 valid ? p.slice_packs : 0,
                 valid && rank == 0 && threadIdx.x % team_threads == 0};

  // All-reduce over the row's team (and cluster): warp shuffles, the team's warp partials in
  // shared memory, the cluster blocks' totals through their mailboxes. Each reduction of a row
  // has its own slots, so no barrier is needed before the next one writes. The order of
  // operations is fixed: deterministic, and the same result on every rank.
  int k = 0;
  auto reduce = [&](auto v, auto op) {
    using V = decltype(v);
    static_assert(sizeof(V) <= sizeof(float4), "reduce: at most 16 bytes");
    V* part = reinterpret_cast<V*>(scratch[k]);
    v = group_allreduce<32>(v, op);
    if (team_threads > 32) {
      const int warps = team_threads / 32;
      if (lane == 0) part[warp] = v;
      __syncthreads();
      v = partials_allreduce(part + team * warps, warps, op);
    }
    ++k;
    return cluster.exchange(v, op);
  };
  const T* in[Policy::kInputs];  // this team's row slice of each input
#pragma unroll
  for (int i = 0; i < Policy::kInputs; ++i) in[i] = staged_input(i) + team * slice;
  if constexpr (Policy::kParams > 0) {
    if (p.params > 0) {
      const P* par[Policy::kParams];  // the staged slices
      for (int j = 0, k = 0; j < Policy::kParams; ++j) {
        par[j] = Policy::param(a, j) ? staged_param(k++) : nullptr;
      }
      Policy::row(a, in, par, sl, reduce);
    } else {
      Policy::row(a, in, static_cast<const P* const*>(nullptr), sl, reduce);
    }
  } else {
    Policy::row(a, in, sl, reduce);
  }
  cluster.close();
#endif
}

// ------------------------------------------------------------------ host: plan and launch

// Sizes count the bytes staged per row: kInputs rows of cols elements. Blocks of one row, or of
// several short rows, of up to Policy::kGroupBytes; rows longer than kSliceBytes split over a
// cluster of up to max_ranks blocks, whose slices grow past kSliceBytes, up to what shared memory
// holds, only when max_ranks can't keep them within it (beyond that, the caller's other kernels
// run). A team of threads per row, one thread per Policy::kBytesPerThread of it. (Where
// fast_dram(), a Policy's kFastDram sizes replace the two.) Measured on an H100, fp32 512x262144
// forward, % of copy: against the looping kernels (softmax 44, layer_norm 52, rms_norm 55), 8
// slices of 128 KB ran 75 / 47 / - with a cluster barrier per exchange, 92 / 68 / 75 with the
// mailbox exchange, and 16 slices of 64 KB (three blocks per SM where 128 KB slices leave one) 97
// / 80 / 87.
// regs(): the kernel's registers per thread (0: unknown), asked only for a cluster.
template <typename Policy, typename Regs>
Plan plan(int64_t rows, int64_t cols, int vec, int max_ranks, const DeviceInfo& dev, int params,
          Regs&& regs) {
  const Plan none{0, 0, 0, 0, 0, 0};
  const int64_t row_bytes = cols * int64_t(sizeof(typename Policy::T));
  if (dev.cc_major < 9 || row_bytes < Policy::kMinRowBytes) return none;
  const bool fast = fast_dram(dev);
  const bool many_blocks =
      rows * row_bytes >= int64_t(kShortRowWaves) * kMinBlocksPerSm * dev.sm_count * kGroupBytes;
  if (row_bytes < kShortRowBytes && !many_blocks) return none;
  if (fast && many_blocks && row_bytes >= kShortRowBytes &&
      row_bytes <= Policy::kFastDramRegisterRowBytes) {
    return none;
  }
  const int bytes_per_thread = fast && Policy::kFastDramBytesPerThread > 0
                                   ? Policy::kFastDramBytesPerThread
                                   : Policy::kBytesPerThread;
  const int group_bytes =
      fast && Policy::kFastDramGroupBytes > 0 ? Policy::kFastDramGroupBytes : Policy::kGroupBytes;
  const int64_t staged_bytes = row_bytes * Policy::kInputs;
  int ranks = 1;
  while (staged_bytes / ranks > kSliceBytes && ranks < max_ranks) ranks *= 2;
  if (staged_bytes / ranks > dev.max_smem_optin - kStaticSmem || cols % (int64_t(ranks) * vec) != 0)
    return none;
  // Rows split over a cluster stage their params too, where the Policy asks (kParamsInClusters)
  // and a block's slices, params included, still fit kSliceBytes with at least half of it for
  // the rows: the params' loads, issued last, stalled the writes (Nsight Compute, H200, bf16
  // layer_norm, 262144 columns), but smaller row slices put fewer DRAM bytes in flight. Measured
  // on an H100, % of copy: rms_norm bf16 1024x131072 91.8 -> 95.2 and 512x262144 89.3 -> 92.8
  // (32 KB of weight beside 32 KB of row); layer_norm, whose weight and bias would make 64 KB
  // beside 32 KB of row, lost with them staged (same build, global -> staged): fp32 1024x131072
  // 85.9 -> 61.8, bf16 512x262144 76.4 -> 59.5.
  const int64_t all_param_bytes = cols * int64_t(sizeof(typename Policy::Param)) * params;
  int64_t param_bytes = 0;  // staged beside the rows
  int param_ranks = ranks;
  while ((staged_bytes + all_param_bytes) / param_ranks > kSliceBytes && param_ranks < max_ranks)
    param_ranks *= 2;
  if (Policy::kParamsInClusters && ranks > 1 && all_param_bytes > 0 &&
      (staged_bytes + all_param_bytes) / param_ranks <= kSliceBytes &&
      staged_bytes / param_ranks >= kSliceBytes / 2 && cols % (int64_t(param_ranks) * vec) == 0) {
    ranks = param_ranks;
    param_bytes = all_param_bytes;
  }
  const int64_t slice_bytes = staged_bytes / ranks;
  int teams = 1;
  while (ranks == 1 && teams * 2 * slice_bytes <= group_bytes && teams * 2 <= kMaxThreads / 32 &&
         rows / (teams * 2) >= int64_t(kMinBlocksPerSm) * dev.sm_count) {
    teams *= 2;
  }
  // A block of several rows stages one copy of the params for all of them where it fits
  // kSliceBytes (H100, % of copy, 16384x4096 / 8192x8192: rms_norm bf16 92.4 / 92.3 -> 94.0 /
  // 94.0, fp32 95.9 -> 97.1 at 16384x4096; layer_norm fp32 +0.5 to +1.1), except two 16-bit
  // params (layer_norm's weight and bias beside bf16 or fp16 rows): row() reads those from global
  // memory four packs at a time, faster than staging them (kernel-only 90.9-91.6 -> 92.7-93.6).
  const bool two_narrow_params = params == 2 && sizeof(typename Policy::Param) == 2;
  if (teams > 1 && !two_narrow_params && teams * slice_bytes + all_param_bytes <= kSliceBytes) {
    param_bytes = all_param_bytes;
  }
  int per_team = 32;  // threads per row (slice): a power of two
  while (per_team * 2 * bytes_per_thread <= slice_bytes && teams * per_team * 2 <= kMaxThreads) {
    per_team *= 2;
  }
  while (teams * per_team < kMinThreads) per_team *= 2;
  const int smem = static_cast<int>(teams * slice_bytes + param_bytes / ranks);
  // A cluster's blocks wait for their peers at each exchange: there, registers must not hold
  // fewer blocks on an SM than shared memory does. Halving the threads (each owning twice the
  // packs) lets them in. 16-bit layer_norm (62 registers: two 512-thread blocks per SM where
  // shared memory holds three 64 KB slices), kernel-only % of copy, bf16 / fp16: H100 1024x131072
  // 85.9 / 87.9 -> 89.7 / 91.1, 512x262144 78.9 / 82.0 -> 86.3 / 87.2; H200 63.5 / 68.9 -> 73.5 /
  // 74.8 and 60.7 / 64.8 -> 70.3 / 70.6. Rows one block holds lost with the same rule (H200,
  // 4096x32768 78.5 / 82.2 -> 76.2 / 79.1): without exchanges, 512 threads' loads in flight beat
  // a third block.
  if (const int r = ranks > 1 ? regs() : 0; r > 0) {
    const int warp_regs = (r * 32 + 255) / 256 * 256;  // allocated per warp, 256 at a time
    auto by_regs = [&](int threads) { return kRegsPerSm / (threads / 32 * warp_regs); };
    const int by_smem = dev.smem_per_sm / (smem + kStaticSmem);
    while (per_team > kMinThreads && by_regs(per_team) < by_smem) per_team /= 2;
  }
  return {teams * per_team,
          ranks,
          teams,
          static_cast<int>(cols / ranks / vec),
          param_bytes > 0 ? params : 0,
          smem};
}

// Launches Policy over the rows when plan() takes them; false otherwise (the caller's other
// tiers run). One block (cluster) per row group: the hardware scheduler balances them. Clusters
// of up to 16 (non-portable: the H100 and H200 run them), else (a GPU that doesn't, or a row
// length 16 slices don't divide) of up to 8.
template <typename Policy, int VEC>
bool try_launch(const typename Policy::Args& a, int64_t rows, int64_t cols, const DeviceInfo& dev,
                cudaStream_t stream, cudaError_t* err) {
  constexpr auto kernel = staged_rows_kernel<Policy, VEC>;
  int params = 0;  // non-null ones
  for (int j = 0; j < Policy::kParams; ++j) params += Policy::param(a, j) != nullptr;
  auto regs = [] { return registers_per_thread(kernel); };
  Plan p = plan<Policy>(rows, cols, VEC, sm90::kMaxRanks, dev, params, regs);
  auto can_run = [&] {
    return resident(kernel, {p.ranks, p.threads, size_t(p.smem), p.ranks}, dev) > 0;
  };
  if (p.ranks == 0 || (p.ranks > kPortableClusterRanks && !can_run())) {
    p = plan<Policy>(rows, cols, VEC, kPortableClusterRanks, dev, params, regs);
  }
  if (p.ranks == 0 || !can_run()) return false;
  const int64_t blocks = (rows + p.teams - 1) / p.teams * p.ranks;
  if (blocks > INT32_MAX) return false;
  *err =
      launch(kernel, {blocks, p.threads, size_t(p.smem), p.ranks}, dev, stream, a, rows, cols, p);
  return true;
}

}  // namespace row_stage
}  // namespace fusedops
