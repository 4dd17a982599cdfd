// GELU and its derivative, exact (erf) and tanh forms, as torch defines them. The one place for
// the formula: CPU (g++, scalar and at::vec), CUDA (nvcc) and Metal ports use these templates.
// V is float, double or a SIMD vector type; GeluMath<V> supplies erf/tanh/exp for V.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define FUSEDOPS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FUSEDOPS_HOST_DEVICE inline
#endif

namespace fusedops {

enum class GeluApprox { kNone, kTanh };

// Activations of fully_fused_mlp (host and kernel share the values).
enum class MlpActivation : int { kNone = 0, kRelu = 1, kGelu = 2, kGeluTanh = 3 };

// Kept as double so that fp64 math sees full precision; float code rounds them at compile time.
constexpr double kSqrt1_2 = 0.70710678118654752440;      // 1/sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/sqrt(2*pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluCubic = 0.044715;

// Specialize for other vector types (at::vec::Vectorized<float> in the CPU kernel file).
template <typename V>
struct GeluMath;

template <>
struct GeluMath<float> {
  static FUSEDOPS_HOST_DEVICE float erf(float x) { return ::erff(x); }
  static FUSEDOPS_HOST_DEVICE float tanh(float x) { return ::tanhf(x); }
  static FUSEDOPS_HOST_DEVICE float exp(float x) { return ::expf(x); }
};

template <>
struct GeluMath<double> {
  static FUSEDOPS_HOST_DEVICE double erf(double x) { return ::erf(x); }
  static FUSEDOPS_HOST_DEVICE double tanh(double x) { return ::tanh(x); }
  static FUSEDOPS_HOST_DEVICE double exp(double x) { return ::exp(x); }
};

// gelu(x) = x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2)))
template <typename V>
FUSEDOPS_HOST_DEVICE V gelu_erf(V x) {
  return V(0.5) * x * (V(1) + GeluMath<V>::erf(x * V(kSqrt1_2)));
}

// gelu'(x) = Phi(x) + x * phi(x), phi's exponent written as -u^2 with u = x / sqrt(2): an erf
// built on exp(-u^2) (the CPU kernel's) then shares that exp with phi once inlined.
template <typename V>
FUSEDOPS_HOST_DEVICE V gelu_erf_grad(V x) {
  const V u = x * V(kSqrt1_2);
  const V cdf = V(0.5) * (V(1) + GeluMath<V>::erf(u));
  const V pdf = GeluMath<V>::exp(V(0) - u * u) * V(kInvSqrt2Pi);
  return cdf + x * pdf;
}

// gelu_tanh(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
template <typename V>
FUSEDOPS_HOST_DEVICE V gelu_tanh(V x) {
  const V inner = V(kSqrt2OverPi) * (x + V(kGeluCubic) * x * x * x);
  return V(0.5) * x * (V(1) + GeluMath<V>::tanh(inner));
}

// d/dx of gelu_tanh, in torch's factoring: 0.5 * (1 + t) + 0.5 * x * (1 - t^2) * inner'(x).
template <typename V>
FUSEDOPS_HOST_DEVICE V gelu_tanh_grad(V x) {
  const V x2 = x * x;
  const V t = GeluMath<V>::tanh(V(kSqrt2OverPi) * (x + V(kGeluCubic) * x2 * x));
  const V dinner = V(kSqrt2OverPi) * (V(1) + V(3 * kGeluCubic) * x2);
  return V(0.5) * (V(1) + t) + V(0.5) * x * (V(1) - t * t) * dinner;
}

template <GeluApprox A, typename V>
FUSEDOPS_HOST_DEVICE V gelu(V x) {
  if constexpr (A == GeluApprox::kTanh) {
    return gelu_tanh(x);
  } else {
    return gelu_erf(x);
  }
}

template <GeluApprox A, typename V>
FUSEDOPS_HOST_DEVICE V gelu_grad(V x) {
  if constexpr (A == GeluApprox::kTanh) {
    return gelu_tanh_grad(x);
  } else {
    return gelu_erf_grad(x);
  }
}

}  // namespace fusedops
