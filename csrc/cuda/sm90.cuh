// Hopper (sm_90+) building blocks of the row kernels: mbarriers, bulk copies from global into
// shared memory, and a cluster all-reduce through mailboxes in distributed shared memory. Every
// device function here exists only when compiling for sm_90+; callers guard their use.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "common/launch.h"

namespace fusedops {
namespace sm90 {

constexpr int kMaxRanks = 16;  // blocks per cluster (16 is non-portable; the H100 allows it)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// An mbarrier whose phase completes on one arrival plus the bytes it was told to expect.
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
}

// The barrier's init must be visible to the copy engine (and the cluster) before a copy or a
// peer names it.
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// This thread's arrival, and `bytes` more for the phase to wait for.
__device__ __forceinline__ void mbar_arrive_expect(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// bytes (a multiple of 16, both addresses 16-byte aligned) from global to this block's shared
// memory, counted on bar when they land.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// 4 bytes (both addresses 4-byte aligned) from global to this block's shared memory,
// asynchronously; mbar_arrive_on_copies makes a barrier's phase wait for them.
__device__ __forceinline__ void copy4_async(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src)
               : "memory");
}

// bar's current phase completes only once this thread's copy4_async copies so far have landed:
// the barrier expects one more arrival, made when they land. Call it before the phase's own
// arrival (mbar_arrive_expect), which could otherwise complete the phase first.
__device__ __forceinline__ void mbar_arrive_on_copies(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// The same shared-memory address in the block of cluster rank `rank`.
__device__ __forceinline__ unsigned peer_addr(const void* p, int rank) {
  unsigned out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(smem_addr(p)), "r"(rank));
  return out;
}

// 16 bytes into block `rank`'s shared memory at dst, counted on its barrier bar (the addresses
// are this block's; the same offsets are used there).
__device__ __forceinline__ void push16(const uint4& v, const void* dst, const uint64_t* bar,
                                       int rank) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];" ::"r"(peer_addr(dst, rank)),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(peer_addr(bar, rank))
      : "memory");
}

// Every thread of the cluster: split cluster barrier (arrive now, wait later).
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

#endif

// All-reduce across the blocks of a cluster with no cluster barrier per exchange: each block
// pushes its total into its slot of every block's mailbox (a remote store counted on the
// receiver's mbarrier) and waits only until its own mailbox is full, then folds the slots in
// rank order (deterministic; the same result on every rank). A barrier-synchronized exchange
// makes every block wait for the slowest at each reduction, and once more before exiting.
// Two sets of slots are used by turns. A block's set is written again two exchanges later: by a
// peer only after that peer has this block's total of the exchange in between, which this
// block's thread 0 pushes only after a block barrier that follows every thread's reads (each
// caller reduces within its block, behind a __syncthreads, before it exchanges).
constexpr int kMailboxSets = 2;
struct Mailbox {
  uint4 slot[kMailboxSets][kMaxRanks];
  uint64_t full[kMailboxSets];
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The block's mailbox, at a fixed shared-memory address: no register holds a pointer to it.
__device__ __forceinline__ Mailbox& block_mailbox() {
  __shared__ Mailbox box;
  return box;
}

__device__ __forceinline__ int cluster_rank() {
  int rank;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}
#endif

// Programmatic dependent launch. On sm_90+ launch() (common/launch.h) lets the GPU launch a
// kernel once every block of the kernel ahead of it in the stream has exited, overlapping that
// kernel's completion (its memory flush) instead of following it; here the kernel waits until
// that completion, when the writes of the kernel ahead are visible. Every kernel launched through
// launch() calls this before its first global memory access. (Letting the next kernel in early,
// griddepcontrol.launch_dependents at the start, was slower: H200, softmax fp32 4096x1024
// kernel-only 72 -> 64% of copy.) Without the launch attribute, or before sm_90, a no-op.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the kernel behind this one launch once every block of this grid has called this (or
// exited), so that its blocks are resident and waiting in grid_dependency_wait() when this grid
// completes: for a last phase the next launch can overlap (a partial-row sum's, behind the
// backwards that write its parts). A no-op where grid_dependency_wait() is.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// One per thread, in registers (two); every thread of every block of the cluster constructs it
// and calls exchange() the same number of times, with its block's total, and close() before it
// exits. With ranks == 1 (no cluster, or not sm_90+) exchange() returns its value.
class ClusterExchange {
 public:
  __device__ explicit ClusterExchange(int ranks) : ranks_(ranks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (ranks_ == 1) return;
    if (threadIdx.x == 0) {
#pragma unroll
      for (int s = 0; s < kMailboxSets; ++s) mbar_init(&block_mailbox().full[s]);
      fence_mbar_init();
    }
    cluster_arrive();  // waited for at the first exchange, long after every block got here
#endif
  }

  template <typename V, typename Op>
  __device__ V exchange(V v, Op op) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (ranks_ == 1) return v;
    const unsigned n = count_++;
    push(n, v);
    return fold<V>(n, op);
#else
    return v;
#endif
  }

  // A block may exit once its exchanges are done: no peer writes to it after its last one. One
  // that never exchanged still waits at the barrier it arrived at.
  __device__ void close() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (ranks_ > 1 && count_ == 0) cluster_wait();
#endif
  }

 private:
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Exchange n: thread 0 pushes v into every block's slot of this rank.
  template <typename V>
  __device__ void push(unsigned n, const V& v) {
    static_assert(sizeof(V) <= sizeof(uint4), "ClusterExchange: at most 16 bytes");
    if (n == 0) cluster_wait();  // every block's mailbox is initialized
    if (threadIdx.x != 0) return;
    Mailbox& box = block_mailbox();
    const unsigned set = n % kMailboxSets;
    mbar_arrive_expect(&box.full[set], unsigned(ranks_ * sizeof(uint4)));
    uint4 word{};
    memcpy(&word, &v, sizeof(V));
    const uint4* slot = &box.slot[set][cluster_rank()];
#pragma unroll 1
    for (int q = 0; q < ranks_; ++q) push16(word, slot, &box.full[set], q);
  }

  // Exchange n's total, once this block's mailbox holds every rank's: the slots folded in rank
  // order, read four at a time (read one by one, each read waited for the add before it: H200,
  // bf16 layer_norm backward over 262144 columns, clusters of 16, 10% of its stall samples).
  template <typename V, typename Op>
  __device__ V fold(unsigned n, Op op) {
    Mailbox& box = block_mailbox();
    const unsigned set = n % kMailboxSets;
    mbar_wait(&box.full[set], (n / kMailboxSets) & 1);
    V v = Op::template identity<V>();
    int q = 0;
#pragma unroll 1
    for (; q + 4 <= ranks_; q += 4) {
      V w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) memcpy(&w[j], &box.slot[set][q + j], sizeof(V));
#pragma unroll
      for (int j = 0; j < 4; ++j) v = op(v, w[j]);
    }
#pragma unroll 1
    for (; q < ranks_; ++q) {
      V w;
      memcpy(&w, &box.slot[set][q], sizeof(V));
      v = op(v, w);
    }
    return v;
  }
#endif

  int ranks_;
  unsigned count_ = 0;  // exchanges so far
};

}  // namespace sm90
}  // namespace fusedops
