// layer_norm and rms_norm (kRms) over contiguous rows [rows, cols], forward and backward, fp32
// math for every dtype; weight and bias are fp32 [cols] (the host widens them), statistics fp32.
//   row:    the row in registers (kMetalRowValues per thread): one read of x (and of dy).
//   looped: any length: the row is read again for each pass.
// The backward writes weight/bias gradients as per-threadgroup partials [chunks, cols], summed in
// chunk order by colsum_bwd_partials (colsum.metal): bitwise reproducible, no atomics.
#include "common.h"

// y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(mean((x - mean)^2) + eps); rms_norm: mean = 0.
// One threadgroup per row. rms_norm binds rstd at mean's slot and never writes it there.
template <typename T, bool kRms>
kernel void norm_fwd_row(device const T* x [[buffer(0)]],      // [rows, cols]
                         device const float* w [[buffer(1)]],  // [cols] if p.has_weight
                         device const float* b [[buffer(2)]],  // [cols] if p.has_bias
                         device T* y [[buffer(3)]],            // [rows, cols]
                         device float* mean [[buffer(4)]],     // [rows], layer_norm only
                         device float* rstd [[buffer(5)]],     // [rows]
                         constant NormParams& p [[buffer(6)]],
                         threadgroup float* scratch [[threadgroup(0)]],
                         uint tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_position_in_threadgroup]],
                         uint tg_size [[threads_per_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]],
                         uint simd [[simdgroup_index_in_threadgroup]]) {
  const ulong base = ulong(tg) * p.cols;
  float v[kMetalRowValues];
  float s = 0.0f;
  for (uint k = 0; k < kMetalRowValues; ++k) {
    const uint c = tid + k * tg_size;
    v[k] = c < p.cols ? float(x[base + c]) : 0.0f;
    s += v[k];
  }
  const float mu = kRms ? 0.0f : tg_sum(s, scratch, tg_size, lane, simd) / float(p.cols);
  // Second pass over the registers for sum((x - mean)^2): no cancellation.
  float q = 0.0f;
  for (uint k = 0; k < kMetalRowValues; ++k) {
    const float d = tid + k * tg_size < p.cols ? v[k] - mu : 0.0f;
    q += d * d;
  }
  const float rs = rsqrt(tg_sum(q, scratch, tg_size, lane, simd) / float(p.cols) + p.eps);
  for (uint k = 0; k < kMetalRowValues; ++k) {
    const uint c = tid + k * tg_size;
    if (c >= p.cols) continue;
    float o = (v[k] - mu) * rs;
    if (p.has_weight != 0) o *= w[c];
    if (p.has_bias != 0) o += b[c];
    y[base + c] = T(o);
  }
  if (tid == 0) {
    if (!kRms) mean[tg] = mu;
    rstd[tg] = rs;
  }
}

template <typename T, bool kRms>
kernel void norm_fwd_looped(device const T* x [[buffer(0)]],      // [rows, cols]
                            device const float* w [[buffer(1)]],  // [cols] if p.has_weight
                            device const float* b [[buffer(2)]],  // [cols] if p.has_bias
                            device T* y [[buffer(3)]],            // [rows, cols]
                            device float* mean [[buffer(4)]],     // [rows], layer_norm only
                            device float* rstd [[buffer(5)]],     // [rows]
                            constant NormParams& p [[buffer(6)]],
                            threadgroup float* scratch [[threadgroup(0)]],
                            uint tg [[threadgroup_position_in_grid]],
                            uint tid [[thread_position_in_threadgroup]],
                            uint tg_size [[threads_per_threadgroup]],
                            uint lane [[thread_index_in_simdgroup]],
                            uint simd [[simdgroup_index_in_threadgroup]]) {
  const ulong base = ulong(tg) * p.cols;
  float mu = 0.0f;
  if (!kRms) {
    float s = 0.0f;
    for (uint c = tid; c < p.cols; c += tg_size) s += float(x[base + c]);
    mu = tg_sum(s, scratch, tg_size, lane, simd) / float(p.cols);
  }
  float q = 0.0f;
  for (uint c = tid; c < p.cols; c += tg_size) {
    const float d = float(x[base + c]) - mu;
    q += d * d;
  }
  const float rs = rsqrt(tg_sum(q, scratch, tg_size, lane, simd) / float(p.cols) + p.eps);
  for (uint c = tid; c < p.cols; c += tg_size) {
    float o = (float(x[base + c]) - mu) * rs;
    if (p.has_weight != 0) o *= w[c];
    if (p.has_bias != 0) o += b[c];
    y[base + c] = T(o);
  }
  if (tid == 0) {
    if (!kRms) mean[tg] = mu;
    rstd[tg] = rs;
  }
}

// With xh = (x - mean) * rstd and g = dy * w (w = 1 when absent):
//   dx = rstd * (g - mean(g) - xh * mean(g * xh))   (rms_norm: no mean(g) term)
//   dw_part[tg][c] = sum of dy * xh,  db_part[tg][c] = sum of dy   over this threadgroup's rows.
// Buffers of gradients not wanted (p.want_*) may be any buffer: they are not written.
template <typename T, bool kRms>
kernel void norm_bwd_row(device const T* dy [[buffer(0)]],        // [rows, cols]
                         device const T* x [[buffer(1)]],         // [rows, cols]
                         device const float* mean [[buffer(2)]],  // [rows], layer_norm only
                         device const float* rstd [[buffer(3)]],  // [rows]
                         device const float* w [[buffer(4)]],     // [cols] if p.has_weight
                         device T* dx [[buffer(5)]],              // [rows, cols]
                         device float* dw_part [[buffer(6)]],     // [chunks, cols]
                         device float* db_part [[buffer(7)]],     // [chunks, cols]
                         constant NormParams& p [[buffer(8)]],
                         threadgroup float* scratch [[threadgroup(0)]],
                         uint tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_position_in_threadgroup]],
                         uint tg_size [[threads_per_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]],
                         uint simd [[simdgroup_index_in_threadgroup]]) {
  float wv[kMetalRowValues], dw_acc[kMetalRowValues], db_acc[kMetalRowValues];
  for (uint k = 0; k < kMetalRowValues; ++k) {
    const uint c = tid + k * tg_size;
    wv[k] = p.has_weight != 0 && c < p.cols ? w[c] : 1.0f;
    dw_acc[k] = 0.0f;
    db_acc[k] = 0.0f;
  }
  const uint row_end = uint(ulong(p.rows) * (tg + 1) / p.chunks);
  for (uint row = uint(ulong(p.rows) * tg / p.chunks); row < row_end; ++row) {
    const ulong base = ulong(row) * p.cols;
    const float mu = kRms ? 0.0f : mean[row];
    const float rs = rstd[row];
    float xh[kMetalRowValues], g[kMetalRowValues];
    float sg = 0.0f, sgx = 0.0f;
    for (uint k = 0; k < kMetalRowValues; ++k) {
      const uint c = tid + k * tg_size;
      const bool in = c < p.cols;
      const float d = in ? float(dy[base + c]) : 0.0f;
      xh[k] = in ? (float(x[base + c]) - mu) * rs : 0.0f;
      g[k] = d * wv[k];
      sg += g[k];
      sgx += g[k] * xh[k];
      dw_acc[k] += d * xh[k];
      db_acc[k] += d;
    }
    if (p.want_dx == 0) continue;  // uniform: every thread skips the reductions alike
    const float c1 = kRms ? 0.0f : tg_sum(sg, scratch, tg_size, lane, simd) / float(p.cols);
    const float c2 = tg_sum(sgx, scratch, tg_size, lane, simd) / float(p.cols);
    for (uint k = 0; k < kMetalRowValues; ++k) {
      const uint c = tid + k * tg_size;
      if (c < p.cols) dx[base + c] = T(rs * (g[k] - c1 - xh[k] * c2));
    }
  }
  const ulong part = ulong(tg) * p.cols;
  for (uint k = 0; k < kMetalRowValues; ++k) {
    const uint c = tid + k * tg_size;
    if (c >= p.cols) continue;
    if (p.want_dw != 0) dw_part[part + c] = dw_acc[k];
    if (p.want_db != 0) db_part[part + c] = db_acc[k];
  }
}

// As norm_bwd_row for rows of any length, in two passes over the threadgroup's rows: dx row by
// row (two reads of the row), then the weight/bias partials one block of tg_size columns at a
// time, each thread walking its column down the rows and summing in registers (one more read;
// no read-modify-write of the partials in device memory).
template <typename T, bool kRms>
kernel void norm_bwd_looped(device const T* dy [[buffer(0)]],        // [rows, cols]
                            device const T* x [[buffer(1)]],         // [rows, cols]
                            device const float* mean [[buffer(2)]],  // [rows], layer_norm only
                            device const float* rstd [[buffer(3)]],  // [rows]
                            device const float* w [[buffer(4)]],     // [cols] if p.has_weight
                            device T* dx [[buffer(5)]],              // [rows, cols]
                            device float* dw_part [[buffer(6)]],     // [chunks, cols]
                            device float* db_part [[buffer(7)]],     // [chunks, cols]
                            constant NormParams& p [[buffer(8)]],
                            threadgroup float* scratch [[threadgroup(0)]],
                            uint tg [[threadgroup_position_in_grid]],
                            uint tid [[thread_position_in_threadgroup]],
                            uint tg_size [[threads_per_threadgroup]],
                            uint lane [[thread_index_in_simdgroup]],
                            uint simd [[simdgroup_index_in_threadgroup]]) {
  const uint row_begin = uint(ulong(p.rows) * tg / p.chunks);
  const uint row_end = uint(ulong(p.rows) * (tg + 1) / p.chunks);
  for (uint row = row_begin; row < row_end && p.want_dx != 0; ++row) {
    const ulong base = ulong(row) * p.cols;
    const float mu = kRms ? 0.0f : mean[row];
    const float rs = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (uint c = tid; c < p.cols; c += tg_size) {
      const float d = float(dy[base + c]);
      const float g = p.has_weight != 0 ? d * w[c] : d;
      sg += g;
      sgx += g * ((float(x[base + c]) - mu) * rs);  // xh exactly as the dx pass rounds it
    }
    const float c1 = kRms ? 0.0f : tg_sum(sg, scratch, tg_size, lane, simd) / float(p.cols);
    const float c2 = tg_sum(sgx, scratch, tg_size, lane, simd) / float(p.cols);
    for (uint c = tid; c < p.cols; c += tg_size) {
      const float xh = (float(x[base + c]) - mu) * rs;
      const float d = float(dy[base + c]);
      const float g = p.has_weight != 0 ? d * w[c] : d;
      dx[base + c] = T(rs * (g - c1 - xh * c2));
    }
  }
  if (p.want_dw == 0 && p.want_db == 0) return;  // after the last barrier
  const ulong part = ulong(tg) * p.cols;
  for (uint c = tid; c < p.cols; c += tg_size) {
    float dw_acc = 0.0f, db_acc = 0.0f;
    for (uint row = row_begin; row < row_end; ++row) {
      const ulong i = ulong(row) * p.cols + c;
      const float d = float(dy[i]);
      dw_acc += d * ((float(x[i]) - (kRms ? 0.0f : mean[row])) * rstd[row]);  // dy * xh
      db_acc += d;
    }
    if (p.want_dw != 0) dw_part[part + c] = dw_acc;
    if (p.want_db != 0) db_part[part + c] = db_acc;
  }
}

FUSEDOPS_INSTANTIATE("layer_norm_fwd_row_float", norm_fwd_row<float, false>)
FUSEDOPS_INSTANTIATE("layer_norm_fwd_looped_float", norm_fwd_looped<float, false>)
FUSEDOPS_INSTANTIATE("layer_norm_bwd_row_float", norm_bwd_row<float, false>)
FUSEDOPS_INSTANTIATE("layer_norm_bwd_looped_float", norm_bwd_looped<float, false>)
FUSEDOPS_INSTANTIATE("rms_norm_fwd_row_float", norm_fwd_row<float, true>)
FUSEDOPS_INSTANTIATE("rms_norm_fwd_looped_float", norm_fwd_looped<float, true>)
FUSEDOPS_INSTANTIATE("rms_norm_bwd_row_float", norm_bwd_row<float, true>)
FUSEDOPS_INSTANTIATE("rms_norm_bwd_looped_float", norm_bwd_looped<float, true>)
FUSEDOPS_INSTANTIATE("layer_norm_fwd_row_half", norm_fwd_row<half, false>)
FUSEDOPS_INSTANTIATE("layer_norm_fwd_looped_half", norm_fwd_looped<half, false>)
FUSEDOPS_INSTANTIATE("layer_norm_bwd_row_half", norm_bwd_row<half, false>)
FUSEDOPS_INSTANTIATE("layer_norm_bwd_looped_half", norm_bwd_looped<half, false>)
FUSEDOPS_INSTANTIATE("rms_norm_fwd_row_half", norm_fwd_row<half, true>)
FUSEDOPS_INSTANTIATE("rms_norm_fwd_looped_half", norm_fwd_looped<half, true>)
FUSEDOPS_INSTANTIATE("rms_norm_bwd_row_half", norm_bwd_row<half, true>)
FUSEDOPS_INSTANTIATE("rms_norm_bwd_looped_half", norm_bwd_looped<half, true>)
#if __METAL_VERSION__ >= 310
FUSEDOPS_INSTANTIATE("layer_norm_fwd_row_bfloat", norm_fwd_row<bfloat, false>)
FUSEDOPS_INSTANTIATE("layer_norm_fwd_looped_bfloat", norm_fwd_looped<bfloat, false>)
FUSEDOPS_INSTANTIATE("layer_norm_bwd_row_bfloat", norm_bwd_row<bfloat, false>)
FUSEDOPS_INSTANTIATE("layer_norm_bwd_looped_bfloat", norm_bwd_looped<bfloat, false>)
FUSEDOPS_INSTANTIATE("rms_norm_fwd_row_bfloat", norm_fwd_row<bfloat, true>)
FUSEDOPS_INSTANTIATE("rms_norm_fwd_looped_bfloat", norm_fwd_looped<bfloat, true>)
FUSEDOPS_INSTANTIATE("rms_norm_bwd_row_bfloat", norm_bwd_row<bfloat, true>)
FUSEDOPS_INSTANTIATE("rms_norm_bwd_looped_bfloat", norm_bwd_looped<bfloat, true>)
#endif
