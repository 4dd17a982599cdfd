// Answers of driver queries (attributes, occupancy), asked once per device and key: a launch
// planner that needs them pays arithmetic only after the first call. Host code of the CUDA
// kernel files (no torch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

namespace fusedops {

// Keyed by (device, kernel or other owner, then two ints the answer depends on).
struct QueryCache {
  std::mutex mutex;
  std::map<std::tuple<int, const void*, int, int>, int> values;
};

inline QueryCache& query_cache() {
  static QueryCache cache;
  return cache;
}

// query(device) on the first call for this key on the current device, the stored answer after.
// Thread-safe: threads that miss together both query (outside the lock) and agree.
template <typename F>
int query_once(const void* owner, int a, int b, F&& query) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) cudaGetLastError();
  const std::tuple<int, const void*, int, int> key{device, owner, a, b};
  QueryCache& cache = query_cache();
  {
    const std::lock_guard<std::mutex> lock(cache.mutex);
    const auto it = cache.values.find(key);
    if (it != cache.values.end()) return it->second;
  }
  const int value = query(device);
  const std::lock_guard<std::mutex> lock(cache.mutex);
  return cache.values.emplace(key, value).first->second;
}

// Opts `kernel` into all the dynamic shared memory a block may have beside its static shared
// memory, once per device, and returns that amount (0 when the opt-in failed). Opting into each
// plan's own size instead would let a later, smaller plan undo an earlier, larger one's opt-in.
template <typename Kernel>
int opt_in_smem(Kernel kernel, int max_smem_optin) {
  return query_once(reinterpret_cast<const void*>(kernel), -1, 0, [&](int) {
    cudaFuncAttributes attr{};
    int most = 0;
    if (cudaFuncGetAttributes(&attr, kernel) == cudaSuccess) {
      most = max_smem_optin - static_cast<int>(attr.sharedSizeBytes);
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most) !=
          cudaSuccess) {
        most = 0;
      }
    }
    cudaGetLastError();  // a failed query leaves no error behind
    return most;
  });
}

// Peak DRAM bandwidth of the current device in GB/s: memory clock x bus width, two transfers
// per clock (an H200 reports 3201 MHz x 6016 bits: 4814; an H100 SXM's 2619 MHz x 5120 bits make
// 3352; 0 when the query failed).
inline int dram_gbps() {
  return query_once(nullptr, 1, 0, [](int device) {
    int khz = 0, bits = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return static_cast<int>(int64_t(khz) * bits / 4000000);
  });
}

// Registers per thread of `kernel` as compiled for the current device (0 when the query failed).
template <typename Kernel>
int registers_per_thread(Kernel kernel) {
  return query_once(reinterpret_cast<const void*>(kernel), -2, 0, [&](int) {
    cudaFuncAttributes attr{};
    const int regs = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess ? attr.numRegs : 0;
    cudaGetLastError();  // a failed query leaves no error behind
    return regs;
  });
}

}  // namespace fusedops
