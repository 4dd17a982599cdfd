// gelu(input + bias) over contiguous rows [rows, cols], forward and backward, fp32 math for every
// dtype (GELU from common.h). Threadgroup t covers a block of tg_size columns over the
// rows_per_chunk rows of one chunk (BiasGeluParams); each thread walks one column down the rows,
// so a SIMD group reads consecutive elements and the bias is loaded once per thread.
#include "common.h"

template <typename T>
kernel void bias_gelu_fwd_rows(device const T* x [[buffer(0)]],  // [rows, cols]
                               device const T* b [[buffer(1)]],  // [cols] if p.has_bias
                               device T* y [[buffer(2)]],        // [rows, cols]
                               constant BiasGeluParams& p [[buffer(3)]],
                               threadgroup float* scratch [[threadgroup(0)]],  // unused
                               uint tg [[threadgroup_position_in_grid]],
                               uint tid [[thread_position_in_threadgroup]],
                               uint tg_size [[threads_per_threadgroup]],
                               uint lane [[thread_index_in_simdgroup]],
                               uint simd [[simdgroup_index_in_threadgroup]]) {
  const uint c = (tg % p.col_blocks) * tg_size + tid;
  if (c >= p.cols) return;  // no barriers here
  const uint row0 = (tg / p.col_blocks) * p.rows_per_chunk;
  const uint row_end = min(p.rows, row0 + p.rows_per_chunk);
  const float bias = p.has_bias != 0 ? float(b[c]) : 0.0f;
  for (uint row = row0; row < row_end; ++row) {
    const ulong i = ulong(row) * p.cols + c;
    y[i] = T(gelu(float(x[i]) + bias, p.approx));
  }
}

// dx = dy * gelu'(x + b); dbias_part[chunk][c] = sum of dx over the chunk's rows (when
// p.want_dbias; colsum_bwd_partials then sums the chunks).
template <typename T>
kernel void bias_gelu_bwd_rows(device const T* dy [[buffer(0)]],        // [rows, cols]
                               device const T* x [[buffer(1)]],         // [rows, cols]
                               device const T* b [[buffer(2)]],         // [cols] if p.has_bias
                               device T* dx [[buffer(3)]],              // [rows, cols]
                               device float* dbias_part [[buffer(4)]],  // [chunks, cols]
                               constant BiasGeluParams& p [[buffer(5)]],
                               threadgroup float* scratch [[threadgroup(0)]],  // unused
                               uint tg [[threadgroup_position_in_grid]],
                               uint tid [[thread_position_in_threadgroup]],
                               uint tg_size [[threads_per_threadgroup]],
                               uint lane [[thread_index_in_simdgroup]],
                               uint simd [[simdgroup_index_in_threadgroup]]) {
  const uint c = (tg % p.col_blocks) * tg_size + tid;
  if (c >= p.cols) return;  // no barriers here
  const uint chunk = tg / p.col_blocks;
  const uint row0 = chunk * p.rows_per_chunk;
  const uint row_end = min(p.rows, row0 + p.rows_per_chunk);
  const float bias = p.has_bias != 0 ? float(b[c]) : 0.0f;
  float db = 0.0f;
  for (uint row = row0; row < row_end; ++row) {
    const ulong i = ulong(row) * p.cols + c;
    const float g = float(dy[i]) * gelu_grad(float(x[i]) + bias, p.approx);
    dx[i] = T(g);
    db += g;
  }
  if (p.want_dbias != 0) dbias_part[ulong(chunk) * p.cols + c] = db;
}

FUSEDOPS_INSTANTIATE("bias_gelu_fwd_rows_float", bias_gelu_fwd_rows<float>)
FUSEDOPS_INSTANTIATE("bias_gelu_fwd_rows_half", bias_gelu_fwd_rows<half>)
FUSEDOPS_INSTANTIATE("bias_gelu_bwd_rows_float", bias_gelu_bwd_rows<float>)
FUSEDOPS_INSTANTIATE("bias_gelu_bwd_rows_half", bias_gelu_bwd_rows<half>)
#if __METAL_VERSION__ >= 310
FUSEDOPS_INSTANTIATE("bias_gelu_fwd_rows_bfloat", bias_gelu_fwd_rows<bfloat>)
FUSEDOPS_INSTANTIATE("bias_gelu_bwd_rows_bfloat", bias_gelu_bwd_rows<bfloat>)
#endif
