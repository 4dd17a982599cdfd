// CUDA fused_mlp: cuBLASLt GEMMs with fused epilogues around the bias_gelu kernels.
//   forward  tanh:  fc1 = GEMM + bias + GELU (GELU_AUX_BIAS, pre-activation as aux output)
//            exact: fc1 = GEMM + bias (BIAS) into pre, then the erf GELU kernel (cuBLASLt's
//                   GELU is the tanh form; no silent switch); for inference on an H100/H200,
//                   one CUTLASS GEMM with the erf GELU in its epilogue (gemm_gelu_sm90.h)
//            fc2 = GEMM + bias (BIAS)
//   backward dW2 + db2 (BGRADB); dact = plain GEMM, then the bias_gelu backward kernel in place
//            (dpre, a deterministic db1 and, with recompute_activation, act for dW2); dW1 and
//            dx plain GEMMs. Not used: cuBLASLt's DGELU
//            epilogue for dpre. Its sm90 kernel (a 128x128 tile on one warpgroup) and the column
//            sum db1 then needs took 90 + 23 us at T = 8192, D = 768 and 134 + 30 at D = 1024
//            (H200, bf16), against 51 + 40 and 101 + 53 for the plain GEMM and this kernel: the
//            tanh training step's kernels 425 -> 397 and 701 -> 680 us without it. DGELU_BGRAD,
//            which also sums db1, made the whole step 13-24% slower; BGRADB on dW1 cost more than
//            the column sum. On dW2, whose bias gradient sums the narrower dy, BGRADB and the
//            column sum ran alike.
// Torch tensors are row-major, cuBLASLt column-major: y = x @ w.T is computed as y.T = w @ x.T.
// Weights are read in place as nn.Linear's row-major [out, in] or as the column-major .t() view of
// a weight stored [in, out] (GPT-2's Conv1D): either way no copy per call.
// A GEMM the epilogue can't take (alignment, dtype, no algorithm) falls back to plain cuBLASLt or
// ATen plus the bias_gelu kernels; it never fails for that reason. fp32 blocks never use the
// GELU epilogues: their GELU is not fp32-accurate (on an H200, dW1 of a 40x24 fp32 block was off
// by 1.5e-5 of its scale where torch is off by 2e-7), harmless only below 16-bit rounding.
#include "mlp.h"

#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "bias_gelu.h"
#include "common/cuda_host.h"
#include "cuda/gemm.h"
#include "cuda/gemm_gelu_sm90.h"

namespace fusedops {
namespace {

bool gelu_epilogue_ok(const MlpProblem& p, const at::Tensor& x) {
  return p.approx == GeluApprox::kTanh && x.scalar_type() != at::kFloat;
}

// Whether a weight gradient [m, n] summed over k rows should also sum the bias gradient in its
// BGRADB epilogue. That epilogue keeps cuBLASLt from splitting k, so a weight too small to fill
// the GPU on its own tiles runs on a handful of blocks: on an H200 at 2^20 rows, a training step
// of a 16-64-16 MLP took 0.99 ms (tanh 1.67) against eager's 0.69, of a 128-128-128 one 1.75
// (2.24) against 1.76. There, a plain GEMM and the column-sum kernel run instead (as eager).
bool bias_grad_in_epilogue(int64_t m, int64_t n, int64_t k) { return k <= m * n; }

// A GEMM operand: a row-major contiguous [rows, cols] matrix (to cuBLASLt column-major
// [cols, rows], ld=cols), used as op(m) = m.T when t.
struct Operand {
  const void* ptr;
  int64_t rows, cols;
  bool t;
  at::ScalarType dtype;
};

// m [rows, cols] is the .t() view of a contiguous [cols, rows] matrix: m.t().is_contiguous(),
// without making the view (host time per call).
bool column_major(const at::Tensor& m) {
  return (m.size(0) == 1 || m.stride(0) == 1) && (m.size(1) == 1 || m.stride(1) == m.size(0));
}

// op(m) = t ? m.T : m for a row-major or a column-major m. A column-major m (e.g. the .t() view of
// a weight stored [in, out]) is read in place as its row-major storage with t flipped: no copy.
Operand operand(const at::Tensor& m, bool t) {
  if (m.is_contiguous()) return {m.const_data_ptr(), m.size(0), m.size(1), t, m.scalar_type()};
  TORCH_INTERNAL_ASSERT(column_major(m));
  return {m.const_data_ptr(), m.size(1), m.size(0), !t, m.scalar_type()};
}

// A weight as the GEMMs read it: row-major (nn.Linear's [out, in]) and column-major (the .t()
// view of a weight stored [in, out]) in place; any other strides copied.
at::Tensor gemm_layout(const at::Tensor& w) {
  return w.is_contiguous() || column_major(w) ? w : w.contiguous();
}

// d [M, N] = op(a) @ op(b) in row-major terms; a and b of d's dtype, or fp16/bf16 into an fp32 d.
// Epilogue operands:
//   bias: BIAS reads it, BGRADB writes it; [N] (BGRADB: [M])
//   aux:  GELU_AUX* writes the pre-activation; [M, N] row-major (ld N)
struct LtGemm {
  Operand a;
  Operand b;
  at::Tensor& d;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  const void* aux = nullptr;
};

// Largest power of two (<= 256) dividing the address: what heuristics may assume about it.
uint32_t alignment_of(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

template <typename R>
bool reduced_precision_allowed(R option) {
  if constexpr (std::is_same_v<R, bool>) {  // torch < 2.9: a bool
    return option;
  } else {
    return option == R::AllowReducedPrecisionWithSplitK;
  }
}

template <typename R>
bool split_k_allowed(R option) {
  if constexpr (std::is_same_v<R, bool>) {
    return true;
  } else {
    return option != R::DisallowReducedPrecisionDisallowSplitK;
  }
}

// torch.backends.cuda.matmul.allow_{fp16,bf16}_reduced_precision_reduction as a cuBLASLt mask.
uint32_t reduction_scheme_mask(at::ScalarType dtype) {
  auto mask = [](auto option) -> uint32_t {
    if (!split_k_allowed(option)) return CUBLASLT_REDUCTION_SCHEME_NONE;
    if (!reduced_precision_allowed(option)) {
      return CUBLASLT_REDUCTION_SCHEME_MASK & ~uint32_t(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE);
    }
    return CUBLASLT_REDUCTION_SCHEME_MASK;
  };
  if (dtype == at::kHalf) return mask(at::globalContext().allowFP16ReductionCuBLAS());
  if (dtype == at::kBFloat16) return mask(at::globalContext().allowBF16ReductionCuBLAS());
  return CUBLASLT_REDUCTION_SCHEME_MASK;
}

#define FUSEDOPS_LT_TRY(expr) \
  if ((expr) != CUBLAS_STATUS_SUCCESS) return false

// A cuBLASLt object, destroyed with its owner; set() writes one of its attributes.
template <typename H, auto kDestroy, auto kSetAttribute = nullptr>
struct LtObject {
  H h = nullptr;
  ~LtObject() {
    if (h != nullptr) kDestroy(h);
  }
  template <typename Attribute, typename V>
  cublasStatus_t set(Attribute attr, const V& value) {
    return kSetAttribute(h, attr, &value, sizeof(value));
  }
};
using MatmulDesc =
    LtObject<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy, cublasLtMatmulDescSetAttribute>;
using Layout = LtObject<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using Preference = LtObject<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy,
                            cublasLtMatmulPreferenceSetAttribute>;

// cuBLASLt's first heuristic is not always its fastest candidate. H100, bf16, T = 8192 rows,
// hidden 4D, random inputs, µs per GEMM in runs of 30 (three rounds, fastest to slowest): at D =
// 768, fc1 with GELU_BIAS 67.2-68.9 for the first choice, 60.7-63.5 for the eighth; with
// GELU_AUX_BIAS 81.8-82.9 against the fifth's 75.7-75.9; at D = 1024 fc1 (BIAS, GELU_BIAS,
// GELU_AUX_BIAS) and the dact GEMM (and DGELU's, no longer used) 5-9% faster by another candidate.
// Runs of two ranked them differently (launch ramp-up), so each candidate is timed in runs of about
// kTuneRunMs. A GEMM shape is tuned once per process, as cudnn.benchmark does: its candidates run
// in turn for kTuneRounds rounds, and the fastest replaces the first choice only where its slowest
// round took at most kTuneMargin of the first choice's fastest (noise keeps the heuristic's
// choice). GEMMs longer than kTuneMaxMs are not tuned: at D = 4096 (1.5-1.8 ms each) one
// candidate's rounds spread by 3-10% (the GPU's power limit), and tuned choices made the
// benchmark's inference slower (exact GELU 3.19-3.26 -> 3.40-3.62 ms). Under CUDA graph capture
// nothing is timed: a shape tuned before runs its tuned choice, another the first. With
// torch.use_deterministic_algorithms(True) or FUSEDOPS_GEMM_TUNING=0, always the heuristic's first
// choice: the same algorithm, hence the same bits, in every process.
constexpr int kTuneCandidates = 8;
constexpr int kTuneRounds = 3;
constexpr float kTuneRunMs = 1.f;  // per candidate and round: runs of at least 2, at most 20
constexpr int kTuneMinRuns = 2, kTuneMaxRuns = 20;
constexpr float kTuneMargin = 0.97f;
constexpr float kTuneMaxMs = 0.5f;  // longer GEMMs keep the first choice

// Everything the heuristic's answer depends on.
using GemmKey = std::array<int64_t, 15>;

struct GemmChoice {
  cublasLtMatmulAlgo_t algo;
  size_t workspace;
};

// kOff: the heuristic's first choice. kCached: the tuned choice where the shape has been tuned,
// else the first (CUDA graph capture, where nothing can be timed). kTune: the tuned choice.
enum class Tuning { kOff, kCached, kTune };

Tuning tuning(cudaStream_t stream) {
  static const bool enabled = [] {
    const char* v = std::getenv("FUSEDOPS_GEMM_TUNING");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  if (!enabled || at::globalContext().deterministicAlgorithms()) return Tuning::kOff;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    cudaGetLastError();
    return Tuning::kCached;
  }
  return status == cudaStreamCaptureStatusNone ? Tuning::kTune : Tuning::kCached;
}

// Per GEMM shape, the heuristic's first choice and the tuned one, as each is first needed.
class GemmChoices {
 public:
  // The choice for key under t; nothing where it is still to be found (the first choice under
  // kOff and kCached, the tuned one under kTune).
  std::optional<GemmChoice> find(const GemmKey& key, Tuning t) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    const Entry& e = it->second;
    if (t != Tuning::kOff && e.tuned) return e.tuned;
    return t == Tuning::kTune ? std::nullopt : e.first;
  }
  void add(const GemmKey& key, const GemmChoice& first, std::optional<GemmChoice> tuned) {
    const std::lock_guard<std::mutex> lock(mutex_);
    Entry& e = map_[key];
    e.first = first;
    if (tuned) e.tuned = tuned;
  }

 private:
  struct Entry {
    std::optional<GemmChoice> first, tuned;
  };
  std::mutex mutex_;
  std::map<GemmKey, Entry> map_;
};

GemmChoices& gemm_choices() {
  static GemmChoices c;
  return c;
}

// CUDA events timing slots of work on a stream, destroyed with their owner; a failed CUDA call
// makes every later time infinite, and leaves no error behind.
class Timings {
 public:
  Timings(int slots, cudaStream_t stream) : start_(slots), stop_(slots), stream_(stream) {
    for (int k = 0; k < slots; ++k) {
      check(cudaEventCreate(&start_[k]));
      check(cudaEventCreate(&stop_[k]));
    }
  }
  ~Timings() {
    for (size_t k = 0; k < start_.size(); ++k) {
      if (start_[k] != nullptr) cudaEventDestroy(start_[k]);
      if (stop_[k] != nullptr) cudaEventDestroy(stop_[k]);
    }
    cudaGetLastError();
  }
  template <typename F>
  void time(int slot, const F& work) {
    check(cudaEventRecord(start_[slot], stream_));
    work();
    check(cudaEventRecord(stop_[slot], stream_));
  }
  void synchronize() { check(cudaStreamSynchronize(stream_)); }
  float ms(int slot) {
    float t = 0.f;
    if (good_) check(cudaEventElapsedTime(&t, start_[slot], stop_[slot]));
    return good_ ? t : std::numeric_limits<float>::infinity();
  }

 private:
  void check(cudaError_t e) { good_ = good_ && e == cudaSuccess; }
  std::vector<cudaEvent_t> start_, stop_;
  cudaStream_t stream_;
  bool good_ = true;
};

// Index of the candidate (of n) to run, run(i) enqueuing candidate i: each runs once (one that
// fails is out), the first once more, timed: beyond kTuneMaxMs, 0. Else kTuneRounds rounds time
// a run of every candidate in turn (the stream synchronized once at the end), and 0 unless the
// margin holds (above).
template <typename Run>
int fastest(int n, cudaStream_t stream, const Run& run) {
  std::vector<bool> ok(n);
  for (int i = 0; i < n; ++i) ok[i] = run(i) == CUBLAS_STATUS_SUCCESS;
  if (!ok[0]) return 0;
  auto runs_of = [&](int i, int runs) {
    return [&, i, runs] {
      for (int j = 0; j < runs; ++j) ok[i] = ok[i] && run(i) == CUBLAS_STATUS_SUCCESS;
    };
  };
  Timings t(1 + kTuneRounds * n, stream);  // [0]: the first candidate once; [1 + r * n + i]
  t.time(0, runs_of(0, 1));
  t.synchronize();
  const float first_ms = t.ms(0);
  if (!(first_ms <= kTuneMaxMs)) return 0;  // also where the timing failed
  const int runs = static_cast<int>(std::clamp(std::ceil(kTuneRunMs / std::max(first_ms, 1e-3f)),
                                               float(kTuneMinRuns), float(kTuneMaxRuns)));
  for (int r = 0; r < kTuneRounds; ++r) {
    for (int i = 0; i < n; ++i) {
      if (ok[i]) t.time(1 + r * n + i, runs_of(i, runs));
    }
  }
  t.synchronize();
  // Each candidate's fastest and slowest round.
  std::vector<float> lo(n, std::numeric_limits<float>::infinity()), hi(n, 0.f);
  for (int r = 0; r < kTuneRounds; ++r) {
    for (int i = 0; i < n; ++i) {
      const float ms = ok[i] ? t.ms(1 + r * n + i) : std::numeric_limits<float>::infinity();
      lo[i] = std::min(lo[i], ms);
      hi[i] = std::max(hi[i], ms);
    }
  }
  int best = 0;
  for (int i = 1; i < n; ++i) {
    if (hi[i] < hi[best]) best = i;
  }
  return ok[0] && hi[best] <= kTuneMargin * lo[0] ? best : 0;
}

// Runs g on the current stream; false (nothing enqueued) when cuBLASLt can't take it.
bool lt_gemm(const LtGemm& g) {
  const at::ScalarType dtype = g.d.scalar_type(), in_dtype = g.a.dtype;
  cudaDataType_t type, in_type;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  const auto lt_type = [](at::ScalarType t, cudaDataType_t& out) {
    switch (t) {
      case at::kFloat:
        out = CUDA_R_32F;
        return true;
      case at::kHalf:
        out = CUDA_R_16F;
        return true;
      case at::kBFloat16:
        out = CUDA_R_16BF;
        return true;
      default:
        return false;
    }
  };
  if (!lt_type(dtype, type) || !lt_type(in_dtype, in_type) || g.b.dtype != in_dtype) return false;
  if (in_dtype != dtype && (dtype != at::kFloat || g.epilogue != CUBLASLT_EPILOGUE_DEFAULT)) {
    return false;
  }
  // torch.backends.cuda.matmul.allow_tf32, as torch's own fp32 matmuls.
  if (in_dtype == at::kFloat && at::globalContext().allowTF32CuBLAS()) {
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  const int64_t m_rows = g.d.size(0), n_cols = g.d.size(1);
  const int64_t k = g.a.t ? g.a.rows : g.a.cols;
  TORCH_INTERNAL_ASSERT((g.a.t ? g.a.cols : g.a.rows) == m_rows &&
                        (g.b.t ? g.b.rows : g.b.cols) == n_cols &&
                        (g.b.t ? g.b.cols : g.b.rows) == k);
  if (m_rows == 0 || n_cols == 0 || k == 0) return false;
  // 16-byte aligned pointers and leading dimensions; the GELU aux ld must be a multiple of 8.
  const int64_t esize = static_cast<int64_t>(at::elementSize(in_dtype));
  const int64_t d_esize = static_cast<int64_t>(at::elementSize(dtype));
  const bool aligned = aligned16(g.a.ptr) && aligned16(g.b.ptr) && aligned16(g.d.data_ptr()) &&
                       (g.a.cols * esize) % 16 == 0 && (g.b.cols * esize) % 16 == 0 &&
                       (n_cols * d_esize) % 16 == 0 && (g.bias == nullptr || aligned16(g.bias)) &&
                       (g.aux == nullptr || (aligned16(g.aux) && n_cols % 8 == 0));
  if (!aligned) return false;

  // Column-major view: D.T [N, M] = op(b).T [N, K] @ op(a).T [K, M], so cuBLASLt's A is our b.
  MatmulDesc desc;
  FUSEDOPS_LT_TRY(cublasLtMatmulDescCreate(&desc.h, compute, CUDA_R_32F));
  FUSEDOPS_LT_TRY(
      desc.set(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(g.b.t ? CUBLAS_OP_T : CUBLAS_OP_N)));
  FUSEDOPS_LT_TRY(
      desc.set(CUBLASLT_MATMUL_DESC_TRANSB, int32_t(g.a.t ? CUBLAS_OP_T : CUBLAS_OP_N)));
  FUSEDOPS_LT_TRY(desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(g.epilogue)));
  if (g.bias != nullptr) FUSEDOPS_LT_TRY(desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias));
  if (g.aux != nullptr) {
    FUSEDOPS_LT_TRY(desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux));
    FUSEDOPS_LT_TRY(desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(n_cols)));
  }
  Layout a_layout, b_layout, d_layout;
  FUSEDOPS_LT_TRY(cublasLtMatrixLayoutCreate(&a_layout.h, in_type, g.b.cols, g.b.rows, g.b.cols));
  FUSEDOPS_LT_TRY(cublasLtMatrixLayoutCreate(&b_layout.h, in_type, g.a.cols, g.a.rows, g.a.cols));
  FUSEDOPS_LT_TRY(cublasLtMatrixLayoutCreate(&d_layout.h, type, n_cols, m_rows, n_cols));

  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const float alpha = 1.f, beta = 0.f;
  void* d = g.d.data_ptr();
  // beta == 0: C is never read; it aliases D as cuBLASLt allows.
  auto matmul = [&](const GemmChoice& c, void* workspace) {
    return cublasLtMatmul(handle, desc.h, &alpha, g.b.ptr, a_layout.h, g.a.ptr, b_layout.h, &beta,
                          d, d_layout.h, d, d_layout.h, &c.algo, workspace, c.workspace, stream);
  };
  // Workspaces come from the caching allocator on this stream: handed back when this returns,
  // reused only by work queued after the GEMM (and from the graph's pool under capture).
  auto workspace_for = [&](size_t bytes) {
    return bytes > 0 ? at::empty({static_cast<int64_t>(bytes)}, g.d.options().dtype(at::kByte))
                     : at::Tensor();
  };
  const GemmKey key{at::cuda::current_device(),
                    int64_t(dtype) * 64 + int64_t(in_dtype),
                    int64_t(compute),
                    g.b.t,
                    g.a.t,
                    m_rows,
                    n_cols,
                    k,
                    int64_t(g.epilogue),
                    g.bias != nullptr,
                    g.aux != nullptr,
                    alignment_of(g.a.ptr),
                    alignment_of(g.b.ptr),
                    alignment_of(d),
                    reduction_scheme_mask(dtype)};
  const Tuning t = tuning(stream);
  std::optional<GemmChoice> choice = gemm_choices().find(key, t);
  if (!choice) {  // ask the heuristic
    const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
    const uint64_t max_workspace = prop->major >= 9 ? (uint64_t(32) << 20) : (uint64_t(4) << 20);
    Preference pref;
    FUSEDOPS_LT_TRY(cublasLtMatmulPreferenceCreate(&pref.h));
    FUSEDOPS_LT_TRY(pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace));
    FUSEDOPS_LT_TRY(
        pref.set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reduction_scheme_mask(dtype)));
    FUSEDOPS_LT_TRY(pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(g.b.ptr)));
    FUSEDOPS_LT_TRY(pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(g.a.ptr)));
    FUSEDOPS_LT_TRY(
        pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(g.d.data_ptr())));
    FUSEDOPS_LT_TRY(
        pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(g.d.data_ptr())));
    const bool tune = t == Tuning::kTune;
    std::array<cublasLtMatmulHeuristicResult_t, kTuneCandidates> found_algos{};
    int found = 0;
    FUSEDOPS_LT_TRY(cublasLtMatmulAlgoGetHeuristic(
        handle, desc.h, a_layout.h, b_layout.h, d_layout.h, d_layout.h, pref.h,
        tune ? kTuneCandidates : 1, found_algos.data(), &found));
    if (found == 0) return false;
    std::vector<GemmChoice> candidates;
    size_t most = 0;
    for (int i = 0; i < found; ++i) {
      candidates.push_back({found_algos[i].algo, found_algos[i].workspaceSize});
      most = std::max(most, found_algos[i].workspaceSize);
    }
    choice = candidates[0];
    if (tune && found > 1) {
      const at::Tensor workspace = workspace_for(most);
      void* ws = workspace.defined() ? workspace.data_ptr() : nullptr;
      choice = candidates[fastest(found, stream, [&](int i) { return matmul(candidates[i], ws); })];
    }
    gemm_choices().add(key, candidates[0], tune ? choice : std::nullopt);
  }
  const at::Tensor workspace = workspace_for(choice->workspace);
  FUSEDOPS_LT_TRY(matmul(*choice, workspace.defined() ? workspace.data_ptr() : nullptr));
  return true;
}

#undef FUSEDOPS_LT_TRY

// d = op(a) @ op(b): cuBLASLt, else ATen.
void gemm_into(at::Tensor& d, const at::Tensor& a, bool a_t, const at::Tensor& b, bool b_t) {
  if (lt_gemm({operand(a, a_t), operand(b, b_t), d})) return;
  at::mm_out(d, a_t ? a.t() : a, b_t ? b.t() : b);
}

// op(a) @ op(b) as the gradient of weight w, in w's layout (weight_grad_mm's rule, mlp.h).
at::Tensor weight_grad(const at::Tensor& w, const at::Tensor& a, bool a_t, const at::Tensor& b,
                       bool b_t) {
  if (!transposed_weight(w)) {
    at::Tensor d = at::empty(w.sizes(), a.options());
    gemm_into(d, a, a_t, b, b_t);
    return d;
  }
  at::Tensor d_t = at::empty({w.size(1), w.size(0)}, a.options());
  gemm_into(d_t, b, !b_t, a, !a_t);  // (op(a) @ op(b)).T = op(b).T @ op(a).T
  return d_t.t();
}

// d = a @ w.T + bias (nn.Linear): cuBLASLt with the BIAS epilogue, else ATen.
void linear_into(at::Tensor& d, const at::Tensor& a, const at::Tensor& w, const at::Tensor& bias) {
  if (!bias.defined()) return gemm_into(d, a, false, w, true);
  if (lt_gemm({operand(a, false), operand(w, true), d, CUBLASLT_EPILOGUE_BIAS,
               bias.const_data_ptr()})) {
    return;
  }
  at::addmm_out(d, bias, a, w.t());
}

// Largest in_features for which the exact GELU's inference fc1 runs as one CUTLASS GEMM. H200,
// bf16, 8192 rows, hidden = 4 * in: the inference step, kernel-only, 0.149 -> 0.142 ms at in = 768
// and 0.253 -> 0.244 at 1024 against cuBLASLt + bias_gelu; at in = 4096 the GEMM alone took
// 1954-2027 us against eager's GEMM + GELU 1866 (its epilogue is not hidden under the MMAs:
// gemm_gelu_sm90.cu).
constexpr int64_t kErfEpilogueMaxIn = 1024;

// act = gelu_erf(x @ w1.T + b1) as one GEMM where the CUTLASS kernel serves: the exact GELU, a
// 16-bit block, compute capability 9.0, nn.Linear's row-major w1. Undefined: nothing enqueued.
at::Tensor erf_epilogue_gemm(const MlpProblem& p, const at::Tensor& x, const at::Tensor& w1,
                             const at::Tensor& b1) {
  const at::ScalarType dtype = x.scalar_type();
  if (p.approx != GeluApprox::kNone || p.in > kErfEpilogueMaxIn || !gemm_gelu_sm90_built() ||
      (dtype != at::kHalf && dtype != at::kBFloat16) || !w1.is_contiguous()) {
    return {};
  }
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  if (prop->major != 9 || prop->minor != 0) return {};
  const DeviceInfo dev = current_device_info();
  at::Tensor act = at::empty({p.rows, p.hidden}, x.options());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  auto run = [&](auto tag) {
    using T = decltype(tag);
    return gemm_gelu_sm90(static_cast<const T*>(x.const_data_ptr()),
                          static_cast<const T*>(w1.const_data_ptr()),
                          b1.defined() ? static_cast<const T*>(b1.const_data_ptr()) : nullptr,
                          static_cast<T*>(act.data_ptr()), p.rows, p.in, p.hidden, dev, stream);
  };
  const bool ran =
      (dtype == at::kHalf && run(__half{})) || (dtype == at::kBFloat16 && run(__nv_bfloat16{}));
  return ran ? act : at::Tensor();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> mlp_fwd(const at::Tensor& x, const at::Tensor& w1,
                                                       const c10::optional<at::Tensor>& b1_opt,
                                                       const at::Tensor& w2,
                                                       const c10::optional<at::Tensor>& b2_opt,
                                                       c10::string_view approximate, bool save_pre,
                                                       bool save_act) {
  const MlpProblem p = check_mlp("fused_mlp", x, w1, b1_opt, w2, b2_opt, approximate);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor x2 = x.reshape({p.rows, p.in}).contiguous();
  const at::Tensor w1c = gemm_layout(w1), w2c = gemm_layout(w2);
  const at::Tensor b1 = contiguous_or_undefined(b1_opt), b2 = contiguous_or_undefined(b2_opt);
  const auto opts = x.options();

  at::Tensor pre, act;
  bool fused = false;
  if (gelu_epilogue_ok(p, x)) {
    act = at::empty({p.rows, p.hidden}, opts);
    if (save_pre) pre = at::empty({p.rows, p.hidden}, opts);
    const cublasLtEpilogue_t epilogue =
        b1.defined() ? (save_pre ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS)
                     : (save_pre ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU);
    fused = lt_gemm({operand(x2, false), operand(w1c, true), act, epilogue,
                     b1.defined() ? b1.const_data_ptr() : nullptr,
                     save_pre ? pre.const_data_ptr() : nullptr});
  } else if (!save_pre) {
    act = erf_epilogue_gemm(p, x2, w1c, b1);
    fused = act.defined();
  }
  if (!fused) {
    pre = at::empty({p.rows, p.hidden}, opts);
    linear_into(pre, x2, w1c, b1);
    // Without a saved pre-activation (inference) the GELU overwrites it: one [T, hidden] buffer.
    act = bias_gelu_rows_fwd_cuda(pre, at::Tensor(), p.approx, /*overwrite_input=*/!save_pre);
  }
  at::Tensor out = at::empty({p.rows, p.out}, opts);
  linear_into(out, act, w2c, b2);
  return mlp_fwd_outputs(p, x, out, pre, act, save_pre, save_act);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mlp_bwd(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
    const at::Tensor& pre, const at::Tensor& act, c10::string_view approximate,
    std::array<bool, 5> mask) {
  const MlpProblem p =
      check_mlp_bwd("fused_mlp_backward", grad_out, x, w1, w2, pre, act, approximate);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor dy2 = grad_out.reshape({p.rows, p.out}).contiguous();
  const at::Tensor x2 = x.reshape({p.rows, p.in}).contiguous();
  const at::Tensor w1c = gemm_layout(w1), w2c = gemm_layout(w2);
  const at::Tensor pre2 = pre.reshape({p.rows, p.hidden}).contiguous();
  const auto opts = x.options();
  std::array<at::Tensor, 5> g;  // dx, dw1, db1, dw2, db2

  // act for dW2: saved, or (recompute_activation) written by the kernel that makes dpre, from the
  // pre it reads anyway, else recomputed below. The recompute then costs a write of act, not a
  // pass of its own (read pre, write act) and a launch; the price is act living beside dpre.
  const bool act_saved = act.sizes() == pre.sizes();
  at::Tensor act2 = act_saved ? act.reshape({p.rows, p.hidden}).contiguous() : at::Tensor();
  // dpre first, freed at the end of its block, before dW2 is allocated: the saved pre and act
  // live until this returns, so the peak is what lives beside them.
  if (mask[0] || mask[1] || mask[2]) {
    // dpre = (dy @ w2) * gelu'(pre), written over dact, and db1 from the same kernel.
    at::Tensor dact = at::empty({p.rows, p.hidden}, opts);
    gemm_into(dact, dy2, false, w2c, false);
    if (mask[3] && !act_saved) act2 = at::empty({p.rows, p.hidden}, opts);
    // A saved act is read, never written (its bits are the forward's).
    auto [dpre, db1] = bias_gelu_rows_bwd_cuda(dact, pre2, at::Tensor(), p.approx, mask[2], true,
                                               act_saved ? at::Tensor() : act2);
    if (mask[1]) g[1] = weight_grad(w1, dpre, true, x2, false);
    if (mask[0]) {
      g[0] = at::empty({p.rows, p.in}, opts);
      gemm_into(g[0], dpre, false, w1c, false);
    }
    g[2] = db1;
  }
  if (mask[3]) {
    if (!act2.defined()) act2 = bias_gelu_rows_fwd_cuda(pre2, at::Tensor(), p.approx);
    // dW2 = dy.T @ act; BGRADB sums dy over the rows (the GEMM's k) into db2.
    bool fused = false;
    if (mask[4] && !transposed_weight(w2) && bias_grad_in_epilogue(p.out, p.hidden, p.rows)) {
      g[3] = at::empty({p.out, p.hidden}, opts);
      g[4] = at::empty({p.out}, opts);
      fused = lt_gemm({operand(dy2, true), operand(act2, false), g[3], CUBLASLT_EPILOGUE_BGRADB,
                       g[4].const_data_ptr()});
    }
    if (!fused) {
      g[3] = weight_grad(w2, dy2, true, act2, false);
      if (mask[4]) g[4] = column_sum_rows_cuda(dy2);
    }
  } else if (mask[4]) {
    g[4] = column_sum_rows_cuda(dy2);
  }

  return mlp_bwd_outputs(x, g);
}

}  // namespace

void mm_f32_out(at::Tensor& d, const at::Tensor& a, bool a_t, const at::Tensor& b, bool b_t) {
  if (lt_gemm({operand(a, a_t), operand(b, b_t), d})) return;
  d.copy_(at::mm(a_t ? a.t() : a, b_t ? b.t() : b));
}

TORCH_LIBRARY_IMPL(fusedops, CUDA, m) {
  m.impl("mlp_fwd", &mlp_fwd);
  m.impl("mlp_bwd", &mlp_bwd);
}

}  // namespace fusedops
