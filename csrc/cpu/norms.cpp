// CPU layer_norm and rms_norm (one template, kRms), forward and backward, over contiguous rows.
// Rows are split across threads (at::parallel_for); within a row the math is at::vec SIMD in
// fp32 (fp64 for double), mean and variance in two passes. fp16/bf16 are widened as they are
// loaded and narrowed as they are stored, with no row buffers: a long row's passes stay in
// cache. dweight/dbias: each chunk of rows writes one partial row, and the partials are summed
// column-wise in chunk order: bitwise reproducible for a given thread count.
#include "norms.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "cpu/cpu_host.h"
#include "cpu/rows.h"
#include "norm_ops.h"

namespace fusedops {
namespace {

using cpu::acc_t;
using cpu::for_each_vec;
using cpu::for_rows;
using cpu::kGrainElems;
using cpu::ld;
using cpu::st;
using cpu::Sum;
using cpu::Vec;
using cpu::Vec2;

// Rows of fp32 / fp64 (and params alike) take a single-vector step before their scalar tail
// (for_each_vec): rows of 16, 24, 48 or 80 fp32 had left 8-16 elements to scalar steps each. 2
// threads, about 4M elements, layer_norm's speed over torch, before -> after: forward 16 / 24 /
// 48 / 80 columns 1.40 / 0.94 / 1.24 / 1.33 -> 2.54 / 1.62 / 2.00 / 1.84x, backward 0.32 / 0.56
// / 0.57 / 0.87 -> 1.19 / 0.62-1.04 / 1.08 / 1.40x.
template <typename T, typename W>
constexpr bool kVecStep = std::is_same_v<T, acc_t<T>> && std::is_same_v<W, acc_t<T>>;

// y = (x - mean) * rstd * w + b, with mean = 0 for rms_norm. w, b: [cols] of W (T or acc_t<T>),
// or null.
template <typename T, typename W, bool kRms>
void norm_fwd_rows(const T* x, const W* w, const W* b, T* y, acc_t<T>* mean, acc_t<T>* rstd,
                   int64_t rows, int64_t cols, double eps) {
  using A = acc_t<T>;
  for_rows(rows, cols, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      A m = A(0);
      if constexpr (!kRms) {
        Sum<A> s;
        for_each_vec<A, kVecStep<T, W>>(0, cols,
                                        [&](int64_t i, auto t) { s.add(ld<decltype(t)>(xr + i)); });
        m = s.total() / A(cols);
      }
      // Second pass over the row (in cache) for sum((x - mean)^2): exact, no cancellation.
      Sum<A> q;
      for_each_vec<A, kVecStep<T, W>>(0, cols, [&](int64_t i, auto t) {
        using V = decltype(t);
        const V d = ld<V>(xr + i) - V(m);
        q.add(d * d);
      });
      const A rs = A(1) / std::sqrt(q.total() / A(cols) + A(eps));
      for_each_vec<A, kVecStep<T, W>>(0, cols, [&](int64_t i, auto t) {
        using V = decltype(t);
        V v = (ld<V>(xr + i) - V(m)) * V(rs);
        if (w != nullptr) v = v * ld<V>(w + i);
        if (b != nullptr) v = v + ld<V>(b + i);
        st(yr + i, v);
      });
      if (mean != nullptr) mean[r] = m;
      rstd[r] = rs;
    }
  });
}

// With xh = (x - mean) * rstd and g = dy * w (w = 1 when absent):
//   dx = rstd * (g - mean(g) - xh * mean(g * xh))   (rms_norm: no mean(g) term)
//   dw_part[c] += dy * xh,  db_part[c] += dy        over the rows of chunk c
// Each output is computed only when its pointer is non-null; the partials start zeroed. Two
// passes: each row's two sums, then dx and the partials together for kRowBlock rows at a time,
// so that a partial row is loaded and stored once per block of rows, not once per row (fp32 rows
// of 1024: the partials had been half of the second pass's loads and stores).
constexpr int kRowBlock = 4;
template <typename T, typename W, bool kRms>
void norm_bwd_rows(const T* dy, const T* x, const acc_t<T>* mean, const acc_t<T>* rstd, const W* w,
                   T* dx, acc_t<T>* dw_part, acc_t<T>* db_part, int64_t rows, int64_t cols,
                   int64_t chunks) {
  using A = acc_t<T>;
  auto grad = [&](const auto& d, int64_t i) {
    using V = std::decay_t<decltype(d)>;
    return w != nullptr ? d * ld<V>(w + i) : d;
  };
  // Rows r0 ... r0 + N - 1 (N a compile-time count: the blocks' values stay in registers).
  auto block_rows = [&](auto rows_in_block, int64_t r0, A* dwp, A* dbp) {
    constexpr int N = decltype(rows_in_block)::value;
    A m[N], rs[N], c1[N] = {}, c2[N] = {};
    for (int k = 0; k < N; ++k) {
      const int64_t r = r0 + k;
      m[k] = kRms ? A(0) : mean[r];
      rs[k] = rstd[r];
      if (dx == nullptr) continue;
      const T* xr = x + r * cols;
      const T* dyr = dy + r * cols;
      Sum<A> sg, sgx;
      for_each_vec<A, kVecStep<T, W>>(0, cols, [&](int64_t i, auto t) {
        using V = decltype(t);
        const V g = grad(ld<V>(dyr + i), i);
        sg.add(g);
        sgx.add(g * ((ld<V>(xr + i) - V(m[k])) * V(rs[k])));
      });
      c1[k] = kRms ? A(0) : sg.total() / A(cols);
      c2[k] = sgx.total() / A(cols);
    }
    for_each_vec<A, kVecStep<T, W>>(0, cols, [&](int64_t i, auto t) {
      using V = decltype(t);
      // Every row's loads before any row's store: rows of 4 KB put a row's loads 4 KB past the
      // previous row's stores, which the core can take for a dependence (4K aliasing).
      V d[N], xh[N];
      for (int k = 0; k < N; ++k) {
        const int64_t off = (r0 + k) * cols + i;
        d[k] = ld<V>(dy + off);
        xh[k] = (ld<V>(x + off) - V(m[k])) * V(rs[k]);
      }
      V dw_sum = d[0] * xh[0], db_sum = d[0];
      for (int k = 1; k < N; ++k) {
        dw_sum = dw_sum + d[k] * xh[k];
        db_sum = db_sum + d[k];
      }
      if (dx != nullptr) {
        for (int k = 0; k < N; ++k) {
          st(dx + (r0 + k) * cols + i, V(rs[k]) * (grad(d[k], i) - V(c1[k]) - xh[k] * V(c2[k])));
        }
      }
      if (dwp != nullptr) st(dwp + i, ld<V>(dwp + i) + dw_sum);
      if (dbp != nullptr) st(dbp + i, ld<V>(dbp + i) + db_sum);
    });
  };
  at::parallel_for(0, chunks, 1, [&](int64_t c_begin, int64_t c_end) {
    for (int64_t c = c_begin; c < c_end; ++c) {
      A* dwp = dw_part != nullptr ? dw_part + c * cols : nullptr;
      A* dbp = db_part != nullptr ? db_part + c * cols : nullptr;
      const int64_t end = rows * (c + 1) / chunks;
      int64_t r = rows * c / chunks;
      for (; r + kRowBlock <= end; r += kRowBlock) {
        block_rows(std::integral_constant<int, kRowBlock>(), r, dwp, dbp);
      }
      for (; r < end; ++r) block_rows(std::integral_constant<int, 1>(), r, dwp, dbp);
    }
  });
}

// out[j] = sum over c = 0, 1, ... of part[c][j], in that order whatever the thread split, rounded
// once to W.
template <typename A, typename W>
void sum_partials(const A* part, W* out, int64_t chunks, int64_t cols) {
  at::parallel_for(0, cols, kGrainElems, [&](int64_t begin, int64_t end) {
    for_each_vec<A>(begin, end, [&](int64_t j, auto t) {
      using V = decltype(t);
      V s = ld<V>(part + j);
      for (int64_t c = 1; c < chunks; ++c) s = s + ld<V>(part + c * cols + j);
      st(out + j, s);
    });
  });
}

// The backend of NormOps (norm_ops.h).
struct CpuNorms {
  template <bool kRms>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> fwd(const char* op, const at::Tensor& input,
                                                            at::IntArrayRef normalized_shape,
                                                            const std::optional<at::Tensor>& weight,
                                                            const std::optional<at::Tensor>& bias,
                                                            double eps) {
    const NormProblem p = norm_problem(op, input, normalized_shape);
    check_norm_params(op, input, normalized_shape, weight, bias);
    const at::Tensor x = input.contiguous();
    at::Tensor out = cpu_empty_like(x);
    at::Tensor mean = kRms ? at::Tensor() : norm_stat_empty(input, p);
    at::Tensor rstd = norm_stat_empty(input, p);
    if (p.rows == 0) return {out, mean, rstd};
    if (p.cols == 0) {
      fill_empty_row_stats(mean, rstd);
      return {out, mean, rstd};
    }
    const at::Tensor w = contiguous_or_undefined(weight), b = contiguous_or_undefined(bias);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "norm_fwd_cpu", [&] {
      auto run = [&](auto* t_tag, auto* w_tag) {
        using T = std::remove_pointer_t<decltype(t_tag)>;
        using W = std::remove_pointer_t<decltype(w_tag)>;
        using A = acc_t<T>;
        norm_fwd_rows<T, W, kRms>(x.const_data_ptr<T>(), ptr_or_null<W>(w), ptr_or_null<W>(b),
                                  out.mutable_data_ptr<T>(), mut_ptr_or_null<A>(mean),
                                  rstd.mutable_data_ptr<A>(), p.rows, p.cols, eps);
      };
      with_norm_param_type<scalar_t>(norm_param_dtype(w, b), run);
    });
    return {out, mean, rstd};
  }

  template <bool kRms>
  static std::tuple<std::optional<at::Tensor>, std::optional<at::Tensor>, std::optional<at::Tensor>>
  bwd(const char* op, const at::Tensor& grad_out, const at::Tensor& input,
      at::IntArrayRef normalized_shape, const at::Tensor* mean, const at::Tensor& rstd,
      const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
      std::array<bool, 3> output_mask) {
    const NormProblem p =
        check_norm_bwd(op, grad_out, input, normalized_shape, mean, rstd, weight, bias);
    const bool need_dw = output_mask[1] && has_tensor(weight);
    const bool need_db = output_mask[2] && has_tensor(bias);
    const at::Tensor x = input.contiguous(), dy = grad_out.contiguous();
    at::Tensor dx = output_mask[0] ? cpu_empty_like(x) : at::Tensor();
    const at::ScalarType acc = norm_stat_dtype(input);
    // A partial row per chunk of rows: one per thread, but no more than tasks of kGrainElems
    // (tiny inputs run on the calling thread, without waking the pool).
    const int64_t tasks = std::max<int64_t>(1, (p.rows * p.cols + kGrainElems - 1) / kGrainElems);
    const int64_t chunks = std::clamp<int64_t>(std::min<int64_t>(at::get_num_threads(), tasks), 1,
                                               std::max<int64_t>(p.rows, 1));
    // dweight's partial rows, then dbias's, in one zeroed allocation.
    const at::Tensor parts = need_dw || need_db
                                 ? at::zeros({int64_t(need_dw) + int64_t(need_db), chunks, p.cols},
                                             x.options().dtype(acc))
                                 : at::Tensor();
    const at::Tensor w = contiguous_or_undefined(weight), b = contiguous_or_undefined(bias);
    std::optional<at::Tensor> dw, db;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "norm_bwd_cpu", [&] {
      auto run = [&](auto* t_tag, auto* w_tag) {
        using T = std::remove_pointer_t<decltype(t_tag)>;
        using W = std::remove_pointer_t<decltype(w_tag)>;
        using A = acc_t<T>;
        A* dw_part = need_dw ? parts.mutable_data_ptr<A>() : nullptr;
        A* db_part =
            need_db ? parts.mutable_data_ptr<A>() + (need_dw ? chunks * p.cols : 0) : nullptr;
        if (x.numel() > 0) {
          const at::Tensor mean_c = mean != nullptr ? mean->contiguous() : at::Tensor();
          const at::Tensor rstd_c = rstd.contiguous();
          norm_bwd_rows<T, W, kRms>(dy.const_data_ptr<T>(), x.const_data_ptr<T>(),
                                    ptr_or_null<A>(mean_c), rstd_c.const_data_ptr<A>(),
                                    ptr_or_null<W>(w), mut_ptr_or_null<T>(dx), dw_part, db_part,
                                    p.rows, p.cols, chunks);
        }
        // A parameter's gradient, in its dtype: its partial rows summed in chunk order.
        auto reduce = [&](bool need, const A* part, const at::Tensor& param) {
          std::optional<at::Tensor> none;
          if (!need) return none;  // (part is null when the rows have no columns)
          at::Tensor sum = at::empty(normalized_shape, param.options());
          sum_partials(part, sum.mutable_data_ptr<W>(), chunks, p.cols);
          return std::optional<at::Tensor>(sum);
        };
        dw = reduce(need_dw, dw_part, w);
        db = reduce(need_db, db_part, b);
      };
      with_norm_param_type<scalar_t>(norm_param_dtype(w, b), run);
    });
    return {output_mask[0] ? std::optional<at::Tensor>(dx) : std::nullopt, dw, db};
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fusedops, CPU, m) { NormOps<CpuNorms>::register_into(m); }

}  // namespace fusedops
