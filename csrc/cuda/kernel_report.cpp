// The resource report behind python -m fusedops.tools.kernels: for every launch configuration
// recorded (common/kernel_registry.h), the kernel's registers, static/local memory and limits
// from cudaFuncGetAttributes, and its resident blocks per SM from the occupancy API.
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>
#include <cxxabi.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include "common/kernel_registry.h"

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
  std::ostringstream out;
  out << func;
  return out.str();
#endif
}

int device_attribute(cudaDeviceAttr attr, int device) {
  int value = 0;
  check(cudaDeviceGetAttribute(&value, attr, device), "cudaDeviceGetAttribute");
  return value;
}

}  // namespace

std::string cuda_kernel_report(int64_t device) {
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const int dev = static_cast<int>(device);
  std::ostringstream out;
  out << "device\tcc=" << device_attribute(cudaDevAttrComputeCapabilityMajor, dev) << "."
      << device_attribute(cudaDevAttrComputeCapabilityMinor, dev)
      << "\tsm_count=" << device_attribute(cudaDevAttrMultiProcessorCount, dev)
      << "\tregs_per_sm=" << device_attribute(cudaDevAttrMaxRegistersPerMultiprocessor, dev)
      << "\tsmem_per_sm=" << device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev)
      << "\tthreads_per_sm=" << device_attribute(cudaDevAttrMaxThreadsPerMultiProcessor, dev)
      << "\tblocks_per_sm=" << device_attribute(cudaDevAttrMaxBlocksPerMultiprocessor, dev)
      << "\treserved_smem_per_block="
      << device_attribute(cudaDevAttrReservedSharedMemoryPerBlock, dev) << "\n";
  for (const auto& [launch, calls] : snapshot()) {
    cudaFuncAttributes attr;
    check(cudaFuncGetAttributes(&attr, launch.func), "cudaFuncGetAttributes");
    int blocks = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, launch.func, launch.threads,
                                                        launch.smem),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    out << "kernel\tname=" << kernel_name(launch.func) << "\tthreads=" << launch.threads
        << "\tdynamic_smem=" << launch.smem << "\tcluster=" << launch.ranks << "\tcalls=" << calls
        << "\tregs=" << attr.numRegs << "\tstatic_smem=" << attr.sharedSizeBytes
        << "\tlocal_bytes=" << attr.localSizeBytes << "\tmax_threads=" << attr.maxThreadsPerBlock
        << "\tmax_dynamic_smem=" << attr.maxDynamicSharedSizeBytes
        << "\tactive_blocks_per_sm=" << blocks;
    if (launch.ranks > 1) {  // clusters also need their blocks co-resident on one GPC
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(static_cast<unsigned>(launch.ranks));
      config.blockDim = dim3(static_cast<unsigned>(launch.threads));
      config.dynamicSmemBytes = launch.smem;
      cudaLaunchAttribute cluster;
      cluster.id = cudaLaunchAttributeClusterDimension;
      cluster.val.clusterDim.x = static_cast<unsigned>(launch.ranks);
      cluster.val.clusterDim.y = 1;
      cluster.val.clusterDim.z = 1;
      config.attrs = &cluster;
      config.numAttrs = 1;
      int clusters = 0;
      check(cudaOccupancyMaxActiveClusters(&clusters, launch.func, &config),
            "cudaOccupancyMaxActiveClusters");
      out << "\tactive_clusters=" << clusters;
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace fusedops::kernel_registry
