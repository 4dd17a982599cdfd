// Argument checks shared by every backend. Each error names the op, the argument and the value.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <optional>
#include <string>

namespace fusedops {

// Integers and shapes for error messages, formatted by std::to_string rather than std::ostream's
// number formatting, which crashes (SIGSEGV) inside extensions built by Ubuntu 24.04's g++ 13.3
// against torch 2.11's wheel: there a bad argument would kill the process instead of raising.
inline std::string to_text(int64_t v) { return std::to_string(v); }
inline std::string to_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}
inline std::string to_text(at::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// dim wrapped into [0, ndim); a 0-dim tensor counts as one dimension, as in torch.
inline int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim) {
  const int64_t n = ndim > 0 ? ndim : 1;
  TORCH_CHECK_INDEX(dim >= -n && dim < n, "fusedops.", op, ": dim=", to_text(dim),
                    " is out of range for a tensor with ", to_text(ndim),
                    " dimension(s) (expected [", to_text(-n), ", ", to_text(n - 1), "])");
  return dim < 0 ? dim + n : dim;
}

inline void check_floating(const char* op, const char* arg, const at::Tensor& t) {
  const auto s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble,
                   "fusedops.", op, ": ", arg,
                   " must be float32, float16, bfloat16 or float64, got ", s);
}

// `t` must match `ref` in shape, dtype and device (e.g. a gradient and the output it belongs to).
inline void check_like(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                       const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), "fusedops.", op, ": ", arg, " is on ", t.device(),
              " but ", ref_arg, " is on ", ref.device());
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), "fusedops.", op, ": ", arg, " has dtype ",
                   t.scalar_type(), " but ", ref_arg, " has dtype ", ref.scalar_type());
  TORCH_CHECK_VALUE(t.sizes() == ref.sizes(), "fusedops.", op, ": ", arg, " has shape ",
                    to_text(t.sizes()), " but ", ref_arg, " has shape ", to_text(ref.sizes()));
}

// An optional tensor made contiguous, or an undefined tensor when absent.
inline at::Tensor contiguous_or_undefined(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->contiguous() : at::Tensor();
}

// Data pointers for kernels, null for an undefined tensor. P may be a type torch doesn't know
// (__half, __nv_bfloat16): the caller has matched it to the tensor's dtype.
template <typename P>
const P* ptr_or_null(const at::Tensor& t) {
  return t.defined() ? static_cast<const P*>(t.const_data_ptr()) : nullptr;
}
template <typename P>
P* mut_ptr_or_null(at::Tensor& t) {
  return t.defined() ? static_cast<P*>(t.mutable_data_ptr()) : nullptr;
}

// Contiguous rows with `dim` last: a copy only when `dim` isn't already the contiguous last dim.
inline at::Tensor to_rows(const at::Tensor& t, int64_t dim) {
  if (t.dim() == 0) return t.reshape({1});
  return (dim == t.dim() - 1 ? t : t.movedim(dim, -1)).contiguous();
}

// Inverse of to_rows: `rows` back in `like`'s shape, contiguous like torch's own output.
inline at::Tensor from_rows(const at::Tensor& rows, int64_t dim, const at::Tensor& like) {
  if (like.dim() == 0) return rows.reshape({});
  return dim == like.dim() - 1 ? rows : rows.movedim(-1, dim).contiguous();
}

}  // namespace fusedops
