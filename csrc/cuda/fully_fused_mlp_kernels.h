// Launchers for the fully fused small-width MLP (fully_fused_mlp_kernels.cu): the whole network
// in one kernel per direction, activations in registers, weights in shared memory, tensor-core
// MMA (sm_80+). Torch-free: raw device pointers, row-major contiguous matrices, the caller's
// stream. T is __half or __nv_bfloat16; accumulation is fp32.
//
// The network: h_0 = x [rows, in]; h_{l+1} = act(h_l @ W_l^T + b_l) for l < hidden_layers, each
// [rows, hidden]; y = out_act(h_L @ W_L^T + b_L) [rows, out]. W_l is nn.Linear's [out_l, in_l].
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/device_info.h"
#include "common/math.h"

namespace fusedops {

constexpr int kFfmMaxMatrices = 17;   // hidden_layers <= 16
constexpr int kFfmMaxFeatures = 128;  // in, hidden (a multiple of 16) and out

struct FfmShape {
  int64_t rows;
  int in, hidden, out;
  int matrices;  // hidden_layers + 1
  MlpActivation act, out_act;
  bool has_bias;
};

template <typename T>
struct FfmForward {
  FfmShape s;
  const T* x;                   // [rows, in]
  const T* w[kFfmMaxMatrices];  // [out_l, in_l]
  const T* b[kFfmMaxMatrices];  // [out_l], when s.has_bias
  T* y;                         // [rows, out]
  // Saved for the backward, one per hidden layer (else null): hidden_pre [hidden_layers, rows,
  // hidden] when act is a GELU (its derivative needs the input; the backward recomputes the
  // output), else hidden_act, the outputs, same shape.
  T* hidden_act;
  T* hidden_pre;
  T* out_pre;  // [rows, out], saved when out_act is not none
};

template <typename T>
struct FfmBackward {
  FfmShape s;
  const T* grad_out;  // [rows, out]
  const T* w[kFfmMaxMatrices];
  const T* hidden_act;  // as saved by the forward when act is not a GELU, else null
  const T* hidden_pre;  // as saved when act is a GELU, else null
  // Elements from one hidden layer's save to the next: the forward's rows * hidden, also where a
  // launch covers only some of those rows (FfmBackwardPlan::chunk_rows).
  int64_t saved_layer_stride;
  const T* out_pre;  // as saved, or null when out_act is none
  const T* x;        // [rows, in]: read where the kernel sums the weight gradients
  // The gradients of the pre-activations the host's weight GEMMs read, written where the kernel
  // does not sum the weight gradients itself (else null), for this launch's s.rows rows:
  T* grad_out_pre;     // [rows, out] when out_act is not none (else grad_out is it)
  T* grad_hidden_pre;  // [hidden_layers, rows, hidden]
  T* hidden_out;       // the GELU hidden layers' outputs, same shape, recomputed
  T* grad_x;           // [rows, in]
  // Per-warp column sums of every layer's pre-activation gradient (the bias gradients), fp32
  // [warps, matrices, ffm_width(s)] (FfmBackwardPlan::bias_partial floats) where the network has
  // biases and the plan does not say weight_grads, else null: sum over warps. A launch zeroes its
  // warps' sums first, or with bias_partial_adds (the later chunks of one backward) adds to them.
  float* bias_partial;
  bool bias_partial_adds;
  // Each block's sums of every parameter gradient, fp32 [blocks, sum of out_l * (in_l + has_bias)]
  // (per matrix its weight row-major, then its bias; FfmBackwardPlan::weight_partial floats) where
  // the plan says weight_grads, else null: sum over blocks.
  float* weight_partial;
};

// How the backward runs a shape on this device. Where the kernel sums the weight gradients, one
// launch over every row. Else the host runs one launch per chunk_rows rows (the last may have
// fewer), each followed by the weight GEMMs over what it wrote, so that the pre-activation
// gradients and GELU outputs of a chunk, not of the batch, are live at once.
struct FfmBackwardPlan {
  bool weight_grads;       // the kernel sums the weight and bias gradients (up to width 64)
  int64_t chunk_rows;      // rows per launch
  int64_t bias_partial;    // floats of FfmBackward::bias_partial (0 where weight_grads)
  int64_t weight_partial;  // floats of FfmBackward::weight_partial (0 unless weight_grads)
};

// Whether the kernels serve this shape on this device: sm_80+, and the weights of every layer fit
// in one block's shared memory beside its staging tiles. The host runs the composed path if not.
bool ffm_supported(const FfmShape& s, const DeviceInfo& dev);

// The kernels' padded width: 16, 32, 64 or 128, whichever first holds every layer's features.
int ffm_width(const FfmShape& s);

template <typename T>
FfmBackwardPlan ffm_backward_plan(const FfmShape& s, const DeviceInfo& dev);

// The forward; writes each save whose pointer is not null.
template <typename T>
cudaError_t ffm_forward_cuda(const FfmForward<T>& p, const DeviceInfo& dev, cudaStream_t stream);

// Where ffm_sum_partials writes: segment i is columns [col[i], col[i] + n[i]) of the partials, to
// dst[i] (n[i] elements): each weight and bias gradient.
template <typename T>
struct FfmSumSegments {
  static constexpr int kMax = 2 * kFfmMaxMatrices;
  int count;
  int col[kMax], n[kMax];
  T* dst[kMax];
};

// The column sums of partial ([rows, cols] fp32, the backward's per-block or per-warp sums), each
// added row by row in order (deterministic; no rows: zeros), rounded to T into the segments.
template <typename T>
cudaError_t ffm_sum_partials(const float* partial, int64_t rows, int64_t cols,
                             const FfmSumSegments<T>& seg, cudaStream_t stream);

// The backward: grad_x, and either each block's weight- and bias-gradient sums (plan.weight_grads)
// or every layer's pre-activation gradient for the host's weight GEMMs and the per-warp
// bias-gradient sums, which ffm_sum_partials then adds in a fixed order.
template <typename T>
cudaError_t ffm_backward_cuda(const FfmBackward<T>& p, const DeviceInfo& dev, cudaStream_t stream);

}  // namespace fusedops
