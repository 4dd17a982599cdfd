// Parameters of the planted-bug kernels: plain 32-bit fields, shared by MSL and C++ (as in
// metal/kernels/params.h).
#pragma once
#ifdef __METAL_VERSION__
#include <metal_stdlib>
#else
#include <stdint.h>
#endif

struct RowSumParams {
  uint32_t rows;
  uint32_t cols;
};
