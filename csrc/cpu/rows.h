// Row helpers shared by the CPU kernels: rows split across threads, and fp16/bf16 rows widened to
// fp32 (fp64 stays fp64) in a per-thread buffer, computed on with at::vec, and narrowed back once.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/cpu/vec/vec_n.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace fusedops {
namespace cpu {

template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Elements per task: about 32K, so short rows don't drown in scheduling overhead.
constexpr int64_t kGrainElems = 32768;

// f(begin, end) over the rows [0, rows), split across threads in tasks of >= kGrainElems.
template <typename F>
void for_rows(int64_t rows, int64_t cols, const F& f) {
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrainElems / std::max<int64_t>(cols, 1)), f);
}

template <typename A>
using Vec = at::vec::Vectorized<A>;

// The vector step: two Vec<A>, which for fp16/bf16 is exactly one Vectorized<T> in memory, and
// two independent chains of arithmetic per iteration.
template <typename A>
using Vec2 = at::vec::VectorizedN<A, 2>;

// Calls f(i, tag) over [begin, end): tag is a Vec2<A> for each full step, then (kVecStep) a
// Vec<A> where a whole one is left, then an A for each tail element, so one generic body (using
// ld/st below) serves every width. A Vec<A> step needs memory of A (ld/st widen only Vec2).
template <typename A, bool kVecStep = false, typename F>
inline void for_each_vec(int64_t begin, int64_t end, const F& f) {
  int64_t i = begin;
  for (; i + Vec2<A>::size() <= end; i += Vec2<A>::size()) f(i, Vec2<A>());
  if constexpr (kVecStep) {
    if (i + Vec<A>::size() <= end) {
      f(i, Vec<A>());
      i += Vec<A>::size();
    }
  }
  for (; i < end; ++i) f(i, A());
}

// Loads V (Vec2<A> or A) from memory of S: S is A (statistics, parameters, partials, fp32/fp64
// rows) or fp16/bf16 (rows), widened here.
template <typename V, typename S>
inline V ld(const S* p) {
  using A = acc_t<S>;
  if constexpr (std::is_same_v<V, A>) {
    return static_cast<A>(*p);
  } else if constexpr (std::is_same_v<S, A>) {
    return V::loadu(p);
  } else {
    V v;
    at::vec::load_to_float<S>(p, v[0], v[1]);
    return v;
  }
}

// Stores V into memory of S, narrowed (round-to-nearest-even) for fp16/bf16.
template <typename S, typename V>
inline void st(S* p, const V& v) {
  using A = acc_t<S>;
  if constexpr (std::is_same_v<V, A>) {
    *p = static_cast<S>(v);
  } else if constexpr (std::is_same_v<S, A>) {
    v.store(p);
  } else {
    at::vec::convert_from_float<S>(v[0], v[1]).store(p);
  }
}

// A sum fed by both vector and scalar (tail) steps. Vector steps go through a short inner
// accumulator folded into the outer one every kInner steps: two short chains of roundings
// instead of one as long as the row (rows reach 10^5 elements and more).
template <typename A>
struct Sum {
  static constexpr int kInner = 32;
  Vec<A> outer = Vec<A>(A(0)), inner = Vec<A>(A(0));
  A s = A(0);
  int n = 0;
  void add(const Vec2<A>& x) {
    inner = inner + (x[0] + x[1]);
    if (++n == kInner) {
      outer = outer + inner;
      inner = Vec<A>(A(0));
      n = 0;
    }
  }
  void add(const Vec<A>& x) { outer = outer + x; }
  void add(A x) { s += x; }
  A total() const {
    return at::vec::vec_reduce_all<A>([](Vec<A>& a, Vec<A>& b) { return a + b; }, outer + inner) +
           s;
  }
};

// exp of V: Vec2<A> lane by lane, or A. exp_u20 (inlined, where exp calls out to Sleef: within 2
// ulp, 5 ulp for results near the smallest normal, and those below it flush to 0) is for
// arguments known to be in [-inf, 0]; exp_u20_nan also for arguments expected there that may be
// NaN (exp_u20 alone turns NaN into inf; +inf and overflow give inf either way); exp for any
// argument.
template <typename V, typename F>
inline V lanes(const V& v, const F& f) {
  if constexpr (std::is_arithmetic_v<V>) {
    __at_align__ V out[Vec<V>::size()];
    f(Vec<V>(v)).store(out);
    return out[0];
  } else {
    V r;
    r[0] = f(v[0]);
    r[1] = f(v[1]);
    return r;
  }
}
template <typename V>
inline V exp(const V& v) {
  return lanes(v, [](const auto& x) { return x.exp(); });
}
template <typename V>
inline V exp_u20(const V& v) {
  return lanes(v, [](const auto& x) { return x.exp_u20(); });
}
template <typename V>
inline V exp_u20_nan(const V& v) {
  return lanes(v, [](const auto& x) {
    using X = std::decay_t<decltype(x)>;
    return X::blendv(x.exp_u20(), x, x.isnan());
  });
}

// A maximum fed by vector and scalar steps; NaN propagates (at::vec::maximum does, and so does
// the scalar step).
template <typename A>
struct Max {
  Vec<A> v = Vec<A>(-std::numeric_limits<A>::infinity());
  A s = -std::numeric_limits<A>::infinity();
  void add(const Vec2<A>& x) { v = at::vec::maximum(v, at::vec::maximum(x[0], x[1])); }
  void add(A x) { s = (x > s || std::isnan(x)) ? x : s; }
  A total() const {
    const A m =
        at::vec::vec_reduce_all<A>([](Vec<A>& a, Vec<A>& b) { return at::vec::maximum(a, b); }, v);
    return (m > s || std::isnan(m)) ? m : s;
  }
};

// Where a row's acc_t copy is: the tensor's own memory when T is acc_t, else `buf`.
template <typename T>
const acc_t<T>* acc_row(const T* row, const std::vector<acc_t<T>>& buf) {
  if constexpr (std::is_same_v<T, acc_t<T>>) {
    return row;
  } else {
    return buf.data();
  }
}

// A row as acc_t: the tensor's own memory when T is acc_t, else a widened copy in `buf`.
template <typename T>
const acc_t<T>* widen(const T* row, int64_t cols, std::vector<acc_t<T>>& buf) {
  if constexpr (!std::is_same_v<T, acc_t<T>>) at::vec::convert(row, buf.data(), cols);
  return acc_row(row, buf);
}

// Where to write a row in acc_t; narrow() copies it out when that was a buffer.
template <typename T>
acc_t<T>* out_row(T* row, std::vector<acc_t<T>>& buf) {
  if constexpr (std::is_same_v<T, acc_t<T>>) {
    return row;
  } else {
    return buf.data();
  }
}

template <typename T>
void narrow(const acc_t<T>* src, T* row, int64_t cols) {
  if constexpr (!std::is_same_v<T, acc_t<T>>) {
    at::vec::convert(src, row, cols);  // round-to-nearest-even, SIMD where at::vec has it
  }
}

// A row in Vec2 steps: f(i, FullStep{}) for each whole step, then the tail: one partial step,
// f(i, PartStep{n}), where n >= kMinPartLanes lanes are left, else a ScalarStep per element.
// With ld_step / st_step below, lanes past the row load a fill value and aren't stored. For
// passes that take an exp per element: a scalar step costs a whole vector's exp (lanes() above).
// 2 threads, 262144 rows of 21, ms, scalar tails -> a partial step (torch): fp32 softmax forward
// 17.8 -> 9.2 (4.5), log_softmax backward 16.4 -> 4.6 (2.2); bf16 19.4 -> 10.4 (14.8) and 17.5 ->
// 5.5 (16.9). A partial step's masked loads and stores cost about as much as 4-5 scalar steps
// (rows of 100 and 197 read alike either way). Whole steps compile as for_each_vec's.
struct FullStep {};
struct PartStep {
  int64_t n;
};
struct ScalarStep {};
constexpr int64_t kMinPartLanes = 8;
template <typename A, typename F>
inline void for_each_step(int64_t cols, const F& f) {
  constexpr int64_t kStep = Vec2<A>::size();
  int64_t i = 0;
  for (; i + kStep <= cols; i += kStep) f(i, FullStep{});
  if (cols - i >= kMinPartLanes) return f(i, PartStep{cols - i});
  for (; i < cols; ++i) f(i, ScalarStep{});
}

// A step's lanes from p (a Vec2, or one value for a ScalarStep), widened to acc_t for
// fp16/bf16; in a partial step, the lanes past the row are `fill`, a value neutral to the step's
// math.
template <typename S>
inline Vec2<acc_t<S>> ld_step(const S* p, FullStep, acc_t<S>) {
  return ld<Vec2<acc_t<S>>>(p);
}
template <typename S>
inline acc_t<S> ld_step(const S* p, ScalarStep, acc_t<S>) {
  return ld<acc_t<S>>(p);
}
template <typename S>
inline Vec2<acc_t<S>> ld_step(const S* p, PartStep step, acc_t<S> fill) {
  using A = acc_t<S>;
  using V = Vec<A>;
  const int64_t n = step.n;
  Vec2<A> v;
  if constexpr (std::is_same_v<S, A>) {
    for (int k = 0; k < 2; ++k) {
      const int64_t c = std::clamp<int64_t>(n - k * V::size(), 0, V::size());
      v[k] = V::set(V(fill), V::loadu(p + k * V::size(), c), c);
    }
  } else {
    auto [lo, hi] = at::vec::convert_to_float<S>(at::vec::Vectorized<S>::loadu(p, n));
    v[0] = V::set(V(fill), lo, std::min<int64_t>(n, V::size()));
    v[1] = V::set(V(fill), hi, std::max<int64_t>(n - V::size(), 0));
  }
  return v;
}

// A step's lanes into p (only those inside the row for a partial step), narrowed
// (round-to-nearest-even) for fp16/bf16.
template <typename S>
inline void st_step(S* p, const Vec2<acc_t<S>>& v, FullStep) {
  st(p, v);
}
template <typename S>
inline void st_step(S* p, acc_t<S> v, ScalarStep) {
  st(p, v);
}
template <typename S>
inline void st_step(S* p, const Vec2<acc_t<S>>& v, PartStep step) {
  using A = acc_t<S>;
  using V = Vec<A>;
  if constexpr (std::is_same_v<S, A>) {
    v[0].store(p, static_cast<int>(std::min<int64_t>(step.n, V::size())));
    if (step.n > V::size()) v[1].store(p + V::size(), static_cast<int>(step.n - V::size()));
  } else {
    at::vec::convert_from_float<S>(v[0], v[1]).store(p, static_cast<int>(step.n));
  }
}

}  // namespace cpu
}  // namespace fusedops
