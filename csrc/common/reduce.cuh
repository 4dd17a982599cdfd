// Warp and block all-reductions. An Op is a functor with `T operator()(T, T)` and
// `static T identity()`; every thread of the group gets the result.
#pragma once

#include <cuda_runtime.h>

namespace fusedops {

constexpr unsigned kFullMask = 0xffffffffu;

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
  template <typename T>
  __device__ static T identity() {
    return T(0);
  }
};

// Shuffles `v` across LANES consecutive lanes (a power of two <= 32). T is one or more
// 32-bit words; each word is shuffled separately.
template <int LANES, typename T>
__device__ __forceinline__ T shuffle_xor(const T& v, int offset) {
  static_assert(sizeof(T) % 4 == 0, "shuffle_xor needs whole 32-bit words");
  T out;
  const int* src = reinterpret_cast<const int*>(&v);
  int* dst = reinterpret_cast<int*>(&out);
#pragma unroll
  for (int i = 0; i < int(sizeof(T) / 4); ++i)
    dst[i] = __shfl_xor_sync(kFullMask, src[i], offset, LANES);
  return out;
}

template <int LANES, typename T, typename Op>
__device__ __forceinline__ T group_allreduce(T v, Op op) {
#pragma unroll
  for (int offset = LANES / 2; offset > 0; offset /= 2) v = op(v, shuffle_xor<LANES>(v, offset));
  return v;
}

// op over the `warps` per-warp partials part[0, warps), in every lane of the calling warp. Each
// aligned group of `span` lanes (warps rounded up to a power of two) holds a copy, so the
// butterfly takes log2(span) steps rather than 5: the same operations the 32-lane butterfly
// applies to the partials, whose first steps only fold in identities (each step is a shuffle's
// latency on the path between a block's two barriers).
template <typename T, typename Op>
__device__ __forceinline__ T partials_allreduce(const T* part, int warps, Op op) {
  const int span = warps > 1 ? 1 << (32 - __clz(warps - 1)) : 1;
  const int i = threadIdx.x % 32 & (span - 1);
  T v = i < warps ? part[i] : Op::template identity<T>();
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    if (offset < span) v = op(v, shuffle_xor<32>(v, offset));
  }
  return v;
}

// All threads of the block (blockDim.x a multiple of 32) get op over every thread's v.
// scratch: 32 slots of shared memory; it is free again when this returns.
// warps: blockDim.x / 32, which a kernel of one block size passes as a constant (the lanes'
// partial indices then fold away instead of holding registers across a row loop).
template <typename T, typename Op>
__device__ __forceinline__ T block_allreduce(T v, Op op, T* scratch,
                                             int warps = int(blockDim.x / 32)) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = group_allreduce<32>(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  // Every warp reduces the per-warp partials itself: no second broadcast barrier.
  v = partials_allreduce(scratch, warps, op);
  __syncthreads();  // scratch may be rewritten by the caller's next reduction
  return v;
}

}  // namespace fusedops
