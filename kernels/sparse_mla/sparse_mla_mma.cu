// Tensor-core sparse-MLA decode (bf16 mma.sync m16n8k16, f32 accumulate), design in docs/sparse-mla.md:
// the 8-warp kernel (any shared memory size: 16- or 32-row tiles; what sm_120 runs) and the split combine
// kernel shared with the wide 16-warp kernel of sparse_mla_mma_wide.cu and the wgmma kernel of
// sparse_mla_wgmma.cu.
//
// One block = one sequence x one group of G = 16 * kMTiles heads (H = 128 runs two 64-head groups) x one
// split of the selected rows. The block streams its rows in tiles of kTileRows through a 3-stage cp.async
// ring (each row gathered by index, read once for all G heads), dequantises each tile once into a bf16 tile
// in shared memory, and per tile runs three phases separated by barriers:
//   1. scores: S[G, rows] = Q K^T. Q stays in registers (A fragments); warp w owns kWarpM m-tiles and
//      kQkDims of the 512 dims, so its partial scores are summed over the kDimGroups warps in phase 2.
//   2. online softmax in f32 (base 2), P (bf16) and the per-head rescale factor to shared memory.
//   3. O[G, 512] = alpha * O + P V: warp w owns dims [64w, 64w + 64) for all G heads (128 f32 accumulators
//      per thread at G = 64), and dequantises the next tile meanwhile (ALU work beside the tensor work).
// With several splits each block writes its normalised partial output and LSE, and a second kernel merges
// them by log-sum-exp; with one split the block applies the sink and writes bf16 directly.
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "kernels/sparse_mla/sparse_mla_cluster_merge.cuh"
#include "kernels/sparse_mla/sparse_mla_device.cuh"
#include "kernels/sparse_mla/sparse_mla_kernels.h"
#include "kernels/sparse_mla/sparse_mla_split_launch.h"

namespace dsv4::kernels::sparse_mla {
namespace {

using namespace device;  // NOLINT(build/namespaces): kernel-local helpers
using internal::LaunchSplitKernel;
using internal::PrepareSplitKernel;
using internal::SplitClusterCapacity;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kStages = 3;
constexpr int kKbStride = 2 * kKvDim + 16;  // bytes per bf16 row; +16 B keeps ldmatrix conflict-free
constexpr int kDataChunks = kRowDataBytes / 16;  // 36 cp.async chunks of 16 B, then one of 8 B (scales)
constexpr float kRescaleSlack = 8.f;  // log2 units, see softmax_tile

template <int kMTiles, int kTileRows>
struct MmaConfig {
  static constexpr int kHeads = 16 * kMTiles;
  // Phase 1 split of the score product over warps.
  static constexpr int kWarpM = kMTiles >= 2 ? 2 : 1;
  static constexpr int kQkHeadGroups = kMTiles / kWarpM;
  static constexpr int kDimGroups = kWarps / kQkHeadGroups;
  static constexpr int kQkDims = kKvDim / kDimGroups;
  static constexpr int kQkKSteps = kQkDims / 16;
  static constexpr int kNTiles = kTileRows / 8;
  // Phase 2: consecutive threads share a head.
  static constexpr int kThreadsPerHead = kThreads / kHeads;
  static constexpr int kRowsPerThread = kTileRows / kThreadsPerHead;
  // Shared memory: raw stages [rows x 576 data][rows x 8 scales][rows x int valid], two bf16 tiles, the
  // partial scores [kDimGroups][G][rows + 4] f32, P [G][rows + 8] bf16, per-head alpha / max / sums.
  static constexpr int kRawData = kTileRows * kRowDataBytes;
  static constexpr int kRawScales = kTileRows * kRowScaleBytes;
  static constexpr int kRawStage = kRawData + kRawScales + kTileRows * 4;
  static constexpr int kKbBytes = kTileRows * kKbStride;
  static constexpr int kSpartStride = kTileRows + 4;
  static constexpr int kPStride = kTileRows + 8;
  static constexpr int kOffKb = kStages * kRawStage;
  static constexpr int kOffSpart = kOffKb + 2 * kKbBytes;
  static constexpr int kOffP = kOffSpart + kDimGroups * kHeads * kSpartStride * 4;
  static constexpr int kOffAlpha = kOffP + kHeads * kPStride * 2;
  static constexpr int kOffStatM = kOffAlpha + kHeads * 4;
  static constexpr int kOffStatL = kOffStatM + kHeads * 4;
  static constexpr int kOffStatLq = kOffStatL + kHeads * 4;
  static constexpr int kSmemBytes = kOffStatLq + kHeads * 4;
  // The cluster merge's scratch (from offset 0) stays below the statistics the peers read (not at 64 heads
  // with 16-row tiles: sm_120's configuration keeps the combine kernel).
  static constexpr bool kClusterMergeFits = ClusterMergeScratchBytes(kHeads) <= kOffStatM;

  static_assert(kTileRows % 16 == 0 && kThreads % kTileRows == 0, "tile rows");
  static_assert(kRowsPerThread >= 1 && kThreadsPerHead <= 32, "softmax mapping");
  static_assert(kRawStage % 16 == 0 && kOffSpart % 16 == 0 && kOffP % 16 == 0 && kOffAlpha % 16 == 0,
                "16-byte alignment of shared regions");
};

template <int kMTiles, int kTileRows>
__global__ void __launch_bounds__(kThreads, 1) SparseMlaMmaKernel(const SparseMlaParams p, float scale_log2) {
  using C = MmaConfig<kMTiles, kTileRows>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int b = blockIdx.z, split = blockIdx.y, num_splits = gridDim.y;
  const int H = p.num_heads, head0 = blockIdx.x * C::kHeads;
  const BlockRange range = MakeRange<kTileRows>(p, b, split, num_splits);

  // ---- Q as A fragments, loaded once: warp owns m-tiles [qk_hq * kWarpM, +kWarpM) x its dim group ----
  const int qk_hq = warp % C::kQkHeadGroups, qk_dg = warp / C::kQkHeadGroups;
  uint32_t qa[C::kWarpM][C::kQkKSteps][4];
  {
    const uint32_t* q32 = reinterpret_cast<const uint32_t*>(p.q);
#pragma unroll
    for (int mi = 0; mi < C::kWarpM; ++mi) {
      const int h = head0 + 16 * (C::kWarpM * qk_hq + mi) + g;
      const int64_t lo = (static_cast<int64_t>(b) * H + h) * (kKvDim / 2);
      const int64_t hi = lo + 8 * (kKvDim / 2);
#pragma unroll
      for (int ks = 0; ks < C::kQkKSteps; ++ks) {
        const int d2 = (qk_dg * C::kQkDims + 16 * ks + 2 * t4) / 2;
        qa[mi][ks][0] = __ldg(q32 + lo + d2);
        qa[mi][ks][1] = __ldg(q32 + hi + d2);
        qa[mi][ks][2] = __ldg(q32 + lo + d2 + 4);
        qa[mi][ks][3] = __ldg(q32 + hi + d2 + 4);
      }
    }
  }

  // ---- load stage: gather one tile of rows (576 data + 8 scale bytes each) with cp.async ----
  auto load_tile = [&](int tile, int stage) {
    constexpr int kThreadsPerRow = kThreads / kTileRows;
    const int row = tid / kThreadsPerRow, sub = tid % kThreadsPerRow;
    const int pos = (range.tile_begin + tile) * kTileRows + row;
    const uint8_t* dummy = reinterpret_cast<const uint8_t*>(p.q);  // never read (zero-fill copies)
    RowAddress addr{dummy, dummy};
    const bool valid = pos < range.n && LocateRow(p, b, pos, range.ew, addr);
    uint8_t* st = smem + stage * C::kRawStage;
    const uint32_t dst = SmemAddr(st + row * kRowDataBytes);
    for (int part = sub; part <= kDataChunks; part += kThreadsPerRow) {
      if (part < kDataChunks) {
        CpAsync16(dst + part * 16, addr.data + (valid ? part * 16 : 0), valid);
      } else {
        CpAsync8(SmemAddr(st + C::kRawData + row * kRowScaleBytes), addr.scales, valid);
      }
    }
    if (sub == 0) reinterpret_cast<int*>(st + C::kRawData + C::kRawScales)[row] = valid;
  };

  // ---- dequant stage: raw tile -> bf16 [rows][512] (invalid rows were zero-filled, so they give 0) ----
  // One task per (row, 64-dim e4m3 tile) with its scale, then one 16-byte rope copy per thread; each task
  // walks its four 16-byte chunks from a tile-dependent start to spread a quarter-warp over the banks.
  auto dequant_tile = [&](int stage, int kbuf) {
    const uint8_t* st = smem + stage * C::kRawStage;
    uint8_t* kb = smem + C::kOffKb + kbuf * C::kKbBytes;
    for (int task = tid; task < kTileRows * kNumTiles; task += kThreads) {
      const int row = task / kNumTiles, tile = task - row * kNumTiles;
      const uint4* src = reinterpret_cast<const uint4*>(st + row * kRowDataBytes + tile * kTileDim);
      uint4* dst = reinterpret_cast<uint4*>(kb + row * kKbStride + tile * 2 * kTileDim);
      const float scale = ScaleFromUe8m0(st[C::kRawData + row * kRowScaleBytes + tile]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = (j + tile) & 3;
        const uint4 v = src[c];
        uint4 lo, hi;
        DequantE4m3x4(v.x, scale, lo.x, lo.y);
        DequantE4m3x4(v.y, scale, lo.z, lo.w);
        DequantE4m3x4(v.z, scale, hi.x, hi.y);
        DequantE4m3x4(v.w, scale, hi.z, hi.w);
        dst[2 * c] = lo;
        dst[2 * c + 1] = hi;
      }
    }
    for (int c = tid; c < kTileRows * 8; c += kThreads) {  // rope dims: 8 chunks of 8 bf16 per row
      const int row = c >> 3, j = c & 7;
      reinterpret_cast<uint4*>(kb + row * kKbStride + 2 * kNopeDim)[j] =
          reinterpret_cast<const uint4*>(st + row * kRowDataBytes + kNopeDim)[j];
    }
  };

  // ---- phase 1: partial scores of this warp's heads over its dims -> shared memory ----
  auto qk_tile = [&](int kbuf) {
    const uint32_t kb_lane = SmemAddr(smem + C::kOffKb + kbuf * C::kKbBytes) +
                             ((lane & 7) + ((lane >> 4) << 3)) * kKbStride +
                             (qk_dg * C::kQkDims + ((lane >> 3) & 1) * 8) * 2;
    float* sp = reinterpret_cast<float*>(smem + C::kOffSpart) + qk_dg * C::kHeads * C::kSpartStride;
    // 16 rows at a time keeps the accumulators to 16 registers (the O accumulators hold 128).
#pragma unroll
    for (int np = 0; np < C::kNTiles / 2; ++np) {
      float acc[C::kWarpM][2][4];
#pragma unroll
      for (int mi = 0; mi < C::kWarpM; ++mi)
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < C::kQkKSteps; ++ks) {
        uint32_t r0, r1, r2, r3;
        Ldsm4(kb_lane + np * 16 * kKbStride + ks * 32, r0, r1, r2, r3);
#pragma unroll
        for (int mi = 0; mi < C::kWarpM; ++mi) {
          Mma16816(acc[mi][0], qa[mi][ks], r0, r1);
          Mma16816(acc[mi][1], qa[mi][ks], r2, r3);
        }
      }
#pragma unroll
      for (int mi = 0; mi < C::kWarpM; ++mi) {
        const int hl = 16 * (C::kWarpM * qk_hq + mi) + g;
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) {
          const int col = 16 * np + 8 * ni + 2 * t4;
          *reinterpret_cast<float2*>(sp + hl * C::kSpartStride + col) = make_float2(acc[mi][ni][0], acc[mi][ni][1]);
          *reinterpret_cast<float2*>(sp + (hl + 8) * C::kSpartStride + col) =
              make_float2(acc[mi][ni][2], acc[mi][ni][3]);
        }
      }
    }
  };

  // ---- phase 2: online softmax (base 2) of one head's rows over kThreadsPerHead consecutive lanes ----
  const int sm_head = tid / C::kThreadsPerHead, sm_sub = tid % C::kThreadsPerHead;
  const int sm_row0 = sm_sub * C::kRowsPerThread;
  float run_max = -INFINITY, run_sum = 0.f, run_sum_q = 0.f;
  float* alpha_s = reinterpret_cast<float*>(smem + C::kOffAlpha);
  auto softmax_tile = [&](int stage) {
    const float* sp = reinterpret_cast<const float*>(smem + C::kOffSpart) + sm_head * C::kSpartStride + sm_row0;
    const int* valid = reinterpret_cast<const int*>(smem + stage * C::kRawStage + C::kRawData + C::kRawScales);
    float sv[C::kRowsPerThread];
#pragma unroll
    for (int i = 0; i < C::kRowsPerThread; ++i) sv[i] = 0.f;
#pragma unroll
    for (int dg = 0; dg < C::kDimGroups; ++dg) {
      const float* row = sp + dg * C::kHeads * C::kSpartStride;
      if constexpr (C::kRowsPerThread % 4 == 0) {
#pragma unroll
        for (int i = 0; i < C::kRowsPerThread; i += 4) {
          const float4 v = *reinterpret_cast<const float4*>(row + i);
          sv[i] += v.x, sv[i + 1] += v.y, sv[i + 2] += v.z, sv[i + 3] += v.w;
        }
      } else {
#pragma unroll
        for (int i = 0; i < C::kRowsPerThread; ++i) sv[i] += row[i];
      }
    }
    float tmax = -INFINITY;
#pragma unroll
    for (int i = 0; i < C::kRowsPerThread; ++i) {
      sv[i] = valid[sm_row0 + i] ? sv[i] * scale_log2 : -INFINITY;
      tmax = fmaxf(tmax, sv[i]);
    }
#pragma unroll
    for (int off = C::kThreadsPerHead / 2; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(~0u, tmax, off));
    // Lazy rescale: the running max only moves when a tile beats it by more than kRescaleSlack (log2
    // units). Weights then stay below 2^kRescaleSlack (far inside bf16's range) and, after the first
    // tiles, alpha is exactly 1 for every head, so the O rescale of phase 3 is skipped. The result is the
    // same softmax: every weight and sum is taken relative to the same (stale) max.
    const float new_max =
        (run_max == -INFINITY || tmax > run_max + kRescaleSlack) ? fmaxf(run_max, tmax) : run_max;
    const float base = new_max == -INFINITY ? 0.f : new_max;  // no valid row yet: keep everything at 0
    const float alpha = exp2f(run_max - base);
    uint8_t* prow = smem + C::kOffP + (sm_head * C::kPStride + sm_row0) * 2;
    // Two sums: of the f32 weights (for the LSE and the split weights) and of the bf16 weights the PV
    // product uses (to normalise O consistently).
    float tsum = 0.f, tsum_q = 0.f;
    if constexpr (C::kRowsPerThread % 2 == 0) {
#pragma unroll
      for (int i = 0; i < C::kRowsPerThread; i += 2) {
        const float p0 = exp2f(sv[i] - base), p1 = exp2f(sv[i + 1] - base);
        const uint32_t pair = PackBf16x2(p0, p1);
        *reinterpret_cast<uint32_t*>(prow + 2 * i) = pair;
        tsum += p0 + p1;
        tsum_q += __uint_as_float(pair << 16) + __uint_as_float(pair & 0xffff0000u);
      }
    } else {
      const float p0 = exp2f(sv[0] - base);
      const __nv_bfloat16 pb = __float2bfloat16_rn(p0);
      *reinterpret_cast<__nv_bfloat16*>(prow) = pb;
      tsum = p0;
      tsum_q = __bfloat162float(pb);
    }
#pragma unroll
    for (int off = C::kThreadsPerHead / 2; off > 0; off >>= 1) {
      tsum += __shfl_xor_sync(~0u, tsum, off);
      tsum_q += __shfl_xor_sync(~0u, tsum_q, off);
    }
    run_sum = run_sum * alpha + tsum;
    run_sum_q = run_sum_q * alpha + tsum_q;
    run_max = new_max;
    if (sm_sub == 0) alpha_s[sm_head] = alpha;
  };

  // ---- phase 3: O = alpha * O + P V over this warp's 64 dims ----
  float o[kMTiles][8][4];
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int nj = 0; nj < 8; ++nj) o[mi][nj][0] = o[mi][nj][1] = o[mi][nj][2] = o[mi][nj][3] = 0.f;
  auto pv_tile = [&](int kbuf) {
    float a_lo[kMTiles], a_hi[kMTiles];
    bool ones = true;
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
      a_lo[mi] = alpha_s[16 * mi + g];
      a_hi[mi] = alpha_s[16 * mi + g + 8];
      ones = ones && a_lo[mi] == 1.f && a_hi[mi] == 1.f;
    }
    if (!__all_sync(~0u, ones)) {  // skipping is exact: the running max did not move for these heads
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
        for (int nj = 0; nj < 8; ++nj) {
          o[mi][nj][0] *= a_lo[mi];
          o[mi][nj][1] *= a_lo[mi];
          o[mi][nj][2] *= a_hi[mi];
          o[mi][nj][3] *= a_hi[mi];
        }
      }
    }
    const int ld_row = (lane & 7) + ((lane >> 3) & 1) * 8, ld_col = (lane >> 4) * 8;
    const uint32_t p_lane = SmemAddr(smem + C::kOffP) + (ld_row * C::kPStride + ld_col) * 2;
    const uint32_t v_lane =
        SmemAddr(smem + C::kOffKb + kbuf * C::kKbBytes) + ld_row * kKbStride + (warp * 64 + ld_col) * 2;
#pragma unroll
    for (int kr = 0; kr < kTileRows / 16; ++kr) {
      uint32_t pa[kMTiles][4];
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
        Ldsm4(p_lane + (16 * mi * C::kPStride + 16 * kr) * 2, pa[mi][0], pa[mi][1], pa[mi][2], pa[mi][3]);
      }
#pragma unroll
      for (int njp = 0; njp < 4; ++njp) {
        uint32_t v0, v1, v2, v3;
        Ldsm4T(v_lane + 16 * kr * kKbStride + njp * 32, v0, v1, v2, v3);
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
          Mma16816(o[mi][2 * njp], pa[mi], v0, v1);
          Mma16816(o[mi][2 * njp + 1], pa[mi], v2, v3);
        }
      }
    }
  };

  // ---- pipeline: tile t+1 lands while t is scored; t+1 is dequantised during t's PV ----
  if (range.num_tiles > 0) load_tile(0, 0);
  CpAsyncCommit();
  if (range.num_tiles > 1) load_tile(1, 1);
  CpAsyncCommit();
  CpAsyncWait<1>();
  __syncthreads();
  if (range.num_tiles > 0) dequant_tile(0, 0);
  if (range.num_tiles > 2) load_tile(2, 2);
  CpAsyncCommit();
  __syncthreads();
  for (int t = 0; t < range.num_tiles; ++t) {
    qk_tile(t & 1);
    __syncthreads();
    softmax_tile(t % kStages);
    CpAsyncWait<1>();  // tile t+1 (group t+1) has landed for this thread's copies
    __syncthreads();
    pv_tile(t & 1);
    if (t + 1 < range.num_tiles) dequant_tile((t + 1) % kStages, (t + 1) & 1);
    if (t + 3 < range.num_tiles) load_tile(t + 3, t % kStages);
    CpAsyncCommit();
    __syncthreads();
  }

  // ---- epilogue: per-head max / sum to every warp, then normalise and store ----
  LaunchDependents();
  float* stat_m = reinterpret_cast<float*>(smem + C::kOffStatM);
  float* stat_l = reinterpret_cast<float*>(smem + C::kOffStatL);
  float* stat_lq = reinterpret_cast<float*>(smem + C::kOffStatLq);
  if (sm_sub == 0) {
    stat_m[sm_head] = run_max;
    stat_l[sm_head] = run_sum;
    stat_lq[sm_head] = run_sum_q;
  }
  __syncthreads();
  if constexpr (C::kClusterMergeFits) {
    if (num_splits > 1 && ClusterBlocks() == num_splits) {  // the splits are one cluster: merge in place
      ClusterMergeOutput<kMTiles, 64, C::kHeads, kThreads>(p, o, stat_m, stat_l, stat_lq, b, head0, tid,
                                                           /*mtile_head0=*/0, /*dim0=*/warp * 64, smem);
      return;
    }
  }
  StoreBlockOutput<kMTiles, 64, C::kHeads>(p, o, stat_m, stat_l, stat_lq, b, head0, split, num_splits, tid,
                                           /*mtile_head0=*/0, /*dim0=*/warp * 64);
}

// Merges the splits of one (sequence, head) per block of 128 threads (thread i owns dims 4i..4i+3):
// weights w_s = l_s 2^(m_s - M) / L with M = max_s m_s and L = sum_s l_s 2^(m_s - M); lse = (M + log2 L) ln 2;
// then the sink factor. Latency matters more than bandwidth here (B x H blocks of 2 KB per split): the
// per-split (max, sum) pairs are loaded by one thread each into shared memory, and the partial rows four
// splits at a time with independent loads, so a block waits on ~2 + splits / 4 memory round trips instead of
// 3 x splits (third pass). Same arithmetic in the same order as a plain loop, so results are unchanged.
constexpr int kCombineMaxSplits = 128;  // per pass over the (max, sum) pairs; more splits loop
__global__ void __launch_bounds__(128) SparseMlaCombineKernel(const SparseMlaParams p, int num_splits) {
  __shared__ float sm_m[kCombineMaxSplits], sm_l[kCombineMaxSplits];
  WaitForPrimaryGrid();
  const int64_t bh = blockIdx.x;
  const int h = static_cast<int>(bh % p.num_heads);
  const int64_t rows = static_cast<int64_t>(p.batch) * p.num_heads;
  const float* ws_o = static_cast<const float*>(p.workspace) + bh * num_splits * kKvDim;
  const float* m_s = static_cast<const float*>(p.workspace) + rows * num_splits * kKvDim + bh * num_splits;
  const float* l_s = m_s + rows * num_splits;
  const float4* o4 = reinterpret_cast<const float4*>(ws_o) + threadIdx.x;
  uint2* out = reinterpret_cast<uint2*>(p.out + bh * kKvDim) + threadIdx.x;
  // Pass 1: M and L over all splits, kCombineMaxSplits at a time.
  float M = -INFINITY, L = 0.f;
  for (int s0 = 0; s0 < num_splits; s0 += kCombineMaxSplits) {
    const int n = min(num_splits - s0, kCombineMaxSplits);
    __syncthreads();
    if (threadIdx.x < n) {
      sm_m[threadIdx.x] = __ldg(m_s + s0 + threadIdx.x);
      sm_l[threadIdx.x] = __ldg(l_s + s0 + threadIdx.x);
    }
    __syncthreads();
    for (int s = 0; s < n; ++s) {
      if (sm_l[s] != 0.f) M = fmaxf(M, sm_m[s]);
    }
  }
  if (M == -INFINITY) {  // no split saw a valid key
    *out = make_uint2(0u, 0u);
    if (threadIdx.x == 0) p.lse[bh] = INFINITY;
    return;
  }
  for (int s0 = 0; s0 < num_splits; s0 += kCombineMaxSplits) {
    const int n = min(num_splits - s0, kCombineMaxSplits);
    if (num_splits > kCombineMaxSplits) {  // reload this pass's pairs (the buffer holds the last pass)
      __syncthreads();
      if (threadIdx.x < n) {
        sm_m[threadIdx.x] = __ldg(m_s + s0 + threadIdx.x);
        sm_l[threadIdx.x] = __ldg(l_s + s0 + threadIdx.x);
      }
      __syncthreads();
    }
    for (int s = 0; s < n; ++s) {
      if (sm_l[s] != 0.f) L += sm_l[s] * exp2f(sm_m[s] - M);
    }
  }
  const float lse = (M + log2f(L)) * kLn2;
  const float factor = p.attn_sink ? 1.f / (1.f + expf(__ldg(p.attn_sink + h) - lse)) : 1.f;
  // Pass 2: the weighted rows, four independent loads in flight per step.
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0; s0 < num_splits; s0 += 4) {
    float4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[k] = s0 + k < num_splits ? __ldg(o4 + (s0 + k) * (kKvDim / 4)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int s = s0 + k;
      if (s < num_splits) {
        const bool in_smem = num_splits <= kCombineMaxSplits;
        const float l = in_smem ? sm_l[s] : __ldg(l_s + s), m = in_smem ? sm_m[s] : __ldg(m_s + s);
        if (l != 0.f) {  // else an empty split
          const float w = l * exp2f(m - M) / L * factor;
          acc.x += w * v[k].x;
          acc.y += w * v[k].y;
          acc.z += w * v[k].z;
          acc.w += w * v[k].w;
        }
      }
    }
  }
  *out = make_uint2(PackBf16x2(acc.x, acc.y), PackBf16x2(acc.z, acc.w));
  if (threadIdx.x == 0) p.lse[bh] = lse;
}

template <int kMTiles, int kTileRows>
cudaError_t LaunchMain(const SparseMlaParams& p, int num_splits, bool cluster_merge, cudaStream_t stream) {
  using C = MmaConfig<kMTiles, kTileRows>;
  if (cluster_merge && !C::kClusterMergeFits) return cudaErrorInvalidValue;  // it would write split partials
  const dim3 grid(p.num_heads / C::kHeads, num_splits, p.batch);
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  return LaunchSplitKernel(SparseMlaMmaKernel<kMTiles, kTileRows>, grid, kThreads, C::kSmemBytes,
                           cluster_merge ? num_splits : 1, stream, p, scale_log2);
}

template <int kMTiles, int kTileRows>
cudaError_t Prepare() {
  return PrepareSplitKernel(SparseMlaMmaKernel<kMTiles, kTileRows>, MmaConfig<kMTiles, kTileRows>::kSmemBytes);
}

template <int kValue>
using IntC = std::integral_constant<int, kValue>;

// Calls fn(IntC<kMTiles>, IntC<kTileRows>) for the supported configurations (6 instantiations); an
// unsupported pair returns a value-initialised result (0 / cudaSuccess: callers check MmaSmemBytes first).
template <typename Fn>
auto Dispatch(int m_tiles, int tile_rows, Fn&& fn) -> decltype(fn(IntC<4>{}, IntC<32>{})) {
  if (tile_rows == 32) {
    if (m_tiles == 4) return fn(IntC<4>{}, IntC<32>{});
    if (m_tiles == 2) return fn(IntC<2>{}, IntC<32>{});
    if (m_tiles == 1) return fn(IntC<1>{}, IntC<32>{});
  } else if (tile_rows == 16) {
    if (m_tiles == 4) return fn(IntC<4>{}, IntC<16>{});
    if (m_tiles == 2) return fn(IntC<2>{}, IntC<16>{});
    if (m_tiles == 1) return fn(IntC<1>{}, IntC<16>{});
  }
  return decltype(fn(IntC<4>{}, IntC<32>{})){};
}

}  // namespace

namespace internal {

int MmaSmemBytes(int m_tiles, int tile_rows) {
  return Dispatch(m_tiles, tile_rows, [](auto m, auto n) { return MmaConfig<m.value, n.value>::kSmemBytes; });
}

cudaError_t PrepareMmaKernel(int m_tiles, int tile_rows) {
  if (MmaSmemBytes(m_tiles, tile_rows) == 0) return cudaErrorInvalidValue;
  return Dispatch(m_tiles, tile_rows, [](auto m, auto n) { return Prepare<m.value, n.value>(); });
}

int MmaClusterCapacity(int m_tiles, int tile_rows, int num_splits) {
  return Dispatch(m_tiles, tile_rows, [&](auto m, auto n) {
    using C = MmaConfig<m.value, n.value>;
    if constexpr (C::kClusterMergeFits) {
      return SplitClusterCapacity(SparseMlaMmaKernel<m.value, n.value>, kThreads, C::kSmemBytes, num_splits);
    } else {
      return 0;
    }
  });
}

size_t MmaWorkspaceBytes(int batch, int num_heads, int num_splits, bool cluster_merge) {
  if (num_splits <= 1 || cluster_merge) return 0;
  return static_cast<size_t>(batch) * num_heads * num_splits * (kKvDim + 2) * sizeof(float);
}

cudaError_t LaunchMmaDecode(const SparseMlaParams& p, bool wide, bool wgmma, bool wgmma_ws, int m_tiles,
                            int tile_rows, int num_splits, bool cluster_merge, bool pdl, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  cluster_merge = cluster_merge && num_splits > 1;
  if (wide) {
    err = LaunchMmaWideMain(p, m_tiles, num_splits, cluster_merge, stream);
  } else if (wgmma) {
    err = wgmma_ws ? LaunchMmaWgmmaWsMain(p, num_splits, cluster_merge, stream)
                   : LaunchMmaWgmmaMain(p, num_splits, cluster_merge, stream);
  } else {
    if (MmaSmemBytes(m_tiles, tile_rows) == 0) return cudaErrorInvalidValue;
    err = Dispatch(m_tiles, tile_rows, [&](auto m, auto n) {
      return LaunchMain<m.value, n.value>(p, num_splits, cluster_merge, stream);
    });
  }
  if (err != cudaSuccess || num_splits == 1 || cluster_merge) return err;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.num_heads;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(rows));
  config.blockDim = dim3(kKvDim / 4);
  config.stream = stream;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attr;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, SparseMlaCombineKernel, p, num_splits);
}

}  // namespace internal
}  // namespace dsv4::kernels::sparse_mla
