// Host-side pieces of fused_mlp shared by the backends: argument checks, shapes, and the
// composed path (ATen GEMMs + the backend's bias_gelu row kernels) that is the whole CPU
// implementation and the CUDA fallback for what cuBLASLt's epilogues can't take.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <array>
#include <tuple>
#include <vector>

#include "bias_gelu.h"
#include "common/checks.h"

namespace fusedops {

struct MlpProblem {
  int64_t rows;    // product of x's leading sizes
  int64_t in;      // x.size(-1) == w1.size(1)
  int64_t hidden;  // w1.size(0) == w2.size(1)
  int64_t out;     // w2.size(0)
  GeluApprox approx;
};

inline void check_param(const char* op, const char* arg, const at::Tensor& t, const at::Tensor& x,
                        int64_t dim) {
  TORCH_CHECK(t.device() == x.device(), "fusedops.", op, ": ", arg, " is on ", t.device(),
              " but x is on ", x.device());
  TORCH_CHECK_TYPE(t.scalar_type() == x.scalar_type(), "fusedops.", op, ": ", arg, " has dtype ",
                   t.scalar_type(), " but x has dtype ", x.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == dim, "fusedops.", op, ": ", arg, " must be ", to_text(dim),
                    "-D, got shape ", to_text(t.sizes()));
}

inline MlpProblem check_mlp(const char* op, const at::Tensor& x, const at::Tensor& w1,
                            const c10::optional<at::Tensor>& b1, const at::Tensor& w2,
                            const c10::optional<at::Tensor>& b2, c10::string_view approximate) {
  const GeluApprox approx = parse_gelu_approx(op, approximate);
  check_floating(op, "x", x);
  TORCH_CHECK_VALUE(x.dim() >= 1, "fusedops.", op,
                    ": x must have at least one dimension (features last), got a 0-dim tensor");
  check_param(op, "w1", w1, x, 2);
  check_param(op, "w2", w2, x, 2);
  TORCH_CHECK_VALUE(x.size(-1) == w1.size(1), "fusedops.", op, ": x has ", to_text(x.size(-1)),
                    " features (last dimension) but w1 of shape ", to_text(w1.sizes()), " expects ",
                    to_text(w1.size(1)));
  TORCH_CHECK_VALUE(w2.size(1) == w1.size(0), "fusedops.", op, ": w2 of shape ",
                    to_text(w2.sizes()), " expects ", to_text(w2.size(1)),
                    " hidden features but w1 of shape ", to_text(w1.sizes()), " makes ",
                    to_text(w1.size(0)));
  if (b1.has_value()) {
    check_param(op, "b1", *b1, x, 1);
    TORCH_CHECK_VALUE(b1->size(0) == w1.size(0), "fusedops.", op, ": b1 must have shape [",
                      to_text(w1.size(0)), "] (w1.size(0)), got ", to_text(b1->sizes()));
  }
  if (b2.has_value()) {
    check_param(op, "b2", *b2, x, 1);
    TORCH_CHECK_VALUE(b2->size(0) == w2.size(0), "fusedops.", op, ": b2 must have shape [",
                      to_text(w2.size(0)), "] (w2.size(0)), got ", to_text(b2->sizes()));
  }
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  return {rows, x.size(-1), w1.size(0), w2.size(0), approx};
}

inline MlpProblem check_mlp_bwd(const char* op, const at::Tensor& grad_out, const at::Tensor& x,
                                const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& pre,
                                const at::Tensor& act, c10::string_view approximate) {
  const MlpProblem p = check_mlp(op, x, w1, c10::nullopt, w2, c10::nullopt, approximate);
  check_param(op, "grad_out", grad_out, x, x.dim());
  check_param(op, "pre", pre, x, x.dim());
  TORCH_CHECK_VALUE(grad_out.size(-1) == p.out && grad_out.numel() == p.rows * p.out, "fusedops.",
                    op, ": grad_out has shape ", to_text(grad_out.sizes()), " but the output has ",
                    to_text(p.rows), " rows of ", to_text(p.out), " features");
  TORCH_CHECK_VALUE(pre.size(-1) == p.hidden && pre.numel() == p.rows * p.hidden, "fusedops.", op,
                    ": pre has shape ", to_text(pre.sizes()), " but the block has ",
                    to_text(p.rows), " rows of ", to_text(p.hidden), " hidden features");
  TORCH_CHECK(act.device() == x.device() && act.scalar_type() == x.scalar_type(), "fusedops.", op,
              ": act must be on x's device with x's dtype");
  TORCH_CHECK_VALUE(act.numel() == 0 || act.sizes() == pre.sizes(), "fusedops.", op,
                    ": act must be empty (recompute it) or have pre's shape ", to_text(pre.sizes()),
                    ", got ", to_text(act.sizes()));
  return p;
}

// x's shape with the last size replaced: the batch shape of the block's outputs.
inline std::vector<int64_t> with_features(const at::Tensor& x, int64_t features) {
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = features;
  return sizes;
}

inline at::Tensor empty_placeholder(const at::Tensor& like) {
  return at::empty({0}, like.options());
}

// out = b ? addmm(b, a, w.T) : a @ w.T, as nn.Linear.
inline at::Tensor linear_2d(const at::Tensor& a, const at::Tensor& w, const at::Tensor& b) {
  return b.defined() ? at::addmm(b, a, w.t()) : at::mm(a, w.t());
}

// Forward over 2-D views: x2 [rows, in]; returns out [rows, out], pre and act [rows, hidden].
template <typename GeluFwd>
std::tuple<at::Tensor, at::Tensor, at::Tensor> mlp_fwd_composed(
    const MlpProblem& p, const at::Tensor& x2, const at::Tensor& w1, const at::Tensor& b1,
    const at::Tensor& w2, const at::Tensor& b2, const GeluFwd& gelu_fwd) {
  at::Tensor pre = linear_2d(x2, w1, b1).contiguous();
  at::Tensor act = gelu_fwd(pre, at::Tensor(), p.approx);
  at::Tensor out = linear_2d(act, w2, b2);
  return {out, pre, act};
}

// A weight stored transposed: the .t() view of a contiguous [in, out] matrix (GPT-2's Conv1D).
inline bool transposed_weight(const at::Tensor& w) {
  return !w.is_contiguous() && w.stride(0) == 1 && w.stride(1) == w.size(0);
}

// A weight's gradient a @ b, laid out as the weight: column-major for a transposed weight, so
// that autograd hands the stored [in, out] weight a contiguous gradient instead of copying one
// (a copy per weight per step, ~20 us each for GPT-2 small's MLP weights on an H100).
inline at::Tensor weight_grad_mm(const at::Tensor& w, const at::Tensor& a, const at::Tensor& b) {
  return transposed_weight(w) ? at::mm(b.t(), a.t()).t() : at::mm(a, b);
}

// Backward over 2-D views. act2 undefined: recomputed from pre2 (when grad_w2 is wanted).
template <typename GeluFwd, typename GeluBwd>
std::array<at::Tensor, 5> mlp_bwd_composed(const MlpProblem& p, const at::Tensor& dy2,
                                           const at::Tensor& x2, const at::Tensor& w1,
                                           const at::Tensor& w2, const at::Tensor& pre2,
                                           const at::Tensor& act2, std::array<bool, 5> mask,
                                           const GeluFwd& gelu_fwd, const GeluBwd& gelu_bwd) {
  std::array<at::Tensor, 5> g;
  // dpre before dW2 (the CUDA backward's order): dpre is freed before dW2 and a recomputed act.
  if (mask[0] || mask[1] || mask[2]) {
    const at::Tensor dact = at::mm(dy2, w2);
    auto [dpre, db1] = gelu_bwd(dact, pre2, at::Tensor(), p.approx, mask[2]);
    if (mask[0]) g[0] = at::mm(dpre, w1);
    if (mask[1]) g[1] = weight_grad_mm(w1, dpre.t(), x2);
    g[2] = db1;
  }
  if (mask[3]) {
    const at::Tensor act = act2.defined() ? act2 : gelu_fwd(pre2, at::Tensor(), p.approx);
    g[3] = weight_grad_mm(w2, dy2.t(), act);
  }
  if (mask[4]) g[4] = dy2.sum(0);
  return g;
}

// The op's outputs from 2-D results: batch shapes back, empty placeholders where not wanted.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> mlp_fwd_outputs(
    const MlpProblem& p, const at::Tensor& x, const at::Tensor& out, const at::Tensor& pre,
    const at::Tensor& act, bool save_pre, bool save_act) {
  return {out.view(with_features(x, p.out)),
          save_pre ? pre.view(with_features(x, p.hidden)) : empty_placeholder(x),
          save_act ? act.view(with_features(x, p.hidden)) : empty_placeholder(x)};
}

inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mlp_bwd_outputs(
    const at::Tensor& x, std::array<at::Tensor, 5> g) {
  if (g[0].defined()) g[0] = g[0].view(x.sizes());
  for (auto& t : g) {
    if (!t.defined()) t = empty_placeholder(x);
  }
  return {g[0], g[1], g[2], g[3], g[4]};
}

}  // namespace fusedops
