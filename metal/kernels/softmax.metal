// softmax and log_softmax over contiguous rows [rows, cols], forward and backward, one threadgroup
// per row, fp32 math for every dtype.
//   row:    the row in registers (kMetalRowValues per thread): one read of x, one write of y.
//   looped: any length: an online max/sum pass, then an output pass (two reads of x).
// A row of all -inf gives NaN, as in torch (exp(-inf - -inf)); NaN anywhere in a row makes the
// row NaN through its sum.
#include "common.h"

// y = exp(x - max) / sum(exp(x - max)), or log_softmax: x - max - log(sum).
template <typename T>
kernel void softmax_fwd_row(device const T* x [[buffer(0)]],  // [rows, cols]
                            device T* y [[buffer(1)]],        // [rows, cols]
                            constant SoftmaxParams& p [[buffer(2)]],
                            threadgroup float* scratch [[threadgroup(0)]],
                            uint tg [[threadgroup_position_in_grid]],
                            uint tid [[thread_position_in_threadgroup]],
                            uint tg_size [[threads_per_threadgroup]],
                            uint lane [[thread_index_in_simdgroup]],
                            uint simd [[simdgroup_index_in_threadgroup]]) {
  const ulong base = ulong(tg) * p.cols;
  float v[kMetalRowValues];
  float m = -INFINITY;
  for (uint k = 0; k < kMetalRowValues; ++k) {
    const uint c = tid + k * tg_size;
    v[k] = c < p.cols ? float(x[base + c]) : -INFINITY;
    m = max(m, v[k]);
  }
  m = tg_max(m, scratch, tg_size, lane, simd);
  float s = 0.0f;
  for (uint k = 0; k < kMetalRowValues; ++k) {
    if (tid + k * tg_size < p.cols) {
      v[k] -= m;
      const float e = exp(v[k]);
      s += e;
      if (p.log == 0) v[k] = e;  // log_softmax keeps x - max
    }
  }
  s = tg_sum(s, scratch, tg_size, lane, simd);
  const float log_s = log(s);
  for (uint k = 0; k < kMetalRowValues; ++k) {
    const uint c = tid + k * tg_size;
    if (c < p.cols) y[base + c] = T(p.log != 0 ? v[k] - log_s : v[k] / s);
  }
}

template <typename T>
kernel void softmax_fwd_looped(device const T* x [[buffer(0)]],  // [rows, cols]
                               device T* y [[buffer(1)]],        // [rows, cols]
                               constant SoftmaxParams& p [[buffer(2)]],
                               threadgroup float* scratch [[threadgroup(0)]],
                               uint tg [[threadgroup_position_in_grid]],
                               uint tid [[thread_position_in_threadgroup]],
                               uint tg_size [[threads_per_threadgroup]],
                               uint lane [[thread_index_in_simdgroup]],
                               uint simd [[simdgroup_index_in_threadgroup]]) {
  const ulong base = ulong(tg) * p.cols;
  // Online: s is the sum of exp(x - m) over this thread's elements so far, one exp per element.
  // -inf elements add exactly 0 and are skipped (else -inf - -inf would make NaN of a row that
  // has finite values); a NaN element takes the else branch and makes s NaN.
  float m = -INFINITY, s = 0.0f;
  for (uint c = tid; c < p.cols; c += tg_size) {
    const float xv = float(x[base + c]);
    if (xv == -INFINITY) continue;
    if (xv > m) {
      s = s * exp(m - xv) + 1.0f;  // a new max: rescale what was summed against the old one
      m = xv;
    } else {
      s += exp(xv - m);
    }
  }
  const float row_m = tg_max(m, scratch, tg_size, lane, simd);
  // A thread that saw no finite element holds s = 0 (and m = -inf, where exp(m - row_m) may be
  // NaN); a NaN s stays NaN.
  s = s == 0.0f ? 0.0f : s * exp(m - row_m);
  const float row_s = tg_sum(s, scratch, tg_size, lane, simd);
  const float log_s = log(row_s);
  for (uint c = tid; c < p.cols; c += tg_size) {
    const float d = float(x[base + c]) - row_m;
    y[base + c] = T(p.log != 0 ? d - log_s : exp(d) / row_s);
  }
}

// softmax: dx = y * (dy - sum(dy * y)); log_softmax: dx = dy - exp(y) * sum(dy).
template <typename T>
kernel void softmax_bwd_row(device const T* dy [[buffer(0)]],  // [rows, cols]
                            device const T* y [[buffer(1)]],   // [rows, cols]
                            device T* dx [[buffer(2)]],        // [rows, cols]
                            constant SoftmaxParams& p [[buffer(3)]],
                            threadgroup float* scratch [[threadgroup(0)]],
                            uint tg [[threadgroup_position_in_grid]],
                            uint tid [[thread_position_in_threadgroup]],
                            uint tg_size [[threads_per_threadgroup]],
                            uint lane [[thread_index_in_simdgroup]],
                            uint simd [[simdgroup_index_in_threadgroup]]) {
  const ulong base = ulong(tg) * p.cols;
  float g[kMetalRowValues], o[kMetalRowValues];
  float s = 0.0f;
  for (uint k = 0; k < kMetalRowValues; ++k) {
    const uint c = tid + k * tg_size;
    g[k] = c < p.cols ? float(dy[base + c]) : 0.0f;
    o[k] = c < p.cols ? float(y[base + c]) : 0.0f;
    s += p.log != 0 ? g[k] : g[k] * o[k];
  }
  s = tg_sum(s, scratch, tg_size, lane, simd);
  for (uint k = 0; k < kMetalRowValues; ++k) {
    const uint c = tid + k * tg_size;
    if (c < p.cols) dx[base + c] = T(p.log != 0 ? g[k] - exp(o[k]) * s : o[k] * (g[k] - s));
  }
}

template <typename T>
kernel void softmax_bwd_looped(device const T* dy [[buffer(0)]],  // [rows, cols]
                               device const T* y [[buffer(1)]],   // [rows, cols]
                               device T* dx [[buffer(2)]],        // [rows, cols]
                               constant SoftmaxParams& p [[buffer(3)]],
                               threadgroup float* scratch [[threadgroup(0)]],
                               uint tg [[threadgroup_position_in_grid]],
                               uint tid [[thread_position_in_threadgroup]],
                               uint tg_size [[threads_per_threadgroup]],
                               uint lane [[thread_index_in_simdgroup]],
                               uint simd [[simdgroup_index_in_threadgroup]]) {
  const ulong base = ulong(tg) * p.cols;
  float s = 0.0f;
  for (uint c = tid; c < p.cols; c += tg_size) {
    const float g = float(dy[base + c]);
    s += p.log != 0 ? g : g * float(y[base + c]);
  }
  s = tg_sum(s, scratch, tg_size, lane, simd);
  for (uint c = tid; c < p.cols; c += tg_size) {
    const float g = float(dy[base + c]), o = float(y[base + c]);
    dx[base + c] = T(p.log != 0 ? g - exp(o) * s : o * (g - s));
  }
}

FUSEDOPS_INSTANTIATE("softmax_fwd_row_float", softmax_fwd_row<float>)
FUSEDOPS_INSTANTIATE("softmax_fwd_row_half", softmax_fwd_row<half>)
FUSEDOPS_INSTANTIATE("softmax_fwd_looped_float", softmax_fwd_looped<float>)
FUSEDOPS_INSTANTIATE("softmax_fwd_looped_half", softmax_fwd_looped<half>)
FUSEDOPS_INSTANTIATE("softmax_bwd_row_float", softmax_bwd_row<float>)
FUSEDOPS_INSTANTIATE("softmax_bwd_row_half", softmax_bwd_row<half>)
FUSEDOPS_INSTANTIATE("softmax_bwd_looped_float", softmax_bwd_looped<float>)
FUSEDOPS_INSTANTIATE("softmax_bwd_looped_half", softmax_bwd_looped<half>)
#if __METAL_VERSION__ >= 310
FUSEDOPS_INSTANTIATE("softmax_fwd_row_bfloat", softmax_fwd_row<bfloat>)
FUSEDOPS_INSTANTIATE("softmax_fwd_looped_bfloat", softmax_fwd_looped<bfloat>)
FUSEDOPS_INSTANTIATE("softmax_bwd_row_bfloat", softmax_bwd_row<bfloat>)
FUSEDOPS_INSTANTIATE("softmax_bwd_looped_bfloat", softmax_bwd_looped<bfloat>)
#endif
