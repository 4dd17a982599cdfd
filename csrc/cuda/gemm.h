// A cuBLASLt GEMM other CUDA ops share with fused_mlp's (defined in mlp.cpp, beside the
// heuristic, tuning and workspace handling it runs through).
#pragma once

#include <ATen/core/Tensor.h>

namespace fusedops {

// d (fp32, contiguous [M, N]) = op(a) @ op(b), op(m) = t ? m.T : m, for fp16/bf16 a and b, each
// contiguous or the .t() view of a contiguous matrix: cuBLASLt accumulating and writing fp32;
// where cuBLASLt can't take the operands (rows not 16-byte multiples), ATen's product in a's dtype,
// widened.
void mm_f32_out(at::Tensor& d, const at::Tensor& a, bool a_t, const at::Tensor& b, bool b_t);

}  // namespace fusedops
