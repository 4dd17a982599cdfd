// The second, deterministic step of every weight/bias gradient: column sums of per-threadgroup
// fp32 partials, added in a fixed order (norms.metal, bias_gelu.metal write the partials).
#include "common.h"

// out[c] = part[0][c] + part[1][c] + ... + part[chunks - 1][c]; one thread per column. Not a
// template: the partials are always fp32 (the host casts the sums to the parameter dtype).
kernel void colsum_bwd_partials_float(device const float* part [[buffer(0)]],  // [chunks, cols]
                                      device float* out [[buffer(1)]],         // [cols]
                                      constant ColsumParams& p [[buffer(2)]],
                                      threadgroup float* scratch [[threadgroup(0)]],  // unused
                                      uint tg [[threadgroup_position_in_grid]],
                                      uint tid [[thread_position_in_threadgroup]],
                                      uint tg_size [[threads_per_threadgroup]],
                                      uint lane [[thread_index_in_simdgroup]],
                                      uint simd [[simdgroup_index_in_threadgroup]]) {
  const ulong c = ulong(tg) * tg_size + tid;
  if (c >= p.cols) return;  // no barriers here
  float s = 0.0f;
  for (uint k = 0; k < p.chunks; ++k) s += part[ulong(k) * p.cols + c];
  out[c] = s;
}
