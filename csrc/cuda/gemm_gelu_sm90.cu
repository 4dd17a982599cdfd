// The CUTLASS 3 GEMM of gemm_gelu_sm90.h. One configuration, measured against the others on an
// H200 (bf16, T = 8192 rows, hidden = 4 * in; bench/results/h200-fused_mlp-cutlass-erf.txt): the
// cooperative kernel on 128x256 tiles, no cluster (76 us at in = 768, where cuBLASLt's GEMM with
// the bias epilogue alone takes 59 and eager's GEMM + GELU 94; 123 us at in = 1024).
// Both consumer warpgroups run the epilogue after a tile's mainloop, so the GELU's ~15
// instructions per element add to the tile's time: at in = 4096 the kernel is slower than
// eager's GEMM + GELU, and fused_mlp calls it only up to in = 1024 (mlp.cpp). Pingpong, which
// overlaps one warpgroup's epilogue with the other's MMAs, ran slower at these K (100-186 us).
// Writing the pre-activation too (training) cost 26 us more at in = 768: slower than cuBLASLt +
// bias_gelu, so training keeps that path.
#include "cuda/gemm_gelu_sm90.h"

#if defined(FUSEDOPS_WITH_CUTLASS)
#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>

#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <type_traits>

#include "common/math.h"
#include "common/vec.cuh"
#endif

namespace fusedops {

#if defined(FUSEDOPS_WITH_CUTLASS)
namespace {

// The epilogue's activation: the same branch-free erf GELU as the bias_gelu kernels (math.h).
// CUTLASS applies it to fragments, Array<float, N>.
template <class T>
struct GeluErf {
  CUTLASS_DEVICE T operator()(T const& x) const { return gelu_erf_fast(x); }
};
template <int N>
struct GeluErf<cutlass::Array<float, N>> {
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& x) const {
    cutlass::Array<float, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = gelu_erf_fast(x[i]);
    return y;
  }
};

// D [M = rows, N = hidden] (row-major) = GeluErf(A @ B.T + bias[N]), A [M, K] and B [N, K]
// row-major (both K-major, the layout Hopper's TMA and MMA prefer); no C operand.
template <class E>
struct GemmGelu {
  using Row = cutlass::layout::RowMajor;
  using KMajorB = cutlass::layout::ColumnMajor;  // CUTLASS's B is K x N: [N, K] row-major
  static constexpr int kAlign = 8;               // elements per 16 bytes
  using Tile = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<GeluErf, E, float, E, void>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, Row, kAlign, E, Row,
      kAlign, cutlass::epilogue::TmaWarpSpecializedCooperative, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E, Row, kAlign, E, KMajorB, kAlign,
      float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static bool run(const E* x, const E* w, const E* bias, E* act, int m, int n, int k, int sm_count,
                  cudaStream_t stream) {
    using cute::_1;
    const typename Kernel::StrideA stride_x = cute::make_stride(int64_t(k), _1{}, int64_t(m) * k);
    const typename Kernel::StrideB stride_w = cute::make_stride(int64_t(k), _1{}, int64_t(n) * k);
    const typename Kernel::StrideD stride_act = cute::make_stride(int64_t(n), _1{}, int64_t(m) * n);
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {m, n, k, 1},
                                  {x, stride_x, w, stride_w},
                                  {{}, nullptr, stride_act, act, stride_act}};
    args.epilogue.thread.bias_ptr = bias;  // null: no bias
    args.hw_info.sm_count = sm_count;      // else CUTLASS queries the device at every call
    Gemm gemm;
    // The persistent scheduler without split-K needs no workspace; should that change, decline.
    return Gemm::get_workspace_size(args) == 0 &&
           gemm.can_implement(args) == cutlass::Status::kSuccess &&
           gemm.initialize(args, nullptr, stream) == cutlass::Status::kSuccess &&
           gemm.run(stream) == cutlass::Status::kSuccess;
  }
};

template <typename T>
using CutlassType =
    std::conditional_t<std::is_same_v<T, __half>, cutlass::half_t, cutlass::bfloat16_t>;

}  // namespace

bool gemm_gelu_sm90_built() { return true; }

template <typename T>
bool gemm_gelu_sm90(const T* x, const T* w, const T* bias, T* act, int64_t rows, int64_t in,
                    int64_t hidden, const DeviceInfo& dev, cudaStream_t stream) {
  using E = CutlassType<T>;
  constexpr int64_t kMaxInt = 0x7fffffff;
  if (rows <= 0 || in <= 0 || hidden <= 0 || rows > kMaxInt || in > kMaxInt || hidden > kMaxInt ||
      in % 8 != 0 || hidden % 8 != 0 || !is_aligned16(x) || !is_aligned16(w) ||
      !is_aligned16(act) || (bias != nullptr && !is_aligned16(bias))) {
    return false;
  }
  return GemmGelu<E>::run(reinterpret_cast<const E*>(x), reinterpret_cast<const E*>(w),
                          reinterpret_cast<const E*>(bias), reinterpret_cast<E*>(act),
                          static_cast<int>(rows), static_cast<int>(hidden), static_cast<int>(in),
                          dev.sm_count, stream);
}

#else

bool gemm_gelu_sm90_built() { return false; }

template <typename T>
bool gemm_gelu_sm90(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t, const DeviceInfo&,
                    cudaStream_t) {
  return false;
}

#endif

template bool gemm_gelu_sm90<__half>(const __half*, const __half*, const __half*, __half*, int64_t,
                                     int64_t, int64_t, const DeviceInfo&, cudaStream_t);
template bool gemm_gelu_sm90<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*,
                                            const __nv_bfloat16*, __nv_bfloat16*, int64_t, int64_t,
                                            int64_t, const DeviceInfo&, cudaStream_t);

}  // namespace fusedops
