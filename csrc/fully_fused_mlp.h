// The host contract of fully_fused_mlp, shared by its backends: argument checks, the saved-tensor
// shapes, and the composed path (ATen GEMMs and activations), which is the whole implementation
// off CUDA and the CUDA fallback for what the fused kernels don't serve.
//
// Network: h_0 = x [..., in]; h_{l+1} = act(h_l @ W_l^T + b_l), l < hidden_layers, each
// [..., hidden]; y = out_act(h_L @ W_L^T + b_L) [..., out]; W_l is nn.Linear's [out_l, in_l].
// Saved for the backward, one tensor per hidden layer: hidden_pre [hidden_layers, rows, hidden]
// (every pre-activation) when act is a GELU, whose output the backward recomputes from it, else
// hidden_act, same shape (every h_{l+1}: ReLU's derivative reads its sign); out_pre [rows, out]
// only when out_act is not none. Absent saves are empty [0] tensors.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <tuple>
#include <vector>

#include "common/math.h"

namespace fusedops {

struct FfmProblem {
  int64_t rows;  // product of x's leading sizes
  int64_t in, hidden, out;
  int64_t hidden_layers;
  MlpActivation act, out_act;
  bool has_bias;
};

using FfmFwdOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using FfmBwdOutputs = std::tuple<at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>>;

FfmProblem check_ffm(const char* op, const at::Tensor& x, at::TensorList weights,
                     at::TensorList biases, c10::string_view activation,
                     c10::string_view output_activation);

// The saves the forward returns when save_for_backward (else empty [0] tensors).
std::tuple<at::Tensor, at::Tensor, at::Tensor> ffm_empty_saves(const FfmProblem& p,
                                                               const at::Tensor& x, bool save);

FfmFwdOutputs ffm_fwd_composed(const FfmProblem& p, const at::Tensor& x, at::TensorList weights,
                               at::TensorList biases, bool save_for_backward);

// Every hidden layer's output [hidden_layers, rows, hidden] from the saves: hidden_act, or the
// GELU of hidden_pre.
at::Tensor ffm_hidden_outputs(const FfmProblem& p, const at::Tensor& hidden_act,
                              const at::Tensor& hidden_pre);

// Weight and bias gradients of every matrix (ATen GEMMs and sums: deterministic), as the op
// returns them, from the hidden layers' outputs (ffm_hidden_outputs) and the pre-activation
// gradients: grad_hidden_pre [hidden_layers, rows, hidden], grad_out_pre [rows, out].
std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> ffm_param_grads(
    const FfmProblem& p, const at::Tensor& x, const at::Tensor& hidden_out,
    const at::Tensor& grad_hidden_pre, const at::Tensor& grad_out_pre);

FfmBwdOutputs ffm_bwd_composed(const FfmProblem& p, const at::Tensor& grad_out, const at::Tensor& x,
                               at::TensorList weights, const at::Tensor& hidden_act,
                               const at::Tensor& hidden_pre, const at::Tensor& out_pre);

// The backward op's arguments checked (x, the weights, grad_out and the saves against one
// another); has_bias: whether the forward had biases (their gradients are wanted).
FfmProblem check_ffm_bwd(const at::Tensor& grad_out, const at::Tensor& x, at::TensorList weights,
                         const at::Tensor& hidden_act, const at::Tensor& hidden_pre,
                         const at::Tensor& out_pre, c10::string_view activation,
                         c10::string_view output_activation, bool has_bias);

}  // namespace fusedops
