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

constexpr bool is_gelu(MlpActivation act) {
  return act == MlpActivation::kGelu || act == MlpActivation::kGeluTanh;
}

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

#if defined(__CUDACC__)
// MUFU approximations with subnormals flushed: without .ftz, nvcc wraps each in range scaling
// (a compare, two multiplies and a select), as many instructions as the MUFU itself saves.
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

constexpr double kLog2e = 1.44269504088896340736;

// The erf GELU for kernels bound by instruction issue (bias_gelu on fp16/bf16, the fully fused
// MLP): Phi(x) from half the tail, 0.5 * erfc(|x| / sqrt(2)), mirrored. The tail is the fit
// erfc(z) = exp(-z^2) * S(t), t = 1 / (1 + 0.509 z), S of degree 5 minimax in relative error over
// z in [0, 9.3] (below 1.1e-5), written in x with the 0.5 folded into S: one reciprocal, one
// exp2, 5 FMAs, no branch and no coefficient selects (erff has nine); ~15 instructions per
// element against ~30 for erff. exp(-z^2) = exp(-x^2 / 2) is the Gaussian phi needs too, so the
// derivative Phi + x * phi takes no second exp2 (with the tail as t * exp(P(t) - z^2) it took
// three MUFU ops per element, now two), and the exp2 no longer waits for the polynomial. In fp32
// the GELU errs below 1.2e-5 relative for |x| < 6 and 1.6e-5 beyond (where -x^2 / 2 is rounded),
// its derivative below 5.4e-6 absolute: far below the fp16/bf16 rounding (fp16's half ulp:
// 4.9e-4) of every value those kernels write. The fit and its check: scripts/fit_normal_cdf.py.
__device__ __forceinline__ float normal_cdf(float x, float& gauss) {
  constexpr double kS[] = {0.0004172703, 0.2797394655, 0.3394191548,
                           0.0655987019, 0.5134598506, -0.1986451339};
  constexpr int kDegree = sizeof(kS) / sizeof(kS[0]) - 1;
  const float t = rcp_approx(fmaf(float(0.509 * kSqrt1_2), fabsf(x), 1.f));
  float s = float(0.5 * kS[kDegree]);
#pragma unroll
  for (int i = kDegree - 1; i >= 0; --i) s = fmaf(s, t, float(0.5 * kS[i]));
  gauss = ex2_approx(x * float(-0.5 * kLog2e) * x);  // exp(-z^2)
  const float half_tail = gauss * s;
  return x > 0.f ? 1.f - half_tail : half_tail;
}

__device__ __forceinline__ float gelu_erf_fast(float x) {
  float gauss;
  return x * normal_cdf(x, gauss);
}

// Phi(x) + x * phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
__device__ __forceinline__ float gelu_erf_grad_fast(float x) {
  float gauss;
  const float cdf = normal_cdf(x, gauss);
  return fmaf(x * float(kInvSqrt2Pi), gauss, cdf);
}

// The tanh GELU for the same kernels: 0.5 * (1 + tanh(u)) = s = sigmoid(2u), so gelu_tanh(x) =
// x * s with one exp2 and one reciprocal (~8 instructions; tanhf is ~20 with a branch), and no
// cancellation in 1 + tanh(u) for negative x. Relative error ~1e-6. Where exp2 overflows (u
// below -44), s = 1 / inf = 0: the result is -0, as torch's.
__device__ __forceinline__ float gelu_tanh_sigmoid(float x) {
  const float u = x * fmaf(float(kGeluCubic) * x, x, 1.f);  // tanh's argument / sqrt(2 / pi)
  return rcp_approx(1.f + ex2_approx(u * float(-2.0 * kSqrt2OverPi * kLog2e)));
}
__device__ __forceinline__ float gelu_tanh_fast(float x) { return x * gelu_tanh_sigmoid(x); }

// s + x * 2s(1 - s) * u'(x): torch's 0.5(1 + t) + 0.5x(1 - t^2)u' with t = 2s - 1.
__device__ __forceinline__ float gelu_tanh_grad_fast(float x) {
  const float s = gelu_tanh_sigmoid(x);
  const float du = float(kSqrt2OverPi) * fmaf(float(3 * kGeluCubic) * x, x, 1.f);
  return fmaf(x * 2.f * s * (1.f - s), du, s);
}
#endif

}  // namespace fusedops
