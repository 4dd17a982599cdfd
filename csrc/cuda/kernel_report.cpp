// The resource report behind python -m fusedops.tools.kernels: for every launch configuration
// recorded (common/kernel_registry.h), the kernel's registers, static/local memory and limits
// from cudaFuncGetAttributes, and its resident blocks per SM from the occupancy API.
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>
#include <cxxabi.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/kernel_registry.h"
#include "common/launch.h"

namespace fusedops::kernel_registry {
namespace {

void check(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "fusedops::cuda_kernel_report: ", what,
              " failed: ", cudaGetErrorString(err));
}

// The demangled kernel name; the mangled one where demangling fails, the address where the
// runtime has no name query (before CUDA 12.3).
std::string kernel_name(const void* func) {
#if CUDART_VERSION >= 12030
  const char* mangled = nullptr;
  check(cudaFuncGetName(&mangled, func), "cudaFuncGetName");
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  const std::string name = status == 0 ? demangled : mangled;
  std::free(demangled);
  return name;
#else
  return std::to_string(reinterpret_cast<std::uintptr_t>(func));
#endif
}

int device_attribute(cudaDeviceAttr attr, int device) {
  int value = 0;
  check(cudaDeviceGetAttribute(&value, attr, device), "cudaDeviceGetAttribute");
  return value;
}

}  // namespace

// Text built with std::to_string, not std::ostream: ostream's integer formatting crashes inside
// extensions built by g++ 13.3 against torch 2.11's wheel (see common/checks.h).
std::string cuda_kernel_report(int64_t device) {
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const int dev = static_cast<int>(device);
  auto attribute = [dev](cudaDeviceAttr attr) {
    return std::to_string(device_attribute(attr, dev));
  };
  std::string out =
      "device\tcc=" + attribute(cudaDevAttrComputeCapabilityMajor) + "." +
      attribute(cudaDevAttrComputeCapabilityMinor) +
      "\tsm_count=" + attribute(cudaDevAttrMultiProcessorCount) +
      "\tregs_per_sm=" + attribute(cudaDevAttrMaxRegistersPerMultiprocessor) +
      "\tsmem_per_sm=" + attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor) +
      "\tthreads_per_sm=" + attribute(cudaDevAttrMaxThreadsPerMultiProcessor) +
      "\tblocks_per_sm=" + attribute(cudaDevAttrMaxBlocksPerMultiprocessor) +
      "\treserved_smem_per_block=" + attribute(cudaDevAttrReservedSharedMemoryPerBlock) + "\n";
  using std::to_string;
  for (const auto& [launch, calls] : snapshot()) {
    cudaFuncAttributes attr;
    check(cudaFuncGetAttributes(&attr, launch.func), "cudaFuncGetAttributes");
    int blocks = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, launch.func, launch.threads,
                                                        launch.smem),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    out += "kernel\tname=" + kernel_name(launch.func) + "\tthreads=" + to_string(launch.threads) +
           "\tdynamic_smem=" + to_string(launch.smem) + "\tcluster=" + to_string(launch.ranks) +
           "\tcalls=" + to_string(calls) + "\tregs=" + to_string(attr.numRegs) +
           "\tstatic_smem=" + to_string(attr.sharedSizeBytes) +
           "\tlocal_bytes=" + to_string(attr.localSizeBytes) +
           "\tmax_threads=" + to_string(attr.maxThreadsPerBlock) +
           "\tmax_dynamic_smem=" + to_string(attr.maxDynamicSharedSizeBytes) +
           "\tactive_blocks_per_sm=" + to_string(blocks);
    if (launch.ranks > 1) {  // clusters also need their blocks co-resident on one GPC
      cudaLaunchAttribute cluster;
      const cudaLaunchConfig_t config = launch_config(
          {launch.ranks, launch.threads, launch.smem, launch.ranks}, nullptr, &cluster);
      int clusters = 0;
      check(cudaOccupancyMaxActiveClusters(&clusters, launch.func, &config),
            "cudaOccupancyMaxActiveClusters");
      out += "\tactive_clusters=" + to_string(clusters);
    }
    out += "\n";
  }
  return out;
}

}  // namespace fusedops::kernel_registry
