// The FP8 decode linear with its weights streamed through a shared-memory ring (LinearPlan::stages > 0; contract:
// linear_params.h; plan: linear.cc PlanRingLinear). Same work split, MMA mapping, x staging and fixed-order K
// reduction as the split-K kernel (linear.cu LinearSplitKernel, one 16-row tile per warp), so the sums are the
// same; what differs is how the weights arrive and how little a step costs:
//  - each warp streams its 16-row x 128-K steps (2 KB, one block-scale column) with cp.async into kStages slots of
//    its own (8 lanes per 128-byte row segment, 4 copies of 16 bytes per lane and step, stored in MMA fragment
//    order: slot byte (h * 2 + u) * 512 + lane * 16 holds lane (g, q)'s bytes [32 q + 16 u, +16) of row 8 h + g),
//    the step's block scale copied beside them; kStages - 1 steps are requested before x is staged, then one step
//    ahead per step consumed, so the bytes in flight do not depend on registers;
//  - the per-step bookkeeping is a handful of adds: source pointers, slot and x offsets are set up once per warp
//    (ncu on the H200 showed the split-K kernel issuing ~430 instructions per 2 KB step, 60% of them address
//    arithmetic, at 7 cycles per issue with 15 warps per SM: instruction- and latency-bound at 42% of DRAM
//    bandwidth; bench/RESULTS.md).
// Only FP8 weights whose rows are 16-byte aligned (Kin % 16 == 0) and whose 16-row tiles sit inside one 128-row
// scale block (groups == 1 or N % 16 == 0); LaunchLinear runs the register ring otherwise.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/linear_device.cuh"
#include "kernels/cuda/linear_params.h"
#include "kernels/cuda/pdl.h"

namespace dsv4::kernels::cuda {
namespace {

constexpr int kRingStep = 128;  // K elements (= bytes) of a step: one FP8 scale-block column
constexpr int kRingSlot = static_cast<int>(kRingTileBytes) + 16;  // 16 rows x 128 bytes + the block scale

// Registers: 64 a thread (4 blocks of 8 warps per SM) for one token tile, 128 (2 blocks) for 2 or 4 (85 would spill).
template <int NW>
constexpr int kRingMinBlocks = NW == 1 ? 4 : 2;

template <int NW, int kStages>
__global__ void __launch_bounds__(32 * kSplitWarps, kRingMinBlocks<NW>) LinearRingKernel(const LinearParams p) {
  PdlEnter();
  extern __shared__ __align__(16) unsigned char ring_smem[];
  constexpr int kTokens = 8 * NW;
  constexpr int kAcc = NW * 4;
  const int warps_k = p.plan.warps_k, warps_m = p.plan.warps_m, cluster = p.plan.cluster;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wk = warp % warps_k, wm = warp / warps_k;
  const int g = lane >> 2, q = lane & 3;
  const int rank = static_cast<int>(blockIdx.x);  // cluster (1, 1, cluster) x = rank: this block's K slice
  const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * kTokens;
  const int64_t rows_per_block = int64_t{16} * warps_m;
  const int64_t row_blocks = (p.n + rows_per_block - 1) / rows_per_block;
  const int64_t grp = blockIdx.z / row_blocks;
  const int64_t block_row0 = (blockIdx.z % row_blocks) * rows_per_block;
  const int64_t row0 = block_row0 + int64_t{16} * wm;
  const int slice_steps = static_cast<int>(p.plan.k_slice / kRingStep);
  const int steps = static_cast<int>((p.k + kRingStep - 1) / kRingStep);
  const int s_begin = rank * slice_steps;
  const int block_steps = s_begin >= steps ? 0 : std::min(steps - s_begin, slice_steps);
  const int my_steps = block_steps > wk ? (block_steps - wk + warps_k - 1) / warps_k : 0;

  // Shared memory: [x slice][partial sums (K split only)][ring: warp-major, kStages slots].
  const int64_t pitch = p.plan.k_slice + 4;  // x slice row pitch, elements
  const int64_t x_bytes = ((kTokens * pitch * 2 + 15) / 16) * 16;
  const int64_t red_bytes = warps_k * cluster > 1 ? int64_t{4} * warps_m * warps_k * kAcc * 32 : 0;
  unsigned char* ring = ring_smem + x_bytes + red_bytes + static_cast<int64_t>(warp) * kStages * kRingSlot;
  const uint32_t ring_s = SharedAddress(ring);

  // Copy side: lane copies 16-byte unit c of rows 4 u + (lane >> 3), u = 0..3, at K byte k0 + it * step_bytes.
  const int c = lane & 7, rsub = lane >> 3;
  const int64_t k0 = static_cast<int64_t>(s_begin + wk) * kRingStep + 16 * c;
  const int64_t step_bytes = static_cast<int64_t>(warps_k) * kRingStep;
  const uint8_t* src[4];
  bool row_ok[4];
  uint32_t dst[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int rr = 4 * u + rsub;
    const int64_t r = row0 + rr;
    row_ok[u] = r < p.n;
    src[u] = static_cast<const uint8_t*>(p.w) + (grp * p.n + (row_ok[u] ? r : 0)) * p.k + k0;
    dst[u] = static_cast<uint32_t>(((u >> 1) * 2 + (c & 1)) * 512 + (4 * (rr & 7) + (c >> 1)) * 16);
  }
  // The tile's block-scale row (every row of a 16-row tile shares it; a tile past N reads row N - 1's).
  const float* sc_src = p.scale + ((grp * p.n + std::min<int64_t>(row0, p.n - 1)) / kScaleBlock) * p.scale_cols +
                        s_begin + wk;
  // Requests local step `it` into slot `slot` (K past Kin and rows past N zero-filled: no bytes read).
  auto issue = [&](int it, int slot) {
    const int64_t off = static_cast<int64_t>(it) * step_bytes;
    const bool k_ok = k0 + off < p.k;
    const uint32_t base = ring_s + static_cast<uint32_t>(slot * kRingSlot);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const bool ok = row_ok[u] && k_ok;
      CpAsync16(base + dst[u], ok ? src[u] + off : p.w, ok ? 16 : 0);
    }
    if (lane == 0) CpAsync4(base + static_cast<uint32_t>(kRingTileBytes), sc_src + static_cast<int64_t>(it) * warps_k);
  };

  // The first kStages - 1 steps fly while x is staged (one cp.async group per step, empty ones included, so the
  // group count stays uniform).
#pragma unroll
  for (int d = 0; d < kStages - 1; ++d) {
    if (d < my_steps) issue(d, d);
    CpAsyncCommit();
  }

  // Stage x[tok0 .. +kTokens, slice] as bf16 (zeros past T and past Kin): a thread takes 4 elements of every
  // token row per pass, all rows' loads issued before the stores (no index division, one L2 round trip a pass).
  uint16_t* xs = reinterpret_cast<uint16_t*>(ring_smem);
  {
    const int quads = static_cast<int>(p.plan.k_slice / 4);
    const int64_t k_base = static_cast<int64_t>(s_begin) * kRingStep;
    const int64_t x_row0 = tok0 * p.x_stride + grp * p.k;
    for (int cq = static_cast<int>(threadIdx.x); cq < quads; cq += static_cast<int>(blockDim.x)) {
      const int64_t k = k_base + 4 * cq;
      uint2 v[kTokens];
#pragma unroll
      for (int r = 0; r < kTokens; ++r) {
        v[r] = uint2{0u, 0u};
        if (tok0 + r < p.t && k < p.k) v[r] = LoadX4(p, x_row0 + r * p.x_stride, k);
      }
      const int pos = static_cast<int>(XPos(4 * cq));
#pragma unroll
      for (int r = 0; r < kTokens; ++r) *reinterpret_cast<uint2*>(xs + r * pitch + pos) = v[r];
    }
  }
  __syncthreads();

  // Compute side: this lane's B fragments of sub-step u sit at unit w = 2 q + u (swizzled) of the step's
  // 128-element chunk, elements 4 j .. 4 j + 3, in token row g of each 8-token tile.
  const unsigned char* xb[2];
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int w = 2 * q + u;
    xb[u] = reinterpret_cast<const unsigned char*>(xs) + g * pitch * 2 + ((w ^ ((w >> 2) & 1)) << 5);
  }
  const int64_t x_tile = 8 * pitch * 2;  // bytes between 8-token tiles
  const unsigned char* my_slots = ring;

  float acc[1][NW][4];
#pragma unroll
  for (int jn = 0; jn < NW; ++jn)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][jn][e] = 0.f;

  for (int base = 0; base < my_steps; base += kStages) {
#pragma unroll
    for (int d = 0; d < kStages; ++d) {
      const int it = base + d;
      if (it >= my_steps) break;
      // Slot d holds step it; step it + kStages - 1 goes into the slot step it - 1 used, once every lane has read
      // it (this __syncwarp); after the wait, the second makes the other lanes' copies visible.
      __syncwarp();
      if (it + kStages - 1 < my_steps) issue(it + kStages - 1, (d + kStages - 1) % kStages);
      CpAsyncCommit();
      CpAsyncWait<kStages - 1>();
      __syncwarp();
      const unsigned char* slot = my_slots + d * kRingSlot;
      uint4 wv[4];  // [h * 2 + u]
#pragma unroll
      for (int v = 0; v < 4; ++v) wv[v] = *reinterpret_cast<const uint4*>(slot + v * 512 + lane * 16);
      const float sc = *reinterpret_cast<const float*>(slot + kRingTileBytes);
      const int64_t xstep = static_cast<int64_t>(wk + it * warps_k) * (kRingStep * 2);
      float part[NW][4];
#pragma unroll
      for (int jn = 0; jn < NW; ++jn)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[jn][e] = 0.f;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        uint32_t a[2][8];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint4 r = wv[h * 2 + u];
          E4m3x4ToBf16(r.x, a[h][0], a[h][1]);
          E4m3x4ToBf16(r.y, a[h][2], a[h][3]);
          E4m3x4ToBf16(r.z, a[h][4], a[h][5]);
          E4m3x4ToBf16(r.w, a[h][6], a[h][7]);
        }
        const unsigned char* xrow = xb[u] + xstep;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int jn = 0; jn < NW; ++jn) {
            const uint2 b = *reinterpret_cast<const uint2*>(xrow + jn * x_tile + 8 * j);
            Mma16816(part[jn], a[0][2 * j], a[1][2 * j], a[0][2 * j + 1], a[1][2 * j + 1], b.x, b.y);
          }
        }
      }
#pragma unroll
      for (int jn = 0; jn < NW; ++jn)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][jn][e] += sc * part[jn][e];
    }
  }
  CpAsyncWait<0>();

  float* red = reinterpret_cast<float*>(ring_smem + x_bytes);
  SplitEpilogue<1, NW>(p, acc, red, block_row0, row0, tok0, grp, wm, wk, lane, rank);
}

template <int NW, int kStages>
cudaError_t LaunchRing(const LinearParams& p, cudaStream_t stream) {
  const LinearPlan& pl = p.plan;
  if (const cudaError_t e = RaiseSharedLimitOnce<LinearRingKernel<NW, kStages>>(internal::LinearMaxSharedBytes());
      e != cudaSuccess) {
    return e;
  }
  const int64_t rows_per_block = int64_t{16} * pl.warps_m;
  const int64_t row_blocks = (p.n + rows_per_block - 1) / rows_per_block;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(pl.cluster), static_cast<unsigned>((p.t + 8 * NW - 1) / (8 * NW)),
                        static_cast<unsigned>(row_blocks * p.groups));
  config.blockDim = dim3(static_cast<unsigned>(32 * pl.warps_m * pl.warps_k));
  config.dynamicSmemBytes = static_cast<size_t>(internal::LinearSharedBytes(pl));
  config.stream = stream;
  cudaLaunchAttribute cluster_dim;
  SetClusterX(config, cluster_dim, pl.cluster);
  return LaunchPdlConfig(config, LinearRingKernel<NW, kStages>, p);
}

template <int NW>
cudaError_t LaunchRingTokens(const LinearParams& p, cudaStream_t stream) {
  switch (p.plan.stages) {
    case 2: return LaunchRing<NW, 2>(p, stream);
    case 3: return LaunchRing<NW, 3>(p, stream);
    case 4: return LaunchRing<NW, 4>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

namespace internal {

cudaError_t LaunchLinearRingKernel(const LinearParams& p, cudaStream_t stream) {
  if (p.format != LinearKernelFormat::kFp8 || p.plan.m_tiles != 1) return cudaErrorInvalidValue;
  switch (p.plan.n_tiles) {
    case 1: return LaunchRingTokens<1>(p, stream);
    case 2: return LaunchRingTokens<2>(p, stream);
    case 4: return LaunchRingTokens<4>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace internal
}  // namespace dsv4::kernels::cuda
