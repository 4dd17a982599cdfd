// The Metal side shared by the MPS backends (csrc/mps/*.mm): the kernel library, compiled at first
// use from the MSL sources embedded at build time, pipelines cached by kernel name, and one launch
// helper that encodes a kernel on torch's current MPS stream.
#pragma once

#include <ATen/core/Tensor.h>
#import <Metal/Metal.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "metal/kernels/params.h"

namespace fusedops::mps {

// A kernel's pipeline state and the threads per threadgroup it allows (a multiple of 32).
struct Kernel {
  id<MTLComputePipelineState> pipeline;
  uint32_t max_threads;
};

// The kernel `name` ("<op>_<fwd|bwd>_<tier>_<type>", metal/kernels/*.metal), compiled once.
const Kernel& kernel(const std::string& name);

// The MSL name of t's dtype, the suffix of the kernel names: "float", "half" or "bfloat".
// Throws for other dtypes (MPS has no float64), naming `op`.
const char* metal_type(const char* op, const at::Tensor& t);

// Rows and columns index the kernels as 32-bit values.
void check_fits_u32(const char* op, int64_t rows, int64_t cols);

// Encodes `k` over `groups` threadgroups of `threads` threads on torch's current MPS stream:
// `buffers` at [[buffer(0)]], [[buffer(1)]], ... (inputs then outputs, each at its storage
// offset), the params struct right after them, and the threadgroup scratch at [[threadgroup(0)]].
void launch(const Kernel& k, std::initializer_list<at::Tensor> buffers, const void* params,
            size_t params_size, uint32_t groups, uint32_t threads);

template <typename P>
void launch(const Kernel& k, std::initializer_list<at::Tensor> buffers, const P& params,
            uint32_t groups, uint32_t threads) {
  launch(k, buffers, &params, sizeof(P), groups, threads);
}

// softmax and the norms: the `row` tier (`<prefix>_row_<type>`, the row in registers) when a row
// fits one threadgroup's registers, else `looped`; with the threads per threadgroup to launch.
struct RowPlan {
  const Kernel* kernel;
  uint32_t threads;
};
RowPlan row_plan(const std::string& prefix, const char* type, int64_t cols);

// out [cols] fp32 = column sums of fp32 partials [chunks, cols] (colsum.metal), in chunk order.
at::Tensor colsum(const at::Tensor& partials);

}  // namespace fusedops::mps
