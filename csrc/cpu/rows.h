// Row helpers shared by the CPU kernels: rows split across threads, and fp16/bf16 rows widened to
// fp32 (fp64 stays fp64) in a per-thread buffer, computed on with at::vec, and narrowed back once.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>
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

// A row as acc_t: the tensor's own memory when T is acc_t, else a widened copy in `buf`.
template <typename T>
const acc_t<T>* widen(const T* row, int64_t cols, std::vector<acc_t<T>>& buf) {
  if constexpr (std::is_same_v<T, acc_t<T>>) {
    return row;
  } else {
    at::vec::convert(row, buf.data(), cols);
    return buf.data();
  }
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

}  // namespace cpu
}  // namespace fusedops
