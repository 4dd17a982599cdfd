// What a CUDA launcher needs to know about the current device, filled in by the host code
// (which may include torch) and passed to kernel files (which don't).
#pragma once

namespace fusedops {

struct DeviceInfo {
  int sm_count;        // multiprocessors
  int cc_major;        // compute capability
  int max_smem_optin;  // bytes of shared memory a block may opt into
  int smem_per_sm;     // bytes of shared memory per multiprocessor
  bool has_clusters() const { return cc_major >= 9; }
};

}  // namespace fusedops
