// Host side shared by the CPU ops (torch included).
#pragma once

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>

namespace fusedops {

// at::empty_like for a dense `t` (its sizes and strides), straight from the CPU allocator as
// torch's own CPU kernels allocate their outputs: at::empty_like takes two trips through the
// dispatcher, a measurable part of a tiny call's host cost.
inline at::Tensor cpu_empty_like(const at::Tensor& t) {
  return at::detail::empty_strided_cpu(t.sizes(), t.strides(), t.options());
}

}  // namespace fusedops
