// The CUDA linear kernels (contract: linear_params.h; host side: linear.cc).
//
// FP8 block-128 and BF16 weights go through two tensor-core kernels (linear_params.h LinearKernel; the plan in
// linear.cc picks one per shape), both "swap AB": the weight rows are the MMA's M dimension (16-row tiles) and
// the tokens its N dimension (8-token tiles), so a decode step of a few tokens wastes no weight bandwidth on
// padding rows. The tiled kernel (LinearMmaKernel) reads its operands straight from global memory into
// registers, no shared-memory staging: within one 64-wide K step thread (g, q) of a warp (g = lane / 4,
// q = lane % 4) owns the 16 consecutive K elements [64 s + 16 q, +16) of weight rows g and g + 8 of each tile
// and of token g of each token tile. A dot product does not care in which order K is summed, so the MMA's
// logical K slots are simply mapped onto those physical elements, the same for weights and tokens:
//   MMA k-step j (0..3), slots 2q, 2q+1  <-  elements 4j, 4j+1      slots 2q+8, 2q+9  <-  elements 4j+2, 4j+3
// which makes every load a 16-byte vector and needs no shuffles. e4m3 -> bf16 is exact (hardware e4m3x2 ->
// f16x2, then f32, then bf16: 4 significant bits fit), x is rounded to bf16, accumulation is fp32 and the f32
// block scale of each row multiplies each 64-wide step's partial sum.
//
// Split K in the tiled kernel: a block's warps_k warps take every warps_k-th step of the same tiles and add their
// partial sums in shared memory in a fixed order, so results are deterministic. The split-K kernel
// (LinearSplitKernel, below) stages x in shared memory and splits K over a thread-block cluster as well; its FP8
// variant with the weights streamed through a shared-memory ring is linear_ring.cu. Shared device helpers:
// linear_device.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/linear_device.cuh"
#include "kernels/cuda/linear_params.h"
#include "kernels/cuda/pdl.h"

namespace dsv4::kernels::cuda {
namespace {

// Loads weight elements [k, k + 16) of one row (zeros past Kin or for a row that does not exist).
template <LinearKernelFormat F>
__device__ __forceinline__ void LoadWeights(const LinearParams& p, const void* row, bool row_ok, int64_t k,
                                            uint32_t (&raw)[kRawWords<F>]) {
  LoadWeightRow<F>(row, row_ok, p.vec, k, p.k, raw);
}

// Raw weight words -> the 8 bf16x2 A-operand words of one row: word 2j = elements 4j, 4j+1; 2j+1 = 4j+2, 4j+3.
template <LinearKernelFormat F>
__device__ __forceinline__ void WeightsToBf16(const uint32_t (&raw)[kRawWords<F>], uint32_t (&a)[8]) {
  if constexpr (F == LinearKernelFormat::kFp8) {
#pragma unroll
    for (int j = 0; j < 4; ++j) E4m3x4ToBf16(raw[j], a[2 * j], a[2 * j + 1]);
  } else {
#pragma unroll
    for (int w = 0; w < 8; ++w) a[w] = raw[w];
  }
}

// Token elements [k, k + 16) as 8 bf16x2 B-operand words in the same order (zeros past Kin or past T).
__device__ __forceinline__ void LoadTokens(const LinearParams& p, int64_t tok, int64_t k, uint32_t (&b)[8]) {
  if (tok >= p.t) {
#pragma unroll
    for (int w = 0; w < 8; ++w) b[w] = 0;
    return;
  }
  const int64_t off = tok * p.x_stride + static_cast<int64_t>(blockIdx.z) * p.k + k;
  if (p.vec && k + 16 <= p.k) {
    if (p.x_bf16) {
      const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.x) + off);
      const uint4 v0 = __ldg(src), v1 = __ldg(src + 1);
      b[0] = v0.x, b[1] = v0.y, b[2] = v0.z, b[3] = v0.w, b[4] = v1.x, b[5] = v1.y, b[6] = v1.z, b[7] = v1.w;
    } else {
      const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + off);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 v = __ldg(src + j);
        b[2 * j] = PackBf16x2(v.x, v.y);
        b[2 * j + 1] = PackBf16x2(v.z, v.w);
      }
    }
    return;
  }
  float v[16];
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    v[e] = 0.f;
    if (k + e < p.k) {
      v[e] = p.x_bf16 ? __bfloat162float(__ushort_as_bfloat16(static_cast<const uint16_t*>(p.x)[off + e]))
                      : static_cast<const float*>(p.x)[off + e];
    }
  }
#pragma unroll
  for (int w = 0; w < 8; ++w) b[w] = PackBf16x2(v[2 * w], v[2 * w + 1]);
}

template <LinearKernelFormat F, int MW, int NW>
__global__ void __launch_bounds__(NW == 1 ? 512 : 256) LinearMmaKernel(const LinearParams p) {
  PdlEnter();
  extern __shared__ float reduce[];  // [warps_m][warps_k - 1][MW*NW*4][32]
  constexpr int kRaw = kRawWords<F>;
  constexpr int kAcc = MW * NW * 4;
  constexpr int64_t kEsize = F == LinearKernelFormat::kFp8 ? 1 : 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wk = warp % p.plan.warps_k, wm = warp / p.plan.warps_k;
  const int g = lane >> 2, q = lane & 3;
  const int64_t grp = blockIdx.z;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * p.plan.warps_m + wm) * (16 * MW);
  const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * (8 * NW);

  // Rows row0 + 16 i + g + 8 h of this group (h = 0: "lo", 1: "hi").
  const void* rows[MW][2];
  bool row_ok[MW][2];
#pragma unroll
  for (int i = 0; i < MW; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = row0 + 16 * i + g + 8 * h;
      row_ok[i][h] = r < p.n;
      rows[i][h] = static_cast<const uint8_t*>(p.w) + (grp * p.n + (row_ok[i][h] ? r : 0)) * p.k * kEsize;
    }
  }

  float acc[MW][NW][4];
#pragma unroll
  for (int i = 0; i < MW; ++i)
#pragma unroll
    for (int jn = 0; jn < NW; ++jn)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][jn][c] = 0.f;

  const int64_t steps = (p.k + kStepK - 1) / kStepK;
  uint32_t next[MW][2][kRaw];
  int64_t s = wk;
  if (s < steps) {
#pragma unroll
    for (int i = 0; i < MW; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) LoadWeights<F>(p, rows[i][h], row_ok[i][h], s * kStepK + 16 * q, next[i][h]);
  }
  for (; s < steps; s += p.plan.warps_k) {
    // Convert this step's weights, then issue the next step's loads so they fly during the MMAs.
    uint32_t a[MW][2][8];
#pragma unroll
    for (int i = 0; i < MW; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) WeightsToBf16<F>(next[i][h], a[i][h]);
    const int64_t k = s * kStepK + 16 * q;
    if (s + p.plan.warps_k < steps) {
#pragma unroll
      for (int i = 0; i < MW; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          LoadWeights<F>(p, rows[i][h], row_ok[i][h], k + p.plan.warps_k * kStepK, next[i][h]);
    }
    float part[MW][NW][4];
#pragma unroll
    for (int i = 0; i < MW; ++i)
#pragma unroll
      for (int jn = 0; jn < NW; ++jn)
#pragma unroll
        for (int c = 0; c < 4; ++c) part[i][jn][c] = 0.f;
#pragma unroll
    for (int jn = 0; jn < NW; ++jn) {
      uint32_t b[8];
      LoadTokens(p, tok0 + 8 * jn + g, k, b);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < MW; ++i)
          Mma16816(part[i][jn], a[i][0][2 * j], a[i][1][2 * j], a[i][0][2 * j + 1], a[i][1][2 * j + 1], b[2 * j],
                   b[2 * j + 1]);
    }
    // Per-row scale of this 64-wide step (1 for BF16), in fp32.
#pragma unroll
    for (int i = 0; i < MW; ++i) {
      float sc[2] = {1.f, 1.f};
      if constexpr (F == LinearKernelFormat::kFp8) {
        const int64_t col = (s * kStepK) / kScaleBlock;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t r = grp * p.n + row0 + 16 * i + g + 8 * h;
          sc[h] = row_ok[i][h] ? __ldg(p.scale + (r / kScaleBlock) * p.scale_cols + col) : 0.f;
        }
      }
#pragma unroll
      for (int jn = 0; jn < NW; ++jn) {
        acc[i][jn][0] += sc[0] * part[i][jn][0];
        acc[i][jn][1] += sc[0] * part[i][jn][1];
        acc[i][jn][2] += sc[1] * part[i][jn][2];
        acc[i][jn][3] += sc[1] * part[i][jn][3];
      }
    }
  }

  // Split-K reduction: warps 1.. of each K group park their sums, warp 0 adds them in order.
  const int wks = p.plan.warps_k;
  if (wks > 1) {
    if (wk > 0) {
      float* dst = reduce + static_cast<int64_t>(wm * (wks - 1) + wk - 1) * kAcc * 32 + lane;
      int v = 0;
#pragma unroll
      for (int i = 0; i < MW; ++i)
#pragma unroll
        for (int jn = 0; jn < NW; ++jn)
#pragma unroll
          for (int c = 0; c < 4; ++c) dst[32 * v++] = acc[i][jn][c];
    }
    __syncthreads();
    if (wk > 0) return;
    for (int w = 1; w < wks; ++w) {
      const float* src = reduce + static_cast<int64_t>(wm * (wks - 1) + w - 1) * kAcc * 32 + lane;
      int v = 0;
#pragma unroll
      for (int i = 0; i < MW; ++i)
#pragma unroll
        for (int jn = 0; jn < NW; ++jn)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[i][jn][c] += src[32 * v++];
    }
  }

  // Store: c0, c1 = (row g, tokens 2q, 2q+1); c2, c3 = (row g+8, same tokens).
#pragma unroll
  for (int i = 0; i < MW; ++i) {
#pragma unroll
    for (int jn = 0; jn < NW; ++jn) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t r = row0 + 16 * i + g + 8 * (c / 2);
        const int64_t t = tok0 + 8 * jn + 2 * q + (c % 2);
        if (r < p.n && t < p.t) p.y[t * p.y_stride + grp * p.n + r] = acc[i][jn][c];
      }
    }
  }
}

// ---- kSplitK: the decode kernel -------------------------------------------------------------------------------
//
// The MMA mapping of LinearMmaKernel (a thread owns 16 consecutive K elements of rows g and g + 8 per 64-wide
// sub-step; K order is free), with:
//  - full 128-byte row segments per load: a step is 128 K elements for FP8 (thread q loads the 32 contiguous
//    bytes [32q, 32q + 32) of each row: sub-step 0 takes [32q, +16), sub-step 1 [32q + 16, +16)) and 64 for BF16
//    (32 bytes = 16 elements per thread, as before), so one warp's loads cover whole 128-byte lines of 16 rows;
//  - x staged once per block: the block's token tile x its K slice, rounded to bf16, in shared memory; row pitch
//    k_slice + 4 elements (8 bytes past a multiple of 128 bytes) and, inside each 128-element chunk, 16-element
//    units swizzled (unit w stored at w ^ (w >> 2 & 1)), so the B fragments' 8-byte reads of a half-warp hit 16
//    distinct bank pairs for both step shapes;
//  - each warp keeps kRing steps of weights (and their FP8 block scales) in flight in a register ring, issued
//    before x is staged and re-issued kRing steps ahead as soon as a slot is converted;
//  - K is split over warps_k warps of a block and over the `cluster` blocks of a thread-block cluster (grid x =
//    cluster rank = K slice); warps wk > 0 park their partial sums in the block's shared memory and warp (wm, 0)
//    adds them to its own in order (wk 1..warps_k-1), and after a cluster barrier the cluster's threads add the
//    blocks' sums (rank 0..cluster-1, distributed shared memory reads): a fixed order, so the result is
//    deterministic (SplitEpilogue, linear_device.cuh).
// Grid: (cluster, token tiles of 8*NW, groups * row blocks of 16*MW*warps_m rows).

// 64-wide sub-steps per step (one FP8 block-128 column per step) and raw 32-bit words per row and sub-step.
template <LinearKernelFormat F>
constexpr int kSub = F == LinearKernelFormat::kFp8 ? 2 : 1;

// Steps in flight per warp: 16 registers of raw weights per row half and tile (2 KB per warp and step at MW 1).
template <LinearKernelFormat F, int MW>
constexpr int kRing = 16 / (MW * kSub<F> * kRawWords<F>) > 0 ? 16 / (MW * kSub<F> * kRawWords<F>) : 1;

template <LinearKernelFormat F, int MW, int NW>
__global__ void __launch_bounds__(32 * kSplitWarps, 2) LinearSplitKernel(const LinearParams p) {
  PdlEnter();
  extern __shared__ __align__(16) unsigned char split_smem[];
  constexpr int kRaw = kRawWords<F>;
  constexpr int kS = kSub<F>;
  constexpr int kStep = kStepK * kS;  // K elements per step
  constexpr int kTokens = 8 * NW;
  constexpr int kD = kRing<F, MW>;
  constexpr bool kFp8 = F == LinearKernelFormat::kFp8;
  constexpr int64_t kEsize = kFp8 ? 1 : 2;
  const int warps_k = p.plan.warps_k, warps_m = p.plan.warps_m;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wk = warp % warps_k, wm = warp / warps_k;
  const int g = lane >> 2, q = lane & 3;
  const int rank = static_cast<int>(blockIdx.x);  // cluster (1, 1, cluster) x = rank: this block's K slice
  const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * kTokens;
  const int64_t rows_per_block = int64_t{16} * MW * warps_m;
  const int64_t row_blocks = (p.n + rows_per_block - 1) / rows_per_block;
  const int64_t grp = blockIdx.z / row_blocks;
  const int64_t row0 = (blockIdx.z % row_blocks) * rows_per_block + int64_t{16} * MW * wm;
  const int64_t slice_steps = p.plan.k_slice / kStep;
  const int64_t steps = (p.k + kStep - 1) / kStep;
  const int64_t s_begin = rank * slice_steps;
  const int64_t block_steps = s_begin >= steps ? 0 : (steps - s_begin < slice_steps ? steps - s_begin : slice_steps);
  const int my_steps = block_steps > wk ? static_cast<int>((block_steps - wk + warps_k - 1) / warps_k) : 0;

  // Rows row0 + 16 i + g + 8 h of this group (h = 0: "lo", 1: "hi").
  const void* rows[MW][2];
  bool row_ok[MW][2];
  const float* scale_row[MW][2];  // FP8: the rows' block-scale rows
#pragma unroll
  for (int i = 0; i < MW; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = row0 + 16 * i + g + 8 * h;
      row_ok[i][h] = r < p.n;
      const int64_t gr = grp * p.n + (row_ok[i][h] ? r : 0);
      rows[i][h] = static_cast<const uint8_t*>(p.w) + gr * p.k * kEsize;
      scale_row[i][h] = kFp8 ? p.scale + (gr / kScaleBlock) * p.scale_cols : nullptr;
    }
  }
  // Step (global) of this warp's local step `it`, and the first K element of this thread's elements in it.
  auto step_of = [&](int it) { return s_begin + wk + static_cast<int64_t>(it) * warps_k; };
  // Requests step `it`'s weights (and FP8 block scales) into a ring slot.
  auto request = [&](int it, uint32_t (&raw)[MW][2][kS][kRaw], float (&sc)[MW][2]) {
    const int64_t s = step_of(it);
    const int64_t k = s * kStep + 16 * kS * q;
#pragma unroll
    for (int i = 0; i < MW; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int u = 0; u < kS; ++u) LoadWeights<F>(p, rows[i][h], row_ok[i][h], k + 16 * u, raw[i][h][u]);
        sc[i][h] = 1.f;
        if constexpr (kFp8) sc[i][h] = row_ok[i][h] ? __ldg(scale_row[i][h] + s) : 0.f;
      }
    }
  };

  // The first kD steps are requested before x is staged, so they fly meanwhile.
  uint32_t ring[kD][MW][2][kS][kRaw];
  float ring_sc[kD][MW][2];
#pragma unroll
  for (int d = 0; d < kD; ++d) {
    if (d < my_steps) request(d, ring[d], ring_sc[d]);
  }

  // Stage x[tok0 .. +kTokens, slice] as bf16 (zeros past T and past Kin): StageXSlice, 8 rows' loads in flight.
  uint16_t* xs = reinterpret_cast<uint16_t*>(split_smem);
  const int64_t pitch = p.plan.k_slice + 4;
  {
    const int64_t k_base = s_begin * kStep;
    const int64_t x_row0 = tok0 * p.x_stride + grp * p.k;
    const int quads = static_cast<int>(p.plan.k_slice / 4);
    if (p.vec && !p.x_bf16 && k_base + p.plan.k_slice <= p.k && tok0 + kTokens <= p.t) {
      // The common case (f32 x, whole slice inside Kin and T): one 16-byte load and two packs a quad, no checks.
      const float4* x0 = reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + x_row0 + k_base);
      const int64_t row_quads = p.x_stride / 4;  // vec: x_stride % 4 == 0
      StageXSlice<8>(xs, static_cast<int>(pitch), kTokens, quads, [&](int r, int cq) {
        const float4 v = __ldg(x0 + r * row_quads + cq);
        return uint2{PackBf16x2(v.x, v.y), PackBf16x2(v.z, v.w)};
      });
    } else {
      StageXSlice<8>(xs, static_cast<int>(pitch), kTokens, quads, [&](int r, int cq) {
        const int64_t k = k_base + 4 * cq;
        return tok0 + r < p.t && k < p.k ? LoadX4(p, x_row0 + r * p.x_stride, k) : uint2{0u, 0u};
      });
    }
  }
  __syncthreads();

  float acc[MW][NW][4];
#pragma unroll
  for (int i = 0; i < MW; ++i)
#pragma unroll
    for (int jn = 0; jn < NW; ++jn)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][jn][c] = 0.f;

  for (int base = 0; base < my_steps; base += kD) {
#pragma unroll
    for (int d = 0; d < kD; ++d) {
      const int it = base + d;
      if (it < my_steps) {
        const int64_t ls = step_of(it) - s_begin;  // local step: x columns [ls * kStep, +kStep)
        float sc[MW][2];
#pragma unroll
        for (int i = 0; i < MW; ++i) sc[i][0] = ring_sc[d][i][0], sc[i][1] = ring_sc[d][i][1];
        float part[MW][NW][4];
#pragma unroll
        for (int i = 0; i < MW; ++i)
#pragma unroll
          for (int jn = 0; jn < NW; ++jn)
#pragma unroll
            for (int c = 0; c < 4; ++c) part[i][jn][c] = 0.f;
#pragma unroll
        for (int u = 0; u < kS; ++u) {
          uint32_t a[MW][2][8];
#pragma unroll
          for (int i = 0; i < MW; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) WeightsToBf16<F>(ring[d][i][h][u], a[i][h]);
          // The slot is free once its last sub-step is converted: request the step kD ahead into it.
          if (u == kS - 1 && it + kD < my_steps) request(it + kD, ring[d], ring_sc[d]);
          const uint16_t* xrow = xs + g * pitch;
          // This thread's 16 elements of the sub-step, as slice columns.
          const int64_t e0 = ls * kStep + 16 * (kS * q + u);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int64_t pos = XPos(e0 + 4 * j);
#pragma unroll
            for (int jn = 0; jn < NW; ++jn) {
              const uint2 b = *reinterpret_cast<const uint2*>(xrow + 8 * jn * pitch + pos);
#pragma unroll
              for (int i = 0; i < MW; ++i)
                Mma16816(part[i][jn], a[i][0][2 * j], a[i][1][2 * j], a[i][0][2 * j + 1], a[i][1][2 * j + 1], b.x,
                         b.y);
            }
          }
        }
        // The step's block scale per row (1 for BF16), in fp32.
#pragma unroll
        for (int i = 0; i < MW; ++i)
#pragma unroll
          for (int jn = 0; jn < NW; ++jn) {
            acc[i][jn][0] += sc[i][0] * part[i][jn][0];
            acc[i][jn][1] += sc[i][0] * part[i][jn][1];
            acc[i][jn][2] += sc[i][1] * part[i][jn][2];
            acc[i][jn][3] += sc[i][1] * part[i][jn][3];
          }
      }
    }
  }

  float* red = reinterpret_cast<float*>(split_smem + ((kTokens * pitch * 2 + 15) / 16) * 16);
  SplitEpilogue<MW, NW>(p, acc, red, (blockIdx.z % row_blocks) * rows_per_block, row0, tok0, grp, wm, wk, lane, rank);
}

// F32 weights: one warp per output row, 4 tokens at a time, plain fp32 FMAs (x not rounded).
constexpr int kF32Warps = 8;
constexpr int kF32Tokens = 4;

__global__ void __launch_bounds__(32 * kF32Warps) LinearF32Kernel(const LinearParams p) {
  PdlEnter();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kF32Warps + warp;
  const int64_t grp = blockIdx.z;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kF32Tokens;
  if (n >= p.n) return;
  const float* w = static_cast<const float*>(p.w) + (grp * p.n + n) * p.k;
  const float* x = static_cast<const float*>(p.x) + grp * p.k;
  float acc[kF32Tokens] = {};
  for (int64_t k = lane; k < p.k; k += 32) {
    const float wv = __ldg(w + k);
#pragma unroll
    for (int j = 0; j < kF32Tokens; ++j) {
      if (t0 + j < p.t) {
        const float xv = p.x_bf16
                             ? __bfloat162float(__ushort_as_bfloat16(
                                   static_cast<const uint16_t*>(p.x)[(t0 + j) * p.x_stride + grp * p.k + k]))
                             : __ldg(x + (t0 + j) * p.x_stride + k);
        acc[j] += wv * xv;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kF32Tokens; ++j) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
    if (lane == 0 && t0 + j < p.t) p.y[(t0 + j) * p.y_stride + grp * p.n + n] = acc[j];
  }
}

template <LinearKernelFormat F, int MW, int NW>
cudaError_t LaunchMma(const LinearParams& p, cudaStream_t stream) {
  const LinearPlan& pl = p.plan;
  const int64_t rows_per_block = 16 * MW * pl.warps_m;
  const int64_t row_blocks = (p.n + rows_per_block - 1) / rows_per_block;
  if (pl.kernel == LinearKernel::kTiled) {
    const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>((p.t + 8 * NW - 1) / (8 * NW)),
                    static_cast<unsigned>(p.groups));
    const dim3 block(32 * pl.warps_m * pl.warps_k);
    return LaunchPdl(LinearMmaKernel<F, MW, NW>, grid, block, internal::LinearSharedBytes(pl), stream, p);
  }
  if constexpr (MW == 2 && NW == 4) {
    return cudaErrorInvalidValue;  // kSplitK has no 2 x 4 tile per warp (it would spill: the planner never asks)
  } else {
    // kSplitK: the shared-memory limit raised once (to the most any plan takes).
    if (const cudaError_t e = RaiseSharedLimitOnce<LinearSplitKernel<F, MW, NW>>(kSplitMaxSharedBytes);
        e != cudaSuccess) {
      return e;
    }
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(pl.cluster), static_cast<unsigned>((p.t + 8 * NW - 1) / (8 * NW)),
                          static_cast<unsigned>(row_blocks * p.groups));
    config.blockDim = dim3(static_cast<unsigned>(32 * pl.warps_m * pl.warps_k));
    config.dynamicSmemBytes = static_cast<size_t>(internal::LinearSharedBytes(pl));
    config.stream = stream;
    cudaLaunchAttribute cluster_dim;
    SetClusterX(config, cluster_dim, pl.cluster);
    return LaunchPdlConfig(config, LinearSplitKernel<F, MW, NW>, p);
  }
}

template <LinearKernelFormat F>
cudaError_t LaunchMmaFormat(const LinearParams& p, cudaStream_t stream) {
  const int mw = p.plan.m_tiles, nw = p.plan.n_tiles;
  if (mw == 1) {
    if (nw == 1) return LaunchMma<F, 1, 1>(p, stream);
    if (nw == 2) return LaunchMma<F, 1, 2>(p, stream);
    return LaunchMma<F, 1, 4>(p, stream);
  }
  if (nw == 1) return LaunchMma<F, 2, 1>(p, stream);
  if (nw == 2) return LaunchMma<F, 2, 2>(p, stream);
  return LaunchMma<F, 2, 4>(p, stream);
}

}  // namespace

namespace internal {

int64_t LinearSharedBytes(const LinearPlan& plan) {
  const int64_t acc_bytes = int64_t{4} * 32 * plan.m_tiles * plan.n_tiles * 4;  // one warp's partial sums
  if (plan.kernel == LinearKernel::kTiled) return plan.warps_m * (plan.warps_k - 1) * acc_bytes;
  const int64_t x_bytes = (int64_t{8} * plan.n_tiles * (plan.k_slice + 4) * 2 + 15) / 16 * 16;
  const bool split = plan.warps_k * plan.cluster > 1;
  // The FP8 weight ring (linear_ring.cu): per warp `stages` slots of one 16-row tile + its block scale.
  const int64_t ring_bytes =
      plan.stages > 0 ? int64_t{plan.warps_m} * plan.warps_k * plan.stages * (kRingTileBytes + 16) : 0;
  return x_bytes + (split ? int64_t{plan.warps_m} * plan.warps_k * acc_bytes : 0) + ring_bytes;
}

int64_t LinearMaxSharedBytes() {
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess || optin <= 0) {
    return kSplitMaxSharedBytes;
  }
  return std::min<int64_t>(optin, kStreamMaxSharedBytes);
}

cudaError_t LaunchLinearKernel(const LinearParams& p, cudaStream_t stream) {
  switch (p.format) {
    case LinearKernelFormat::kFp8:
      if (p.plan.kernel == LinearKernel::kSplitK && p.plan.stages > 0) return LaunchLinearRingKernel(p, stream);
      return LaunchMmaFormat<LinearKernelFormat::kFp8>(p, stream);
    case LinearKernelFormat::kBf16: return LaunchMmaFormat<LinearKernelFormat::kBf16>(p, stream);
    case LinearKernelFormat::kF32: {
      const dim3 grid(static_cast<unsigned>((p.n + kF32Warps - 1) / kF32Warps),
                      static_cast<unsigned>((p.t + kF32Tokens - 1) / kF32Tokens), static_cast<unsigned>(p.groups));
      return LaunchPdl(LinearF32Kernel, grid, dim3(32 * kF32Warps), 0, stream, p);
    }
  }
  return cudaErrorInvalidValue;
}

}  // namespace internal
}  // namespace dsv4::kernels::cuda
