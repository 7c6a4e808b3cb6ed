// Host entry point of the CUDA sparse-MLA decode: pick a kernel (--attention-kernel=mma|simt), make a plan
// once per (H, batch bucket) at start-up, then launch with no host-side decisions, so launches can be
// captured in CUDA graphs. The plan fixes the launch configuration (tile rows, split count, grid) from the
// device's SM count and shared memory only: nothing tunes itself at capture time.
//
// Threading: a plan is immutable; launches may come from any thread that owns the stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/sparse_mla/sparse_mla_params.h"

namespace dsv4::kernels::sparse_mla {

enum class SparseMlaKernel { kMma, kSimt };

// "mma" or "simt" (the --attention-kernel flag); anything else is InvalidArgument.
absl::StatusOr<SparseMlaKernel> ParseSparseMlaKernel(std::string_view name);
std::string_view SparseMlaKernelName(SparseMlaKernel kernel);

// Overrides for tests and benchmarks; 0 = automatic.
struct SparseMlaPlanOptions {
  int tile_rows = 0;   // 16 or 32 rows per pipeline step (automatic: 32 where shared memory allows)
  int num_splits = 0;  // split-KV blocks per (sequence, head group)
  int warps = 0;       // MMA block width: 16 (wide kernel, 32-row tiles) or 8 (automatic: see MakeSparseMlaPlan)
  int m_tiles = 0;     // 16-head m-tiles per block: 1, 2 or 4 (automatic: see MakeSparseMlaPlan)
  int pdl = 0;         // split combine with programmatic dependent launch: 1 on, -1 off (0 = automatic)
  // The sm_90a wgmma kernel for 64-head blocks: 1 forces it (FailedPrecondition where it is not built for
  // sm_90a or the GPU is not compute capability 9.0), -1 keeps the mma.sync kernels, 0 = automatic (used for
  // 64-head blocks when available and no other shape option is given).
  int wgmma = 0;
  // Which wgmma kernel: 1 the warp-specialised one (producer warpgroup, sparse_mla_wgmma_ws.cu), -1 the
  // fourth pass's two-warpgroup one (sparse_mla_wgmma.cu), 0 = automatic.
  int wgmma_ws = 0;
  // Split merge inside a thread-block cluster (sm_90+, every main kernel): 1 forces it (FailedPrecondition
  // where the configuration cannot run it; the automatic wgmma choice yields to it), -1 keeps the combine
  // kernel, 0 = automatic (see MakeSparseMlaPlan; with num_splits given, wherever those splits fit a cluster).
  int cluster_merge = 0;
};

struct SparseMlaPlan {
  SparseMlaKernel kernel = SparseMlaKernel::kMma;
  int max_batch = 0;        // B of the bucket; launches take any batch <= max_batch
  int num_heads = 0;        // H
  int max_topk = 0;         // window.topk + extra.topk the split count was chosen for
  int warps = 0;            // MMA: 16 = wide kernel (sparse_mla_mma_wide.cu), 8 = 8-warp kernel
  int m_tiles = 0;          // MMA: 16-head m-tiles per block (1, 2 or 4)
  int head_groups = 0;      // MMA: blocks per sequence along heads (H / (16 * m_tiles))
  int tile_rows = 0;        // MMA: KV rows per pipeline step
  int num_splits = 1;       // MMA: blocks per (sequence, head group) along the selected rows
  bool pdl = false;         // MMA: the combine launches with programmatic dependent launch (sm_90+)
  bool wgmma = false;       // MMA: an sm_90a wgmma kernel instead of the 8-warp one
  bool wgmma_ws = false;    // MMA, with wgmma: the warp-specialised wgmma kernel (sparse_mla_wgmma_ws.cu)
  bool cluster_merge = false;  // MMA, num_splits > 1: the splits run as one cluster and merge in place
  int smem_bytes = 0;       // MMA: dynamic shared memory per block
  size_t workspace_bytes = 0;  // SparseMlaParams::workspace needed for max_batch
};

// Chooses the launch configuration on the current device: with B * max(H / 64, 1) <= 8 the wide kernel with
// 16-head (<= 4) or 32-head blocks where its shared memory fits, else 64-head blocks -- on the sm_90a wgmma
// kernel where this build has it, the GPU is compute capability 9.0 and blocks hold >= 8 tiles, else on the
// mma.sync 8-warp kernel;
// splits = clamp(SMs / (B * head groups), 1, tiles of max_topk), so small batches still fill the GPU, then
// lowered to the fewest splits with the same tiles per split. On sm_90+ the splits of a (sequence, head group)
// may instead run as one thread-block cluster that merges them in distributed shared memory (no combine kernel,
// no f32 partials in global memory): splits capped at kMaxClusterSplits (16) and lowered until the GPU
// co-schedules all of the batch's clusters in one wave, kept where the combine plan's splits hold one tile each
// and the cluster's at most two, or (any kernel, wgmma included) where the split count stays the combine plan's.
// Raises the kernel's shared memory limit.
absl::StatusOr<SparseMlaPlan> MakeSparseMlaPlan(SparseMlaKernel kernel, int max_batch, int num_heads,
                                                int max_topk, const SparseMlaPlanOptions& options = {});

// Validates `params` against the contract and the plan (H, batch, workspace, pointer alignment) and
// enqueues the kernel(s) on `stream`. Capturable: no allocation, no synchronisation.
absl::Status LaunchSparseMlaDecode(const SparseMlaParams& params, const SparseMlaPlan& plan,
                                   cudaStream_t stream);

}  // namespace dsv4::kernels::sparse_mla
