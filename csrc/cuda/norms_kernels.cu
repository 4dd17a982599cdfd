// layer_norm / rms_norm forward and backward (kRms: rms_norm, i.e. mean 0 and no bias).
// Ownership: each row belongs to a group of g consecutive threads, a warp (short rows, several
// rows per block, no barriers) or a block; each thread holds its share of the row in registers
// as kPacks packs of VEC elements (16-byte accesses when VEC = kVec16<T>): x is read once and y
// written once. Rows too long for registers take a looping kernel that reads them twice (the
// second time mostly from L2). Numerics: fp32 throughout; mean and variance in two passes over
// the registers (per-pack Welford in the looping kernel). Backward: each block sums its rows'
// dweight/dbias in registers and writes one fp32 partial row; norm_partials_kernel adds the
// partial rows in a fixed order: deterministic, no float atomics.
// Preconditions (checked by the launchers): rows, cols > 0; VEC > 1 only when cols % VEC == 0
// and every row pointer is 16-byte aligned.
#include "cuda/norms_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/reduce.cuh"
#include "common/vec.cuh"

namespace fusedops {
namespace {

constexpr int kWarp = 32;
constexpr int kFwdMaxThreads = 512;     // forward block tier: 4 or 8 16-byte packs per thread,
constexpr int kFwdScalars = 16;         // or 16 elements when rows aren't 16-byte aligned
constexpr int kFwdWarpRowsPerBlock = 4;
constexpr int kBwdElems = 16;           // elements per thread, backward register tiers
constexpr int kBwdScalars = 8;          // ... when rows aren't 16-byte aligned
constexpr int kBwdMaxThreads = 512;     // x, dy, dw and db accumulators: ~4 * kBwdElems registers
constexpr int kLoopThreads = 512;
constexpr int kLoopUnroll = 4;          // packs in flight per thread in the looping kernels
constexpr int kPartSlices = 8;          // norm_partials_kernel: partial rows summed in 8 slices
constexpr int kPartCols = kWarp * 4;    // ... of 32 float4 columns per block

struct Sum2Op {
  __device__ __forceinline__ float2 operator()(float2 a, float2 b) const {
    return make_float2(a.x + b.x, a.y + b.y);
  }
  template <typename V>
  __device__ static V identity() {
    return V{0.f, 0.f};
  }
};

// Count, mean and sum of squared deviations of a set of values; merged with Chan's formula.
struct Welford {
  float n, mean, m2;
};

struct WelfordOp {
  __device__ __forceinline__ Welford operator()(const Welford& a, const Welford& b) const {
    const float n = a.n + b.n;
    if (n == 0.f) return a;
    const float d = b.mean - a.mean, fb = b.n / n;
    return {n, a.mean + d * fb, a.m2 + b.m2 + d * d * a.n * fb};
  }
  template <typename V>
  __device__ static V identity() {
    return V{0.f, 0.f, 0.f};
  }
};

// All-reduce over a row's group of g consecutive threads (g a multiple of 32 dividing
// blockDim.x). Block groups meet at barriers, so every thread of the block must call it.
// scratch: 32 slots of shared memory. The order of additions is fixed: deterministic.
template <bool kWarpRow, typename V, typename Op>
__device__ __forceinline__ V row_allreduce(V v, Op op, V* scratch, int g) {
  v = group_allreduce<kWarp>(v, op);
  if constexpr (!kWarpRow) {
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, warps = g / kWarp;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[warp / warps * warps + lane] : Op::template identity<V>();
    v = group_allreduce<kWarp>(v, op);
    __syncthreads();  // scratch is rewritten by the next reduction
  }
  return v;
}

// VEC elements at p widened to fp32, moved in accesses of at most 16 bytes (an fp32 weight
// beside bf16 activations takes two).
template <int VEC, typename S>
__device__ __forceinline__ void load_f32(const S* p, float (&out)[VEC]) {
  constexpr int kSub = VEC < kVec16<S> ? VEC : kVec16<S>;
#pragma unroll
  for (int s = 0; s < VEC; s += kSub) {
    const Pack<S, kSub> pk = load_pack<S, kSub>(p + s);
#pragma unroll
    for (int j = 0; j < kSub; ++j) out[s + j] = to_acc(pk.v[j]);
  }
}

template <int VEC, typename S>
__device__ __forceinline__ void store_f32(S* p, const float (&in)[VEC]) {
  constexpr int kSub = VEC < kVec16<S> ? VEC : kVec16<S>;
#pragma unroll
  for (int s = 0; s < VEC; s += kSub) {
    Pack<S, kSub> pk;
#pragma unroll
    for (int j = 0; j < kSub; ++j) pk.v[j] = from_acc<S>(in[s + j]);
    store_pack<S, kSub>(p + s, pk);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void widen(const Pack<T, VEC>& pk, float (&out)[VEC]) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) out[j] = to_acc(pk.v[j]);
}

// out = (v - mu) * rs * w + b for one pack (w, b optional).
template <int VEC, typename W>
__device__ __forceinline__ void normalize_pack(const float (&v)[VEC], float mu, float rs,
                                               const W* w, const W* b, float (&out)[VEC]) {
  float wv[VEC], bv[VEC];
  if (w != nullptr) load_f32<VEC>(w, wv);
  if (b != nullptr) load_f32<VEC>(b, bv);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    out[j] = (v[j] - mu) * rs;
    if (w != nullptr) out[j] *= wv[j];
    if (b != nullptr) out[j] += bv[j];
  }
}

// Forward, row in registers: thread t of a g-thread group holds packs p = 0..kPacks-1 at
// columns (p * g + t) * VEC, so each pack index is one coalesced sweep of the group. The packs
// stay in T (half the registers for fp16/bf16) and are widened on each use.
template <typename T, typename W, bool kRms, int VEC, int kPacks, bool kWarpRow>
__global__ void __launch_bounds__(kFwdMaxThreads, 1)
    norm_fwd_kernel(NormFwdArgs<T, W> a, int g) {
  __shared__ float scratch[kWarp];
  const int rows_per_block = blockDim.x / g, t = threadIdx.x % g;
  const int cols = static_cast<int>(a.cols);  // < 2^31 in the register tiers
  // Every thread runs the same iterations (the block's barriers); rows past the end idle.
  for (int64_t base = int64_t(blockIdx.x) * rows_per_block; base < a.rows;
       base += int64_t(gridDim.x) * rows_per_block) {
    const int64_t row = base + threadIdx.x / g;
    const bool valid = row < a.rows;
    Pack<T, VEC> x[kPacks];
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int col = (p * g + t) * VEC;
      if (valid && col < cols) {
        x[p] = load_pack<T, VEC>(a.x + row * a.cols + col);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) x[p].v[j] = from_acc<T>(0.f);
      }
    }
    float mu = 0.f;
    if constexpr (!kRms) {
      float s = 0.f;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        float v[VEC];
        widen(x[p], v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) s += v[j];
      }
      mu = row_allreduce<kWarpRow>(s, SumOp(), scratch, g) / cols;
    }
    float q = 0.f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if ((p * g + t) * VEC < cols) {  // padding lanes hold 0, not mu
        float v[VEC];
        widen(x[p], v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) q += (v[j] - mu) * (v[j] - mu);
      }
    }
    const float rs = rsqrtf(row_allreduce<kWarpRow>(q, SumOp(), scratch, g) / cols + a.eps);
    if (!valid) continue;  // after the last barrier of this iteration
    if (t == 0) {
      if constexpr (!kRms) a.mean[row] = mu;
      a.rstd[row] = rs;
    }
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int col = (p * g + t) * VEC;
      if (col < cols) {
        float v[VEC], out[VEC];
        widen(x[p], v);
        normalize_pack<VEC>(v, mu, rs, a.w ? a.w + col : nullptr, a.b ? a.b + col : nullptr, out);
        store_f32<VEC>(a.y + row * a.cols + col, out);
      }
    }
  }
}

// Forward for rows that don't fit in registers: a block per row; pass 1 accumulates the
// statistics (Welford per pack, merged across the block), pass 2 re-reads x (recently read, so
// mostly from L2) and writes y.
template <typename T, typename W, bool kRms, int VEC>
__global__ void __launch_bounds__(kLoopThreads) norm_fwd_loop_kernel(NormFwdArgs<T, W> a) {
  __shared__ float scratch[kWarp];
  __shared__ Welford wscratch[kWarp];
  const int64_t cols = a.cols, step = int64_t(blockDim.x) * VEC;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* xr = a.x + row * cols;
    float sq = 0.f;
    Welford acc{0.f, 0.f, 0.f};
    for (int64_t c0 = int64_t(threadIdx.x) * VEC; c0 < cols; c0 += step * kLoopUnroll) {
      float v[kLoopUnroll][VEC];
#pragma unroll
      for (int u = 0; u < kLoopUnroll; ++u) {
        if (c0 + u * step < cols) load_f32<VEC>(xr + c0 + u * step, v[u]);
      }
#pragma unroll
      for (int u = 0; u < kLoopUnroll; ++u) {
        if (c0 + u * step >= cols) continue;
        if constexpr (kRms) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) sq += v[u][j] * v[u][j];
        } else {
          float m = 0.f, m2 = 0.f;
#pragma unroll
          for (int j = 0; j < VEC; ++j) m += v[u][j];
          m /= VEC;
#pragma unroll
          for (int j = 0; j < VEC; ++j) m2 += (v[u][j] - m) * (v[u][j] - m);
          acc = WelfordOp()(acc, Welford{float(VEC), m, m2});
        }
      }
    }
    float mu = 0.f, var;
    if constexpr (kRms) {
      var = block_allreduce(sq, SumOp(), scratch) / cols;
    } else {
      acc = block_allreduce(acc, WelfordOp(), wscratch);
      mu = acc.mean;
      var = acc.m2 / cols;
    }
    const float rs = rsqrtf(var + a.eps);
    if (threadIdx.x == 0) {
      if constexpr (!kRms) a.mean[row] = mu;
      a.rstd[row] = rs;
    }
    for (int64_t c0 = int64_t(threadIdx.x) * VEC; c0 < cols; c0 += step * kLoopUnroll) {
      float v[kLoopUnroll][VEC];
#pragma unroll
      for (int u = 0; u < kLoopUnroll; ++u) {
        if (c0 + u * step < cols) load_f32<VEC>(xr + c0 + u * step, v[u]);
      }
#pragma unroll
      for (int u = 0; u < kLoopUnroll; ++u) {
        const int64_t col = c0 + u * step;
        if (col >= cols) continue;
        float out[VEC];
        normalize_pack<VEC>(v[u], mu, rs, a.w ? a.w + col : nullptr, a.b ? a.b + col : nullptr,
                            out);
        store_f32<VEC>(a.y + row * cols + col, out);
      }
    }
  }
}

// Where a backward kernel puts its block's dweight/dbias: row blockIdx.x of dw / db
// ([gridDim.x, ld] fp32, either may be null). group: threads per data row.
struct PartialRows {
  float* dw;
  float* db;
  int64_t ld;
  int group;
};

// Backward, row in registers (layout as norm_fwd_kernel, x and dy kept in T). With
// xh = (x - mean) * rstd and g = dy * w:
//   dx = rstd * (g - mean(g) - xh * mean(g * xh))   (rms_norm: no mean(g) term)
// dw += dy * xh and db += dy accumulate in fp32 registers over the block's rows; at the end the
// block's row groups are summed in shared memory (fixed order) into its partial row.
template <typename T, typename W, bool kRms, int VEC, int kPacks, bool kWarpRow>
__global__ void __launch_bounds__(kBwdMaxThreads, 1)
    norm_bwd_kernel(NormBwdArgs<T, W> a, PartialRows part) {
  extern __shared__ float red[];  // [rows_per_block, g * kPacks * VEC] when rows_per_block > 1
  __shared__ float2 scratch[kWarp];
  const int g = part.group, rows_per_block = blockDim.x / g, grp = threadIdx.x / g,
            t = threadIdx.x % g;
  const int cols = static_cast<int>(a.cols);  // < 2^31 in the register tiers
  float dw_acc[kPacks][VEC] = {}, db_acc[kPacks][VEC] = {};
  for (int64_t base = int64_t(blockIdx.x) * rows_per_block; base < a.rows;
       base += int64_t(gridDim.x) * rows_per_block) {
    const int64_t row = base + grp;
    const bool valid = row < a.rows;
    Pack<T, VEC> x[kPacks], dy[kPacks];
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int col = (p * g + t) * VEC;
      if (valid && col < cols) {
        x[p] = load_pack<T, VEC>(a.x + row * a.cols + col);
        dy[p] = load_pack<T, VEC>(a.dy + row * a.cols + col);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) x[p].v[j] = dy[p].v[j] = from_acc<T>(0.f);  // adds 0
      }
    }
    const float mu = kRms || !valid ? 0.f : a.mean[row];
    const float rs = valid ? a.rstd[row] : 0.f;
    // xh and g of pack p, recomputed for each of the two uses.
    auto xh_g = [&](int p, float (&xh)[VEC], float (&gr)[VEC]) {
      const int col = (p * g + t) * VEC;
      widen(x[p], xh);
      widen(dy[p], gr);
      float wv[VEC];
      if (a.w != nullptr && col < cols) load_f32<VEC>(a.w + col, wv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        xh[j] = (xh[j] - mu) * rs;
        if (a.w != nullptr && col < cols) gr[j] *= wv[j];
      }
    };
    float2 s{0.f, 0.f};
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      float xh[VEC], gr[VEC], d[VEC];
      xh_g(p, xh, gr);
      widen(dy[p], d);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        dw_acc[p][j] += d[j] * xh[j];
        if constexpr (!kRms) db_acc[p][j] += d[j];
        s.x += gr[j];
        s.y += gr[j] * xh[j];
      }
    }
    if (a.dx == nullptr) continue;  // uniform over the grid: no barrier is skipped unevenly
    s = row_allreduce<kWarpRow>(s, Sum2Op(), scratch, g);
    if (!valid) continue;
    const float c1 = kRms ? 0.f : s.x / cols, c2 = s.y / cols;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int col = (p * g + t) * VEC;
      if (col < cols) {
        float xh[VEC], gr[VEC], out[VEC];
        xh_g(p, xh, gr);
#pragma unroll
        for (int j = 0; j < VEC; ++j) out[j] = rs * (gr[j] - c1 - xh[j] * c2);
        store_f32<VEC>(a.dx + row * a.cols + col, out);
      }
    }
  }
  auto flush = [&](const float (&acc)[kPacks][VEC], float* dst) {
    dst += int64_t(blockIdx.x) * part.ld;
    if (rows_per_block == 1) {
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        const int col = (p * g + t) * VEC;
        if (col < cols) store_f32<VEC>(dst + col, acc[p]);
      }
      return;
    }
    const int cap = g * kPacks * VEC;
    __syncthreads();  // red is free (the previous flush has read it)
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) red[grp * cap + (p * g + t) * VEC + j] = acc[p][j];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      float sum = red[c];
      for (int r = 1; r < rows_per_block; ++r) sum += red[r * cap + c];
      dst[c] = sum;
    }
  };
  if (part.dw != nullptr) flush(dw_acc, part.dw);
  if constexpr (!kRms) {
    if (part.db != nullptr) flush(db_acc, part.db);
  }
}

// Backward for rows that don't fit in registers: a block per row. Pass 1 reduces sum(g) and
// sum(g * xh); pass 2 re-reads x and dy (mostly from L2), writes dx and adds into the block's
// own partial rows in global memory (zeroed by the launcher; one writer per element).
template <typename T, typename W, bool kRms, int VEC>
__global__ void __launch_bounds__(kLoopThreads)
    norm_bwd_loop_kernel(NormBwdArgs<T, W> a, PartialRows part) {
  __shared__ float2 scratch[kWarp];
  const int64_t cols = a.cols, step = int64_t(blockDim.x) * VEC;
  float* dwp = part.dw != nullptr ? part.dw + int64_t(blockIdx.x) * part.ld : nullptr;
  float* dbp = part.db != nullptr ? part.db + int64_t(blockIdx.x) * part.ld : nullptr;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* xr = a.x + row * cols;
    const T* dyr = a.dy + row * cols;
    const float mu = kRms ? 0.f : a.mean[row], rs = a.rstd[row];
    // One pass of the row: f(col, xh, g, dy) for each pack.
    auto sweep = [&](auto&& f) {
      for (int64_t c0 = int64_t(threadIdx.x) * VEC; c0 < cols; c0 += step * kLoopUnroll) {
        float xv[kLoopUnroll][VEC], dv[kLoopUnroll][VEC];
#pragma unroll
        for (int u = 0; u < kLoopUnroll; ++u) {
          if (c0 + u * step < cols) {
            load_f32<VEC>(xr + c0 + u * step, xv[u]);
            load_f32<VEC>(dyr + c0 + u * step, dv[u]);
          }
        }
#pragma unroll
        for (int u = 0; u < kLoopUnroll; ++u) {
          const int64_t col = c0 + u * step;
          if (col >= cols) continue;
          float wv[VEC], xh[VEC], gr[VEC];
          if (a.w != nullptr) load_f32<VEC>(a.w + col, wv);
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            xh[j] = (xv[u][j] - mu) * rs;
            gr[j] = a.w != nullptr ? dv[u][j] * wv[j] : dv[u][j];
          }
          f(col, xh, gr, dv[u]);
        }
      }
    };
    float c1 = 0.f, c2 = 0.f;
    if (a.dx != nullptr) {
      float2 s{0.f, 0.f};
      sweep([&](int64_t, const float(&xh)[VEC], const float(&gr)[VEC], const float(&)[VEC]) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          s.x += gr[j];
          s.y += gr[j] * xh[j];
        }
      });
      s = block_allreduce(s, Sum2Op(), scratch);
      c1 = kRms ? 0.f : s.x / cols;
      c2 = s.y / cols;
    }
    sweep([&](int64_t col, const float(&xh)[VEC], const float(&gr)[VEC],
              const float(&dy)[VEC]) {
      if (a.dx != nullptr) {
        float out[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) out[j] = rs * (gr[j] - c1 - xh[j] * c2);
        store_f32<VEC>(a.dx + row * cols + col, out);
      }
      float acc[VEC];
      if (dwp != nullptr) {
        load_f32<VEC>(dwp + col, acc);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] += dy[j] * xh[j];
        store_f32<VEC>(dwp + col, acc);
      }
      if (dbp != nullptr) {
        load_f32<VEC>(dbp + col, acc);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] += dy[j];
        store_f32<VEC>(dbp + col, acc);
      }
    });
  }
}

// out[c] = sum over r = 0..parts-1 of part[r * ld + c], cast to W. blockIdx.y picks
// (part0, out0) or (part1, out1). Thread (x, y) sums float4 column group x over rows
// y, y + 8, ...; the 8 slices are then added in order: fixed order, bitwise reproducible.
template <typename W>
__global__ void __launch_bounds__(kWarp* kPartSlices)
    norm_partials_kernel(const float* part0, W* out0, const float* part1, W* out1, int64_t parts,
                         int64_t ld, int64_t cols) {
  __shared__ float4 red[kPartSlices][kWarp];
  const float* part = blockIdx.y == 0 ? part0 : part1;
  W* out = blockIdx.y == 0 ? out0 : out1;
  for (int64_t tile = blockIdx.x; tile * kPartCols < cols; tile += gridDim.x) {
    const int64_t c = tile * kPartCols + threadIdx.x * 4;
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c < cols) {  // ld % 4 == 0 and ld >= cols: the float4 at c is inside the row
#pragma unroll 4
      for (int64_t r = threadIdx.y; r < parts; r += kPartSlices) {
        const float4 v = *reinterpret_cast<const float4*>(part + r * ld + c);
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
      }
    }
    red[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
      float4 sum = red[0][threadIdx.x];
      for (int k = 1; k < kPartSlices; ++k) {
        const float4 v = red[k][threadIdx.x];
        sum.x += v.x;
        sum.y += v.y;
        sum.z += v.z;
        sum.w += v.w;
      }
      const float vals[4] = {sum.x, sum.y, sum.z, sum.w};
      for (int j = 0; j < 4 && c + j < cols; ++j) out[c + j] = from_acc<W>(vals[j]);
    }
    __syncthreads();  // red is rewritten by the next tile
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int round_up_warp(int64_t n) { return static_cast<int>(ceil_div(n, kWarp) * kWarp); }

// Enough blocks to fill the device many times over; kernels grid-stride beyond that (which also
// keeps gridDim.x far below its limit however many rows there are).
int stride_grid(int64_t blocks, const DeviceInfo& info) {
  return static_cast<int>(std::min<int64_t>(blocks, int64_t(info.sm_count) * 32));
}

// Looping kernels re-read a row soon after reading it: keep the rows in flight within half the
// L2, but use at least one block per SM.
int loop_grid(int64_t rows, int64_t row_bytes, const DeviceInfo& info) {
  int device = 0, l2 = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device) != cudaSuccess) {
    l2 = 0;
  }
  const int64_t fit = l2 / 2 / std::max<int64_t>(row_bytes, 1);
  const int64_t blocks = std::clamp<int64_t>(fit, info.sm_count, int64_t(info.sm_count) * 4);
  return static_cast<int>(std::min(rows, blocks));
}

template <typename T, typename W, bool kRms, int VEC, int kPacks, bool kWarpRow>
void launch_fwd(const NormFwdArgs<T, W>& a, int64_t blocks, int threads, int group,
                const DeviceInfo& info, cudaStream_t stream) {
  norm_fwd_kernel<T, W, kRms, VEC, kPacks, kWarpRow>
      <<<stride_grid(blocks, info), threads, 0, stream>>>(a, group);
}

// Warp tier for rows of up to 4 packs per lane; block tier with the fewest packs per thread
// that fit the row into kFwdMaxThreads threads; the looping kernel beyond.
template <typename T, typename W, bool kRms, int VEC>
cudaError_t norm_fwd_vec(const NormFwdArgs<T, W>& a, const DeviceInfo& info,
                         cudaStream_t stream) {
  constexpr int kRowsPerBlock = kFwdWarpRowsPerBlock, kThreads = kWarp * kRowsPerBlock;
  constexpr int64_t kMaxThreads = kFwdMaxThreads;
  const int64_t warp_blocks = ceil_div(a.rows, kRowsPerBlock);
  auto threads_for = [&](int packs) { return round_up_warp(ceil_div(a.cols, packs * VEC)); };
  if (a.cols <= kWarp * VEC) {
    launch_fwd<T, W, kRms, VEC, 1, true>(a, warp_blocks, kThreads, kWarp, info, stream);
  } else if (a.cols <= kWarp * VEC * 2) {
    launch_fwd<T, W, kRms, VEC, 2, true>(a, warp_blocks, kThreads, kWarp, info, stream);
  } else if (a.cols <= kWarp * VEC * 4) {
    launch_fwd<T, W, kRms, VEC, 4, true>(a, warp_blocks, kThreads, kWarp, info, stream);
  } else if (VEC == 1 && a.cols <= kMaxThreads * kFwdScalars) {
    if constexpr (VEC == 1) {
      const int threads = threads_for(kFwdScalars);
      launch_fwd<T, W, kRms, VEC, kFwdScalars, false>(a, a.rows, threads, threads, info, stream);
    }
  } else if (VEC > 1 && a.cols <= kMaxThreads * 4 * VEC) {
    if constexpr (VEC > 1) {
      const int threads = threads_for(4);
      launch_fwd<T, W, kRms, VEC, 4, false>(a, a.rows, threads, threads, info, stream);
    }
  } else if (VEC > 1 && a.cols <= kMaxThreads * 8 * VEC) {
    if constexpr (VEC > 1) {
      const int threads = threads_for(8);
      launch_fwd<T, W, kRms, VEC, 8, false>(a, a.rows, threads, threads, info, stream);
    }
  } else {
    norm_fwd_loop_kernel<T, W, kRms, VEC>
        <<<loop_grid(a.rows, a.cols * int64_t(sizeof(T)), info), kLoopThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <typename T, typename W>
using BwdKernel = void (*)(NormBwdArgs<T, W>, PartialRows);

template <typename T, typename W>
struct BwdLaunch {
  BwdKernel<T, W> kernel;
  int threads;
  int group;             // threads per data row
  size_t smem;           // dynamic shared memory
  bool zeroed_partials;  // the kernel adds into its partial rows
};

template <typename T, typename W, bool kRms, int VEC>
BwdLaunch<T, W> bwd_launch_vec(const NormBwdArgs<T, W>& a) {
  constexpr int kElems = VEC > 1 ? kBwdElems : kBwdScalars, kPacks = kElems / VEC;
  // Blocks of several rows keep the partial rows few; their sum goes through shared memory.
  auto smem = [](int threads) { return size_t(threads) * kElems * sizeof(float); };
  if (a.cols <= kWarp * kElems) {
    return {norm_bwd_kernel<T, W, kRms, VEC, kPacks, true>, kBwdMaxThreads, kWarp,
            smem(kBwdMaxThreads), false};
  }
  if (a.cols <= int64_t(kBwdMaxThreads) * kElems) {
    const int g = round_up_warp(ceil_div(a.cols, kElems)), threads = kBwdMaxThreads / g * g;
    return {norm_bwd_kernel<T, W, kRms, VEC, kPacks, false>, threads, g,
            threads == g ? 0 : smem(threads), false};
  }
  return {norm_bwd_loop_kernel<T, W, kRms, VEC>, kLoopThreads, kLoopThreads, 0, true};
}

template <typename T, typename W, bool kRms>
BwdLaunch<T, W> bwd_launch(const NormBwdArgs<T, W>& a) {
  constexpr int V = kVec16<T>;
  const bool vec = a.cols % V == 0 && is_aligned16(a.x) && is_aligned16(a.dy) &&
                   (a.dx == nullptr || is_aligned16(a.dx)) &&
                   (a.w == nullptr || is_aligned16(a.w));
  return vec ? bwd_launch_vec<T, W, kRms, V>(a) : bwd_launch_vec<T, W, kRms, 1>(a);
}

// As many blocks as fit on the device at once (each writes one partial row), fewer if there
// aren't enough rows.
template <typename T, typename W>
int64_t bwd_grid(const BwdLaunch<T, W>& l, const NormBwdArgs<T, W>& a, const DeviceInfo& info) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, l.kernel, l.threads, l.smem) !=
      cudaSuccess) {
    per_sm = 1;
  }
  const int64_t blocks = ceil_div(a.rows, l.threads / l.group);
  return std::min<int64_t>(blocks, int64_t(info.sm_count) * std::max(per_sm, 1));
}

int64_t partial_ld(int64_t cols) { return ceil_div(cols, 4) * 4; }  // float4 rows

}  // namespace

template <typename T, typename W, bool kRms>
cudaError_t norm_fwd_cuda(const NormFwdArgs<T, W>& a, const DeviceInfo& info,
                          cudaStream_t stream) {
  constexpr int V = kVec16<T>;
  const bool vec = a.cols % V == 0 && is_aligned16(a.x) && is_aligned16(a.y) &&
                   (a.w == nullptr || is_aligned16(a.w)) && (a.b == nullptr || is_aligned16(a.b));
  return vec ? norm_fwd_vec<T, W, kRms, V>(a, info, stream)
             : norm_fwd_vec<T, W, kRms, 1>(a, info, stream);
}

template <typename T, typename W, bool kRms>
int64_t norm_bwd_workspace_size(const NormBwdArgs<T, W>& a, const DeviceInfo& info) {
  const int64_t n = (a.dw != nullptr) + (a.db != nullptr);
  if (n == 0) return 0;
  return n * bwd_grid(bwd_launch<T, W, kRms>(a), a, info) * partial_ld(a.cols);
}

template <typename T, typename W, bool kRms>
cudaError_t norm_bwd_cuda(const NormBwdArgs<T, W>& a, float* workspace, const DeviceInfo& info,
                          cudaStream_t stream) {
  if (a.dx == nullptr && a.dw == nullptr && a.db == nullptr) return cudaSuccess;
  const BwdLaunch<T, W> l = bwd_launch<T, W, kRms>(a);
  const int64_t grid = bwd_grid(l, a, info), ld = partial_ld(a.cols);
  PartialRows part{a.dw != nullptr ? workspace : nullptr, nullptr, ld, l.group};
  if (a.db != nullptr) part.db = workspace + (a.dw != nullptr ? grid * ld : 0);
  const int64_t n = (a.dw != nullptr) + (a.db != nullptr);
  if (n > 0 && l.zeroed_partials) {
    const cudaError_t err =
        cudaMemsetAsync(workspace, 0, size_t(n * grid * ld) * sizeof(float), stream);
    if (err != cudaSuccess) return err;
  }
  l.kernel<<<static_cast<unsigned>(grid), l.threads, l.smem, stream>>>(a, part);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || n == 0) return err;
  const float* part0 = part.dw != nullptr ? part.dw : part.db;
  W* out0 = a.dw != nullptr ? a.dw : a.db;
  const dim3 pgrid(static_cast<unsigned>(std::min<int64_t>(ceil_div(a.cols, kPartCols), 1 << 20)),
                   static_cast<unsigned>(n));
  norm_partials_kernel<W><<<pgrid, dim3(kWarp, kPartSlices), 0, stream>>>(
      part0, out0, part.db, a.db, grid, ld, a.cols);
  return cudaGetLastError();
}

#define FUSEDOPS_NORM_INSTANTIATE(T, W, RMS)                                                    \
  template cudaError_t norm_fwd_cuda<T, W, RMS>(const NormFwdArgs<T, W>&, const DeviceInfo&,    \
                                                cudaStream_t);                                  \
  template int64_t norm_bwd_workspace_size<T, W, RMS>(const NormBwdArgs<T, W>&,                 \
                                                      const DeviceInfo&);                       \
  template cudaError_t norm_bwd_cuda<T, W, RMS>(const NormBwdArgs<T, W>&, float*,               \
                                                const DeviceInfo&, cudaStream_t);
#define FUSEDOPS_NORM_INSTANTIATE_BOTH(T, W) \
  FUSEDOPS_NORM_INSTANTIATE(T, W, false)     \
  FUSEDOPS_NORM_INSTANTIATE(T, W, true)

FUSEDOPS_NORM_INSTANTIATE_BOTH(float, float)
FUSEDOPS_NORM_INSTANTIATE_BOTH(__half, __half)
FUSEDOPS_NORM_INSTANTIATE_BOTH(__half, float)
FUSEDOPS_NORM_INSTANTIATE_BOTH(__nv_bfloat16, __nv_bfloat16)
FUSEDOPS_NORM_INSTANTIATE_BOTH(__nv_bfloat16, float)

}  // namespace fusedops
