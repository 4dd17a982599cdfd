// Parameter structs of the Metal kernels, shared by the MSL sources (metal/kernels/*.metal) and
// the host (csrc/mps/*.mm): plain structs of 32-bit fields, so both sides agree on the layout.
// Each kernel takes its struct as `constant <Op>Params& p` after its device buffers.
#pragma once

#ifdef __METAL_VERSION__
#include <metal_stdlib>
#else
#include <stdint.h>
#endif

// Values a thread keeps in registers in the `row` tier: a row of up to
// kMetalRowValues * (threads per threadgroup) elements is read from memory once.
enum : uint32_t { kMetalRowValues = 8 };

// Threadgroups are at most 1024 threads, whole SIMD groups of 32: the threadgroup scratch holds
// one float per SIMD group.
enum : uint32_t { kMetalMaxSimdGroups = 32 };

// softmax / log_softmax over contiguous rows [rows, cols]; one threadgroup per row.
struct SoftmaxParams {
  uint32_t rows;
  uint32_t cols;
  uint32_t log;  // 1: log_softmax
};

// layer_norm / rms_norm over contiguous rows [rows, cols]. Forward: one threadgroup per row.
// Backward: `chunks` threadgroups, threadgroup g takes rows [rows*g/chunks, rows*(g+1)/chunks) and
// writes its weight/bias gradient partials to row g of [chunks, cols] buffers.
struct NormParams {
  uint32_t rows;
  uint32_t cols;
  float eps;            // forward only
  uint32_t has_weight;  // weight/bias are fp32 [cols], bound only when present
  uint32_t has_bias;
  uint32_t want_dx;  // backward only: which gradients to write
  uint32_t want_dw;
  uint32_t want_db;
  uint32_t chunks;  // backward only
};

// gelu(input + bias) over contiguous rows [rows, cols], bias [cols] in input's dtype. Threadgroup
// t covers columns [(t % col_blocks) * tg_size, +tg_size) of the rows_per_chunk rows of chunk
// t / col_blocks; the backward writes each chunk's bias gradient to row `chunk` of [chunks, cols].
struct BiasGeluParams {
  uint32_t rows;
  uint32_t cols;
  uint32_t approx;    // 0: erf, 1: tanh
  uint32_t has_bias;  // 0: gelu(input) (fused_mlp, whose bias is already in the GEMM)
  uint32_t want_dbias;
  uint32_t rows_per_chunk;
  uint32_t col_blocks;
};

// out[c] = sum over k = 0, 1, ..., chunks-1 of part[k][c], in that order (deterministic).
struct ColsumParams {
  uint32_t chunks;
  uint32_t cols;
};
