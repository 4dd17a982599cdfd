// CPU softmax / log_softmax, forward and backward, over contiguous rows.
// Rows are split across threads (at::parallel_for); within a row the math is at::vec SIMD in
// fp32 (fp64 for double), two vectors per step; fp16/bf16 are widened as loaded and narrowed as
// stored, with a per-thread buffer where softmax's forward keeps exp(x - max) (exp runs once).
#include "softmax.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/cpu_host.h"
#include "cpu/rows.h"

namespace fusedops {
namespace {

using cpu::acc_t;
using cpu::for_each_step;
using cpu::for_each_vec;
using cpu::for_rows;
using cpu::ld;
using cpu::ld_step;
using cpu::Max;
using cpu::st;
using cpu::st_step;
using cpu::Sum;

// Three passes over a row (in cache after the first): max; exp(x - max) and its sum; the
// result. softmax keeps exp(x - max) between the last two in fp32 (fp64 for double): in y, or in
// a per-thread buffer for fp16/bf16 (narrowing it there would round twice). Every pass takes a
// row's tail as one partial vector step where it is long enough (cpu::for_each_step; lanes past
// the row load -inf for the max and exp, 0 elsewhere). Partial steps in the max and write passes
// too, 2 threads, 65536 rows, ms, alternating processes: fp32 16 / 21 / 48 columns 1.95 / 2.26 /
// 2.59 -> 1.48 / 1.61 / 1.91 (torch 0.67 / 1.11 / 1.23), bf16 2.24 / 2.58 / 2.96 -> 1.89 / 1.94 /
// 2.43 (bf16 log_softmax at 16 columns 2.31 -> 2.43); whole rows (32, 64, 100, 128, 1024) alike.
// Short rows go in groups: each pass runs over every row of the group before the next pass
// starts, so that one row's reductions (a horizontal max, a horizontal sum, a log) overlap the
// next row's loads instead of ending a chain of dependent instructions. A group is as many rows as
// keep the bytes its passes read again within kGroupBytes, so that they are still in L1.
constexpr int64_t kGroupBytes = 8192;
constexpr int64_t kMaxGroupRows = 64;
inline int64_t group_rows(int64_t reread_row_bytes) {
  return std::clamp<int64_t>(kGroupBytes / std::max<int64_t>(reread_row_bytes, 1), 1,
                             kMaxGroupRows);
}
template <typename T, bool kLog>
void softmax_fwd_rows(const T* x, T* y, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  constexpr bool kBuffer = !kLog && !std::is_same_v<T, A>;
  const int64_t group = group_rows(cols * int64_t(sizeof(T) + (kLog ? 0 : sizeof(A))));
  for_rows(rows, cols, [&](int64_t begin, int64_t end) {
    std::vector<A> buf(kBuffer ? group * cols : 0);
    A row_max[kMaxGroupRows], row_sum[kMaxGroupRows];
    for (int64_t first = begin; first < end; first += group) {
      const int64_t n = std::min(group, end - first);
      const T* xg = x + first * cols;
      T* yg = y + first * cols;
      // Where softmax keeps row r's exp(x - max) for the last pass.
      auto exps = [&](int64_t r) {
        if constexpr (kBuffer) {
          return buf.data() + r * cols;
        } else {
          return yg + r * cols;
        }
      };
      for (int64_t r = 0; r < n; ++r) {
        const T* xr = xg + r * cols;
        Max<A> mx;
        for_each_step<A>(cols,
                         [&](int64_t i, auto step) { mx.add(ld_step(xr + i, step, kNegInf)); });
        row_max[r] = mx.total();
      }
      // With a finite max every x - max is in [-inf, 0], where the cheaper exp_u20 is exact
      // enough; a row holding NaN or +inf takes exp(), which propagates NaN.
      for (int64_t r = 0; r < n; ++r) {
        const T* xr = xg + r * cols;
        auto exp_sum = [&](const auto& exp_fn) {
          Sum<A> acc;
          for_each_step<A>(cols, [&](int64_t i, auto step) {
            const auto v = ld_step(xr + i, step, kNegInf);
            const auto ev = exp_fn(v - decltype(v)(row_max[r]));
            if constexpr (!kLog) st_step(exps(r) + i, ev, step);
            acc.add(ev);
          });
          return acc.total();
        };
        row_sum[r] = std::isfinite(row_max[r])
                         ? exp_sum([](const auto& v) { return cpu::exp_u20(v); })
                         : exp_sum([](const auto& v) { return cpu::exp(v); });
      }
      // Now what the last pass takes: log(sum) (log_softmax), 1 / sum (softmax).
      for (int64_t r = 0; r < n; ++r) row_sum[r] = kLog ? std::log(row_sum[r]) : A(1) / row_sum[r];
      for (int64_t r = 0; r < n; ++r) {
        T* yr = yg + r * cols;
        if constexpr (kLog) {  // (x - max) - log(sum): max + log(sum) loses digits
          const T* xr = xg + r * cols;
          for_each_step<A>(cols, [&](int64_t i, auto step) {
            const auto v = ld_step(xr + i, step, A(0));
            using V = std::decay_t<decltype(v)>;
            st_step(yr + i, (v - V(row_max[r])) - V(row_sum[r]), step);
          });
        } else {
          const A* e = exps(r);
          for_each_step<A>(cols, [&](int64_t i, auto step) {
            const auto v = ld_step(e + i, step, A(0));
            st_step(yr + i, v * std::decay_t<decltype(v)>(row_sum[r]), step);
          });
        }
      }
    }
  });
}

template <typename T>
void softmax_fwd_cpu(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  log ? softmax_fwd_rows<T, true>(x, y, rows, cols) : softmax_fwd_rows<T, false>(x, y, rows, cols);
}

// softmax:     dx = y * (dy - sum(dy * y))
// log_softmax: dx = dy - exp(y) * sum(dy)
// Two passes over each row, both reading dy and y from the tensors (the second from cache) and
// widening fp16/bf16 as loaded: fp32 copies of long rows would not stay in cache. log_softmax's
// passes take a partial tail step as the forward's do (0 past the row; the sum pass's too since:
// 2 threads, 65536 rows of 16 / 21 / 48 fp32, ms, 1.02 / 1.16 / 1.50 -> 0.92 / 0.86 / 1.30).
// Its exp is exp_u20_nan (y, a log-probability, is <= 0; a NaN row stays NaN): with Sleef's exp
// the fp32 backward read 0.72x torch at 4352x100 and 4096x255 and 0.9x at 1024x1000 (2 threads,
// rows in cache), after 1.0 / 0.84-0.95 / 1.16-1.2x; its error stays within 1.5x torch's.
template <typename T>
void softmax_bwd_cpu(const T* dy, const T* y, T* dx, int64_t rows, int64_t cols, bool log) {
  using A = acc_t<T>;
  for_rows(rows, cols, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* dyr = dy + r * cols;
      const T* yr = y + r * cols;
      T* dxr = dx + r * cols;
      Sum<A> s;
      if (log) {
        for_each_step<A>(cols, [&](int64_t i, auto step) { s.add(ld_step(dyr + i, step, A(0))); });
        const A sum = s.total();
        for_each_step<A>(cols, [&](int64_t i, auto step) {
          const auto d = ld_step(dyr + i, step, A(0));
          st_step(dxr + i, d - cpu::exp_u20_nan(ld_step(yr + i, step, A(0))) * decltype(d)(sum),
                  step);
        });
      } else {
        // Scalar tails: a partial step's masked loads and stores cost more here (2 threads,
        // 65536 rows of 16 / 21 / 48 fp32, ms: 0.31 / 0.45 / 0.67 against 0.74 / 0.87 / 1.06).
        for_each_vec<A>(0, cols, [&](int64_t i, auto t) {
          using V = decltype(t);
          s.add(ld<V>(dyr + i) * ld<V>(yr + i));
        });
        const A sum = s.total();
        for_each_vec<A>(0, cols, [&](int64_t i, auto t) {
          using V = decltype(t);
          st(dxr + i, ld<V>(yr + i) * (ld<V>(dyr + i) - V(sum)));
        });
      }
    }
  });
}

// A strided dim runs torch's own kernel (softmax.h), and so do many short rows whose results go
// `inner` apart (a transposed dim, softmax.h): there torch's copy to the result's layout and its
// kernel down the strided dim beat the rows path's short rows and the same copy (2 threads,
// [16, C, 64, 64] channels_last over dim 1, rows path / torch, ms: C = 21 fp32 16.4 / 7.4, bf16
// 12.3 / 5.4; C = 32 bf16 1.97 / 1.52; C = 64 bf16 3.5 / 4.4, fp32 14.2 / 15.5). Not fp16/bf16
// log_softmax on torch 2.4, whose CPU kernel there maps -inf inputs to NaN (the floor build's
// tests; torch 2.14's doesn't). So do fp32 rows of 16-63 elements in any layout, where
// torch's vectorized kernel beats the rows path's one or two partial vector steps per row (2
// threads, 65536 rows, the rows path's speed over torch at 16 / 21 / 32 / 48 columns: softmax
// forward 0.45 / 0.68 / 0.99 / 0.65x, backward 0.47 / 0.59 / 0.77 / 0.88x, log_softmax forward
// 0.30 / 0.57 / 0.97 / 0.75x, backward 0.38 / 0.68 / 0.93 / 0.68x); shorter rows (4 and 8
// columns: 1.1-9.8x) and rows of 64 and more (0.88-1.49x) keep the rows path. And fp16/bf16
// rows of 32-255 elements, for log_softmax and softmax's backward, where torch's kernels beat
// the rows path's per-row reductions and scalar tails (same measure, 32 / 48 / 96 / 127 / 197 /
// 255 columns: bf16 log_softmax forward 0.68 / 0.56 / 0.83 / 0.82 / 0.98 / 1.00x, backward 1.00
// / 0.74 / 1.00 / 0.88 / 0.94 / 0.94x, softmax backward 0.92 / 0.76 / 0.94 / 0.58 / 1.02 /
// 0.72x; fp16 0.80 / 0.67 / 1.02 / 0.90 / 0.93 / 1.08x, 1.00 / 0.77 / 1.01 / 0.86 / 0.85 /
// 0.94x, 0.92 / 0.28 / 0.97 / 0.29 / 0.95 / 0.49x; torch's kernel through the op: 0.96-1.02x);
// softmax's forward keeps the rows path there (1.08-2.7x), and so do shorter rows (16 and 21:
// 1.1-6.5x) and longer ones (256: 0.96-1.19x). Those two row-length rules hold for any number of
// rows: with fewer, in cache, torch's kernel led by more (2 threads, the rows path's speed over
// torch at 64 / 512 / 4352 rows: fp32 17 columns softmax forward 0.64 / 0.40 / 0.66x, log_softmax
// forward 0.55 / 0.28 / 0.41x, backward 0.97 / 0.74 / 0.66x; fp32 48 columns 0.62 / 0.40 / 0.68x,
// 0.55 / 0.31 / 0.46x, 0.94 / 0.66 / 0.65x; bf16 48 columns log_softmax forward 0.49 / 0.29 /
// 0.49x, softmax backward 0.96 / 0.73 / 0.75x; at 8 rows level), so they no longer wait for
// many_short_softmaxes' 16384 rows. (The demo's attention softmax, 4352 fp32 rows of 17, read
// 0.71x torch on the CPU.)
constexpr int64_t kCpuTransposedRowsCols = 64;       // rows at least this long keep the rows path
constexpr int64_t kCpuFp32TorchRows[2] = {16, 64};   // [first, end) of fp32 row lengths for torch
constexpr int64_t kCpuHalfTorchRows[2] = {32, 256};  // and of fp16/bf16 ones (not softmax forward)
bool cpu_runs_torch(const at::Tensor& t, int64_t dim, bool log, bool backward) {
  const bool half = at::isReducedFloatingType(t.scalar_type());
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 5
  if (log && half) return false;
#endif
  if (softmax_dim_strided(t, dim)) return true;
  if (t.dim() == 0) return false;
  const int64_t cols = t.size(dim);
  return (softmax_dim_transposed(t, dim) && many_short_softmaxes(t, dim) &&
          cols < kCpuTransposedRowsCols) ||
         (t.scalar_type() == at::kFloat && cols >= kCpuFp32TorchRows[0] &&
          cols < kCpuFp32TorchRows[1]) ||
         (half && (log || backward) && cols >= kCpuHalfTorchRows[0] && cols < kCpuHalfTorchRows[1]);
}

at::Tensor softmax_fwd(const at::Tensor& input, int64_t dim, bool log) {
  const auto p = check_softmax_fwd(input, dim, log);
  if (cpu_runs_torch(input, p.dim, log, /*backward=*/false))
    return torch_softmax_fwd(input, p.dim, log);
  const at::Tensor x = to_rows(input, p.dim);
  at::Tensor y = cpu_empty_like(x);
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
  if (cpu_runs_torch(output, p.dim, log, /*backward=*/true))
    return torch_softmax_bwd(grad_output, output, p.dim, log);
  const at::Tensor dy = to_rows(grad_output, p.dim);
  const at::Tensor y = to_rows(output, p.dim);
  at::Tensor dx = cpu_empty_like(y);
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
