// CPU bias + GELU, forward and backward, over contiguous [rows, cols] rows (bias [cols]).
// Rows are split across threads; within a row the math is at::vec SIMD in fp32 (fp64 for double),
// fp16/bf16 widened a vector at a time. dbias is deterministic: rows are cut into a number of
// blocks that depends only on the shape, each block sums its rows in order into its own fp32
// partial, and the partials are added in block order.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common/bias_gelu_host.h"
#include "common/math.h"

namespace fusedops {

template <typename A>
struct GeluMath<at::vec::Vectorized<A>> {
  using V = at::vec::Vectorized<A>;
  static V erf(const V& x) { return x.erf(); }
  static V tanh(const V& x) { return x.tanh(); }
  static V exp(const V& x) { return x.exp(); }
};

namespace {

template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// kSize consecutive elements of T as acc_t vectors: one for float/double, two for fp16/bf16.
template <typename T>
struct Chunk {
  using AVec = at::vec::Vectorized<acc_t<T>>;
  static constexpr bool kWiden = !std::is_same_v<T, acc_t<T>>;
  static constexpr int kParts = kWiden ? 2 : 1;
  static constexpr int64_t kSize = at::vec::Vectorized<T>::size();
  static_assert(kParts * AVec::size() == kSize, "one T vector must widen into kParts acc vectors");
  AVec v[kParts];

  // n < kSize loads a zero-padded tail.
  static Chunk load(const T* p, int64_t n) {
    const auto raw = n == kSize ? at::vec::Vectorized<T>::loadu(p)
                                : at::vec::Vectorized<T>::loadu(p, static_cast<int>(n));
    Chunk c;
    if constexpr (kWiden) {
      std::tie(c.v[0], c.v[1]) = at::vec::convert_to_float<T>(raw);
    } else {
      c.v[0] = raw;
    }
    return c;
  }
  // From an acc_t array padded to a multiple of kSize.
  static Chunk load_acc(const acc_t<T>* p) {
    Chunk c;
    for (int i = 0; i < kParts; ++i) c.v[i] = AVec::loadu(p + i * AVec::size());
    return c;
  }
  void store(T* p, int64_t n) const {
    at::vec::Vectorized<T> raw;
    if constexpr (kWiden) {
      raw = at::vec::convert_from_float<T>(v[0], v[1]);
    } else {
      raw = v[0];
    }
    if (n == kSize) {
      raw.store(p);
    } else {
      raw.store(p, static_cast<int>(n));
    }
  }
};

template <typename T>
int64_t padded(int64_t cols) {
  return (cols + Chunk<T>::kSize - 1) / Chunk<T>::kSize * Chunk<T>::kSize;
}

// The bias widened to acc_t and zero-padded, so that vector loads of it never need a tail.
template <typename T>
std::vector<acc_t<T>> widen_bias(const T* bias, int64_t cols) {
  std::vector<acc_t<T>> out(padded<T>(cols), acc_t<T>(0));
  if (bias != nullptr) {
    for (int64_t c = 0; c < cols; ++c) out[c] = static_cast<acc_t<T>>(bias[c]);
  }
  return out;
}

// Rows per task: about 32K elements, so short rows don't drown in scheduling overhead.
constexpr int64_t kGrainElems = 32768;
// dbias partials: at most this many row blocks, and at most this many fp32 partial values.
constexpr int64_t kMaxBlocks = 64;
constexpr int64_t kMaxPartialElems = int64_t(1) << 22;

template <GeluApprox kApprox, typename T>
void bias_gelu_fwd_cpu(const T* x, const T* bias, T* y, int64_t rows, int64_t cols) {
  using C = Chunk<T>;
  const auto b = widen_bias(bias, cols);
  const int64_t grain = std::max<int64_t>(1, kGrainElems / cols);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      for (int64_t c = 0; c < cols; c += C::kSize) {
        const int64_t n = std::min(C::kSize, cols - c);
        C v = C::load(xr + c, n);
        const C bv = C::load_acc(b.data() + c);
        for (int i = 0; i < C::kParts; ++i) v.v[i] = gelu<kApprox>(v.v[i] + bv.v[i]);
        v.store(yr + c, n);
      }
    }
  });
}

// dx = dy * gelu'(x + bias); dbias[c] = sum over rows of dx[:, c] (in acc_t, before rounding).
template <GeluApprox kApprox, typename T>
void bias_gelu_bwd_cpu(const T* dy, const T* x, const T* bias, T* dx, T* dbias, int64_t rows,
                       int64_t cols) {
  using C = Chunk<T>;
  using A = acc_t<T>;
  const auto b = widen_bias(bias, cols);
  const int64_t pcols = padded<T>(cols);
  // The block count depends on the shape only, never on the thread count: same bits every run.
  const int64_t nblocks = std::max<int64_t>(
      1, std::min({rows, kMaxBlocks, rows * cols / kGrainElems, kMaxPartialElems / pcols}));
  std::vector<A> partial(dbias != nullptr ? nblocks * pcols : 0, A(0));
  at::parallel_for(0, nblocks, 1, [&](int64_t bbegin, int64_t bend) {
    for (int64_t blk = bbegin; blk < bend; ++blk) {
      A* acc = dbias != nullptr ? partial.data() + blk * pcols : nullptr;
      for (int64_t r = rows * blk / nblocks; r < rows * (blk + 1) / nblocks; ++r) {
        const T* dyr = dy + r * cols;
        const T* xr = x + r * cols;
        T* dxr = dx + r * cols;
        for (int64_t c = 0; c < cols; c += C::kSize) {
          const int64_t n = std::min(C::kSize, cols - c);
          C g = C::load(dyr + c, n);
          const C xv = C::load(xr + c, n);
          const C bv = C::load_acc(b.data() + c);
          for (int i = 0; i < C::kParts; ++i) {
            g.v[i] = g.v[i] * gelu_grad<kApprox>(xv.v[i] + bv.v[i]);
          }
          g.store(dxr + c, n);
          if (acc != nullptr) {
            // Padded tail lanes only ever land in the padding, which is never read back.
            const C a = C::load_acc(acc + c);
            for (int i = 0; i < C::kParts; ++i) {
              (a.v[i] + g.v[i]).store(acc + c + i * C::AVec::size());
            }
          }
        }
      }
    }
  });
  if (dbias == nullptr) return;
  at::parallel_for(0, cols, kGrainElems / nblocks + 1, [&](int64_t begin, int64_t end) {
    std::vector<A> sum(partial.begin() + begin, partial.begin() + end);
    for (int64_t blk = 1; blk < nblocks; ++blk) {
      const A* src = partial.data() + blk * pcols;
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
  const at::Tensor y = bias_gelu_rows_fwd_cpu(input.contiguous().view({p.rows, p.cols}),
                                              bias.contiguous(), p.approx);
  return y.view(input.sizes());
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_bwd(const at::Tensor& grad_output,
                                                 const at::Tensor& input, const at::Tensor& bias,
                                                 c10::string_view approximate) {
  const auto p = check_bias_gelu("bias_gelu_backward", input, bias, approximate);
  check_like("bias_gelu_backward", "grad_output", grad_output, "input", input);
  auto [dx, db] = bias_gelu_rows_bwd_cpu(grad_output.contiguous().view({p.rows, p.cols}),
                                         input.contiguous().view({p.rows, p.cols}),
                                         bias.contiguous(), p.approx, true);
  return {dx.view(input.sizes()), db};
}

}  // namespace

at::Tensor bias_gelu_rows_fwd_cpu(const at::Tensor& input, const at::Tensor& bias,
                                  GeluApprox approx) {
  const int64_t rows = input.size(0), cols = input.size(1);
  at::Tensor y = at::empty({rows, cols}, input.options());
  if (y.numel() == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "bias_gelu_fwd_cpu", [&] {
        dispatch_approx(approx, [&](auto a) {
          bias_gelu_fwd_cpu<decltype(a)::value>(
              input.const_data_ptr<scalar_t>(),
              bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr,
              y.mutable_data_ptr<scalar_t>(), rows, cols);
        });
      });
  return y;
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_rows_bwd_cpu(const at::Tensor& grad_output,
                                                          const at::Tensor& input,
                                                          const at::Tensor& bias, GeluApprox approx,
                                                          bool want_dbias) {
  const int64_t rows = input.size(0), cols = input.size(1);
  at::Tensor dx = at::empty({rows, cols}, input.options());
  at::Tensor db;
  if (want_dbias)
    db = rows == 0 ? at::zeros({cols}, input.options()) : at::empty({cols}, input.options());
  if (dx.numel() == 0) return {dx, db};
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "bias_gelu_bwd_cpu", [&] {
        dispatch_approx(approx, [&](auto a) {
          bias_gelu_bwd_cpu<decltype(a)::value>(
              grad_output.const_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(),
              bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr,
              dx.mutable_data_ptr<scalar_t>(),
              want_dbias ? db.mutable_data_ptr<scalar_t>() : nullptr, rows, cols);
        });
      });
  return {dx, db};
}

TORCH_LIBRARY_IMPL(fusedops, CPU, m) {
  m.impl("bias_gelu_fwd", &bias_gelu_fwd);
  m.impl("bias_gelu_bwd", &bias_gelu_bwd);
}

}  // namespace fusedops
