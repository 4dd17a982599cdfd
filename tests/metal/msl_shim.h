// MSL as clang C++, for the Linux checks of metal/kernels (test infrastructure, never installed).
// Two views of one source, picked by tests/metal/mslcheck.py:
// - type check (default; clang --target=aarch64 -fsyntax-only -nostdinc): device / constant /
//   threadgroup are clang address spaces 1 / 2 / 3, so mixing them fails as in MSL (and a
//   threadgroup array inside a kernel body fails: the kernels get threadgroup memory only as
//   the host-sized scratch argument); half and bfloat are the target's _Float16 and __bf16;
//   `double` is not a type; C++14, the dialect of MSL 3.0 and 3.1.
// - emulation (MSL_SHIM_EMULATE, host build): the address spaces vanish, half and bfloat are
//   16-bit classes rounding to nearest even, and threadgroup_barrier / simd_* are scheduling
//   points of the fiber emulator (emu.cpp).
// Only what the kernels may use exists: metal::exp, exp2, log, sqrt, rsqrt, tanh, abs, fabs, max,
// min, fma, isinf, isnan, INFINITY, simd_sum, simd_max, simd_shuffle_xor, threadgroup_barrier,
// float2/float4/half2/half4, ulong. Anything else (erf, a libm call, std::) fails to compile here.
// [[...]] attributes are ignored; the driver renames [[threadgroup(N)]] (threadgroup is a macro).
#pragma once

#ifndef __METAL_VERSION__
#error "the shim needs __METAL_VERSION__ (300 or 310): it is a view of one Metal version"
#endif

typedef __INT8_TYPE__ int8_t;
typedef __UINT8_TYPE__ uint8_t;
typedef __INT16_TYPE__ int16_t;
typedef __UINT16_TYPE__ uint16_t;
typedef __INT32_TYPE__ int32_t;
typedef __UINT32_TYPE__ uint32_t;
typedef __INT64_TYPE__ int64_t;
typedef __UINT64_TYPE__ uint64_t;
typedef __SIZE_TYPE__ size_t;
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef __UINT64_TYPE__ ulong;

#define kernel
#define thread
#ifdef MSL_SHIM_EMULATE
#define device
#define constant const
#define threadgroup
#else
#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2))) const
#define threadgroup __attribute__((address_space(3)))
#endif

#define INFINITY (__builtin_inff())

#ifdef MSL_SHIM_EMULATE
// IEEE binary16 storage, float arithmetic (through the conversions), round to nearest even.
struct half {
  uint16_t bits;
  half() = default;
  half(float f) : bits(from_float(f)) {}
  operator float() const {
    const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
    const uint32_t e = (bits >> 10) & 0x1fu, m = bits & 0x3ffu;
    if (e == 0) {  // zero or subnormal: m * 2^-24
      const float v = float(m) * (1.0f / 16777216.0f);
      return sign ? -v : v;
    }
    const uint32_t u = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112) << 23) | (m << 13));
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  }
  static uint16_t from_float(float f) {
    uint32_t x;
    __builtin_memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
    if (ax < 0x38800000u) {                                  // below 2^-14: subnormal result
      float a;
      __builtin_memcpy(&a, &ax, 4);
      return uint16_t(sign | uint32_t(__builtin_rintf(a * 16777216.0f)));
    }
    const uint32_t r = ax - 0x38000000u;  // exponent bias 127 -> 15
    return uint16_t(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
};
#if __METAL_VERSION__ >= 310
// bfloat16 storage: the top half of a float, rounded to nearest even.
struct bfloat {
  uint16_t bits;
  bfloat() = default;
  bfloat(float f) {
    uint32_t x;
    __builtin_memcpy(&x, &f, 4);
    bits = (x & 0x7fffffffu) > 0x7f800000u ? uint16_t((x >> 16) | 0x40u)
                                           : uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }
  operator float() const {
    const uint32_t u = uint32_t(bits) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  }
};
#endif
typedef float float2 __attribute__((ext_vector_type(2)));
typedef float float4 __attribute__((ext_vector_type(4)));
#else
typedef _Float16 half;
#if __METAL_VERSION__ >= 310
typedef __bf16 bfloat;
#endif
typedef float float2 __attribute__((ext_vector_type(2)));
typedef float float4 __attribute__((ext_vector_type(4)));
typedef half half2 __attribute__((ext_vector_type(2)));
typedef half half4 __attribute__((ext_vector_type(4)));
#endif

namespace metal {

#define MSL_SHIM_UNARY(name, builtin)               \
  inline float name(float x) { return builtin(x); } \
  inline half name(half x) { return half(builtin(float(x))); }
MSL_SHIM_UNARY(exp, __builtin_expf)
MSL_SHIM_UNARY(exp2, __builtin_exp2f)
MSL_SHIM_UNARY(log, __builtin_logf)
MSL_SHIM_UNARY(sqrt, __builtin_sqrtf)
MSL_SHIM_UNARY(tanh, __builtin_tanhf)
MSL_SHIM_UNARY(fabs, __builtin_fabsf)
MSL_SHIM_UNARY(abs, __builtin_fabsf)
#undef MSL_SHIM_UNARY

inline float rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }
inline half rsqrt(half x) { return half(rsqrt(float(x))); }
inline int abs(int x) { return x < 0 ? -x : x; }
inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline half fma(half a, half b, half c) { return half(__builtin_fmaf(a, b, c)); }
inline bool isinf(float x) { return __builtin_isinf(x); }
inline bool isnan(float x) { return __builtin_isnan(x); }

// MSL's max/min of floats are fmax/fmin: a NaN operand yields the other one.
inline float max(float a, float b) { return __builtin_fmaxf(a, b); }
inline float min(float a, float b) { return __builtin_fminf(a, b); }
inline half max(half a, half b) { return half(__builtin_fmaxf(a, b)); }
inline half min(half a, half b) { return half(__builtin_fminf(a, b)); }
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline uint max(uint a, uint b) { return a > b ? a : b; }
inline uint min(uint a, uint b) { return a < b ? a : b; }

enum class mem_flags : uint { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };

// Defined by the emulator; in the type check only declared.
void threadgroup_barrier(mem_flags flags);
float simd_sum(float x);
float simd_max(float x);
float simd_shuffle_xor(float x, ushort mask);
int simd_sum(int x);
int simd_max(int x);
uint simd_sum(uint x);
uint simd_max(uint x);

}  // namespace metal

#ifndef MSL_SHIM_EMULATE
#define double msl_has_no_double
#endif
