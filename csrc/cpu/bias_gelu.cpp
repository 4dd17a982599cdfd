// CPU bias + GELU, forward and backward, over contiguous [rows, cols] rows (bias [cols]).
// Rows are split across threads; a row is processed kBlock columns at a time: widened to fp32
// (fp64 for double) with the bias added, then GELU over the block in branch-free lane loops
// that the compiler vectorizes, built for AVX-512, AVX2 and baseline x86-64 and picked at load
// time. dbias is deterministic: rows are cut into a number of blocks that depends only on the
// shape, each block sums its rows in order into its own fp32 partial, added in block order.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common/bias_gelu_host.h"
#include "common/math.h"
#include "cpu/rows.h"

// Why not at::vec: an extension builds it without torch's per-ISA dispatch, so its erf/exp/tanh
// are one libm call per lane here. Instead the lane loops below are cloned per ISA (GCC/Clang
// function multiversioning, x86-64 Linux) and vectorized by the compiler.
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define FUSEDOPS_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FUSEDOPS_CPU_CLONES
#endif

namespace fusedops {

// An fp32 lane: math.h's GELU templates over it use the arithmetic-only erf/exp/tanh below.
struct Lane {
  float v;
  Lane() = default;
  explicit Lane(float f) : v(f) {}
};

inline Lane operator+(Lane a, Lane b) { return Lane(a.v + b.v); }
inline Lane operator-(Lane a, Lane b) { return Lane(a.v - b.v); }
inline Lane operator*(Lane a, Lane b) { return Lane(a.v * b.v); }

namespace {

// NaN passes through.
inline float clamp_lane(float x, float lo, float hi) {
  const float up = x < lo ? lo : x;
  return up > hi ? hi : up;
}

// exp: x = n ln2 + r, |r| <= ln2/2; degree-6 polynomial for e^r (~1e-7 relative), times 2^n from
// its exponent bits. x is clamped to [-87.3, 88.7], where e^x is a normal float: below, this
// gives 1.2e-38 rather than 0 (GELU multiplies it by x: 0 for any finite x); above, GELU never
// goes (its arguments are -x^2/2 and at most 18). NaN gives a finite value, but every caller also
// multiplies by x or divides by NaN, so NaN still comes out. No select on the result: with one,
// GCC stops vectorizing the loop for AVX2 and AVX-512.
inline float exp_lane(float x) {
  const float xc = x == x ? clamp_lane(x, -87.3f, 88.7f) : 0.0f;  // float-to-int needs no NaN
  const int32_t ni = static_cast<int32_t>(xc * 1.44269504089f + __builtin_copysignf(0.5f, xc));
  const float n = static_cast<float>(ni);
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 in two parts: exact n*hi
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const int32_t bits = (ni + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof(scale));
  return ((p * r) * r + r + 1.0f) * scale;
}

// erf: Abramowitz & Stegun 7.1.26, absolute error < 1.5e-7 (the formula torch's own vectorized
// CPU erf uses).
inline float erf_lane(float x) {
  const float t = 1.0f / (1.0f + 0.3275911f * __builtin_fabsf(x));
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  return __builtin_copysignf(1.0f - p * t * exp_lane(0.0f - x * x), x);  // as gelu_erf_grad's phi
}

// tanh = (e^2x - 1) / (e^2x + 1); |x| > 9 is +-1 in fp32 anyway (and e^2x stays finite).
inline float tanh_lane(float x) {
  const float e = exp_lane(2.0f * clamp_lane(x, -9.0f, 9.0f));
  return (e - 1.0f) / (e + 1.0f);
}

}  // namespace

template <>
struct GeluMath<Lane> {
  static Lane erf(Lane x) { return Lane(erf_lane(x.v)); }
  static Lane tanh(Lane x) { return Lane(tanh_lane(x.v)); }
  static Lane exp(Lane x) { return Lane(exp_lane(x.v)); }
};

namespace {

// z = gelu(z) and g = g * gelu'(z) over n fp32 lanes: the vectorized, per-ISA loops.
template <GeluApprox kApprox>
inline void gelu_fwd_lanes(float* z, int64_t n) {
  for (int64_t i = 0; i < n; ++i) z[i] = gelu<kApprox>(Lane(z[i])).v;
}
template <GeluApprox kApprox>
inline void gelu_bwd_lanes(const float* z, float* g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = (Lane(g[i]) * gelu_grad<kApprox>(Lane(z[i]))).v;
}
FUSEDOPS_CPU_CLONES void gelu_erf_fwd_lanes(float* z, int64_t n) {
  gelu_fwd_lanes<GeluApprox::kNone>(z, n);
}
FUSEDOPS_CPU_CLONES void gelu_tanh_fwd_lanes(float* z, int64_t n) {
  gelu_fwd_lanes<GeluApprox::kTanh>(z, n);
}
FUSEDOPS_CPU_CLONES void gelu_erf_bwd_lanes(const float* z, float* g, int64_t n) {
  gelu_bwd_lanes<GeluApprox::kNone>(z, g, n);
}
FUSEDOPS_CPU_CLONES void gelu_tanh_bwd_lanes(const float* z, float* g, int64_t n) {
  gelu_bwd_lanes<GeluApprox::kTanh>(z, g, n);
}

}  // namespace

namespace {

template <GeluApprox kApprox>
void gelu_fwd_block(float* z, int64_t n) {
  kApprox == GeluApprox::kTanh ? gelu_tanh_fwd_lanes(z, n) : gelu_erf_fwd_lanes(z, n);
}
template <GeluApprox kApprox>
void gelu_bwd_block(const float* z, float* g, int64_t n) {
  kApprox == GeluApprox::kTanh ? gelu_tanh_bwd_lanes(z, g, n) : gelu_erf_bwd_lanes(z, g, n);
}
// fp64 (gradcheck, references): libm, unvectorized.
template <GeluApprox kApprox>
void gelu_fwd_block(double* z, int64_t n) {
  for (int64_t i = 0; i < n; ++i) z[i] = gelu<kApprox>(z[i]);
}
template <GeluApprox kApprox>
void gelu_bwd_block(const double* z, double* g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] *= gelu_grad<kApprox>(z[i]);
}

using cpu::acc_t;
using cpu::for_rows;
using cpu::kGrainElems;

constexpr int64_t kBlock = 512;  // columns per step: two fp32 buffers stay in L1
// dbias partials: at most this many row blocks, and at most this many fp32 partial values.
constexpr int64_t kMaxBlocks = 64;
constexpr int64_t kMaxPartialElems = int64_t(1) << 22;

template <typename T>
std::vector<acc_t<T>> bias_as_acc(const T* bias, int64_t cols) {
  return std::vector<acc_t<T>>(bias, bias + cols);
}

template <GeluApprox kApprox, typename T>
void bias_gelu_fwd_cpu(const T* x, const T* bias, T* y, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  const auto b = bias_as_acc(bias, cols);
  for_rows(rows, cols, [&](int64_t begin, int64_t end) {
    A z[kBlock];
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
        const int64_t n = std::min(kBlock, cols - c0);
        const T* xr = x + r * cols + c0;
        for (int64_t i = 0; i < n; ++i) z[i] = static_cast<A>(xr[i]) + b[c0 + i];
        gelu_fwd_block<kApprox>(z, n);
        T* yr = y + r * cols + c0;
        for (int64_t i = 0; i < n; ++i) yr[i] = static_cast<T>(z[i]);
      }
    }
  });
}

// dx = dy * gelu'(x + bias); dbias[c] = sum over rows of dx[:, c] (in acc_t, before rounding).
template <GeluApprox kApprox, typename T>
void bias_gelu_bwd_cpu(const T* dy, const T* x, const T* bias, T* dx, T* dbias, int64_t rows,
                       int64_t cols) {
  using A = acc_t<T>;
  const auto b = bias_as_acc(bias, cols);
  // The block count depends on the shape only, never on the thread count: same bits every run.
  const int64_t nblocks = std::max<int64_t>(
      1, std::min({rows, kMaxBlocks, rows * cols / kGrainElems, kMaxPartialElems / cols}));
  std::vector<A> partial(nblocks * cols, A(0));
  at::parallel_for(0, nblocks, 1, [&](int64_t bbegin, int64_t bend) {
    A z[kBlock], g[kBlock];
    for (int64_t blk = bbegin; blk < bend; ++blk) {
      A* acc = partial.data() + blk * cols;
      for (int64_t r = rows * blk / nblocks; r < rows * (blk + 1) / nblocks; ++r) {
        for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
          const int64_t n = std::min(kBlock, cols - c0);
          const int64_t off = r * cols + c0;
          for (int64_t i = 0; i < n; ++i) {
            z[i] = static_cast<A>(x[off + i]) + b[c0 + i];
            g[i] = static_cast<A>(dy[off + i]);
          }
          gelu_bwd_block<kApprox>(z, g, n);
          for (int64_t i = 0; i < n; ++i) dx[off + i] = static_cast<T>(g[i]);
          for (int64_t i = 0; i < n; ++i) acc[c0 + i] += g[i];
        }
      }
    }
  });
  at::parallel_for(0, cols, kGrainElems / nblocks + 1, [&](int64_t begin, int64_t end) {
    std::vector<A> sum(partial.begin() + begin, partial.begin() + end);
    for (int64_t blk = 1; blk < nblocks; ++blk) {
      const A* src = partial.data() + blk * cols;
      for (int64_t c = begin; c < end; ++c) sum[c - begin] += src[c];
    }
    for (int64_t c = begin; c < end; ++c) dbias[c] = static_cast<T>(sum[c - begin]);
  });
}

template <typename F>
void dispatch_approx(GeluApprox approx, const F& f) {
  if (approx == GeluApprox::kTanh) {
    f(std::integral_constant<GeluApprox, GeluApprox::kTanh>());
  } else {
    f(std::integral_constant<GeluApprox, GeluApprox::kNone>());
  }
}

at::Tensor bias_gelu_fwd(const at::Tensor& input, const at::Tensor& bias,
                         c10::string_view approximate) {
  const auto p = check_bias_gelu("bias_gelu", input, bias, approximate);
  const at::Tensor x = input.contiguous(), b = bias.contiguous();
  at::Tensor y = at::empty_like(x);
  if (y.numel() == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_gelu_fwd", [&] {
    dispatch_approx(p.approx, [&](auto a) {
      bias_gelu_fwd_cpu<decltype(a)::value>(x.const_data_ptr<scalar_t>(),
                                            b.const_data_ptr<scalar_t>(),
                                            y.mutable_data_ptr<scalar_t>(), p.rows, p.cols);
    });
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_bwd(const at::Tensor& grad_output,
                                                 const at::Tensor& input, const at::Tensor& bias,
                                                 c10::string_view approximate) {
  const auto p = check_bias_gelu("bias_gelu_backward", input, bias, approximate);
  check_like("bias_gelu_backward", "grad_output", grad_output, "input", input);
  const at::Tensor dy = grad_output.contiguous(), x = input.contiguous(), b = bias.contiguous();
  at::Tensor dx = at::empty_like(x);
  at::Tensor db = p.rows == 0 ? at::zeros_like(b) : at::empty_like(b);
  if (dx.numel() == 0) return {dx, db};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_gelu_bwd", [&] {
    dispatch_approx(p.approx, [&](auto a) {
      bias_gelu_bwd_cpu<decltype(a)::value>(
          dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), b.const_data_ptr<scalar_t>(),
          dx.mutable_data_ptr<scalar_t>(), db.mutable_data_ptr<scalar_t>(), p.rows, p.cols);
    });
  });
  return {dx, db};
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, CPU, m) {
  m.impl("bias_gelu_fwd", &bias_gelu_fwd);
  m.impl("bias_gelu_bwd", &bias_gelu_bwd);
}

}  // namespace fusedops
