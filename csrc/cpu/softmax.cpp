// CPU softmax / log_softmax, forward and backward, over contiguous rows.
// Rows are split across threads (at::parallel_for); within a row the math is at::vec SIMD in
// fp32 (fp64 for double); fp16/bf16 rows are converted on the fly, or widened into per-thread
// buffers where softmax's forward keeps exp(x - max) between passes (so exp runs once).
#include "softmax.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "cpu/rows.h"

namespace fusedops {
namespace {

using cpu::acc_t;
using cpu::for_rows;
using cpu::narrow;
using cpu::out_row;
using cpu::widen;

template <typename T>
void softmax_fwd_cpu(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  using A = acc_t<T>;
  using Vec = at::vec::Vectorized<A>;
  // at::vec::maximum propagates NaN. With a finite max every x - max is in [-inf, 0], where the
  // cheaper exp_u20 (within 2 ulp; results below FLT_MIN flush to 0) is exact enough; a row
  // holding NaN or +inf takes exp(), which propagates NaN.
  auto row_max = [](const auto* row, int64_t n) {
    using S = std::remove_const_t<std::remove_pointer_t<decltype(row)>>;
    return at::vec::reduce_all<S>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, row, n);
  };
  auto exp_shifted = [](A max) {
    return [vmax = Vec(max), fast = std::isfinite(max)](Vec v) {
      return fast ? (v - vmax).exp_u20() : (v - vmax).exp();
    };
  };
  auto add = [](Vec a, Vec b) { return a + b; };
  for_rows(rows, cols, [&](int64_t begin, int64_t end) {
    // softmax keeps exp(x - max) in A between its sum and its scaling, so fp16/bf16 rows go
    // through buffers; log_softmax only reads x (three times), converting it on the fly.
    const bool buffered = !std::is_same_v<T, A> && !log;
    std::vector<A> xbuf(buffered ? cols : 0), ybuf(xbuf.size());
    for (int64_t r = begin; r < end; ++r) {
      if (log) {
        const T* xr = x + r * cols;
        const A max = row_max(xr, cols);
        const A sum = at::vec::map_reduce_all<T>(exp_shifted(max), add, xr, cols);
        // (x - max) - log(sum): max + log(sum) loses digits.
        const Vec vmax(max), log_sum(std::log(sum));
        at::vec::map<T>([&](Vec v) { return (v - vmax) - log_sum; }, y + r * cols, xr, cols);
      } else {
        const A* xr = widen(x + r * cols, cols, xbuf);
        A* yr = out_row(y + r * cols, ybuf);
        at::vec::map(exp_shifted(row_max(xr, cols)), yr, xr, cols);
        const Vec inv(A(1) /
                      at::vec::reduce_all<A>([&](Vec& a, Vec& b) { return add(a, b); }, yr, cols));
        at::vec::map([&](Vec v) { return v * inv; }, yr, yr, cols);
        narrow<T>(yr, y + r * cols, cols);
      }
    }
  });
}

// softmax:     dx = y * (dy - sum(dy * y))
// log_softmax: dx = dy - exp(y) * sum(dy)
// Two passes over the rows, fp16/bf16 converted on the fly.
template <typename T>
void softmax_bwd_cpu(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols, bool log) {
  using A = acc_t<T>;
  using Vec = at::vec::Vectorized<A>;
  for_rows(rows, cols, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* dyr = dy + r * cols;
      const T* yr = y + r * cols;
      T* dxr = dx + r * cols;
      if (log) {
        const Vec sum(at::vec::reduce_all<T>([](Vec& a, Vec& b) { return a + b; }, dyr, cols));
        at::vec::map2<T>([&](Vec g, Vec o) { return g - o.exp() * sum; }, dxr, dyr, yr, cols);
      } else {
        const Vec dot(at::vec::map2_reduce_all<T>(
            [](Vec g, Vec o) { return g * o; }, [](Vec a, Vec b) { return a + b; }, dyr, yr, cols));
        at::vec::map2<T>([&](Vec g, Vec o) { return o * (g - dot); }, dxr, dyr, yr, cols);
      }
    }
  });
}

at::Tensor softmax_fwd(const at::Tensor& input, int64_t dim, bool log) {
  const auto p = check_softmax_fwd(input, dim, log);
  const at::Tensor x = to_rows(input, p.dim);
  at::Tensor y = at::empty_like(x);
  if (p.rows > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, x.scalar_type(), "softmax_fwd_cpu", [&] {
          softmax_fwd_cpu(x.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(), p.rows,
                          p.cols, log);
        });
  }
  return from_rows(y, p.dim, input);
}

at::Tensor softmax_bwd(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                       bool log) {
  const auto p = check_softmax_bwd(grad_output, output, dim, log);
  const at::Tensor dy = to_rows(grad_output, p.dim);
  const at::Tensor y = to_rows(output, p.dim);
  at::Tensor dx = at::empty_like(y);
  if (p.rows > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, y.scalar_type(), "softmax_bwd_cpu", [&] {
          softmax_bwd_cpu(dy.const_data_ptr<scalar_t>(), y.const_data_ptr<scalar_t>(),
                          dx.mutable_data_ptr<scalar_t>(), p.rows, p.cols, log);
        });
  }
  return from_rows(dx, p.dim, output);
}

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, CPU, m) {
  m.impl("softmax_fwd", &softmax_fwd);
  m.impl("softmax_bwd", &softmax_bwd);
}

}  // namespace fusedops
