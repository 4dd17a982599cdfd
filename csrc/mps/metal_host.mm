// The kernel library, the pipeline cache and the launch helper of the MPS backends.
#include "mps/metal_host.h"

#include <ATen/mps/MPSDevice.h>
#include <ATen/mps/MPSStream.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/checks.h"
#include "fusedops_metal_source.h"  // kMetalSource: metal/kernels, concatenated by setup.py

namespace fusedops::mps {
namespace {

constexpr NSUInteger kScratchBytes = kMetalMaxSimdGroups * sizeof(float);

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

id<MTLDevice> device() { return at::mps::MPSDevice::getInstance()->device(); }

// Compiled once per process (a few hundred ms), at the first fusedops call on MPS.
id<MTLLibrary> library() {
  static id<MTLLibrary> lib = [] {
    MTLCompileOptions* options = [[MTLCompileOptions alloc] init];
    // No fast math: it assumes finite values, and softmax's -inf masking relies on IEEE exp/max.
#if defined(__MAC_15_0) && __MAC_OS_X_VERSION_MAX_ALLOWED >= __MAC_15_0
    if (@available(macOS 15.0, *)) {
      options.mathMode = MTLMathModeSafe;
      options.mathFloatingPointFunctions = MTLMathFloatingPointFunctionsPrecise;
    } else {
      options.fastMathEnabled = NO;
    }
#else
    options.fastMathEnabled = NO;
#endif
    NSError* error = nil;
    id<MTLLibrary> compiled =
        [device() newLibraryWithSource:[NSString stringWithUTF8String:kMetalSource]
                               options:options
                                 error:&error];
    TORCH_CHECK(compiled != nil, "fusedops: compiling the Metal kernels failed: ",
                error != nil ? error.localizedDescription.UTF8String : "no error message");
    return compiled;
  }();
  return lib;
}

}  // namespace

const Kernel& kernel(const std::string& name) {
  static std::mutex mutex;
  static std::unordered_map<std::string, Kernel> cache;  // nodes: references stay valid
  const std::lock_guard<std::mutex> lock(mutex);
  const auto hit = cache.find(name);
  if (hit != cache.end()) return hit->second;
  id<MTLFunction> fn = [library() newFunctionWithName:[NSString stringWithUTF8String:name.c_str()]];
  TORCH_CHECK(fn != nil, "fusedops: no Metal kernel '", name,
              "' (bfloat16 kernels need macOS 14 or newer)");
  NSError* error = nil;
  id<MTLComputePipelineState> pipeline = [device() newComputePipelineStateWithFunction:fn
                                                                                 error:&error];
  TORCH_CHECK(pipeline != nil, "fusedops: building the Metal pipeline '", name, "' failed: ",
              error != nil ? error.localizedDescription.UTF8String : "no error message");
  const auto limit = static_cast<uint32_t>(
      std::min<NSUInteger>(32 * kMetalMaxSimdGroups, pipeline.maxTotalThreadsPerThreadgroup));
  return cache.emplace(name, Kernel{pipeline, limit / 32 * 32}).first->second;
}

const char* metal_type(const char* op, const at::Tensor& t) {
  const at::ScalarType s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kHalf || s == at::kBFloat16, "fusedops.", op, ": ",
                   s, " is not supported on MPS (use float32, float16 or bfloat16)");
  return s == at::kFloat ? "float" : s == at::kHalf ? "half" : "bfloat";
}

void check_fits_u32(const char* op, int64_t rows, int64_t cols) {
  constexpr int64_t kMax = UINT32_MAX;
  TORCH_CHECK_VALUE(rows <= kMax && cols <= kMax, "fusedops.", op, ": ", to_text(rows), " rows of ",
                    to_text(cols), " elements: the Metal kernels take at most 2^32 - 1 of each");
}

void launch(const Kernel& k, std::initializer_list<at::Tensor> buffers, const void* params,
            size_t params_size, uint32_t groups, uint32_t threads) {
  std::vector<id<MTLBuffer>> bufs;
  std::vector<NSUInteger> offsets;
  for (const at::Tensor& t : buffers) {
    TORCH_INTERNAL_ASSERT(t.defined() && t.is_mps());
    // An MPS tensor's storage is an MTLBuffer; the tensor starts storage_offset elements in.
    bufs.push_back((__bridge id<MTLBuffer>)const_cast<void*>(t.storage().data()));
    offsets.push_back(static_cast<NSUInteger>(t.storage_offset() * t.element_size()));
  }
  id<MTLComputePipelineState> pipeline = k.pipeline;
  at::mps::MPSStream* stream = at::mps::getCurrentMPSStream();
  // torch's stream owns the command buffer and its encoder: take the shared encoder on the
  // stream's queue, never create, end or commit one here.
  dispatch_sync(stream->queue(), ^{
    id<MTLComputeCommandEncoder> enc = stream->commandEncoder();
    [enc setComputePipelineState:pipeline];
    for (NSUInteger i = 0; i < bufs.size(); ++i) {
      [enc setBuffer:bufs[i] offset:offsets[i] atIndex:i];
    }
    [enc setBytes:params length:params_size atIndex:bufs.size()];
    [enc setThreadgroupMemoryLength:kScratchBytes atIndex:0];
    [enc dispatchThreadgroups:MTLSizeMake(groups, 1, 1)
        threadsPerThreadgroup:MTLSizeMake(threads, 1, 1)];
  });
}

RowPlan row_plan(const std::string& prefix, const char* type, int64_t cols) {
  const Kernel& row = kernel(prefix + "_row_" + type);
  if (cols <= int64_t{kMetalRowValues} * row.max_threads) {
    const int64_t threads = ceil_div(ceil_div(cols, kMetalRowValues), 32) * 32;
    return {&row, static_cast<uint32_t>(std::max<int64_t>(threads, 32))};
  }
  const Kernel& looped = kernel(prefix + "_looped_" + type);
  return {&looped, looped.max_threads};
}

at::Tensor colsum(const at::Tensor& partials) {
  const int64_t chunks = partials.size(0), cols = partials.size(1);
  at::Tensor out = at::empty({cols}, partials.options());
  const Kernel& k = kernel("colsum_bwd_partials_float");
  const uint32_t threads = std::min<uint32_t>(256, k.max_threads);
  launch(k, {partials, out},
         ColsumParams{static_cast<uint32_t>(chunks), static_cast<uint32_t>(cols)},
         static_cast<uint32_t>(ceil_div(cols, threads)), threads);
  return out;
}

}  // namespace fusedops::mps
