// The multi-weight split-K linear (contract: linear_params.h FusedLinearParams; host side and plan:
// linear_fused.cc). Several weights that read the same x - the projections of a DeepSeek-V4 layer's normed hidden
// state (wq_a, wkv, the compressors' wkv / wgate, the indexer's weights_proj) or of c_q (wq_b, the indexer's wq_b) -
// in one launch: at decode sizes each of them alone is a latency-bound 5-8 us launch on the H200 whatever the kernel
// (bench/RESULTS.md), so one launch over all of them pays that latency once and fills the GPU with their summed
// rows. Also a single (grouped) linear when its plan asks for this kernel (LinearPlan::min_blocks > 0).
//
// Work items: grid z enumerates the weights' row blocks (16 rows per warp, warps_m warps per block) one weight
// after another, grid y the 8 * NW-token tiles, grid x the blocks of a thread-block cluster that split K. Every
// block serves one weight (its format - FP8 block-128 or BF16 - decided per block, uniform), so a launch may mix
// formats and row counts; all weights share Kin and the plan.
//
// Per block the computation is the split-K kernel's (linear.cu LinearSplitKernel, one 16-row tile per warp),
// whose MMA mapping, x swizzle and fixed-order reduction it shares (linear_device.cuh), so results are
// deterministic and each output is a plain fp32 sum of bf16 x bf16 products with the FP8 block scales applied
// per 128-wide step. Differences from that kernel:
//  - x staging: only the block's real token rows (min(T - tok0, 8 * NW)) are staged and the shared-memory slice is
//    sized for min(T, 8 * NW) rows (at T = 1 an eighth of the staging and of the shared memory); a fragment row past
//    the block's tokens reads the last real row instead (its outputs are never stored);
//  - kD weight steps in flight per warp: 2 in the default build (as LinearSplitKernel, __launch_bounds__ for 2
//    blocks of 8 warps per SM), 1 in the lean build (4 blocks per SM: <= 64 registers, twice the warps to issue
//    from - ncu put the split-K kernel at ~113 registers, ~15 warps per SM and 7 cycles per issue), and 1 in the
//    default build's 64-token warp tile (NW 8, 33-128 tokens: each weight step dequantised once for 64 tokens);
//  - kBits: the FP8 dequantisation by bit moves (e4m3_bits.h: 3 instructions per 2 elements instead of 4); x is
//    then staged times 2^kBitsXShift and each step's partial sums multiplied by 2^kBitsPartShift in fp32, both
//    exact, so the sums equal the hardware path's for any practical x (e4m3_bits.h says where they could not).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/e4m3_bits.h"
#include "kernels/cuda/linear_device.cuh"
#include "kernels/cuda/linear_params.h"
#include "kernels/cuda/pdl.h"

namespace dsv4::kernels::cuda {
namespace {

// Raw 32-bit words one thread loads per weight row and 64-wide sub-step (16 e4m3 bytes or 16 bf16 values) and
// sub-steps per step (a step is one FP8 block-128 column: 128 K elements; BF16 steps are 64 wide).
template <LinearKernelFormat F>
constexpr int kFusedRaw = kRawWords<F>;
template <LinearKernelFormat F>
constexpr int kFusedSub = F == LinearKernelFormat::kFp8 ? 2 : 1;

// MMA k-step j's A words of one row and sub-step from its raw words: word 2j = elements 4j, 4j+1 and 2j+1 = 4j+2,
// 4j+3 as bf16x2. kBits: the values are the weights times 2^-120 (e4m3_bits.h).
template <LinearKernelFormat F, bool kBits>
__device__ __forceinline__ void FusedToBf16Pair(const uint32_t (&raw)[kFusedRaw<F>], int j, uint32_t& lo,
                                                uint32_t& hi) {
  if constexpr (F == LinearKernelFormat::kFp8) {
    if constexpr (kBits) {
      E4m3x4ToBf16Bits(raw[j], lo, hi);
    } else {
      E4m3x4ToBf16(raw[j], lo, hi);
    }
  } else {
    lo = raw[2 * j], hi = raw[2 * j + 1];
  }
}

// Four x elements [k, k + 4) at element offset `off` of x as two bf16x2 words, each value times `mul` (1 or
// 2^kBitsXShift: exact) before its rounding to bf16; zeros past Kin.
__device__ __forceinline__ uint2 FusedLoadX4(const void* x, bool x_bf16, bool vec, int64_t off, int64_t k,
                                             int64_t kin, float mul) {
  float v[4];
  if (vec && k + 4 <= kin) {
    if (x_bf16) {
      const uint2 raw = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(x) + off + k));
      if (mul == 1.f) return raw;
      v[0] = __uint_as_float(raw.x << 16), v[1] = __uint_as_float(raw.x & 0xffff0000u);
      v[2] = __uint_as_float(raw.y << 16), v[3] = __uint_as_float(raw.y & 0xffff0000u);
    } else {
      const float4 f = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(x) + off + k));
      v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[e] = 0.f;
      if (k + e < kin) {
        v[e] = x_bf16 ? __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(x)[off + k + e]) << 16)
                      : static_cast<const float*>(x)[off + k + e];
      }
    }
  }
  return uint2{PackBf16x2(v[0] * mul, v[1] * mul), PackBf16x2(v[2] * mul, v[3] * mul)};
}

// One block's work for weight `e` in format F: row block `row_block` of it, token tile blockIdx.y, K slice
// blockIdx.x of the cluster. kD weight steps in flight per warp.
template <LinearKernelFormat F, int NW, int kD, bool kBits>
__device__ __forceinline__ void FusedBody(const FusedLinearParams& p, const FusedLinearEntry& e, int64_t row_block,
                                          unsigned char* smem) {
  constexpr int kRaw = kFusedRaw<F>;
  constexpr int kS = kFusedSub<F>;
  constexpr int kStep = kStepK * kS;  // K elements per step
  constexpr int kTokens = 8 * NW;
  constexpr bool kFp8 = F == LinearKernelFormat::kFp8;
  constexpr int64_t kEsize = kFp8 ? 1 : 2;
  const int warps_k = p.plan.warps_k, warps_m = p.plan.warps_m;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wk = warp % warps_k, wm = warp / warps_k;
  const int g = lane >> 2, q = lane & 3;
  const int rank = static_cast<int>(blockIdx.x);  // cluster (1, 1, cluster) x = rank: this block's K slice
  const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * kTokens;
  const int kin = static_cast<int>(p.k);  // < 2^30 (CheckFusedPlan)
  const int64_t n = e.n;
  const bool vec = e.vec;
  const int64_t block_row0 = row_block * (int64_t{16} * warps_m);
  const int64_t row0 = block_row0 + int64_t{16} * wm;
  const int slice_steps = static_cast<int>(p.plan.k_slice / kStep);
  const int steps = (kin + kStep - 1) / kStep;
  const int s_begin = rank * slice_steps;
  const int block_steps = s_begin >= steps ? 0 : (steps - s_begin < slice_steps ? steps - s_begin : slice_steps);
  const int my_steps = block_steps > wk ? (block_steps - wk + warps_k - 1) / warps_k : 0;

  // Rows row0 + g + 8 h of this weight (h = 0: "lo", 1: "hi"); a row past n reads nothing (zeros).
  const void* rows[2];
  bool row_ok[2];
  const float* scale_row[2];  // FP8: the rows' block-scale rows
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = row0 + g + 8 * h;
    row_ok[h] = r < n;
    const int64_t rr = row_ok[h] ? r : 0;
    rows[h] = static_cast<const uint8_t*>(e.w) + rr * kin * kEsize;
    scale_row[h] = kFp8 ? e.scale + ((e.scale_row0 + rr) / kScaleBlock) * e.scale_cols : nullptr;
  }
  auto step_of = [&](int it) { return s_begin + wk + it * warps_k; };
  // Requests local step `it`'s weights (and FP8 block scales) into a ring slot.
  auto request = [&](int it, uint32_t (&raw)[2][kS][kRaw], float (&sc)[2]) {
    const int s = step_of(it);
    const int k = s * kStep + 16 * kS * q;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int u = 0; u < kS; ++u) LoadWeightRow<F>(rows[h], row_ok[h], vec, k + 16 * u, kin, raw[h][u]);
      sc[h] = 1.f;
      if constexpr (kFp8) sc[h] = row_ok[h] ? __ldg(scale_row[h] + s) : 0.f;
    }
  };

  // The first kD steps are requested before x is staged, so they fly meanwhile.
  uint32_t ring[kD][2][kS][kRaw];
  float ring_sc[kD][2];
#pragma unroll
  for (int d = 0; d < kD; ++d) {
    if (d < my_steps) request(d, ring[d], ring_sc[d]);
  }

  // Stage this block's token rows of x[.., slice] as bf16 (zeros past Kin): StageXSlice, 8 rows' loads in flight a
  // thread (4 in the lean build, for its registers).
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);
  const int pitch = static_cast<int>(p.plan.k_slice) + 4;
  const int rows_here = static_cast<int>(p.t - tok0 < kTokens ? p.t - tok0 : kTokens);  // >= 1: tok0 < T
  {
    static_assert(kBitsXShift == 64 && kBitsPartShift == 56, "the literals below");
    const float mul = (kFp8 && kBits) ? 0x1p64f : 1.f;
    const int k_base = s_begin * kStep;
    const int64_t x_row0 = tok0 * p.x_stride + e.x_col;
    constexpr int kBatch = (kD == 1 && NW == 1) ? 4 : 8;  // the lean build: 4, for its 64 registers
    const int quads = static_cast<int>(p.plan.k_slice / 4);
    if (vec && !p.x_bf16 && k_base + static_cast<int>(p.plan.k_slice) <= kin) {
      // The common case (f32 x, whole slice inside Kin): one 16-byte load and two packs a quad, no checks.
      const float4* x0 = reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + x_row0 + k_base);
      const int64_t row_quads = p.x_stride / 4;  // vec: x_stride % 4 == 0
      StageXSlice<kBatch>(xs, pitch, rows_here, quads, [&](int r, int cq) {
        const float4 v = __ldg(x0 + r * row_quads + cq);
        return uint2{PackBf16x2(v.x * mul, v.y * mul), PackBf16x2(v.z * mul, v.w * mul)};
      });
    } else {
      StageXSlice<kBatch>(xs, pitch, rows_here, quads, [&](int r, int cq) {
        const int k = k_base + 4 * cq;
        return k < kin ? FusedLoadX4(p.x, p.x_bf16, vec, x_row0 + r * p.x_stride, k, kin, mul) : uint2{0u, 0u};
      });
    }
  }
  __syncthreads();

  // This lane's token row of each 8-token tile (g + 8 jn), or the block's last real row past its tokens.
  int xrow[NW];
#pragma unroll
  for (int jn = 0; jn < NW; ++jn) xrow[jn] = (8 * jn + g < rows_here ? 8 * jn + g : rows_here - 1) * pitch;

  float acc[1][NW][4];
#pragma unroll
  for (int jn = 0; jn < NW; ++jn)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[0][jn][c] = 0.f;

  for (int base = 0; base < my_steps; base += kD) {
#pragma unroll
    for (int d = 0; d < kD; ++d) {
      const int it = base + d;
      if (it < my_steps) {
        const int ls = step_of(it) - s_begin;  // local step: x columns [ls * kStep, +kStep)
        const float sc0 = ring_sc[d][0], sc1 = ring_sc[d][1];
        float part[NW][4];
#pragma unroll
        for (int jn = 0; jn < NW; ++jn)
#pragma unroll
          for (int c = 0; c < 4; ++c) part[jn][c] = 0.f;
#pragma unroll
        for (int u = 0; u < kS; ++u) {
          // This thread's 16 elements of the sub-step, as slice columns.
          const int e0 = ls * kStep + 16 * (kS * q + u);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            // Each MMA's A words are converted just before it (4 live words instead of 16: the lean build's
            // registers), elements 4j .. 4j+3 of rows g and g + 8.
            uint32_t a[2][8];
#pragma unroll
            for (int h = 0; h < 2; ++h) FusedToBf16Pair<F, kBits>(ring[d][h][u], j, a[h][2 * j], a[h][2 * j + 1]);
            const int pos = static_cast<int>(XPos(e0 + 4 * j));
#pragma unroll
            for (int jn = 0; jn < NW; ++jn) {
              const uint2 b = *reinterpret_cast<const uint2*>(xs + xrow[jn] + pos);
              Mma16816(part[jn], a[0][2 * j], a[1][2 * j], a[0][2 * j + 1], a[1][2 * j + 1], b.x, b.y);
            }
          }
        }
        // Every word of the slot is converted: request the step kD ahead into it.
        if (it + kD < my_steps) request(it + kD, ring[d], ring_sc[d]);
        // The step's block scale per row (1 for BF16), in fp32; kBits first undoes 2^-120 * 2^64 (exact).
#pragma unroll
        for (int jn = 0; jn < NW; ++jn) {
          if constexpr (kFp8 && kBits) {
#pragma unroll
            for (int c = 0; c < 4; ++c) part[jn][c] *= 0x1p56f;
          }
          acc[0][jn][0] += sc0 * part[jn][0];
          acc[0][jn][1] += sc0 * part[jn][1];
          acc[0][jn][2] += sc1 * part[jn][2];
          acc[0][jn][3] += sc1 * part[jn][3];
        }
      }
    }
  }

  float* red = reinterpret_cast<float*>(smem + ((p.x_rows * pitch * 2 + 15) / 16) * 16);
  SplitEpilogueTo<1, NW>(p.plan, e.y, e.y_stride, n, p.t, acc, red, block_row0, row0, tok0, wm, wk, lane, rank);
}

// kD: weight steps in flight per warp - 2 where two blocks of 8 warps share an SM's registers, 1 for four, and 1 for
// the 64-token warp tile (NW 8: its 64 accumulators; two steps in flight spilled 156 bytes, one spills none).
template <int kMinBlocks, int NW>
constexpr int kFusedRing = (kMinBlocks >= kFusedLeanBlocks || NW == 8) ? 1 : 2;

template <int NW, int kMinBlocks, bool kBits>
__global__ void __launch_bounds__(32 * kSplitWarps, kMinBlocks)
    LinearFusedKernel(const __grid_constant__ FusedLinearParams p) {
  PdlEnter();
  extern __shared__ __align__(16) unsigned char fused_smem[];
  // The weight of this block's row block: the last whose first block is <= blockIdx.z (block0 ascends). Uniform
  // over the block and over its cluster (the cluster spans grid x only).
  int idx = 0;
#pragma unroll
  for (int i = 1; i < kFusedMaxWeights; ++i) {
    if (i < p.count && static_cast<int64_t>(blockIdx.z) >= p.e[i].block0) idx = i;
  }
  const FusedLinearEntry& e = p.e[idx];
  const int64_t row_block = static_cast<int64_t>(blockIdx.z) - e.block0;
  if (e.format == LinearKernelFormat::kFp8) {
    FusedBody<LinearKernelFormat::kFp8, NW, kFusedRing<kMinBlocks, NW>, kBits>(p, e, row_block, fused_smem);
  } else {
    FusedBody<LinearKernelFormat::kBf16, NW, kFusedRing<kMinBlocks, NW>, false>(p, e, row_block, fused_smem);
  }
}

template <int NW, int kMinBlocks, bool kBits>
cudaError_t LaunchFused(const FusedLinearParams& p, cudaStream_t stream) {
  const LinearPlan& pl = p.plan;
  // The shared-memory limit raised once (to the most any plan takes).
  if (const cudaError_t err = RaiseSharedLimitOnce<LinearFusedKernel<NW, kMinBlocks, kBits>>(kSplitMaxSharedBytes);
      err != cudaSuccess) {
    return err;
  }
  const FusedLinearEntry& last = p.e[p.count - 1];
  const int64_t rows_per_block = int64_t{16} * pl.warps_m;
  const int64_t blocks = last.block0 + (last.n + rows_per_block - 1) / rows_per_block;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(pl.cluster), static_cast<unsigned>((p.t + 8 * NW - 1) / (8 * NW)),
                        static_cast<unsigned>(blocks));
  config.blockDim = dim3(static_cast<unsigned>(32 * pl.warps_m * pl.warps_k));
  config.dynamicSmemBytes = static_cast<size_t>(internal::FusedSharedBytes(pl, p.x_rows));
  config.stream = stream;
  cudaLaunchAttribute cluster_dim;
  SetClusterX(config, cluster_dim, pl.cluster);
  return LaunchPdlConfig(config, LinearFusedKernel<NW, kMinBlocks, kBits>, p);
}

template <int NW, bool kBits>
cudaError_t LaunchFusedBlocks(const FusedLinearParams& p, cudaStream_t stream) {
  if (p.plan.min_blocks == kFusedMinBlocks) return LaunchFused<NW, kFusedMinBlocks, kBits>(p, stream);
  if constexpr (NW == 1) {  // the lean build spills with more token tiles (ptxas: 12-16 bytes at NW 2)
    if (p.plan.min_blocks == kFusedLeanBlocks) return LaunchFused<NW, kFusedLeanBlocks, kBits>(p, stream);
  }
  return cudaErrorInvalidValue;  // no such build (the plan check refuses it first)
}

template <int NW>
cudaError_t LaunchFusedTokens(const FusedLinearParams& p, cudaStream_t stream) {
  return p.plan.bit_dequant ? LaunchFusedBlocks<NW, true>(p, stream) : LaunchFusedBlocks<NW, false>(p, stream);
}

}  // namespace

namespace internal {

cudaError_t LaunchFusedLinearKernel(const FusedLinearParams& p, cudaStream_t stream) {
  if (p.count < 1 || p.count > kFusedMaxWeights || p.plan.m_tiles != 1) return cudaErrorInvalidValue;
  switch (p.plan.n_tiles) {
    case 1: return LaunchFusedTokens<1>(p, stream);
    case 2: return LaunchFusedTokens<2>(p, stream);
    case 4: return LaunchFusedTokens<4>(p, stream);
    case 8: return LaunchFusedTokens<8>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace internal
}  // namespace dsv4::kernels::cuda
