// Split-KV merge inside a thread-block cluster (sm_90+): the num_splits blocks of one (sequence, head group)
// run as one cluster, each leaves its normalised partial output in its own shared memory, and each then merges
// a slice of the heads x 512 outputs by reading every split's partial through distributed shared memory. No
// f32 partials go through global memory and no combine kernel runs (issue 17: the combine was ~9 of the
// 12.5 us at B = 1). The weights and the order of the sums are the combine kernel's
// (sparse_mla_mma.cu: w_s = l_s 2^(m_s - M) / L x sink factor, added split by split), so both paths give
// the same bits. Why not the last block merging alone (branch mla-combine): one SM then reads every split's
// partials; here the merge is spread over all blocks of the cluster.
#pragma once

#include <cooperative_groups.h>

#include "kernels/sparse_mla/sparse_mla_device.cuh"
#include "kernels/sparse_mla/sparse_mla_kernels.h"

namespace dsv4::kernels::sparse_mla::device {

using internal::kMaxClusterSplits;

// Shared memory the merge reuses from offset 0 of the block's dynamic shared memory: the partial output
// [G][512] f32 and the split weights [G][kMaxClusterSplits] f32. A kernel may run the merge only where this is
// below its per-head statistics (which the peers read during the merge).
constexpr int ClusterMergeScratchBytes(int heads) { return heads * (kKvDim + kMaxClusterSplits) * 4; }

// The block barrier between the merge's steps: __syncthreads() for kernels whose threads all merge; the
// warp-specialised wgmma kernel passes its consumer-only named barrier (its producer warpgroup has exited by
// then, and an exited thread does not hold up barrier.cluster).
struct SyncThreads {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};

// Blocks in this block's cluster (1 without a cluster launch).
__device__ __forceinline__ int ClusterBlocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return static_cast<int>(cooperative_groups::this_cluster().num_blocks());
#else
  return 1;
#endif
}

// Called by every merging thread (tid < kThreads; all threads of the block, or the consumers of the
// warp-specialised kernel, with `sync` their barrier) of every block of the cluster after the block's statistics
// are in stat_* (and a block barrier). `o` and the layout arguments as StoreBlockOutput's. Writes the bf16
// output of the block's heads and (cluster rank 0) their natural-log LSE.
template <int kMTiles, int kDimsPerWarp, int kHeadsPerBlock, int kThreads, typename BlockSync = SyncThreads>
__device__ __forceinline__ void ClusterMergeOutput(const SparseMlaParams& p,
                                                   const float (&o)[kMTiles][kDimsPerWarp / 8][4],
                                                   const float* stat_m, const float* stat_l, const float* stat_lq,
                                                   int b, int head0, int tid, int mtile_head0, int dim0,
                                                   uint8_t* scratch, BlockSync sync = {}) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int splits = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  float* part = reinterpret_cast<float*>(scratch);   // [G][512]: o / lq of this split
  float* wts = part + kHeadsPerBlock * kKvDim;        // [G][kMaxClusterSplits]
  const int lane = tid & 31, g = lane >> 2, t4 = lane & 3;

  // 1. This split's normalised partial (StoreBlockOutput's workspace row, kept in shared memory).
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int hl = mtile_head0 + 16 * mi + g + 8 * half;
      const float factor = stat_l[hl] != 0.f ? 1.f / stat_lq[hl] : 0.f;
      float* dst = part + hl * kKvDim + dim0 + 2 * t4;
#pragma unroll
      for (int nj = 0; nj < kDimsPerWarp / 8; ++nj) {
        *reinterpret_cast<float2*>(dst + nj * 8) =
            make_float2(o[mi][nj][2 * half] * factor, o[mi][nj][2 * half + 1] * factor);
      }
    }
  }
  cluster.sync();  // every split's partial and statistics are visible to the cluster

  // 2. Per-head weights of every split (each block computes all of its heads; G x splits remote loads).
  if (tid < kHeadsPerBlock) {
    float m[kMaxClusterSplits], l[kMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      m[s] = -INFINITY;
      l[s] = 0.f;
      if (s < splits) {
        m[s] = *cluster.map_shared_rank(stat_m + tid, s);
        l[s] = *cluster.map_shared_rank(stat_l + tid, s);
      }
    }
    float M = -INFINITY, L = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (l[s] != 0.f) M = fmaxf(M, m[s]);
    }
    float lse = INFINITY, factor = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        if (l[s] != 0.f) L += l[s] * exp2f(m[s] - M);
      }
      lse = (M + log2f(L)) * kLn2;
      factor = p.attn_sink ? 1.f / (1.f + expf(__ldg(p.attn_sink + head0 + tid) - lse)) : 1.f;
    }
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      wts[tid * kMaxClusterSplits + s] = l[s] != 0.f ? l[s] * exp2f(m[s] - M) / L * factor : 0.f;
    }
    if (rank == 0) p.lse[static_cast<int64_t>(b) * p.num_heads + head0 + tid] = lse;
  }
  sync();

  // 3. This rank's slice of the [G][512] outputs, four splits' loads in flight at a time, summed in split
  // order (the combine kernel's order; an empty split, weight 0, is skipped as there).
  constexpr int kQuads = kHeadsPerBlock * (kKvDim / 4);
  const int chunk = (kQuads + splits - 1) / splits;
  const int end = min(kQuads, (rank + 1) * chunk);
  for (int i = rank * chunk + tid; i < end; i += kThreads) {
    const int hl = i / (kKvDim / 4);
    const float* w = wts + hl * kMaxClusterSplits;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < splits; s0 += 4) {
      float4 v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        v[k] = s0 + k < splits ? *cluster.map_shared_rank(reinterpret_cast<const float4*>(part) + i, s0 + k)
                               : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float ws = s0 + k < splits ? w[s0 + k] : 0.f;
        if (ws != 0.f) {
          acc.x += ws * v[k].x;
          acc.y += ws * v[k].y;
          acc.z += ws * v[k].z;
          acc.w += ws * v[k].w;
        }
      }
    }
    const int64_t bh = static_cast<int64_t>(b) * p.num_heads + head0 + hl;
    reinterpret_cast<uint2*>(p.out + bh * kKvDim)[i % (kKvDim / 4)] =
        make_uint2(PackBf16x2(acc.x, acc.y), PackBf16x2(acc.z, acc.w));
  }
  cluster.sync();  // no block leaves (freeing its shared memory) while a peer may still read it
#endif
}

}  // namespace dsv4::kernels::sparse_mla::device
