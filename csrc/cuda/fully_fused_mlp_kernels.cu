// The fully fused MLP: one kernel runs every layer of a small-width network over a 16-row tile
// per warp, forward and backward.
//
// Why it is fast: an eager MLP of width w writes and re-reads a [rows, w] activation per layer;
// here only x and y (forward) or grad_out, the saves and grad_x (backward) touch DRAM: up to width
// 64 the backward also sums the weight and bias gradients on chip (accumulate_weight_grad). A warp
// keeps its 16 rows in registers from layer to layer: the fp32 accumulator of one m16n8k16 MMA,
// rounded to bf16/fp16 pairs, is exactly the A-operand fragment of the next layer's MMA (same rows,
// same column pairs), so activations never go through shared memory. Every layer's weights sit in
// shared memory for the life of a persistent block, loaded once from L2; each warp reads B
// fragments from there with conflict-free ldmatrix.x4 (rows padded by kSkew halves). What goes to
// or comes from DRAM (x, y, the saves, the gradients) passes through a small per-warp staging tile,
// which makes those accesses coalesced whatever the feature count, and 16 bytes wide where the rows
// and pointers are 16-byte aligned.
//
// Measured on an H100 (bf16, 4 hidden layers): the narrow widths are bound by instruction issue and
// latency, not by DRAM; the erf GELU is a third of the forward at width 64 (ReLU: 0.57 ms, GELU:
// 1.11 ms at 2^21 rows). Hence: one activation switch per layer (per element, it kept the GELUs
// from interleaving: 1.8 ms), a branch-free erfc, warps and registers per width and direction
// (max_warps, kMinBlocks), tile indices that are shifts (no integer division per element),
// compile-time dims for W x W layers (with_layer_dims), and the backward's saved activations
// fetched with cp.async while its GEMM runs.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .row.col; g = lane / 4, t = lane % 4):
//   A 16x16: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B 16x8:  b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g); B[k][n] = W[n][k] is nn.Linear's
//            [out, in] row-major, read as is in the forward and stored transposed for the backward
//   C 16x8:  c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..)
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/launch.h"
#include "common/math.h"
#include "common/vec.cuh"
#include "cuda/fully_fused_mlp_kernels.h"

namespace fusedops {
namespace {

constexpr int kWarps = 8;      // warps per block, 16 rows each (more at some widths: max_warps)
constexpr int kTileRows = 16;  // rows per warp tile: the MMA's M
constexpr int kSkew = 8;       // halves added to each shared-memory row (bank-conflict-free)

__host__ __device__ constexpr int pad16(int n) { return (n + 15) / 16 * 16; }

// Matrix l maps k (padded) input features to n (padded) outputs.
struct MatDims {
  int n, k;
};
__host__ __device__ inline MatDims mat_dims(const FfmShape& s, int l) {
  return {l == s.matrices - 1 ? pad16(s.out) : s.hidden, l == 0 ? pad16(s.in) : s.hidden};
}
__host__ __device__ inline int mat_real_n(const FfmShape& s, int l) {
  return l == s.matrices - 1 ? s.out : s.hidden;
}
__host__ __device__ inline int mat_real_k(const FfmShape& s, int l) {
  return l == 0 ? s.in : s.hidden;
}

// f(n, k) for a matrix of d's dims: compile-time constants where it is W x W (the hidden layers
// where hidden is the register width; the first and last too where in / out pad to it), so that the
// layer's GEMM, bias and fragment loops carry no bound checks and its ldmatrix addresses fold into
// immediates; the runtime dims otherwise (a second copy of the layer's code). H100, bf16, 4 hidden
// layers, 2^21 rows, erf GELU, ms, width 64 / 128: inference 0.678 / 1.887 -> 0.650 / 1.555,
// training 3.446 / 7.827 -> 3.354 / 7.158 (width 32: inference unchanged, training -5%).
template <int N>
struct Fixed {  // std::integral_constant, usable in device code without relaxed constexpr
  __host__ __device__ constexpr operator int() const { return N; }
};
template <int W, typename F>
__device__ __forceinline__ void with_layer_dims(MatDims d, F&& f) {
  if (d.n == W && d.k == W) {
    f(Fixed<W>{}, Fixed<W>{});
  } else {
    f(d.n, d.k);
  }
}

// Halves of shared memory holding matrix l: forward [n][k + kSkew], backward [k][n + kSkew].
__host__ __device__ inline int mat_elems(const FfmShape& s, int l, bool transposed) {
  const MatDims d = mat_dims(s, l);
  return transposed ? d.k * (d.n + kSkew) : d.n * (d.k + kSkew);
}

// A warp's staging tile, [16][stage_ld(W)], holds 16 rows of x, a hidden layer or y (forward), of
// grad_out, a hidden layer's gradient or grad_x (backward): what goes to or comes from global
// memory.
__host__ __device__ constexpr int stage_ld(int width) { return width + kSkew; }

// The most warps a block of this width runs. A width-128 block is alone on its SM (its weights fill
// shared memory), and 8 warps of 188 registers left that SM waiting on dependencies: it takes 12
// (at most 168 registers each) where their staging tiles fit beside the weights (warps_for). The
// width-64 forward takes 10, its backward 16 where it sums the weight gradients (one block per SM:
// the sums take 80 KB of shared memory), else 8 (see kMinBlocks).
__host__ __device__ constexpr int max_warps(int width, bool backward, bool weight_grads) {
  return width >= 128                  ? 12
         : width == 64 && weight_grads ? 16
         : width == 64 && !backward    ? 10
                                       : kWarps;
}

// The register width: the smallest of 16, 32, 64, 128 that holds every layer's features.
inline int width_of(const FfmShape& s) {
  int w = pad16(s.in) > s.hidden ? pad16(s.in) : s.hidden;
  w = pad16(s.out) > w ? pad16(s.out) : w;
  return w <= 16 ? 16 : w <= 32 ? 32 : w <= 64 ? 64 : 128;
}

// Floats of a block's parameter-gradient sums in shared memory: each matrix's at its padded dims,
// then its bias's (n floats) where the network has biases.
__host__ __device__ inline int param_sum_floats(const FfmShape& s, int l) {
  const MatDims d = mat_dims(s, l);
  return d.n * d.k + (s.has_bias ? d.n : 0);
}
__host__ __device__ inline int weight_grad_floats(const FfmShape& s) {
  int floats = 0;
  for (int l = 0; l < s.matrices; ++l) floats += param_sum_floats(s, l);
  return floats;
}
// Elements of every weight matrix and bias: a block's row of FfmBackward::weight_partial.
__host__ __device__ inline int weight_grad_elems(const FfmShape& s) {
  int elems = 0;
  for (int l = 0; l < s.matrices; ++l) {
    elems += mat_real_n(s, l) * (mat_real_k(s, l) + (s.has_bias ? 1 : 0));
  }
  return elems;
}

// Shared memory of one block of `warps` warps: every matrix, the fp32 biases (forward), the
// staging tiles; a backward that sums the weight gradients adds a second set of staging tiles
// (each layer's input) and the fp32 sums.
template <typename T>
size_t smem_bytes(const FfmShape& s, bool backward, bool weight_grads, int warps) {
  size_t halves = 0, biases = 0;
  for (int l = 0; l < s.matrices; ++l) {
    halves += mat_elems(s, l, backward);
    biases += mat_dims(s, l).n;
  }
  const size_t tiles = size_t(warps) * kTileRows * stage_ld(width_of(s)) * sizeof(T);
  return halves * sizeof(T) + (backward ? 0 : biases * sizeof(float)) + tiles +
         (weight_grads ? tiles + weight_grad_floats(s) * sizeof(float) : 0);
}

// Warps per block for s on this device: max_warps where that block fits its shared memory, else
// kWarps (deep width-128 networks on sm_87's 163 KiB, say).
template <typename T>
int warps_for(const FfmShape& s, bool backward, bool weight_grads, const DeviceInfo& dev) {
  const int most = max_warps(width_of(s), backward, weight_grads);
  return smem_bytes<T>(s, backward, weight_grads, most) <= size_t(dev.max_smem_optin) ? most
                                                                                      : kWarps;
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const float v[2] = {lo, hi};
  const Pack<T, 2> p = pack_from_acc<T, 2>(v);
  return *reinterpret_cast<const uint32_t*>(&p);
}

template <typename T>
__device__ __forceinline__ void unpack2(uint32_t bits, float& lo, float& hi) {
  const Pack<T, 2> p = *reinterpret_cast<const Pack<T, 2>*>(&bits);
  lo = to_acc(p.v[0]);
  hi = to_acc(p.v[1]);
}

__device__ __forceinline__ uint32_t load32(const void* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices from shared memory; lane i gives the address of row i % 8 of matrix i / 8
// and receives (row lane / 4, columns 2 * (lane % 4) + {0, 1}) of each: a B fragment pair. kTrans:
// (rows 2 * (lane % 4) + {0, 1}, column lane / 4) of each instead, the matrices transposed.
template <bool kTrans = false>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  }
#else
  __trap();
#endif
}

// d += a * b for one m16n8k16 tile, fp32 accumulation.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  __trap();  // ffm_supported() keeps the host from launching below sm_80
#endif
}

__device__ __forceinline__ float activate(MlpActivation act, float v) {
  switch (act) {
    case MlpActivation::kRelu:
      return v < 0.f ? 0.f : v;  // NaN stays NaN, as in torch.relu
    case MlpActivation::kGelu:
      return gelu_erf_fast(v);
    case MlpActivation::kGeluTanh:
      return gelu_tanh_fast(v);
    default:
      return v;
  }
}

// act'(x) from `src`: the pre-activation for the GELUs, the pre-activation or the output for ReLU
// (same sign); none is 1.
__device__ __forceinline__ float activate_grad(MlpActivation act, float src) {
  switch (act) {
    case MlpActivation::kRelu:
      return src > 0.f ? 1.f : 0.f;
    case MlpActivation::kGelu:
      return gelu_erf_grad_fast(src);
    case MlpActivation::kGeluTanh:
      return gelu_tanh_grad_fast(src);
    default:
      return 1.f;
  }
}

// act, and act with act', as functors with the activation fixed at compile time.
template <MlpActivation A>
struct Activate {
  __device__ __forceinline__ float operator()(float v) const { return activate(A, v); }
};
// (act(x), act'(x)) from the saved tile's x: the GELUs' pre-activation, whose Gaussian both
// share (one evaluation after inlining); ReLU's x is its output already and stays.
template <MlpActivation A>
struct ActivateWithGrad {
  __device__ __forceinline__ float2 operator()(float x) const {
    return {A == MlpActivation::kRelu ? x : activate(A, x), activate_grad(A, x)};
  }
};

// f(Fn<act>{}) with act fixed at compile time: one switch per layer around f's loop, not one per
// element (per element it kept the GELUs from interleaving). none does nothing: identity, act' 1.
template <template <MlpActivation> class Fn, typename F>
__device__ __forceinline__ void with_activation(MlpActivation act, F&& f) {
  switch (act) {
    case MlpActivation::kRelu:
      f(Fn<MlpActivation::kRelu>{});
      break;
    case MlpActivation::kGelu:
      f(Fn<MlpActivation::kGelu>{});
      break;
    case MlpActivation::kGeluTanh:
      f(Fn<MlpActivation::kGeluTanh>{});
      break;
    default:
      break;
  }
}

// act over every accumulator.
template <int W>
__device__ __forceinline__ void activate_all(float (&c)[W / 8][4], MlpActivation act) {
  with_activation<Activate>(act, [&c](auto fn) {
#pragma unroll
    for (int nt = 0; nt < W / 8; ++nt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) c[nt][j] = fn(c[nt][j]);
    }
  });
}

// c[nt][j] *= act'(x) for the n columns, x read at the accumulator's places from the saved tile
// (q points at row g, column 2t of it). kToInput: the tile also becomes the layer's output act(x),
// in place (each lane rewrites the elements it read): the input of the weight gradient below it,
// recomputed rather than saved by the forward.
template <typename T, int W, bool kToInput>
__device__ __forceinline__ void mul_activate_grad(float (&c)[W / 8][4], T* q, int n,
                                                  MlpActivation act) {
  constexpr int ld = stage_ld(W);
  with_activation<ActivateWithGrad>(act, [&](auto fn) {
#pragma unroll
    for (int nt = 0; nt < W / 8; ++nt) {
      if (nt * 8 < n) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t* pair = reinterpret_cast<uint32_t*>(q + 8 * h * ld + nt * 8);
          float x0, x1;
          unpack2<T>(*pair, x0, x1);
          const float2 v0 = fn(x0), v1 = fn(x1);
          c[nt][2 * h] *= v0.y;
          c[nt][2 * h + 1] *= v1.y;
          if constexpr (kToInput) *pair = pack2<T>(v0.x, v1.x);
        }
      }
    }
  });
}

// Whether a [rows, cols] matrix at p takes the 16-byte path (load_matrix, load_tile, store_tile).
template <typename T>
__device__ __forceinline__ bool vec_ok(const T* p, int cols) {
  return cols % (16 / sizeof(T)) == 0 && is_aligned16(p);
}

// Matrix w ([n_real, k_real] row-major) into shared memory as [n][k + kSkew], or transposed as
// [k][n + kSkew]; zero outside the real matrix so that padded features stay exactly 0. Where w
// needs no padding and its rows are 16-byte multiples, 16-byte loads, kBatch of them in flight
// per thread (element by element, each launch of a width-128 backward took ~84 us longer: H200,
// nine launches 4084 -> 3332 us); the transposed copy gives consecutive lanes consecutive rows,
// so that a warp's 2-byte stores of one column fill consecutive halves (no bank conflicts).
template <typename T>
__device__ void load_matrix(T* dst, const T* w, int n_real, int k_real, MatDims d,
                            bool transposed) {
  constexpr int kV = 16 / sizeof(T), kBatch = 4;
  if (n_real == d.n && k_real == d.k && vec_ok(w, k_real)) {
    const int row_chunks = d.k / kV, chunks = d.n * row_chunks;
    for (int i0 = threadIdx.x; i0 < chunks; i0 += kBatch * blockDim.x) {
      Pack<T, kV> v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = i0 + b * blockDim.x;
        const int r = transposed ? i % d.n : i / row_chunks;
        const int c = (transposed ? i / d.n : i % row_chunks) * kV;
        if (i < chunks) v[b] = load_pack<T, kV>(w + r * d.k + c);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = i0 + b * blockDim.x;
        const int r = transposed ? i % d.n : i / row_chunks;
        const int c = (transposed ? i / d.n : i % row_chunks) * kV;
        if (i >= chunks) break;
        if (transposed) {
#pragma unroll
          for (int j = 0; j < kV; ++j) dst[(c + j) * (d.n + kSkew) + r] = v[b].v[j];
        } else {
          store_pack<T, kV>(dst + r * (d.k + kSkew) + c, v[b]);
        }
      }
    }
    return;
  }
  const T zero = from_acc<T>(0.f);
  for (int i = threadIdx.x; i < d.n * d.k; i += blockDim.x) {
    const int r = i / d.k, c = i % d.k;
    const T v = r < n_real && c < k_real ? w[r * k_real + c] : zero;
    if (transposed) {
      dst[c * (d.n + kSkew) + r] = v;
    } else {
      dst[r * (d.k + kSkew) + c] = v;
    }
  }
}

// f(row, column) for the 16-byte chunks of a 16 x W tile, each lane one chunk per pass: chunk
// lane % (W / V) of row lane / (W / V), the next rows on the next pass. Every index is a shift
// (the widths are powers of two): no division per element.
template <typename T, int W, typename F>
__device__ __forceinline__ void for_tile_chunks(int lane, F&& f) {
  constexpr int kV = 16 / sizeof(T), kChunks = W / kV, kRowsPerPass = 32 / kChunks;
  static_assert(kChunks <= 32 && kTileRows % kRowsPerPass == 0);
  const int r = lane / kChunks, c = lane % kChunks * kV;
#pragma unroll
  for (int pass = 0; pass < kTileRows / kRowsPerPass; ++pass) f(r + pass * kRowsPerPass, c);
}

// Rows [r0, r0 + 16) of src [rows, cols] into the warp's staging tile, zero past `rows` and in
// columns [cols, W). With `deriv`, each element is multiplied by act'(deriv[same place]) (the
// output layer's gradient). `vec`: cols is a multiple of 16 bytes and src (and deriv) 16-byte
// aligned, for coalesced 16-byte loads; otherwise one element per lane and step.
template <typename T, int W>
__device__ __forceinline__ void load_tile(T* stage, const T* src, int64_t r0, int64_t rows,
                                          int cols, bool vec, const T* deriv, MlpActivation act,
                                          int lane) {
  constexpr int kV = 16 / sizeof(T), kLd = stage_ld(W);
  const int valid = rows - r0 < kTileRows ? int(rows - r0) : kTileRows;
  src += r0 * cols;
  if (deriv) deriv += r0 * cols;
  if (vec) {
    for_tile_chunks<T, W>(lane, [&](int r, int c) {
      Pack<T, kV> v;
      if (r < valid && c < cols) {
        v = load_pack<T, kV>(src + r * cols + c);
        if (deriv) {
          const Pack<T, kV> d = load_pack<T, kV>(deriv + r * cols + c);
#pragma unroll
          for (int j = 0; j < kV; ++j) {
            v.v[j] = from_acc<T>(to_acc(v.v[j]) * activate_grad(act, to_acc(d.v[j])));
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < kV; ++j) v.v[j] = from_acc<T>(0.f);
      }
      store_pack<T, kV>(stage + r * kLd + c, v);
    });
  } else {
#pragma unroll 1  // the rare path (unaligned or odd widths): kept compact
    for (int i = lane; i < kTileRows * W; i += 32) {
      const int r = i / W, c = i % W;
      float v = 0.f;
      if (r < valid && c < cols) {
        v = to_acc(src[r * cols + c]);
        if (deriv) v *= activate_grad(act, to_acc(deriv[r * cols + c]));
      }
      stage[r * kLd + c] = from_acc<T>(v);
    }
  }
}

// 16 bytes from global to shared memory without passing through registers, or 16 zero bytes when
// !valid (nothing is read then); complete once cp_async_wait has returned.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// load_tile's 16-byte path without a derivative, started but not waited for: the tile lands in
// the staging tile while the warp computes (cp_async_wait, then __syncwarp, before reading it).
template <typename T, int W>
__device__ __forceinline__ void load_tile_async(T* stage, const T* src, int64_t r0, int64_t rows,
                                                int cols, int lane) {
  const int valid = rows - r0 < kTileRows ? int(rows - r0) : kTileRows;
  src += r0 * cols;
  for_tile_chunks<T, W>(lane, [&](int r, int c) {
    const bool in = r < valid && c < cols;
    cp_async16(stage + r * stage_ld(W) + c, in ? src + r * cols + c : src, in);
  });
}

// The warp's staging tile back to rows [r0, r0 + 16) of dst [rows, cols], stopping at `rows`.
// `vec` as for load_tile.
template <typename T, int W>
__device__ __forceinline__ void store_tile(T* dst, const T* stage, int64_t r0, int64_t rows,
                                           int cols, bool vec, int lane) {
  constexpr int kV = 16 / sizeof(T), kLd = stage_ld(W);
  const int valid = rows - r0 < kTileRows ? int(rows - r0) : kTileRows;
  dst += r0 * cols;
  if (vec) {
    for_tile_chunks<T, W>(lane, [&](int r, int c) {
      if (r < valid && c < cols) {
        store_pack_global<T, kV>(dst + r * cols + c, load_pack<T, kV>(stage + r * kLd + c));
      }
    });
  } else {
#pragma unroll 1  // the rare path (unaligned or odd widths): kept compact
    for (int i = lane; i < kTileRows * W; i += 32) {
      const int r = i / W, c = i % W;
      if (r < valid && c < cols) dst[r * cols + c] = stage[r * kLd + c];
    }
  }
}

// A fragments of the staging tile's first k (a multiple of 16) columns.
template <typename T, int W>
__device__ __forceinline__ void tile_to_frags(uint32_t (&a)[W / 16][4], const T* stage, int k,
                                              int lane) {
  constexpr int ld = stage_ld(W);
  const T* p = stage + (lane >> 2) * ld + 2 * (lane & 3);
#pragma unroll
  for (int kt = 0; kt < W / 16; ++kt) {
    if (kt * 16 < k) {
      a[kt][0] = load32(p + kt * 16);
      a[kt][1] = load32(p + 8 * ld + kt * 16);
      a[kt][2] = load32(p + kt * 16 + 8);
      a[kt][3] = load32(p + 8 * ld + kt * 16 + 8);
    }
  }
}

// The accumulators of n (a multiple of 16) columns as the next layer's A fragments.
template <typename T, int W>
__device__ __forceinline__ void acc_to_frags(uint32_t (&a)[W / 16][4], const float (&c)[W / 8][4],
                                             int n) {
#pragma unroll
  for (int kt = 0; kt < W / 16; ++kt) {
    if (kt * 16 < n) {
      a[kt][0] = pack2<T>(c[2 * kt][0], c[2 * kt][1]);
      a[kt][1] = pack2<T>(c[2 * kt][2], c[2 * kt][3]);
      a[kt][2] = pack2<T>(c[2 * kt + 1][0], c[2 * kt + 1][1]);
      a[kt][3] = pack2<T>(c[2 * kt + 1][2], c[2 * kt + 1][3]);
    }
  }
}

// The accumulators of n columns into the staging tile (rounded to T).
template <typename T, int W>
__device__ __forceinline__ void acc_to_tile(T* stage, const float (&c)[W / 8][4], int n, int lane) {
  constexpr int ld = stage_ld(W);
  T* p = stage + (lane >> 2) * ld + 2 * (lane & 3);
#pragma unroll
  for (int nt = 0; nt < W / 8; ++nt) {
    if (nt * 8 < n) {
      *reinterpret_cast<uint32_t*>(p + nt * 8) = pack2<T>(c[nt][0], c[nt][1]);
      *reinterpret_cast<uint32_t*>(p + 8 * ld + nt * 8) = pack2<T>(c[nt][2], c[nt][3]);
    }
  }
}

// The accumulators (n columns) to rows [r0, r0 + 16) of dst [rows, cols], rounded to T, through
// the staging tile: coalesced 16-byte stores where the row length allows.
template <typename T, int W>
__device__ __forceinline__ void store_acc(T* dst, T* stage, const float (&c)[W / 8][4], int n,
                                          int64_t r0, int64_t rows, int cols, bool vec, int lane) {
  acc_to_tile<T, W>(stage, c, n, lane);
  __syncwarp();
  store_tile<T, W>(dst, stage, r0, rows, cols, vec, lane);
  __syncwarp();
}

// A warp's bias-gradient partials, one float per column in global memory, each column owned by
// lane c % 32: the tile's column sums are added in a fixed order (deterministic). The old values
// are read before the layer's work (prefetch) so that the add doesn't wait on L2.
template <int W>
struct ColumnSums {
  static constexpr int kPerLane = (W + 31) / 32;
  float prev[kPerLane];

  __device__ __forceinline__ void prefetch(const float* partial, int cols, int lane) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int c = lane + 32 * j;
      prev[j] = c < cols ? partial[c] : 0.f;
    }
  }

  // partial[c] = prev + the sum of column c over the staging tile's first `valid` rows. Ends with
  // __syncwarp: the staging tile is free for the next write.
  template <typename T>
  __device__ __forceinline__ void add(float* partial, const T* stage, int valid, int cols,
                                      int lane) const {
    constexpr int ld = stage_ld(W);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int c = lane + 32 * j;
      if (c < cols) {
        float sum = prev[j];
        if (valid == kTileRows) {  // every load in flight before the first add; the same order
          float v[kTileRows];
#pragma unroll
          for (int r = 0; r < kTileRows; ++r) v[r] = to_acc(stage[r * ld + c]);
#pragma unroll
          for (int r = 0; r < kTileRows; ++r) sum += v[r];
        } else {
          for (int r = 0; r < valid; ++r) sum += to_acc(stage[r * ld + c]);
        }
        partial[c] = sum;
      }
    }
    __syncwarp();
  }
};

// c[16 x n] += a[16 x k] * B, B[k][n] = ws[n * ldw + k] in shared memory (n, k multiples of 16).
// One ldmatrix.x4 brings the B fragments of two n8 tiles for one k16 step: matrices (n 0-7 | 8-15)
// x (k 0-7 | 8-15), lane i addressing row i % 8 of matrix i / 8.
template <typename T, int W>
__device__ __forceinline__ void warp_gemm(float (&c)[W / 8][4], const uint32_t (&a)[W / 16][4],
                                          const T* ws, int ldw, int n, int k, int lane) {
  const uint32_t base =
      smem_addr(ws + ((lane & 7) + (lane >> 4) * 8) * ldw + ((lane >> 3) & 1) * 8);
  const uint32_t pair_stride = 16 * ldw * sizeof(T);
#pragma unroll
  for (int kt = 0; kt < W / 16; ++kt) {
    if (kt * 16 < k) {
#pragma unroll
      for (int np = 0; np < W / 16; ++np) {
        if (np * 16 < n) {
          uint32_t b[4];
          ldmatrix_x4(b, base + np * pair_stride + kt * 16 * sizeof(T));
          mma16816<T>(c[2 * np], a[kt], b[0], b[1]);
          mma16816<T>(c[2 * np + 1], a[kt], b[2], b[3]);
        }
      }
    }
  }
}

// The block's weight gradient of one matrix, sums[n][k] += G^T A over the block's warps * 16 rows:
// G, the gradient of the matrix's output ([rows][n]), and A, its input ([rows][k]), are the
// warps' staging tiles side by side ([warps * 16][stage_ld(W)], row r of warp w's tile is block
// row 16 w + r). Warp w owns the 16 x 16 units u = w, w + warps, ... of the matrix and keeps their
// fp32 sums in shared memory in fragment order (lane i's 8 floats of unit u at (32 u + i) * 8): no
// two warps touch the same sums and each adds its rows in one order, so the sums are deterministic.
// Both operands come through ldmatrix.trans: G^T is the MMA's A, read column-major; A is its B
// (B[k = row][n = feature], row-major in the tile). With bias_sums ([n] floats, else null) the
// bias gradient too, the column sums of G, in the same way.
template <typename T, int W>
__device__ __forceinline__ void accumulate_weight_grad(float* sums, float* bias_sums,
                                                       const T* g_tiles, const T* a_tiles, int n,
                                                       int k, int warp, int warps, int lane) {
  constexpr int ld = stage_ld(W);
  constexpr uint32_t kStep = 16 * ld * sizeof(T);  // 16 block rows: one MMA's K
  // Lane i addresses row i % 8 of 8x8 matrix i / 8. G^T's A fragment: matrices (features 0-7 |
  // 8-15) x (rows 0-7 | 8-15), rows outer; A's B fragments for two n8 tiles: (rows 0-7 | 8-15) x
  // (features 0-7 | 8-15), features outer.
  const uint32_t g_lane =
      smem_addr(g_tiles + ((lane >> 4) * 8 + (lane & 7)) * ld + ((lane >> 3) & 1) * 8);
  const uint32_t a_lane =
      smem_addr(a_tiles + (((lane >> 3) & 1) * 8 + (lane & 7)) * ld + (lane >> 4) * 8);
  const int k_units = k / 16, units = n / 16 * k_units;
  for (int u = warp; u < units; u += warps) {
    const uint32_t g_addr = g_lane + u / k_units * 16 * sizeof(T);
    const uint32_t a_addr = a_lane + u % k_units * 16 * sizeof(T);
    float4* mine = reinterpret_cast<float4*>(sums + (u * 32 + lane) * 8);
    const float4 s0 = mine[0], s1 = mine[1];
    float c[2][4] = {{s0.x, s0.y, s0.z, s0.w}, {s1.x, s1.y, s1.z, s1.w}};
#pragma unroll 2  // warps is even here (8 or 16): the next loads ahead of these MMAs
    for (int r = 0; r < warps; ++r) {
      uint32_t ga[4], ab[4];
      ldmatrix_x4<true>(ga, g_addr + r * kStep);
      ldmatrix_x4<true>(ab, a_addr + r * kStep);
      mma16816<T>(c[0], ga, ab[0], ab[1]);
      mma16816<T>(c[1], ga, ab[2], ab[3]);
    }
    mine[0] = make_float4(c[0][0], c[0][1], c[0][2], c[0][3]);
    mine[1] = make_float4(c[1][0], c[1][1], c[1][2], c[1][3]);
  }
  if (!bias_sums) return;
  // The bias gradient, 16 features at a time: G^T times a ones fragment, each of the 16 x 8
  // result's columns the features' sums (lane i holds features i / 4 and i / 4 + 8). These units
  // come after the weight's in the warps' rotation: idle warps take them where the weight has
  // fewer units than the block has warps, else they spread over the schedulers.
  const uint32_t ones = pack2<T>(1.f, 1.f);
  for (int u = (warp - units % warps + warps) % warps; u < n / 16; u += warps) {
    float* const bias = bias_sums + u * 16 + (lane >> 2);
    float c[4] = {bias[0], bias[0], bias[8], bias[8]};
#pragma unroll 4
    for (int r = 0; r < warps; ++r) {
      uint32_t ga[4];
      ldmatrix_x4<true>(ga, g_lane + u * 16 * sizeof(T) + r * kStep);
      mma16816<T>(c, ga, ones, ones);
    }
    if ((lane & 3) == 0) bias[0] = c[0], bias[8] = c[2];
  }
}

// A warp's units of one matrix's sums (fragment order, see accumulate_weight_grad) to dst, the
// matrix's [n_real][k_real] row-major place in the block's partial: the padding is dropped.
__device__ __forceinline__ void store_weight_grad(float* dst, const float* sums, int n, int k,
                                                  int n_real, int k_real, int warp, int warps,
                                                  int lane) {
  const int g = lane >> 2, t2 = 2 * (lane & 3);
  const int k_units = k / 16, units = n / 16 * k_units;
  for (int u = warp; u < units; u += warps) {
    const float* mine = sums + (u * 32 + lane) * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) {  // n8 tile i / 4; rows g (i % 4 < 2) or g + 8; column pair i % 2
      const int row = u / k_units * 16 + g + (i & 2) * 4,
                col = u % k_units * 16 + (i >> 2) * 8 + t2 + (i & 1);
      if (row < n_real && col < k_real) dst[row * k_real + col] = mine[i];
    }
  }
}

template <int W>
__device__ __forceinline__ void zero_acc(float (&c)[W / 8][4]) {
#pragma unroll
  for (int nt = 0; nt < W / 8; ++nt) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.f;
}

// Blocks per SM the register budget is set for: the narrow widths are latency-bound and want more
// warps (their shared memory allows it); 128 wide, the weights fill shared memory. At width 64 both
// directions run 2: the backward's 8 warps at most 128 registers (at 80 it spilled inside its
// GEMMs), the forward's 10 at 96, where each warp's GELUs overlap more than at 80. H100, bf16, 4
// hidden layers, 2^21 rows, forward warps x blocks (registers) 8 x 3 (80, 22 bytes spilled) /
// 8 x 2 (123) / 10 x 2 (96) / 6 x 3 (96), ms: inference erf 0.644-0.654 / 0.627-0.637 /
// 0.629-0.632 / 0.689-0.702, gelu_tanh 0.534 / 0.556 / 0.522 / 0.583; training erf 3.354-3.365 /
// 3.324-3.333 / 3.326-3.327 / 3.390-3.400. Width 32 (64 registers) at 3 or 2 blocks: within 1%.
// A backward that sums the weight gradients: width 64 one block of 16 warps (128 registers), the
// narrower widths 3 blocks of 8 (80; at 64, ptxas spilled 196 bytes at width 32).
template <int W, bool kWeightGrads = false>
constexpr int kMinBlocks = W >= 128       ? 1
                           : kWeightGrads ? (W == 64 ? 1 : 3)
                           : W == 64      ? 2
                                          : 4;

// Persistent blocks: each loads the weights once, then walks tiles of (its warps) x 16 rows.
template <typename T, int W>
__global__ void __launch_bounds__(max_warps(W, false, false) * 32, kMinBlocks<W>)
    ffm_forward_kernel(const FfmForward<T> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const FfmShape& s = p.s;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int t2 = 2 * (lane & 3);

  T* weights = reinterpret_cast<T*>(smem);
  int halves = 0, nbias = 0;
  for (int l = 0; l < s.matrices; ++l) {
    load_matrix(weights + halves, p.w[l], mat_real_n(s, l), mat_real_k(s, l), mat_dims(s, l),
                false);
    halves += mat_elems(s, l, false);
    nbias += mat_dims(s, l).n;
  }
  float* biases = reinterpret_cast<float*>(weights + halves);
  for (int l = 0, off = 0; l < s.matrices; off += mat_dims(s, l).n, ++l) {
    for (int i = threadIdx.x; i < mat_dims(s, l).n; i += blockDim.x) {
      biases[off + i] = s.has_bias && i < mat_real_n(s, l) ? to_acc(p.b[l][i]) : 0.f;
    }
  }
  T* stage = reinterpret_cast<T*>(biases + nbias) + warp * kTileRows * stage_ld(W);
  // Whether each matrix the kernel reads or writes takes the 16-byte path (uniform).
  const bool x_vec = vec_ok(p.x, s.in), y_vec = vec_ok(p.y, s.out);
  const bool out_pre_vec = p.out_pre && vec_ok(p.out_pre, s.out);
  __syncthreads();

  const int64_t tiles = (s.rows + warps * kTileRows - 1) / (warps * kTileRows);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t r0 = (tile * warps + warp) * kTileRows;
    if (r0 >= s.rows) break;  // no block-wide barrier below: warps finish independently
    load_tile<T, W>(stage, p.x, r0, s.rows, s.in, x_vec, static_cast<const T*>(nullptr),
                    MlpActivation::kNone, lane);
    __syncwarp();
    uint32_t a[W / 16][4];
    tile_to_frags<T, W>(a, stage, pad16(s.in), lane);
    __syncwarp();  // the staging tile is written again by the output layer

    float c[W / 8][4];
    const T* ws = weights;
    const float* bias = biases;
    for (int l = 0; l < s.matrices; ++l) {
      with_layer_dims<W>(mat_dims(s, l), [&](auto n, auto k) {
#pragma unroll
        for (int nt = 0; nt < W / 8; ++nt) {
          if (nt * 8 < n) {
            const float b0 = bias[nt * 8 + t2], b1 = bias[nt * 8 + t2 + 1];
            c[nt][0] = c[nt][2] = b0;
            c[nt][1] = c[nt][3] = b1;
          }
        }
        warp_gemm<T, W>(c, a, ws, k + kSkew, n, k, lane);

        if (l + 1 < s.matrices) {  // a hidden layer: save for the backward, activate, feed on
          const int64_t layer = int64_t(l) * s.rows * s.hidden;
          // The saves are [rows, hidden] in buffers of our own: 16-byte rows, aligned.
          if (p.hidden_pre) {
            store_acc<T, W>(p.hidden_pre + layer, stage, c, n, r0, s.rows, s.hidden, true, lane);
          }
          activate_all<W>(c, s.act);
          if (p.hidden_act) {
            store_acc<T, W>(p.hidden_act + layer, stage, c, n, r0, s.rows, s.hidden, true, lane);
          }
          acc_to_frags<T, W>(a, c, n);
        } else {  // the output layer
          if (p.out_pre) {
            store_acc<T, W>(p.out_pre, stage, c, n, r0, s.rows, s.out, out_pre_vec, lane);
          }
          activate_all<W>(c, s.out_act);
          store_acc<T, W>(p.y, stage, c, n, r0, s.rows, s.out, y_vec, lane);
        }
      });
      ws += mat_elems(s, l, false);
      bias += mat_dims(s, l).n;
    }
  }
}

// Walks the layers backward: grad of the output's pre-activation -> through W_L^T -> times act'
// -> grad of hidden layer L-1's pre-activation -> ... -> through W_0^T -> grad_x. kWeightGrads:
// each layer's weight gradient is summed here too (accumulate_weight_grad, the block's warps in
// step, two barriers per layer), its input act(pre) recomputed from the saved pre-activation;
// else each pre-activation gradient is stored for the host's weight GEMMs.
template <typename T, int W, bool kWeightGrads>
__global__ void __launch_bounds__(max_warps(W, true, kWeightGrads) * 32,
                                  kMinBlocks<W, kWeightGrads>)
    ffm_backward_kernel(const FfmBackward<T> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const FfmShape& s = p.s;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int g = lane >> 2, t2 = 2 * (lane & 3);
  constexpr int ld = stage_ld(W);

  T* weights = reinterpret_cast<T*>(smem);
  int halves = 0;
  for (int l = 0; l < s.matrices; ++l) {
    load_matrix(weights + halves, p.w[l], mat_real_n(s, l), mat_real_k(s, l), mat_dims(s, l), true);
    halves += mat_elems(s, l, true);
  }
  // The staging tiles: the warp's gradient tile (stage), then with kWeightGrads its input tile
  // (the layer's saved tile, then act of it), each set [warps * 16][ld], then the fp32 sums.
  T* const grad_tiles = weights + halves;
  T* const input_tiles = grad_tiles + warps * kTileRows * ld;
  T* stage = grad_tiles + warp * kTileRows * ld;
  T* input = input_tiles + warp * kTileRows * ld;
  float* const weight_sums = reinterpret_cast<float*>(input_tiles + warps * kTileRows * ld);
  if constexpr (kWeightGrads) {
    for (int i = threadIdx.x; i < weight_grad_floats(s); i += blockDim.x) weight_sums[i] = 0.f;
  }
  float* partial = !kWeightGrads && p.bias_partial
                       ? p.bias_partial + (int64_t(blockIdx.x) * warps + warp) * s.matrices * W
                       : nullptr;
  if (partial && !p.bias_partial_adds) {
    for (int i = lane; i < s.matrices * W; i += 32) partial[i] = 0.f;
  }
  __syncthreads();

  // The saved tile of each hidden layer: the GELUs' pre-activation (their output is recomputed:
  // into the input tile with kWeightGrads, else to hidden_out), else the output (ReLU's
  // derivative reads its sign; a weight gradient reads it as the next matrix's input).
  const T* saved = p.hidden_pre ? p.hidden_pre : p.hidden_act;
  // The tile act' comes from, if any; kWeightGrads loads `saved` for every activation.
  const T* deriv = s.act == MlpActivation::kNone ? nullptr : saved;
  const T* load = kWeightGrads ? saved : deriv;
  T* const load_to = kWeightGrads ? input : stage;
  // Whether each matrix takes the 16-byte path (uniform). The saves and grad_hidden_pre have
  // 16-byte rows (hidden is a multiple of 16); the saves may still sit at any offset.
  const bool go_vec = vec_ok(p.grad_out, s.out) && (!p.out_pre || vec_ok(p.out_pre, s.out));
  const bool go_pre_vec = p.grad_out_pre && vec_ok(p.grad_out_pre, s.out);
  const bool load_vec = load && vec_ok(load, s.hidden);
  const bool ghp_vec = !kWeightGrads && vec_ok(p.grad_hidden_pre, s.hidden);
  const bool gx_vec = vec_ok(p.grad_x, s.in), x_vec = kWeightGrads && vec_ok(p.x, s.in);
  const int64_t tiles = (s.rows + warps * kTileRows - 1) / (warps * kTileRows);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t r0 = (tile * warps + warp) * kTileRows;
    // kWeightGrads: every warp takes part in the block's barriers; past the rows its tiles are 0.
    if (!kWeightGrads && r0 >= s.rows) break;
    const int valid = s.rows - r0 < kTileRows ? int(s.rows - r0) : kTileRows;
    ColumnSums<W> sums;
    float* out_partial = partial ? partial + (s.matrices - 1) * W : nullptr;
    if (partial) sums.prefetch(out_partial, s.out, lane);
    load_tile<T, W>(stage, p.grad_out, r0, s.rows, s.out, go_vec, p.out_pre, s.out_act, lane);
    __syncwarp();
    if (p.grad_out_pre) {
      store_tile<T, W>(p.grad_out_pre, stage, r0, s.rows, s.out, go_pre_vec, lane);
    }
    if (partial) sums.add(out_partial, stage, valid, s.out, lane);
    uint32_t a[W / 16][4];
    tile_to_frags<T, W>(a, stage, pad16(s.out), lane);
    __syncwarp();

    // The block's weight (and bias) gradient of matrix l (n x k), matrices walked last to first.
    int sums_offset = weight_grad_floats(s);
    const auto weight_grad = [&](int n, int k) {
      sums_offset -= n * k + (s.has_bias ? n : 0);
      float* const sums = weight_sums + sums_offset;
      __syncthreads();  // every warp's tiles written
      accumulate_weight_grad<T, W>(sums, s.has_bias ? sums + n * k : nullptr, grad_tiles,
                                   input_tiles, n, k, warp, warps, lane);
      __syncthreads();  // and read
    };
    float c[W / 8][4];
    const T* ws = weights + halves;
    for (int l = s.matrices - 1; l >= 1; --l) {  // into hidden layer l - 1
      ws -= mat_elems(s, l, true);
      float* layer_partial = partial ? partial + (l - 1) * W : nullptr;
      if (partial) sums.prefetch(layer_partial, s.hidden, lane);
      const int64_t layer = int64_t(l - 1) * s.rows * s.hidden;
      const T* const load_layer = load ? load + int64_t(l - 1) * p.saved_layer_stride : nullptr;
      // The saved tile of this layer, through a staging tile (coalesced): fetched during the GEMM
      // where the 16-byte path allows.
      if (load_vec) load_tile_async<T, W>(load_to, load_layer, r0, s.rows, s.hidden, lane);
      zero_acc<W>(c);
      with_layer_dims<W>(mat_dims(s, l), [&](auto n, auto k) {
        warp_gemm<T, W>(c, a, ws, n + kSkew, k, n, lane);
        if (load) {
          if (load_vec) {
            cp_async_wait();
          } else {
            load_tile<T, W>(load_to, load_layer, r0, s.rows, s.hidden, false,
                            static_cast<const T*>(nullptr), MlpActivation::kNone, lane);
          }
          __syncwarp();
          if (kWeightGrads || p.hidden_out) {
            mul_activate_grad<T, W, true>(c, load_to + g * ld + t2, k, s.act);
          } else {
            mul_activate_grad<T, W, false>(c, load_to + g * ld + t2, k, s.act);
          }
          __syncwarp();
          if (!kWeightGrads && p.hidden_out) {  // our own buffer: 16-byte rows, aligned
            store_tile<T, W>(p.hidden_out + layer, stage, r0, s.rows, s.hidden, true, lane);
            __syncwarp();
          }
        }
        if constexpr (kWeightGrads) {
          weight_grad(n, k);
          acc_to_tile<T, W>(stage, c, k, lane);
          __syncwarp();
        } else {
          store_acc<T, W>(p.grad_hidden_pre + layer, stage, c, k, r0, s.rows, s.hidden, ghp_vec,
                          lane);
        }
        if (partial) sums.add(layer_partial, stage, valid, s.hidden, lane);
        acc_to_frags<T, W>(a, c, k);
      });
    }
    if constexpr (kWeightGrads) {  // x, the first matrix's input
      if (x_vec) {
        load_tile_async<T, W>(input, p.x, r0, s.rows, s.in, lane);
      } else {
        load_tile<T, W>(input, p.x, r0, s.rows, s.in, false, static_cast<const T*>(nullptr),
                        MlpActivation::kNone, lane);
      }
    }
    zero_acc<W>(c);
    with_layer_dims<W>(mat_dims(s, 0), [&](auto n, auto k) {
      warp_gemm<T, W>(c, a, weights, n + kSkew, k, n, lane);
      if constexpr (kWeightGrads) {
        cp_async_wait();
        weight_grad(n, k);
      }
      store_acc<T, W>(p.grad_x, stage, c, k, r0, s.rows, s.in, gx_vec, lane);
    });
  }
  if constexpr (kWeightGrads) {  // the block's sums: each warp its own units, any warp the biases
    float* dst = p.weight_partial + int64_t(blockIdx.x) * weight_grad_elems(s);
    for (int l = 0, offset = 0; l < s.matrices; ++l) {
      const MatDims d = mat_dims(s, l);
      const int n_real = mat_real_n(s, l), k_real = mat_real_k(s, l);
      store_weight_grad(dst, weight_sums + offset, d.n, d.k, n_real, k_real, warp, warps, lane);
      dst += n_real * k_real;
      if (s.has_bias) {  // the last weight_grad's barrier made every warp's bias sums visible
        for (int i = threadIdx.x; i < n_real; i += blockDim.x) {
          dst[i] = weight_sums[offset + d.n * d.k + i];
        }
        dst += n_real;
      }
      offset += param_sum_floats(s, l);
    }
  }
}

// Blocks of `warps` warps and `smem` bytes that the device holds at once, at least one per SM
// (the launch reports any error). resident() also lets the kernel use all of the shared memory a
// block may opt into: always the maximum, so that a smaller problem never lowers the limit a
// larger one relies on.
template <typename Kernel>
int64_t resident_blocks(Kernel kernel, int warps, size_t smem, const DeviceInfo& dev) {
  return std::max(resident(kernel, {1, warps * 32, smem, 1}, dev), dev.sm_count);
}

// A tile of rows for each warp, in no more blocks than the device holds at once.
template <typename Kernel>
int grid_size(Kernel kernel, const FfmShape& s, int warps, size_t smem, const DeviceInfo& dev) {
  const int64_t tiles = (s.rows + warps * kTileRows - 1) / (warps * kTileRows);
  return int(std::min(tiles, resident_blocks(kernel, warps, smem, dev)));
}

template <typename T, typename Params, typename Kernel>
cudaError_t launch(Kernel kernel, const Params& p, bool backward, bool weight_grads,
                   const DeviceInfo& dev, cudaStream_t stream) {
  const int warps = warps_for<T>(p.s, backward, weight_grads, dev);
  const size_t smem = smem_bytes<T>(p.s, backward, weight_grads, warps);
  kernel<<<grid_size(kernel, p.s, warps, smem, dev), warps * 32, smem, stream>>>(p);
  return cudaGetLastError();
}

// Bytes of pre-activation gradients and GELU outputs a backward launch writes for the host's weight
// GEMMs, about, at most (FfmBackwardPlan::chunk_rows). Width 128, 4 hidden layers, 2^21 rows, H200,
// training step: unchunked 6.45 ms and 7172 MiB at peak (eager: 5252); 1 GiB chunks 6.47 ms and
// 4071 MiB; 512 MiB chunks 6.87 ms and 3579 MiB (cuBLASLt's GEMMs over fewer rows ran slower).
// And at least kMinChunks chunks: at 2^18 rows, one chunk 0.913 ms and 904 MiB (eager: 772), two
// 0.966 ms and 688 MiB, four 1.121 ms and 541 MiB.
constexpr int64_t kGemmChunkBytes = int64_t(1) << 30;
constexpr int64_t kMinChunks = 2;

// Whether the backward sums the weight gradients itself: up to width 64, where a block's fp32 sums
// (80 KB for five 64 x 64 matrices) fit beside the weights and both sets of staging tiles. Width
// 128's sums alone (64 KB a matrix) would not: the host runs GEMMs over grad_hidden_pre there.
template <typename T>
bool sums_weight_grads(const FfmShape& s, const DeviceInfo& dev) {
  const int warps = warps_for<T>(s, true, true, dev);
  return width_of(s) <= 64 && smem_bytes<T>(s, true, true, warps) <= size_t(dev.max_smem_optin);
}

// f(the backward kernel for s's width, that width).
template <typename T, typename F>
auto with_backward_kernel(const FfmShape& s, bool weight_grads, F&& f) {
  switch (width_of(s)) {
    case 16:
      return weight_grads ? f(ffm_backward_kernel<T, 16, true>, 16)
                          : f(ffm_backward_kernel<T, 16, false>, 16);
    case 32:
      return weight_grads ? f(ffm_backward_kernel<T, 32, true>, 32)
                          : f(ffm_backward_kernel<T, 32, false>, 32);
    case 64:
      return weight_grads ? f(ffm_backward_kernel<T, 64, true>, 64)
                          : f(ffm_backward_kernel<T, 64, false>, 64);
    default:  // never weight_grads (sums_weight_grads)
      return f(ffm_backward_kernel<T, 128, false>, 128);
  }
}

// A block per 32 consecutive outputs (the segment each falls in, its column of the partials) and
// kSumSlices slices of the rows: slice j adds rows j, j + kSumSlices, ... in order, then slice 0
// adds the slices' sums in order (deterministic). A width-128 backward's bias partials have ~1600
// rows (one per warp of its grid): one thread per output walking them took ~100 us; a step's two
// launches now take ~17 us together (H200).
constexpr int kSumSlices = 16;

template <typename T>
__global__ void __launch_bounds__(32 * kSumSlices)
    ffm_sum_partials_kernel(const float* partial, int64_t rows, int64_t cols,
                            const FfmSumSegments<T> seg) {
  __shared__ float slice_sums[kSumSlices][32];
  int i = blockIdx.x * 32 + threadIdx.x, s = 0;
  while (s < seg.count && i >= seg.n[s]) i -= seg.n[s++];
  const bool active = s < seg.count;
  float sum = 0.f;
  if (active) {
    const float* p = partial + seg.col[s] + i;
#pragma unroll 8
    for (int64_t r = threadIdx.y; r < rows; r += kSumSlices) sum += p[r * cols];
  }
  slice_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y > 0 || !active) return;
  for (int j = 1; j < kSumSlices; ++j) sum += slice_sums[j][threadIdx.x];
  seg.dst[s][i] = from_acc<T>(sum);
}

}  // namespace

bool ffm_supported(const FfmShape& s, const DeviceInfo& dev) {
  const bool dims = s.matrices >= 2 && s.matrices <= kFfmMaxMatrices && s.in >= 1 &&
                    s.in <= kFfmMaxFeatures && s.out >= 1 && s.out <= kFfmMaxFeatures &&
                    s.hidden >= 16 && s.hidden <= kFfmMaxFeatures && s.hidden % 16 == 0;
  if (!dims || dev.cc_major < 8) return false;
  // fp16 and bf16 need the same bytes.
  const size_t limit = size_t(dev.max_smem_optin);
  return smem_bytes<__half>(s, false, false, kWarps) <= limit &&
         smem_bytes<__half>(s, true, false, kWarps) <= limit;
}

template <typename T>
cudaError_t ffm_forward_cuda(const FfmForward<T>& p, const DeviceInfo& dev, cudaStream_t stream) {
  switch (width_of(p.s)) {
    case 16:
      return launch<T>(ffm_forward_kernel<T, 16>, p, false, false, dev, stream);
    case 32:
      return launch<T>(ffm_forward_kernel<T, 32>, p, false, false, dev, stream);
    case 64:
      return launch<T>(ffm_forward_kernel<T, 64>, p, false, false, dev, stream);
    default:
      return launch<T>(ffm_forward_kernel<T, 128>, p, false, false, dev, stream);
  }
}

int ffm_width(const FfmShape& s) { return width_of(s); }

template <typename T>
FfmBackwardPlan ffm_backward_plan(const FfmShape& s, const DeviceInfo& dev) {
  const bool weight_grads = sums_weight_grads<T>(s, dev);
  return with_backward_kernel<T>(s, weight_grads, [&](auto kernel, int width) {
    const int warps = warps_for<T>(s, true, weight_grads, dev);
    const size_t smem = smem_bytes<T>(s, true, weight_grads, warps);
    if (weight_grads) {
      return FfmBackwardPlan{
          true, s.rows, 0, grid_size(kernel, s, warps, smem, dev) * int64_t(weight_grad_elems(s))};
    }
    // Whole waves of the resident warps' tiles per chunk (each block walks as many tiles in every
    // full chunk): as many as keep the chunk's GEMM inputs within kGemmChunkBytes, and no more
    // than cover half the batch (kMinChunks: the whole batch's took a GELU network's step above
    // eager's peak).
    const int64_t wave_rows = resident_blocks(kernel, warps, smem, dev) * warps * kTileRows;
    const int64_t row_bytes =
        int64_t(sizeof(T)) * ((s.matrices - 1) * s.hidden * (is_gelu(s.act) ? 2 : 1) +
                              (s.out_act != MlpActivation::kNone ? s.out : 0));
    const int64_t budget_waves = std::max<int64_t>(kGemmChunkBytes / (row_bytes * wave_rows), 1);
    const int64_t share_waves = ceil_div(ceil_div(s.rows, kMinChunks), wave_rows);
    const int64_t chunk = std::min(s.rows, std::min(budget_waves, share_waves) * wave_rows);
    // Every launch adds to the first's per-warp partials (its grid is the largest).
    FfmShape first = s;
    first.rows = chunk;
    const int64_t partial =
        int64_t(grid_size(kernel, first, warps, smem, dev)) * warps * s.matrices * width;
    return FfmBackwardPlan{false, chunk, partial, 0};
  });
}

template <typename T>
cudaError_t ffm_backward_cuda(const FfmBackward<T>& p, const DeviceInfo& dev, cudaStream_t stream) {
  const bool weight_grads = sums_weight_grads<T>(p.s, dev);
  if (weight_grads != (p.weight_partial != nullptr)) return cudaErrorInvalidValue;  // see the plan
  return with_backward_kernel<T>(p.s, weight_grads, [&](auto kernel, int) {
    return launch<T>(kernel, p, true, weight_grads, dev, stream);
  });
}

template <typename T>
cudaError_t ffm_sum_partials(const float* partial, int64_t rows, int64_t cols,
                             const FfmSumSegments<T>& seg, cudaStream_t stream) {
  int total = 0;
  for (int i = 0; i < seg.count; ++i) total += seg.n[i];
  if (total > 0) {
    ffm_sum_partials_kernel<T>
        <<<(total + 31) / 32, dim3(32, kSumSlices), 0, stream>>>(partial, rows, cols, seg);
  }
  return cudaGetLastError();
}

template cudaError_t ffm_forward_cuda<__half>(const FfmForward<__half>&, const DeviceInfo&,
                                              cudaStream_t);
template cudaError_t ffm_forward_cuda<__nv_bfloat16>(const FfmForward<__nv_bfloat16>&,
                                                     const DeviceInfo&, cudaStream_t);
template FfmBackwardPlan ffm_backward_plan<__half>(const FfmShape&, const DeviceInfo&);
template FfmBackwardPlan ffm_backward_plan<__nv_bfloat16>(const FfmShape&, const DeviceInfo&);
template cudaError_t ffm_backward_cuda<__half>(const FfmBackward<__half>&, const DeviceInfo&,
                                               cudaStream_t);
template cudaError_t ffm_backward_cuda<__nv_bfloat16>(const FfmBackward<__nv_bfloat16>&,
                                                      const DeviceInfo&, cudaStream_t);

template cudaError_t ffm_sum_partials<__half>(const float*, int64_t, int64_t,
                                              const FfmSumSegments<__half>&, cudaStream_t);
template cudaError_t ffm_sum_partials<__nv_bfloat16>(const float*, int64_t, int64_t,
                                                     const FfmSumSegments<__nv_bfloat16>&,
                                                     cudaStream_t);

}  // namespace fusedops
