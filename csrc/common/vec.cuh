// Vectorized global-memory access and fp32 conversions shared by the CUDA kernels.
// Kernel files include only this and the CUDA headers (never torch), to keep nvcc fast.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace fusedops {

// VEC consecutive elements moved as one access: 16 bytes when VEC == kVec16<T>.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

template <typename T>
constexpr int kVec16 = 16 / sizeof(T);

// Accumulation type: fp32 for fp32/fp16/bf16 (sm_87 lacks some bf16 math), fp64 for fp64.
template <typename T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
template <typename T>
using acc_t = typename AccOf<T>::type;

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
// bf16 is the top half of an fp32: widening is a shift.
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) {
  return __uint_as_float(static_cast<unsigned>(__bfloat16_as_ushort(v)) << 16);
}

// Round-to-nearest-even narrowing, as torch's own casts.
template <typename T>
__device__ __forceinline__ T from_acc(acc_t<T> v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return v;
  }
}

// Narrows VEC fp32 values into a pack; 16-bit types two at a time (one cvt per pair).
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> pack_from_acc(const acc_t<T> (&v)[VEC]) {
  Pack<T, VEC> out;
  if constexpr (VEC % 2 == 0 && std::is_same_v<T, __nv_bfloat16>) {
#pragma unroll
    for (int k = 0; k < VEC; k += 2) {
      const __nv_bfloat162 two = __floats2bfloat162_rn(v[k], v[k + 1]);
      out.v[k] = two.x;
      out.v[k + 1] = two.y;
    }
  } else if constexpr (VEC % 2 == 0 && std::is_same_v<T, __half>) {
#pragma unroll
    for (int k = 0; k < VEC; k += 2) {
      const __half2 two = __floats2half2_rn(v[k], v[k + 1]);
      out.v[k] = two.x;
      out.v[k + 1] = two.y;
    }
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out.v[k] = from_acc<T>(v[k]);
  }
  return out;
}

template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, VEC>*>(p);
}

// Through a plain word type: copying Pack<__nv_bfloat16/__half, 8> as a struct compiles to
// scalar 2-byte stores (seen in PTX), which flood L2 with partial-sector writes.
template <int BYTES>
struct Word;
template <>
struct Word<16> {
  using type = uint4;
};
template <>
struct Word<8> {
  using type = uint2;
};
template <>
struct Word<4> {
  using type = unsigned;
};
template <>
struct Word<2> {
  using type = unsigned short;
};

template <typename T, int VEC>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, VEC>& v) {
  if constexpr (sizeof(Pack<T, VEC>) <= 16 &&
                (sizeof(Pack<T, VEC>) & (sizeof(Pack<T, VEC>) - 1)) == 0 &&
                sizeof(Pack<T, VEC>) >= 2) {
    using W = typename Word<sizeof(Pack<T, VEC>)>::type;
    W w;
    memcpy(&w, &v, sizeof(W));
    *reinterpret_cast<W*>(p) = w;
  } else {
    *reinterpret_cast<Pack<T, VEC>*>(p) = v;
  }
}

// A pack into global memory; a 16-byte pack with one 16-byte store instruction. In the staged
// row kernels the compiler split store_pack's word into four 4-byte stores (their PTX and SASS),
// four times the store instructions.
template <typename T, int VEC>
__device__ __forceinline__ void store_pack_global(T* p, const Pack<T, VEC>& v) {
  if constexpr (sizeof(Pack<T, VEC>) == sizeof(uint4)) {
    uint4 w;
    memcpy(&w, &v, sizeof(w));
    // "memory": kernels read back what they stored (the norms' partial rows across rows).
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w.x), "r"(w.y), "r"(w.z),
                 "r"(w.w)
                 : "memory");
  } else {
    store_pack<T, VEC>(p, v);
  }
}

// A pack widened to its accumulation type; bf16 packs through their 32-bit words (a shift for
// the lower half, a mask for the upper). Element by element, the compiler split each word into
// halves first: two or three instructions for the upper half's one (the staged bf16 softmax
// loops lost a sixth and a third of their SASS to this). fp16 widens either half as it is.
template <typename T, int VEC>
__device__ __forceinline__ void widen(const Pack<T, VEC>& pk, acc_t<T> (&out)[VEC]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && VEC % 2 == 0) {
    unsigned u[VEC / 2];
    memcpy(u, &pk, sizeof(u));
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) {
      out[2 * i] = __uint_as_float(u[i] << 16);
      out[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = to_acc(pk.v[j]);
  }
}

// A pack held as its plain words, for rows kept in registers between passes. A Pack of 16-bit
// elements was kept as halves, joined again at each use (a PRMT per word); where the loads
// landed in reused registers, each load's halves were split out before the next load issued
// (the norm backward's warp tiers: their loads no longer all in flight).
template <typename T, int VEC>
using PackWords = typename Word<sizeof(Pack<T, VEC>)>::type;
template <typename T, int VEC>
__device__ __forceinline__ PackWords<T, VEC> load_words(const T* p) {
  return *reinterpret_cast<const PackWords<T, VEC>*>(p);
}
template <typename T, int VEC>
__device__ __forceinline__ void widen(const PackWords<T, VEC>& w, acc_t<T> (&out)[VEC]) {
  Pack<T, VEC> pk;
  memcpy(&pk, &w, sizeof(pk));
  widen(pk, out);
}

__host__ __device__ inline bool is_aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

}  // namespace fusedops
