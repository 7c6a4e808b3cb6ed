// Warp-specialised tensor-core sparse-MLA decode for sm_90a (fifth pass, docs/cuda-attention.md): the fourth
// pass's wgmma kernel (sparse_mla_wgmma.cu) with the gather and the dequantisation moved to a third, producer
// warpgroup, so the two consumer warpgroups only run the two products and the softmax. Built only where the
// target list holds 90a; the plan picks it in place of the two-warpgroup wgmma kernel (which stays, tested).
//
// One block = one sequence x 64 heads x one split, 384 threads, 32-row tiles:
//   - producer (warpgroup 2, 56 registers after setmaxnreg): gathers raw rows with cp.async into a 3-stage
//     ring, two tiles in flight ahead of the one it dequantises, with each row's index loaded a tile before
//     its copy is issued; rows sit 592 bytes apart, so the dequantisation's 16-byte reads of 8 consecutive
//     rows hit 8 different bank groups. It dequantises each tile into one of two bf16 tiles in the
//     interleaved wgmma layout (with the per-row valid flags beside it) and hands it over on that tile's
//     "full" named barrier; before refilling a bf16 tile it waits on the tile's "empty" barrier.
//   - consumers (warpgroups 0 and 1, 224 registers): per tile, softmax of the scores from shared memory, then
//     one wgmma batch holding P V of this tile (warpgroup w: output dims [256 w, +256)) and Q K^T of the next
//     tile (warpgroup w: partial scores over dims [256 w, +256)), one wait, "empty" for this tile, and the
//     next tile's partial scores to shared memory. Two consumer-only barriers per tile.
// Q layout, wgmma shapes, softmax (lazy rescale), epilogue and split combine are the fourth pass's.
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

constexpr int kConsumers = 256;  // two consumer warpgroups
constexpr int kProducers = 128;  // one producer warpgroup
constexpr int kThreads = kConsumers + kProducers;
// Registers after setmaxnreg (the launch gives 168 to every thread; ptxas fits each side's code in its own
// count: 0 spills, against 332 bytes of consumer spills at a flat 168). Two producer warpgroups (512 threads)
// do not compile: the launch's 128 registers per thread are below what one m64n256 wgmma needs (158).
constexpr int kProducerRegs = 56;
constexpr int kConsumerRegs = 224;
constexpr int kHeads = 64;
constexpr int kRows = 32;      // KV rows per tile
constexpr int kStages = 3;     // raw tiles in the producer's cp.async ring
constexpr int kKBufs = 2;      // bf16 tiles handed from the producer to the consumers
constexpr int kDimGroups = 2;  // partial score tiles (one per consumer warpgroup)
// Shared memory: raw stages [rows x 576][rows x 8 scales][rows x int valid]; Q bf16 (interleaved); kKBufs
// bf16 tiles (interleaved) and their valid flags; partial scores [2][64][rows + 4] f32; P [64][rows + 8] bf16;
// alpha and stats.
constexpr int kRawRowStride = kRowDataBytes + 16;  // 37 16-byte chunks: 8 consecutive rows hit 8 bank groups
constexpr int kRawData = kRows * kRawRowStride;
constexpr int kRawScales = kRows * kRowScaleBytes;
constexpr int kRawStage = kRawData + kRawScales + kRows * 4;
constexpr int kQBytes = kHeads * kKvDim * 2;
constexpr int kKBytes = kRows * kKvDim * 2;
constexpr int kSpartStride = kRows + 4;
constexpr int kPStride = kRows + 8;
constexpr int kOffQ = kStages * kRawStage;
constexpr int kOffK = kOffQ + kQBytes;
constexpr int kOffKValid = kOffK + kKBufs * kKBytes;
constexpr int kOffSpart = kOffKValid + kKBufs * kRows * 4;
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
static_assert(kProducers * kProducerRegs + kConsumers * kConsumerRegs <= 65536, "register file");

__global__ void __launch_bounds__(kThreads, 1) SparseMlaWgmmaWsKernel(const SparseMlaParams p, float scale_log2) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Named barriers: full[k] (producer arrives, consumers wait), empty[k] (consumers arrive, producer waits),
  // consumer-only and producer-only.
  constexpr int kBarFull = 1;                   // ids 1, 2
  constexpr int kBarEmpty = kBarFull + kKBufs;  // ids 3, 4
  constexpr int kBarConsumers = kBarEmpty + kKBufs;
  constexpr int kBarProducers = kBarConsumers + 1;
  constexpr int kDataChunks = kRowDataBytes / 16;
  constexpr float kRescaleSlack = 8.f;  // log2 units, as the 8-warp kernel
  constexpr int kThreadsPerHead = kConsumers / kHeads;
  constexpr int kRowsPerThread = kRows / kThreadsPerHead;
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x;
  const int b = blockIdx.z, split = blockIdx.y, num_splits = gridDim.y;
  const int H = p.num_heads, head0 = blockIdx.x * kHeads;
  const BlockRange range = MakeRange<kRows>(p, b, split, num_splits);
  const int n = range.num_tiles;
  const uint32_t smem_base = SmemAddr(smem);

  if (tid >= kConsumers) {
    // ================= producer warpgroup: gather + dequantise =================
    SetMaxNRegDec<kProducerRegs>();
    const int ptid = tid - kConsumers;
    // One raw tile: 4 threads per row, 576 data bytes in 16-byte chunks + the 8 scale bytes. The row's
    // physical id comes from fetch_id, called a tile earlier, so the index load's latency is not on the
    // producer's path (a dependent index load + copy per tile was).
    constexpr int kThreadsPerRow = kProducers / kRows;
    const int my_row = ptid / kThreadsPerRow, sub = ptid % kThreadsPerRow;
    auto fetch_id = [&](int tile) -> int32_t {
      const int pos = (range.tile_begin + tile) * kRows + my_row;
      return pos < range.n ? LoadRowId(p, b, pos, range.ew) : -1;
    };
    auto load_tile = [&](int tile, int stage, int32_t id) {
      const int pos = (range.tile_begin + tile) * kRows + my_row;
      const uint8_t* dummy = reinterpret_cast<const uint8_t*>(p.q);  // never read (zero-fill copies)
      RowAddress addr{dummy, dummy};
      const bool valid = pos < range.n && RowFromId(p, pos >= range.ew, id, addr);
      uint8_t* st = smem + stage * kRawStage;
      const uint32_t dst = SmemAddr(st + my_row * kRawRowStride);
      for (int part = sub; part <= kDataChunks; part += kThreadsPerRow) {
        if (part < kDataChunks) {
          CpAsync16(dst + part * 16, addr.data + (valid ? part * 16 : 0), valid);
        } else {
          CpAsync8(SmemAddr(st + kRawData + my_row * kRowScaleBytes), addr.scales, valid);
        }
      }
      if (sub == 0) reinterpret_cast<int*>(st + kRawData + kRawScales)[my_row] = valid;
    };
    // Raw tile -> interleaved bf16 tile, as the fourth pass (invalid rows were zero-filled, so they give 0).
    auto dequant_tile = [&](int stage, int kbuf) {
      const uint8_t* st = smem + stage * kRawStage;
      uint8_t* kb = smem + kOffK + kbuf * kKBytes;
      for (int task = ptid; task < kRows * kNumTiles; task += kProducers) {
        const int tile = task / kRows, row = task - tile * kRows;
        const uint4* src = reinterpret_cast<const uint4*>(st + row * kRawRowStride + tile * kTileDim);
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
#pragma unroll
      for (int c = ptid; c < kRows * 8; c += kProducers) {  // rope dims 448..511: 8 chunks per row
        const int row = c & (kRows - 1), j = c / kRows;
        *reinterpret_cast<uint4*>(kb + InterleavedChunk<kRows>(row, kNopeDim / 8 + j)) =
            reinterpret_cast<const uint4*>(st + row * kRawRowStride + kNopeDim)[j];
      }
      if (ptid < kRows) {
        reinterpret_cast<int*>(smem + kOffKValid)[kbuf * kRows + ptid] =
            reinterpret_cast<const int*>(st + kRawData + kRawScales)[ptid];
      }
    };
    if (n > 0) load_tile(0, 0, fetch_id(0));
    CpAsyncCommit();
    if (n > 1) load_tile(1, 1, fetch_id(1));
    CpAsyncCommit();
    int32_t id_ahead = n > 2 ? fetch_id(2) : -1;  // tile t + 2's row id during iteration t
    for (int t = 0; t < n; ++t) {
      CpAsyncWait<1>();                         // this thread's copies of tile t have landed
      NamedBarSync(kBarProducers, kProducers);  // everyone's have; everyone is done with stage (t + 2) % 3
      if (t + 2 < n) load_tile(t + 2, (t + 2) % kStages, id_ahead);
      CpAsyncCommit();
      if (t + 3 < n) id_ahead = fetch_id(t + 3);  // lands while this tile is dequantised
      if (t >= kKBufs) NamedBarSync(kBarEmpty + t % kKBufs, kThreads);  // P V of tile t - 2 has finished
      dequant_tile(t % kStages, t % kKBufs);
      FenceProxyAsync();  // the generic-proxy stores -> the consumers' wgmma (async proxy)
      NamedBarArrive(kBarFull + t % kKBufs, kThreads);
    }
    return;
  }

  // ================= consumer warpgroups: Q K^T, softmax, P V =================
  SetMaxNRegInc<kConsumerRegs>();
  const int lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wg_warp = warp & 3;
  const int g = lane >> 2, t4 = lane & 3;

  // ---- Q: [64 heads][512] bf16 -> interleaved shared memory ----
  {
    const uint8_t* q_src = reinterpret_cast<const uint8_t*>(p.q + (static_cast<int64_t>(b) * H + head0) * kKvDim);
    for (int c = tid; c < kHeads * (kKvDim / 8); c += kConsumers) {
      const int h = c / (kKvDim / 8), j = c % (kKvDim / 8);
      CpAsync16(smem_base + kOffQ + InterleavedChunk<kHeads>(h, j), q_src + static_cast<int64_t>(c) * 16, true);
    }
    CpAsyncCommit();
    CpAsyncWait<0>();
    FenceProxyAsync();
    NamedBarSync(kBarConsumers, kConsumers);
  }

  // ---- S = Q K^T: warpgroup wg's partial scores over dims [256 wg, +256) (issued; the caller waits) ----
  float acc[16] = {};
  auto qk_issue = [&](int kbuf) {
    const uint32_t q_base = smem_base + kOffQ, k_base = smem_base + kOffK + kbuf * kKBytes;
#pragma unroll
    for (int ks = 0; ks < 16; ++ks) {
      const int c = 32 * wg + 2 * ks;  // first 8-dim chunk of this k-step
      const uint64_t da = SmemDesc(q_base + InterleavedChunk<kHeads>(0, c), kHeads * 16, 128);
      const uint64_t db = SmemDesc(k_base + InterleavedChunk<kRows>(0, c), kRows * 16, 128);
      WgmmaM64N32Ss(acc, da, db, ks > 0);
    }
  };
  float* spart = reinterpret_cast<float*>(smem + kOffSpart);
  auto store_scores = [&]() {
    float* sp = spart + (wg * kHeads + 16 * wg_warp + g) * kSpartStride + 2 * t4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      *reinterpret_cast<float2*>(sp + 8 * j) = make_float2(acc[4 * j], acc[4 * j + 1]);
      *reinterpret_cast<float2*>(sp + 8 * kSpartStride + 8 * j) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    }
  };

  // ---- online softmax (base 2) of one head's rows over 4 consecutive lanes, as the fourth pass ----
  const int sm_head = tid / kThreadsPerHead, sm_sub = tid % kThreadsPerHead;
  const int sm_row0 = sm_sub * kRowsPerThread;
  float run_max = -INFINITY, run_sum = 0.f, run_sum_q = 0.f;
  float* alpha_s = reinterpret_cast<float*>(smem + kOffAlpha);
  auto softmax_tile = [&](int kbuf) {
    const float* sp = spart + sm_head * kSpartStride + sm_row0;
    const int* valid = reinterpret_cast<const int*>(smem + kOffKValid) + kbuf * kRows;
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

  // ---- O = alpha O + P V over this warpgroup's 256 dims ----
  float o[1][32][4];
#pragma unroll
  for (int j = 0; j < 32; ++j) o[0][j][0] = o[0][j][1] = o[0][j][2] = o[0][j][3] = 0.f;
  float(&o_flat)[128] = *reinterpret_cast<float(*)[128]>(&o[0][0][0]);
  const int ld_row = (lane & 7) + ((lane >> 3) & 1) * 8, ld_col = (lane >> 4) * 8;

  // ---- pipeline: scores of tile t are in shared memory when iteration t starts ----
  if (n > 0) {
    NamedBarSync(kBarFull, kThreads);  // tile 0 dequantised
    WgmmaFence();
    qk_issue(0);
    WgmmaCommit();
    WgmmaWaitAll();
    store_scores();
  }
  for (int t = 0; t < n; ++t) {
    const int kbuf = t % kKBufs;
    NamedBarSync(kBarConsumers, kConsumers);  // both warpgroups' partial scores of tile t
    softmax_tile(kbuf);
    NamedBarSync(kBarConsumers, kConsumers);  // P and alpha of tile t; scores of t consumed
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
    const bool next = t + 1 < n;
    if (next) NamedBarSync(kBarFull + (t + 1) % kKBufs, kThreads);  // tile t + 1 dequantised
    const uint32_t v_base = smem_base + kOffK + kbuf * kKBytes;
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      // B = V rows [16 kk, +16) x dims [256 wg, +256), N-major: LBO = next 8 rows, SBO = next 8 dims.
      const uint64_t db = SmemDesc(v_base + InterleavedChunk<kRows>(16 * kk, 32 * wg), 128, kRows * 16);
      WgmmaM64N256RsT(o_flat, pa[kk], db, 1);
    }
    if (next) qk_issue((t + 1) % kKBufs);
    WgmmaCommit();
    WgmmaWaitAll();
    if (t + kKBufs < n) NamedBarArrive(kBarEmpty + kbuf, kThreads);  // the producer may refill this tile
    if (next) store_scores();
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
  NamedBarSync(kBarConsumers, kConsumers);
  if (num_splits > 1 && ClusterBlocks() == num_splits) {  // the splits are one cluster: merge in place
    // Consumers only (tid < kConsumers): the producer warpgroup has returned, which releases it from the
    // cluster barriers; between them the consumers meet at their own named barrier.
    ClusterMergeOutput<1, 256, kHeads, kConsumers>(p, o, stat_m, stat_l, stat_lq, b, head0, tid,
                                                   /*mtile_head0=*/16 * wg_warp, /*dim0=*/256 * wg, smem,
                                                   [] { NamedBarSync(kBarConsumers, kConsumers); });
  } else {
    StoreBlockOutput<1, 256, kHeads>(p, o, stat_m, stat_l, stat_lq, b, head0, split, num_splits, tid,
                                     /*mtile_head0=*/16 * wg_warp, /*dim0=*/256 * wg);
  }
#endif
}

}  // namespace

namespace internal {

int MmaWgmmaWsSmemBytes() { return kSmemBytes; }

cudaError_t PrepareMmaWgmmaWsKernel() { return PrepareSplitKernel(SparseMlaWgmmaWsKernel, kSmemBytes); }

int MmaWgmmaWsClusterCapacity(int num_splits) {
  if (!MmaWgmmaBuilt()) return 0;  // the kernel is empty outside sm_90a builds
  return SplitClusterCapacity(SparseMlaWgmmaWsKernel, kThreads, kSmemBytes, num_splits);
}

cudaError_t LaunchMmaWgmmaWsMain(const SparseMlaParams& p, int num_splits, bool cluster_merge,
                                 cudaStream_t stream) {
  const dim3 grid(p.num_heads / kHeads, num_splits, p.batch);
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  return LaunchSplitKernel(SparseMlaWgmmaWsKernel, grid, kThreads, kSmemBytes, cluster_merge ? num_splits : 1, stream, p,
                           scale_log2);
}

}  // namespace internal
}  // namespace dsv4::kernels::sparse_mla
