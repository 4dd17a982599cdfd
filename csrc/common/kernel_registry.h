// The launch configurations of fusedops' CUDA kernels, for the resource report (python -m
// fusedops.tools.kernels). Every launch site calls record_launch(); while recording is off that
// is one relaxed atomic load, so the hot path stays as it was. The report turns recording on,
// runs the ops, and reads back each (kernel, block, dynamic shared memory, cluster) seen, then
// queries the runtime for its registers and occupancy. Torch-free: kernel files include it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace fusedops {

struct KernelLaunch {
  const void* func;  // the kernel's host stub, as the CUDA runtime API takes it
  int threads;       // per block
  size_t smem;       // dynamic shared memory per block, bytes
  int ranks;         // blocks per cluster (1: no cluster)
  bool operator<(const KernelLaunch& o) const {
    return std::tie(func, threads, smem, ranks) < std::tie(o.func, o.threads, o.smem, o.ranks);
  }
};

namespace kernel_registry {

inline std::atomic<bool> recording{false};

// Launch config -> number of launches recorded. Guarded by mutex().
inline std::map<KernelLaunch, int64_t>& launches() {
  static std::map<KernelLaunch, int64_t> seen;
  return seen;
}

inline std::mutex& mutex() {
  static std::mutex m;
  return m;
}

// Starts (clearing what was recorded) or stops recording.
inline void set_recording(bool on) {
  std::lock_guard<std::mutex> lock(mutex());
  if (on) launches().clear();
  recording.store(on, std::memory_order_relaxed);
}

inline std::vector<std::pair<KernelLaunch, int64_t>> snapshot() {
  std::lock_guard<std::mutex> lock(mutex());
  return {launches().begin(), launches().end()};
}

// One line per recorded launch configuration of the kernels on `device`, after a "device" line:
// tab-separated key=value fields (fusedops.tools.kernels parses them). In cuda/kernel_report.cpp.
std::string cuda_kernel_report(int64_t device);

}  // namespace kernel_registry

template <typename... Params>
inline void record_launch(void (*kernel)(Params...), int threads, size_t smem = 0, int ranks = 1) {
  if (!kernel_registry::recording.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(kernel_registry::mutex());
  ++kernel_registry::launches()[{reinterpret_cast<const void*>(kernel), threads, smem, ranks}];
}

}  // namespace fusedops
