// Tensor-core sparse-MLA decode for sm_90a (H100 / H200): the 8-warp kernel's pipeline with its two matrix
// products on wgmma (fourth pass, docs/sparse-mla.md "sm_90a wgmma kernel"). Built only where the target list
// holds 90a (DSV4_SPARSE_MLA_SM90A); the plan picks it on compute capability 9.0 in place of the mma.sync
// 8-warp kernel for 64-head blocks, which stays the portable path (sm_120) and is tested beside it.
//
// One block = one sequence x 64 heads x one split, 256 threads = two warpgroups, 32-row tiles. What changes
// against the mma.sync kernel:
//   - Q lives in shared memory (bf16, 64 KB) instead of 64 registers per thread, and the dequantised K tile is
//     stored in the "interleaved" (no-swizzle) wgmma layout: 8 rows x 8 dims (128 contiguous bytes) per core
//     matrix. That one layout is K-major for S = Q K^T (rows = N) and N-major for O = P V (dims = N), so the
//     same bf16 tile feeds both products with no transpose and no ldmatrix of K or V.
//   - S = Q K^T: warpgroup w takes dims [256 w, 256 w + 256) for all 32 rows: 16 wgmma m64n32k16 with A and B
//     from shared memory; the two partial score tiles are summed by the softmax (as the 8-warp kernel's
//     dim groups).
//   - O += P V: warpgroup w owns output dims [256 w, 256 w + 256): 2 wgmma m64n256k16 with P from registers
//     (ldmatrix of the softmax's bf16 P, the m16n8k16 A fragment) and V from the K tile (N-major); they run
//     asynchronously while the same threads dequantise the next tile.
// Gather (cp.async, 3 stages), dequantisation (exact, as device.cuh), online softmax (lazy rescale), epilogue
// and split combine are those of the 8-warp kernel.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/sparse_mla/sparse_mla_cluster_merge.cuh"
#include "kernels/sparse_mla/sparse_mla_device.cuh"
#include "kernels/sparse_mla/sparse_mla_kernels.h"
#include "kernels/sparse_mla/sparse_mla_split_launch.h"
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "kernels/sparse_mla/sparse_mla_wgmma_ops.cuh"
#endif

namespace dsv4::kernels::sparse_mla {
namespace {

using namespace device;  // NOLINT(build/namespaces): kernel-local helpers

constexpr int kThreads = 256;  // two warpgroups
constexpr int kHeads = 64;
constexpr int kRows = 32;      // KV rows per tile
constexpr int kStages = 3;     // raw tiles in the cp.async ring
constexpr int kDimGroups = 2;  // partial score tiles (one per warpgroup)
// Shared memory: raw stages [rows x 576][rows x 8 scales][rows x int valid]; Q bf16 (interleaved); two K
// tiles bf16 (interleaved); partial scores [2][64][rows + 4] f32; P [64][rows + 8] bf16; alpha and stats.
constexpr int kRawData = kRows * kRowDataBytes;
constexpr int kRawScales = kRows * kRowScaleBytes;
constexpr int kRawStage = kRawData + kRawScales + kRows * 4;
constexpr int kQBytes = kHeads * kKvDim * 2;
constexpr int kKBytes = kRows * kKvDim * 2;
constexpr int kSpartStride = kRows + 4;
constexpr int kPStride = kRows + 8;
constexpr int kOffQ = kStages * kRawStage;
constexpr int kOffK = kOffQ + kQBytes;
constexpr int kOffSpart = kOffK + 2 * kKBytes;
constexpr int kOffP = kOffSpart + kDimGroups * kHeads * kSpartStride * 4;
constexpr int kOffAlpha = kOffP + kHeads * kPStride * 2;
constexpr int kOffStatM = kOffAlpha + kHeads * 4;
constexpr int kOffStatL = kOffStatM + kHeads * 4;
constexpr int kOffStatLq = kOffStatL + kHeads * 4;
constexpr int kSmemBytes = kOffStatLq + kHeads * 4;
static_assert(kRawStage % 16 == 0 && kOffQ % 128 == 0 && kOffK % 128 == 0 && kOffSpart % 16 == 0 &&
                  kOffP % 16 == 0 && kOffAlpha % 16 == 0,
              "alignment of shared regions");
static_assert(kSmemBytes <= 227 * 1024, "fits sm_90's 227 KB per block");
// The cluster merge's scratch (from offset 0: tiles and Q, all consumed by then) stays below the statistics the
// peers read.
static_assert(ClusterMergeScratchBytes(kHeads) <= kOffStatM, "room for the cluster merge");

// Device-only parts: compiled for sm_90a alone (other targets get an empty kernel the plan never launches).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr int kDataChunks = kRowDataBytes / 16;
constexpr float kRescaleSlack = 8.f;  // log2 units, as the 8-warp kernel
constexpr int kThreadsPerHead = kThreads / kHeads;
constexpr int kRowsPerThread = kRows / kThreadsPerHead;

#endif

__global__ void __launch_bounds__(kThreads, 1) SparseMlaWgmmaKernel(const SparseMlaParams p, float scale_log2) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wg_warp = warp & 3;
  const int g = lane >> 2, t4 = lane & 3;
  const int b = blockIdx.z, split = blockIdx.y, num_splits = gridDim.y;
  const int H = p.num_heads, head0 = blockIdx.x * kHeads;
  const BlockRange range = MakeRange<kRows>(p, b, split, num_splits);
  const uint32_t smem_base = SmemAddr(smem);

  // ---- Q: [64 heads][512] bf16 -> interleaved shared memory (cp.async; waited with tile 0) ----
  {
    const uint8_t* q_src = reinterpret_cast<const uint8_t*>(p.q + (static_cast<int64_t>(b) * H + head0) * kKvDim);
    for (int c = tid; c < kHeads * (kKvDim / 8); c += kThreads) {
      const int h = c / (kKvDim / 8), j = c % (kKvDim / 8);
      CpAsync16(smem_base + kOffQ + InterleavedChunk<kHeads>(h, j), q_src + static_cast<int64_t>(c) * 16, true);
    }
  }

  // ---- gather one raw tile (576 data + 8 scale bytes per row), as the 8-warp kernel ----
  // The row id of this thread's row of a tile, loaded one tile before load_tile uses it, so the index load's
  // latency is not on the per-tile path (fifth pass: a dependent index load + copy per tile was).
  auto fetch_id = [&](int tile) -> int32_t {
    const int pos = (range.tile_begin + tile) * kRows + tid / (kThreads / kRows);
    return pos < range.n ? LoadRowId(p, b, pos, range.ew) : -1;
  };
  auto load_tile = [&](int tile, int stage, int32_t id) {
    constexpr int kThreadsPerRow = kThreads / kRows;
    const int row = tid / kThreadsPerRow, sub = tid % kThreadsPerRow;
    const int pos = (range.tile_begin + tile) * kRows + row;
    const uint8_t* dummy = reinterpret_cast<const uint8_t*>(p.q);  // never read (zero-fill copies)
    RowAddress addr{dummy, dummy};
    const bool valid = pos < range.n && RowFromId(p, pos >= range.ew, id, addr);
    uint8_t* st = smem + stage * kRawStage;
    const uint32_t dst = SmemAddr(st + row * kRowDataBytes);
    for (int part = sub; part <= kDataChunks; part += kThreadsPerRow) {
      if (part < kDataChunks) {
        CpAsync16(dst + part * 16, addr.data + (valid ? part * 16 : 0), valid);
      } else {
        CpAsync8(SmemAddr(st + kRawData + row * kRowScaleBytes), addr.scales, valid);
      }
    }
    if (sub == 0) reinterpret_cast<int*>(st + kRawData + kRawScales)[row] = valid;
  };

  // ---- raw tile -> interleaved bf16 tile (invalid rows were zero-filled, so they give 0) ----
  // One task per (row, 64-dim e4m3 tile); consecutive tasks are consecutive rows, whose 16-byte chunks are
  // adjacent in the interleaved layout (conflict-free stores). Then the rope dims, 8 chunks per row.
  auto dequant_tile = [&](int stage, int kbuf) {
    const uint8_t* st = smem + stage * kRawStage;
    uint8_t* kb = smem + kOffK + kbuf * kKBytes;
    for (int task = tid; task < kRows * kNumTiles; task += kThreads) {
      const int tile = task / kRows, row = task - tile * kRows;
      const uint4* src = reinterpret_cast<const uint4*>(st + row * kRowDataBytes + tile * kTileDim);
      const float scale = ScaleFromUe8m0(st[kRawData + row * kRowScaleBytes + tile]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint4 v = src[j];
        uint4 lo, hi;
        DequantE4m3x4(v.x, scale, lo.x, lo.y);
        DequantE4m3x4(v.y, scale, lo.z, lo.w);
        DequantE4m3x4(v.z, scale, hi.x, hi.y);
        DequantE4m3x4(v.w, scale, hi.z, hi.w);
        *reinterpret_cast<uint4*>(kb + InterleavedChunk<kRows>(row, tile * 8 + 2 * j)) = lo;
        *reinterpret_cast<uint4*>(kb + InterleavedChunk<kRows>(row, tile * 8 + 2 * j + 1)) = hi;
      }
    }
    {  // rope dims 448..511: one 16-byte chunk per thread (32 rows x 8 chunks = 256)
      const int row = tid & (kRows - 1), j = tid / kRows;
      *reinterpret_cast<uint4*>(kb + InterleavedChunk<kRows>(row, kNopeDim / 8 + j)) =
          reinterpret_cast<const uint4*>(st + row * kRowDataBytes + kNopeDim)[j];
    }
  };

  // ---- S = Q K^T: warpgroup wg's partial scores over dims [256 wg, +256) -> shared memory ----
  float* spart = reinterpret_cast<float*>(smem + kOffSpart);
  auto qk_tile = [&](int kbuf) {
    float acc[16] = {};
    const uint32_t q_base = smem_base + kOffQ, k_base = smem_base + kOffK + kbuf * kKBytes;
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < 16; ++ks) {
      const int c = 32 * wg + 2 * ks;  // first 8-dim chunk of this k-step
      const uint64_t da = SmemDesc(q_base + InterleavedChunk<kHeads>(0, c), kHeads * 16, 128);
      const uint64_t db = SmemDesc(k_base + InterleavedChunk<kRows>(0, c), kRows * 16, 128);
      WgmmaM64N32Ss(acc, da, db, ks > 0);
    }
    WgmmaCommit();
    WgmmaWaitAll();
    float* sp = spart + (wg * kHeads + 16 * wg_warp + g) * kSpartStride + 2 * t4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      *reinterpret_cast<float2*>(sp + 8 * j) = make_float2(acc[4 * j], acc[4 * j + 1]);
      *reinterpret_cast<float2*>(sp + 8 * kSpartStride + 8 * j) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    }
  };

  // ---- online softmax (base 2) of one head's rows over 4 consecutive lanes, as the 8-warp kernel ----
  const int sm_head = tid / kThreadsPerHead, sm_sub = tid % kThreadsPerHead;
  const int sm_row0 = sm_sub * kRowsPerThread;
  float run_max = -INFINITY, run_sum = 0.f, run_sum_q = 0.f;
  float* alpha_s = reinterpret_cast<float*>(smem + kOffAlpha);
  auto softmax_tile = [&](int stage) {
    const float* sp = spart + sm_head * kSpartStride + sm_row0;
    const int* valid = reinterpret_cast<const int*>(smem + stage * kRawStage + kRawData + kRawScales);
    float sv[kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) sv[i] = 0.f;
#pragma unroll
    for (int dg = 0; dg < kDimGroups; ++dg) {
      const float* row = sp + dg * kHeads * kSpartStride;
#pragma unroll
      for (int i = 0; i < kRowsPerThread; i += 4) {
        const float4 v = *reinterpret_cast<const float4*>(row + i);
        sv[i] += v.x, sv[i + 1] += v.y, sv[i + 2] += v.z, sv[i + 3] += v.w;
      }
    }
    float tmax = -INFINITY;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      sv[i] = valid[sm_row0 + i] ? sv[i] * scale_log2 : -INFINITY;
      tmax = fmaxf(tmax, sv[i]);
    }
#pragma unroll
    for (int off = kThreadsPerHead / 2; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(~0u, tmax, off));
    const float new_max =
        (run_max == -INFINITY || tmax > run_max + kRescaleSlack) ? fmaxf(run_max, tmax) : run_max;
    const float base = new_max == -INFINITY ? 0.f : new_max;
    const float alpha = exp2f(run_max - base);
    uint8_t* prow = smem + kOffP + (sm_head * kPStride + sm_row0) * 2;
    float tsum = 0.f, tsum_q = 0.f;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; i += 2) {
      const float p0 = exp2f(sv[i] - base), p1 = exp2f(sv[i + 1] - base);
      const uint32_t pair = PackBf16x2(p0, p1);
      *reinterpret_cast<uint32_t*>(prow + 2 * i) = pair;
      tsum += p0 + p1;
      tsum_q += __uint_as_float(pair << 16) + __uint_as_float(pair & 0xffff0000u);
    }
#pragma unroll
    for (int off = kThreadsPerHead / 2; off > 0; off >>= 1) {
      tsum += __shfl_xor_sync(~0u, tsum, off);
      tsum_q += __shfl_xor_sync(~0u, tsum_q, off);
    }
    run_sum = run_sum * alpha + tsum;
    run_sum_q = run_sum_q * alpha + tsum_q;
    run_max = new_max;
    if (sm_sub == 0) alpha_s[sm_head] = alpha;
  };

  // ---- O = alpha O + P V over this warpgroup's 256 dims (issued; the caller waits) ----
  float o[1][32][4];
#pragma unroll
  for (int j = 0; j < 32; ++j) o[0][j][0] = o[0][j][1] = o[0][j][2] = o[0][j][3] = 0.f;
  float(&o_flat)[128] = *reinterpret_cast<float(*)[128]>(&o[0][0][0]);
  const int ld_row = (lane & 7) + ((lane >> 3) & 1) * 8, ld_col = (lane >> 4) * 8;
  auto pv_issue = [&](int kbuf) {
    const float a_lo = alpha_s[16 * wg_warp + g], a_hi = alpha_s[16 * wg_warp + g + 8];
    if (!__all_sync(~0u, a_lo == 1.f && a_hi == 1.f)) {  // skipping is exact: the running max did not move
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[0][j][0] *= a_lo;
        o[0][j][1] *= a_lo;
        o[0][j][2] *= a_hi;
        o[0][j][3] *= a_hi;
      }
    }
    const uint32_t p_lane = smem_base + kOffP + ((16 * wg_warp + ld_row) * kPStride + ld_col) * 2;
    uint32_t pa[2][4];
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) Ldsm4(p_lane + 32 * kk, pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3]);
    const uint32_t v_base = smem_base + kOffK + kbuf * kKBytes;
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      // B = V rows [16 kk, +16) x dims [256 wg, +256), N-major: LBO = next 8 rows, SBO = next 8 dims.
      const uint64_t db = SmemDesc(v_base + InterleavedChunk<kRows>(16 * kk, 32 * wg), 128, kRows * 16);
      WgmmaM64N256RsT(o_flat, pa[kk], db, 1);
    }
    WgmmaCommit();
  };

  // ---- pipeline (as the 8-warp kernel): tile t+1 lands while t is scored; t+1 is dequantised while the
  // asynchronous P V of tile t runs ----
  if (range.num_tiles > 0) load_tile(0, 0, fetch_id(0));
  CpAsyncCommit();  // group 0: Q and tile 0
  if (range.num_tiles > 1) load_tile(1, 1, fetch_id(1));
  CpAsyncCommit();
  int32_t id_ahead = range.num_tiles > 2 ? fetch_id(2) : -1;  // the next load_tile's row id
  CpAsyncWait<1>();
  __syncthreads();
  if (range.num_tiles > 0) dequant_tile(0, 0);
  if (range.num_tiles > 2) load_tile(2, 2, id_ahead);
  CpAsyncCommit();
  if (range.num_tiles > 3) id_ahead = fetch_id(3);
  FenceProxyAsync();  // Q (cp.async) and tile 0 (stores) -> wgmma
  __syncthreads();
  for (int t = 0; t < range.num_tiles; ++t) {
    qk_tile(t & 1);
    __syncthreads();
    softmax_tile(t % kStages);
    CpAsyncWait<1>();  // tile t+1 has landed for this thread's copies
    __syncthreads();
    pv_issue(t & 1);
    if (t + 1 < range.num_tiles) dequant_tile((t + 1) % kStages, (t + 1) & 1);
    if (t + 3 < range.num_tiles) load_tile(t + 3, t % kStages, id_ahead);
    CpAsyncCommit();
    if (t + 4 < range.num_tiles) id_ahead = fetch_id(t + 4);
    FenceProxyAsync();
    WgmmaWaitAll();
    __syncthreads();
  }

  // ---- epilogue (shared with the mma.sync kernels) ----
  LaunchDependents();
  float* stat_m = reinterpret_cast<float*>(smem + kOffStatM);
  float* stat_l = reinterpret_cast<float*>(smem + kOffStatL);
  float* stat_lq = reinterpret_cast<float*>(smem + kOffStatLq);
  if (sm_sub == 0) {
    stat_m[sm_head] = run_max;
    stat_l[sm_head] = run_sum;
    stat_lq[sm_head] = run_sum_q;
  }
  __syncthreads();
  if (num_splits > 1 && ClusterBlocks() == num_splits) {  // the splits are one cluster: merge in place
    ClusterMergeOutput<1, 256, kHeads, kThreads>(p, o, stat_m, stat_l, stat_lq, b, head0, tid,
                                                 /*mtile_head0=*/16 * wg_warp, /*dim0=*/256 * wg, smem);
  } else {
    StoreBlockOutput<1, 256, kHeads>(p, o, stat_m, stat_l, stat_lq, b, head0, split, num_splits, tid,
                                     /*mtile_head0=*/16 * wg_warp, /*dim0=*/256 * wg);
  }
#endif
}

}  // namespace

namespace internal {

bool MmaWgmmaBuilt() {
#if defined(DSV4_SPARSE_MLA_SM90A)
  return true;
#else
  return false;
#endif
}

int MmaWgmmaSmemBytes() { return kSmemBytes; }

cudaError_t PrepareMmaWgmmaKernel() { return PrepareSplitKernel(SparseMlaWgmmaKernel, kSmemBytes); }

int MmaWgmmaClusterCapacity(int num_splits) {
  if (!MmaWgmmaBuilt()) return 0;  // the kernel is empty outside sm_90a builds
  return SplitClusterCapacity(SparseMlaWgmmaKernel, kThreads, kSmemBytes, num_splits);
}

cudaError_t LaunchMmaWgmmaMain(const SparseMlaParams& p, int num_splits, bool cluster_merge,
                               cudaStream_t stream) {
  const dim3 grid(p.num_heads / kHeads, num_splits, p.batch);
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  return LaunchSplitKernel(SparseMlaWgmmaKernel, grid, kThreads, kSmemBytes, cluster_merge ? num_splits : 1, stream, p,
                           scale_log2);
}

}  // namespace internal
}  // namespace dsv4::kernels::sparse_mla
