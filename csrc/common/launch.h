// Host side of the CUDA kernel files (no torch): launch sizes, and launches with an optional
// cluster dimension, each recorded for the kernel report (kernel_registry.h).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "common/device_info.h"
#include "common/kernel_registry.h"
#include "common/query_cache.h"

namespace fusedops {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks per cluster that every sm_90+ GPU runs; larger clusters need the kernel's opt-in.
constexpr int kPortableClusterRanks = 8;

// A launch of `blocks` blocks (a multiple of ranks), in clusters of `ranks` when ranks > 1.
struct LaunchShape {
  int64_t blocks;
  int threads;
  size_t smem;  // dynamic shared memory per block
  int ranks;
};

// `attr` must outlive the config.
inline cudaLaunchConfig_t launch_config(const LaunchShape& l, cudaStream_t stream,
                                        cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(l.blocks));
  config.blockDim = dim3(static_cast<unsigned>(l.threads));
  config.dynamicSmemBytes = l.smem;
  config.stream = stream;
  if (l.ranks > 1) {
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = static_cast<unsigned>(l.ranks);
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    config.attrs = attr;
    config.numAttrs = 1;
  }
  return config;
}

// Blocks (l.ranks == 1), or clusters of l.ranks blocks, of `kernel` at l's threads and dynamic
// shared memory that the device holds at once; 0 where they can't run (more shared memory than
// the kernel can opt into, a cluster the device refuses). Opts the kernel into its shared memory
// and, past kPortableClusterRanks, into larger clusters first. A failed query of plain blocks
// counts one per SM (their launch reports any error). Asked of the driver once per device,
// kernel and shape.
template <typename Kernel>
int resident(Kernel kernel, const LaunchShape& l, const DeviceInfo& dev) {
  if (l.smem > size_t(opt_in_smem(kernel, dev.max_smem_optin))) return 0;
  const int smem = static_cast<int>(l.smem), threads_ranks = l.threads * 32 + l.ranks;
  return query_once(reinterpret_cast<const void*>(kernel), smem, threads_ranks, [&](int) {
    int fit = 0;
    if (l.ranks == 1) {
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, l.threads, l.smem) !=
          cudaSuccess) {
        fit = 1;
      }
      fit *= dev.sm_count;
    } else if (l.ranks <= kPortableClusterRanks ||
               cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
                   cudaSuccess) {
      cudaLaunchAttribute attr;
      const cudaLaunchConfig_t config =
          launch_config({l.ranks, l.threads, l.smem, l.ranks}, nullptr, &attr);
      if (cudaOccupancyMaxActiveClusters(&fit, kernel, &config) != cudaSuccess) fit = 0;
    }
    cudaGetLastError();  // a failed query leaves no error behind
    return std::max(fit, 0);
  });
}

// Launches with the runtime's error, also cleared (a failed launch leaves none behind for later
// calls). On sm_90+ the kernel may be launched before the one ahead of it in the stream has
// finished (programmatic dependent launch): every kernel launched here must call
// sm90::grid_dependency_wait() before it touches global memory.
template <typename... Params, typename... Args>
cudaError_t launch_with(cudaLaunchConfig_t config, const DeviceInfo& dev, void (*kernel)(Params...),
                        Args&&... args) {
  cudaLaunchAttribute attrs[2];
  for (unsigned i = 0; i < config.numAttrs; ++i) attrs[i] = config.attrs[i];
  if (dev.cc_major >= 9) {
    attrs[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[config.numAttrs].val.programmaticStreamSerializationAllowed = 1;
    ++config.numAttrs;
  }
  config.attrs = attrs;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  const cudaError_t last = cudaGetLastError();
  return err != cudaSuccess ? err : last;
}

template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), const LaunchShape& l, const DeviceInfo& dev,
                   cudaStream_t stream, Args&&... args) {
  record_launch(kernel, l.threads, l.smem, l.ranks);
  cudaLaunchAttribute cluster;
  return launch_with(launch_config(l, stream, &cluster), dev, kernel, std::forward<Args>(args)...);
}

// A 2-D grid or block, no clusters.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, const DeviceInfo& dev,
                   cudaStream_t stream, Args&&... args) {
  record_launch(kernel, int(block.x * block.y * block.z));
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = stream;
  return launch_with(config, dev, kernel, std::forward<Args>(args)...);
}

}  // namespace fusedops
