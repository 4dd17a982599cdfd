// CPU bias + GELU, forward and backward, over contiguous [rows, cols] rows (bias [cols]).
// A row is processed kBlock columns at a time (fp16/bf16 widened to fp32 first; fp32 in place)
// by branch-free lane loops that add the bias, apply GELU (and in the backward, add dx into the
// dbias partial), vectorized by the compiler for AVX-512, AVX2 and baseline x86-64 and picked at
// load time. Forward: rows split across threads. Backward: tasks of a row block x a column tile;
// dbias is deterministic: the blocks depend only on the shape, each sums its rows in order into
// its own fp32 partial, and the partials are added in block order.
#include "bias_gelu.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common/math.h"
#include "cpu/cpu_host.h"
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
// its exponent bits. Needs x <= 88.7: every caller passes at most 18 (-x^2, or 2x for tanh with x
// clamped to 9). Below -84, and for NaN, it is exactly 0: x is replaced by -88, whose n = -127
// gives exponent bits 0. Above, the result is at least e^-84 = 3.3e-37, and what GELU computes
// from it stays a normal float too (phi = e^x / sqrt(2 pi), erf's p * t * e^x >= 2e-38). A
// subnormal there would be 0 on a thread with FTZ/DAZ set (torch.set_flush_denormal, or the
// crtfastmath.o of a library linked with -ffast-math, as torch 2.4's torch.compile builds them)
// and not on another, so the bits would depend on which thread computed the element. The cost:
// gelu' (erf) is 0 from |x| = 12.96 on, where it is at most 1.7e-36, so dx is off by at most that
// times |dy| (the tests allow 1e-6 |dy|). NaN still comes out: every caller also multiplies by x
// or divides by NaN. One compare, which GCC vectorizes as a mask; an upper clamp costs it blends.
inline float exp_lane(float x) {
  const float xc = x >= -84.0f ? x : -88.0f;
  constexpr float kRoundShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float shifted = xc * 1.44269504089f + kRoundShift;
  const float n = shifted - kRoundShift;
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 in two parts: exact n*hi
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  int32_t bits;
  __builtin_memcpy(&bits, &shifted, sizeof(bits));
  // shifted's bits are 0x4B400000 + n; shifting left by 23 drops the 0x4B400000.
  bits = static_cast<int32_t>((static_cast<uint32_t>(bits) + 127u) << 23);
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

// y = gelu(x + bias), and dx = dy * gelu'(x + bias) added into dbias_acc, over n fp32 lanes: the
// vectorized, per-ISA loops. No pointer aliases another (fresh outputs, the kernel's own buffers).
template <GeluApprox kApprox>
inline void gelu_fwd_lanes(const float* __restrict__ x, const float* __restrict__ bias,
                           float* __restrict__ y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu<kApprox>(Lane(x[i]) + Lane(bias[i])).v;
}
template <GeluApprox kApprox>
inline void gelu_bwd_lanes(const float* __restrict__ dy, const float* __restrict__ x,
                           const float* __restrict__ bias, float* __restrict__ dx,
                           float* __restrict__ dbias_acc, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = (Lane(dy[i]) * gelu_grad<kApprox>(Lane(x[i]) + Lane(bias[i]))).v;
    // A subnormal dy * gelu' (gelu' near exp_lane's cutoff, or a tiny dy) is flushed here, to the
    // signed zero FTZ gives, so that the bits are the same with FTZ/DAZ set or not.
    const float d = __builtin_fabsf(g) >= FLT_MIN ? g : g * 0.0f;
    dx[i] = d;
    dbias_acc[i] += d;
  }
}
FUSEDOPS_CPU_CLONES void gelu_erf_fwd_lanes(const float* x, const float* bias, float* y,
                                            int64_t n) {
  gelu_fwd_lanes<GeluApprox::kNone>(x, bias, y, n);
}
FUSEDOPS_CPU_CLONES void gelu_tanh_fwd_lanes(const float* x, const float* bias, float* y,
                                             int64_t n) {
  gelu_fwd_lanes<GeluApprox::kTanh>(x, bias, y, n);
}
FUSEDOPS_CPU_CLONES void gelu_erf_bwd_lanes(const float* dy, const float* x, const float* bias,
                                            float* dx, float* dbias_acc, int64_t n) {
  gelu_bwd_lanes<GeluApprox::kNone>(dy, x, bias, dx, dbias_acc, n);
}
FUSEDOPS_CPU_CLONES void gelu_tanh_bwd_lanes(const float* dy, const float* x, const float* bias,
                                             float* dx, float* dbias_acc, int64_t n) {
  gelu_bwd_lanes<GeluApprox::kTanh>(dy, x, bias, dx, dbias_acc, n);
}

}  // namespace

namespace {

using cpu::acc_t;
using cpu::for_rows;
using cpu::kGrainElems;

constexpr int64_t kBlock = 512;  // columns per step: a step's fp32 buffers stay in L1
// Backward tasks cover at most this many columns, so a task's slice of its dbias partial (16 KiB
// in fp32) stays in L1 while the task adds its rows into it.
constexpr int64_t kTileCols = 4096;
// Backward tasks (row blocks x column tiles) per call, at least, where the grain allows: enough
// for a balanced split over the threads. Long rows get their tasks from their tiles and need few
// row blocks, so the dbias partials ([blocks, cols], fp32) stay small: at most about
// kMinTasks x kTileCols values, or one row.
constexpr int64_t kMinTasks = 64;
constexpr int64_t kCacheLine = 64;

// Loads of a step's inputs are requested one step ahead, so that they arrive while the step before
// computes: the hardware prefetchers go quiet without demand loads, and a step's own loads would
// otherwise come in a burst that waits on DRAM.
template <typename T>
inline void prefetch_step(const T* p, int64_t n) {
  const char* bytes = reinterpret_cast<const char*>(p);
  for (int64_t i = 0; i < n * static_cast<int64_t>(sizeof(T)); i += kCacheLine) {
    __builtin_prefetch(bytes + i);
  }
}

// One step of n <= kBlock columns in acc_t: the lane loops for fp32; libm, unvectorized, for fp64
// (gradcheck, references).
template <GeluApprox kApprox>
void gelu_fwd_step(const float* x, const float* bias, float* y, int64_t n) {
  kApprox == GeluApprox::kTanh ? gelu_tanh_fwd_lanes(x, bias, y, n)
                               : gelu_erf_fwd_lanes(x, bias, y, n);
}
template <GeluApprox kApprox>
void gelu_bwd_step(const float* dy, const float* x, const float* bias, float* dx, float* dbias_acc,
                   int64_t n) {
  kApprox == GeluApprox::kTanh ? gelu_tanh_bwd_lanes(dy, x, bias, dx, dbias_acc, n)
                               : gelu_erf_bwd_lanes(dy, x, bias, dx, dbias_acc, n);
}
template <GeluApprox kApprox>
void gelu_fwd_step(const double* x, const double* bias, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu<kApprox>(x[i] + bias[i]);
}
template <GeluApprox kApprox>
void gelu_bwd_step(const double* dy, const double* x, const double* bias, double* dx,
                   double* dbias_acc, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dx[i] = dy[i] * gelu_grad<kApprox>(x[i] + bias[i]);
    dbias_acc[i] += dx[i];
  }
}

// A thread's fp32 buffers for a step of fp16/bf16 (empty for fp32 and fp64, which run on the
// tensors' own memory).
template <typename T>
std::vector<acc_t<T>> step_buffer() {
  return std::vector<acc_t<T>>(std::is_same_v<T, acc_t<T>> ? 0 : kBlock);
}

template <typename T>
std::vector<acc_t<T>> bias_as_acc(const T* bias, int64_t cols) {
  return std::vector<acc_t<T>>(bias, bias + cols);
}

template <GeluApprox kApprox, typename T>
void bias_gelu_fwd_cpu(const T* x, const T* bias, T* y, int64_t rows, int64_t cols) {
  const auto b = bias_as_acc(bias, cols);
  for_rows(rows, cols, [&](int64_t begin, int64_t end) {
    auto xbuf = step_buffer<T>(), ybuf = step_buffer<T>();
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
        const int64_t n = std::min(kBlock, cols - c0);
        const int64_t off = r * cols + c0;
        prefetch_step(x + off + n, std::min(kBlock, end * cols - off - n));  // rows are contiguous
        auto* yw = cpu::out_row(y + off, ybuf);
        gelu_fwd_step<kApprox>(cpu::widen(x + off, n, xbuf), b.data() + c0, yw, n);
        cpu::narrow(yw, y + off, n);
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
  const int64_t ntiles = (cols + kTileCols - 1) / kTileCols;
  // The block count depends on the shape only, never on the thread count: same bits every run.
  const int64_t nblocks = std::max<int64_t>(
      1, std::min({rows, (kMinTasks + ntiles - 1) / ntiles, rows * cols / kGrainElems}));
  // [nblocks, cols]; uninitialized: each task zeroes its own slice, in parallel.
  const std::unique_ptr<A[]> partial(new A[nblocks * cols]);
  // A task is one row block's rows over one column tile, added in row order into the block's
  // partial: the order, and so the bits, are those of whole rows at a time. Threads claim tasks
  // one at a time, so one slowed down (page faults on dx, another process) takes fewer instead of
  // holding up the rest; which thread runs a task changes no bit.
  const int64_t ntasks = nblocks * ntiles;
  std::atomic<int64_t> next_task{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    auto dybuf = step_buffer<T>(), xbuf = step_buffer<T>(), dxbuf = step_buffer<T>();
    for (int64_t task = next_task++; task < ntasks; task = next_task++) {
      const int64_t blk = task / ntiles;
      const int64_t c_begin = task % ntiles * kTileCols;
      const int64_t c_end = std::min(cols, c_begin + kTileCols);
      const int64_t r_end = rows * (blk + 1) / nblocks;
      A* acc = partial.get() + blk * cols;
      std::fill(acc + c_begin, acc + c_end, A(0));
      for (int64_t r = rows * blk / nblocks; r < r_end; ++r) {
        for (int64_t c0 = c_begin; c0 < c_end; c0 += kBlock) {
          const int64_t n = std::min(kBlock, c_end - c0);
          const int64_t off = r * cols + c0;
          // The next step: on along this row's tile, else the tile's start in the next row.
          const bool row_left = c0 + n < c_end;
          if (row_left || r + 1 < r_end) {
            const int64_t next = row_left ? off + n : (r + 1) * cols + c_begin;
            const int64_t next_n = std::min(kBlock, c_end - (row_left ? c0 + n : c_begin));
            prefetch_step(x + next, next_n);
            prefetch_step(dy + next, next_n);
          }
          auto* dxw = cpu::out_row(dx + off, dxbuf);
          gelu_bwd_step<kApprox>(cpu::widen(dy + off, n, dybuf), cpu::widen(x + off, n, xbuf),
                                 b.data() + c0, dxw, acc + c0, n);
          cpu::narrow(dxw, dx + off, n);
        }
      }
    }
  });
  at::parallel_for(0, cols, kGrainElems / nblocks + 1, [&](int64_t begin, int64_t end) {
    std::vector<A> sum(partial.get() + begin, partial.get() + end);
    for (int64_t blk = 1; blk < nblocks; ++blk) {
      const A* src = partial.get() + blk * cols;
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
  at::Tensor y = cpu_empty_like(x);
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
  at::Tensor dx = cpu_empty_like(x);
  at::Tensor db = p.rows == 0 ? at::zeros_like(b) : cpu_empty_like(b);
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
