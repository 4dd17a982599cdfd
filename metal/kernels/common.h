// Helpers shared by the MSL kernels: threadgroup reductions and GELU.
//
// Every kernel has the same argument order: device buffers (inputs, then outputs), then
// `constant <Op>Params& p` (params.h), then `threadgroup float* scratch [[threadgroup(0)]]` (at
// least kMetalMaxSimdGroups floats, sized by the host), then the thread-position arguments
// tg, tid, tg_size, lane, simd (1-D grids). Threadgroups are whole SIMD groups of 32 threads.
//
// MSL used beyond the basic list (simd_sum, simd_max, threadgroup_barrier, exp, log, sqrt,
// rsqrt, tanh, fabs, max, min, INFINITY): `ulong` for element offsets (tensors may pass 2^32
// elements).
#pragma once

#include <metal_stdlib>

#include "params.h"

using namespace metal;

// Explicit instantiation of a kernel template specialization (the variadic part, e.g.
// norm_fwd_row<half, true>) under the host name `name`, "<op>_<fwd|bwd>_<tier>_<type>": the
// name the host asks for.
#define FUSEDOPS_INSTANTIATE(name, ...) \
  template [[host_name(name)]] [[kernel]] decltype(__VA_ARGS__) __VA_ARGS__;

struct SumOp {
  static float identity() { return 0.0f; }
  static float simd(float v) { return simd_sum(v); }
};

struct MaxOp {
  static float identity() { return -INFINITY; }
  static float simd(float v) { return simd_max(v); }
};

// Reduces v over the threadgroup; every thread gets the result. Call from uniform control flow
// (all threads): it has barriers. The second barrier lets the next reduction reuse scratch.
template <typename Op>
inline float tg_reduce(float v, threadgroup float* scratch, uint tg_size, uint lane, uint simd) {
  v = Op::simd(v);
  if (lane == 0) scratch[simd] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const uint groups = (tg_size + 31) / 32;
  v = Op::simd(lane < groups ? scratch[lane] : Op::identity());
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return v;
}

inline float tg_sum(float v, threadgroup float* scratch, uint tg_size, uint lane, uint simd) {
  return tg_reduce<SumOp>(v, scratch, tg_size, lane, simd);
}

inline float tg_max(float v, threadgroup float* scratch, uint tg_size, uint lane, uint simd) {
  return tg_reduce<MaxOp>(v, scratch, tg_size, lane, simd);
}

// GELU as in csrc/common/math.h (same formula and constants; MSL has no erf and no double).
constant float kSqrt1_2 = 0.70710678118654752440f;      // 1/sqrt(2)
constant float kInvSqrt2Pi = 0.39894228040143267794f;   // 1/sqrt(2*pi)
constant float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2/pi)
constant float kGeluCubic = 0.044715f;
constant float kGeluCubic3 = 0.134145f;  // 3 * kGeluCubic

// erf: Abramowitz & Stegun 7.1.26, absolute error < 1.5e-7 (as the CPU kernels' erf).
inline float erf_as(float x) {
  const float t = 1.0f / (1.0f + 0.3275911f * fabs(x));
  float q = 1.061405429f;
  q = q * t - 1.453152027f;
  q = q * t + 1.421413741f;
  q = q * t - 0.284496736f;
  q = q * t + 0.254829592f;
  const float r = 1.0f - q * t * exp(-x * x);
  return x < 0.0f ? -r : r;
}

// approx: 0 erf, 1 tanh (BiasGeluParams::approx).
inline float gelu(float x, uint approx) {
  if (approx != 0) {
    const float inner = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    return 0.5f * x * (1.0f + tanh(inner));
  }
  return 0.5f * x * (1.0f + erf_as(x * kSqrt1_2));
}

inline float gelu_grad(float x, uint approx) {
  if (approx != 0) {
    const float x2 = x * x;
    const float t = tanh(kSqrt2OverPi * (x + kGeluCubic * x2 * x));
    const float dinner = kSqrt2OverPi * (1.0f + kGeluCubic3 * x2);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner;
  }
  // phi's exponent as -u^2, as in math.h: the same exp(-u * u) as erf_as(u)'s, shared once inlined.
  const float u = x * kSqrt1_2;
  const float cdf = 0.5f * (1.0f + erf_as(u));
  const float pdf = exp(-u * u) * kInvSqrt2Pi;
  return cdf + x * pdf;
}
