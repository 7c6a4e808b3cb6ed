// Plans and launches of the CUDA sparse-MLA decode (see sparse_mla_launch.h).
#include "kernels/sparse_mla/sparse_mla_launch.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/sparse_mla/sparse_mla_kernels.h"
#include "kernels/sparse_mla/sparse_mla_validate.h"

namespace dsv4::kernels::sparse_mla {
namespace {

bool Aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

// Whether the automatic plan runs the wide kernel also when there are more than 8 64-head blocks.
constexpr bool kWideAtLargeBatch = false;
// Whether the automatic plan launches the split combine with programmatic dependent launch (sm_90+).
constexpr bool kAutoPdl = false;
// The automatic plan uses the wgmma kernel only for blocks of at least this many 32-row tiles.
constexpr int kWgmmaMinTiles = 8;

// Whether the automatic plan runs the warp-specialised wgmma kernel (else the fourth pass's two-warpgroup one).
constexpr bool kAutoWgmmaWs = true;

// Split count: one wave of blocks (every MMA kernel runs one block per SM): splits = SMs / blocks, clamped to
// [1, tiles], then the fewest splits with the same tiles per split (the same critical path, fewer partials to
// combine and fewer pipeline ramps): B = 3 at H = 64 gets 10 splits of 2 tiles instead of 11, B = 16 7 of 3
// instead of 8. A cost model of waves x tiles per split that allowed more than one wave picked 5 splits at
// B = 48 and 4 at B = 96 and was 18-35% slower there (H200, fifth pass): each extra block costs a pipeline
// ramp and its partials, worth ~3 tiles.
int ChooseSplits(int64_t blocks, int tiles, int sms, int max_splits = 1 << 30) {
  const int wave = static_cast<int>(std::clamp<int64_t>(sms / blocks, 1, std::min(tiles, max_splits)));
  const int per_split = (tiles + wave - 1) / wave;
  return (tiles + per_split - 1) / per_split;
}

// Whether the automatic plan merges splits inside a cluster where it can (else the combine kernel).
constexpr bool kAutoClusterMerge = true;
// Whether the automatic plan also merges in a cluster where that keeps the combine plan's split count with more
// than one tile per block (the wgmma kernels from B = 45 at H = 64, 2 splits of 10 tiles; the 8-warp kernel at
// H = 16 / 32 there; wgmma at H = 128, B = 23-33): the combine launch and the f32 round trip go, no tile is added.
// Written without a GPU (seventh session): measure with bench_cluster before relying on it.
constexpr bool kAutoClusterSameSplits = true;

}  // namespace

absl::StatusOr<SparseMlaKernel> ParseSparseMlaKernel(std::string_view name) {
  if (name == "mma") return SparseMlaKernel::kMma;
  if (name == "simt") return SparseMlaKernel::kSimt;
  return absl::InvalidArgumentError(absl::StrCat("attention kernel '", std::string(name), "' is not one of: mma, simt"));
}

std::string_view SparseMlaKernelName(SparseMlaKernel kernel) {
  return kernel == SparseMlaKernel::kMma ? "mma" : "simt";
}

absl::StatusOr<SparseMlaPlan> MakeSparseMlaPlan(SparseMlaKernel kernel, int max_batch, int num_heads,
                                                int max_topk, const SparseMlaPlanOptions& options) {
  if (max_batch < 1) return absl::InvalidArgumentError(absl::StrCat("max_batch is ", max_batch, ", must be >= 1"));
  if (num_heads != 16 && num_heads != 32 && num_heads != 64 && num_heads != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_heads is ", num_heads, "; the CUDA kernels take 16, 32, 64 or 128 (pad heads)"));
  }
  if (max_topk < 0) return absl::InvalidArgumentError(absl::StrCat("max_topk is ", max_topk, ", must be >= 0"));
  SparseMlaPlan plan{.kernel = kernel, .max_batch = max_batch, .num_heads = num_heads, .max_topk = max_topk};
  if (kernel == SparseMlaKernel::kSimt) return plan;

  int device = 0, sms = 0, smem_optin = 0;
  DSV4_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "cudaGetDevice"));
  DSV4_RETURN_IF_ERROR(
      CudaStatus(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count"));
  DSV4_RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "shared memory"));

  // Automatic shape (H200 measurements, bench/RESULTS.md "second pass"): with few 64-head blocks per
  // batch the wide kernel with 16- or 32-head blocks puts more SMs to work (B = 1: 15.5 us against 20.0);
  // at larger batches the 64-head block is best.
  if (options.wgmma < -1 || options.wgmma > 1) {
    return absl::InvalidArgumentError(absl::StrCat("wgmma is ", options.wgmma, "; use 1 (on), -1 (off) or 0"));
  }
  int cc_major = 0, cc_minor = 0;
  DSV4_RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device), "compute capability"));
  DSV4_RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, device), "compute capability"));
  const bool wgmma_available = internal::MmaWgmmaBuilt() && cc_major == 9 && cc_minor == 0 && num_heads >= 64 &&
                               internal::MmaWgmmaSmemBytes() <= smem_optin &&
                               internal::MmaWgmmaWsSmemBytes() <= smem_optin;
  if (options.wgmma_ws < -1 || options.wgmma_ws > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("wgmma_ws is ", options.wgmma_ws, "; use 1 (warp-specialised), -1 (two warpgroups) or 0"));
  }
  if (options.wgmma == 1) {
    if (!wgmma_available) {
      return absl::FailedPreconditionError(
          "wgmma = 1: the wgmma kernel needs a build for sm_90a (90a in CMAKE_CUDA_ARCHITECTURES), a compute "
          "capability 9.0 GPU and num_heads 64 or 128");
    }
    if ((options.m_tiles != 0 && options.m_tiles != 4) || options.warps == 16 || options.tile_rows == 16) {
      return absl::InvalidArgumentError("wgmma = 1 runs 64-head blocks of 32-row tiles (m_tiles 4, warps 8)");
    }
  }
  const int64_t head_blocks = static_cast<int64_t>(max_batch) * std::max(num_heads / 64, 1);
  const bool few_blocks = options.m_tiles == 0 && options.warps != 8 && options.tile_rows != 16 &&
                          options.wgmma != 1 && head_blocks <= 8;
  plan.m_tiles = options.m_tiles != 0 ? options.m_tiles
                 : few_blocks          ? std::min(head_blocks <= 4 ? 1 : 2, num_heads / 16)
                                       : std::min(num_heads / 16, 4);
  if ((plan.m_tiles != 1 && plan.m_tiles != 2 && plan.m_tiles != 4) || 16 * plan.m_tiles > num_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("m_tiles is ", options.m_tiles, "; use 1, 2 or 4 with 16 * m_tiles <= num_heads"));
  }
  plan.head_groups = num_heads / (16 * plan.m_tiles);
  if (options.tile_rows != 0 && options.tile_rows != 16 && options.tile_rows != 32) {
    return absl::InvalidArgumentError(absl::StrCat("tile_rows is ", options.tile_rows, "; use 16 or 32"));
  }
  if (options.warps != 0 && options.warps != 8 && options.warps != 16) {
    return absl::InvalidArgumentError(absl::StrCat("warps is ", options.warps, "; use 8 or 16"));
  }
  if (options.warps == 16 && options.tile_rows == 16) {
    return absl::InvalidArgumentError("warps = 16 (the wide kernel) takes 32-row tiles only, not tile_rows = 16");
  }
  // The wide kernel wherever its shared memory fits (sm_90: 199 KB at G = 64); else the 8-warp kernel.
  const bool wide_fits = internal::MmaWideSmemBytes(plan.m_tiles) <= smem_optin;
  plan.warps = options.warps != 0                                    ? options.warps
               : options.tile_rows != 16 && wide_fits && (few_blocks || kWideAtLargeBatch) ? 16
                                                                                        : 8;
  plan.tile_rows = plan.warps == 16 ? 32 : options.tile_rows;
  if (plan.tile_rows == 0) {
    plan.tile_rows = internal::MmaSmemBytes(plan.m_tiles, 32) <= smem_optin ? 32 : 16;
  }
  // Splits: the same for the 8-warp and the wgmma kernel (both 64-head blocks of 32-row tiles).
  const int tiles = std::max(1, (max_topk + plan.tile_rows - 1) / plan.tile_rows);
  const int64_t blocks = static_cast<int64_t>(max_batch) * plan.head_groups;
  plan.num_splits = options.num_splits > 0 ? options.num_splits : ChooseSplits(blocks, tiles, sms);
  if (plan.num_splits > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("num_splits is ", plan.num_splits, ", at most 65535"));
  }
  // The wgmma kernel replaces the 8-warp one for 64-head blocks of 32-row tiles: when asked, or by default
  // when no shape option pins the mma.sync kernels (tests and benchmarks pin them to keep them measured) and
  // each block has at least kWgmmaMinTiles tiles (H200, fourth pass: 5-7% faster from B = 48 at H = 64,
  // 1-2 us slower at B = 16 / 32 where blocks hold 3-5 tiles and its start-up dominates).
  const bool shape_pinned = options.warps != 0 || options.m_tiles != 0 || options.tile_rows != 0;
  const bool long_blocks = (tiles + plan.num_splits - 1) / plan.num_splits >= kWgmmaMinTiles;
  plan.wgmma = options.wgmma == 1 || (options.wgmma == 0 && options.cluster_merge != 1 && !shape_pinned &&
                                      wgmma_available && long_blocks && plan.warps == 8 && plan.m_tiles == 4 &&
                                      plan.tile_rows == 32);
  plan.wgmma_ws = plan.wgmma && (options.wgmma_ws == 1 || (options.wgmma_ws == 0 && kAutoWgmmaWs));
  // Cluster merge (sm_90+, every main kernel): splits as above but at most kMaxClusterSplits, then fewer
  // (one more tile per split each time) until every (sequence, head group) cluster of the batch runs at once.
  if (options.cluster_merge < -1 || options.cluster_merge > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster_merge is ", options.cluster_merge, "; use 1 (on), -1 (off) or 0"));
  }
  if (options.cluster_merge == 1 || (options.cluster_merge == 0 && kAutoClusterMerge)) {
    // Capacity queries only where a cluster can run (sm_90+), once per split count.
    const bool supported = cc_major >= 9;
    int queried = 0, queried_capacity = 0;
    auto capacity = [&](int splits) {
      if (!supported) return 0;
      if (splits != queried) {
        queried = splits;
        queried_capacity = plan.warps == 16 ? internal::MmaWideClusterCapacity(plan.m_tiles, splits)
                           : plan.wgmma_ws  ? internal::MmaWgmmaWsClusterCapacity(splits)
                           : plan.wgmma     ? internal::MmaWgmmaClusterCapacity(splits)
                                            : internal::MmaClusterCapacity(plan.m_tiles, plan.tile_rows, splits);
      }
      return queried_capacity;
    };
    int splits = options.num_splits > 0 ? options.num_splits
                                        : ChooseSplits(blocks, tiles, sms, internal::kMaxClusterSplits);
    if (supported && options.num_splits == 0) {
      for (int per_split = (tiles + splits - 1) / splits; splits > 1 && capacity(splits) < blocks;) {
        ++per_split;  // one more tile per split until the split count drops
        splits = std::min(splits, (tiles + per_split - 1) / per_split);
      }
    }
    const bool can = supported && splits > 1 && capacity(splits) >= blocks;
    // Automatic: where the combine plan's blocks hold a single tile and the cluster's at most two (H200, sixth
    // pass: B = 1 at H = 64, B = 1-4 at H = 16, 4-6% faster). Where the GPU's cluster capacity forces more tiles
    // per block than that the combine kernel stays (each extra tile cost 1-3.5 us, more than the merge saves).
    // With kAutoClusterSameSplits also where the cluster keeps the combine plan's split count (see there). A
    // forced split count takes the cluster wherever it fits.
    // The wgmma kernels take only the same-splits rule (the one-tile rule was measured on the mma.sync kernels;
    // a forced split count keeps them on the combine kernel unless cluster_merge = 1, so their tests keep it).
    auto per_split = [&](int s) { return (tiles + s - 1) / s; };
    const bool same_splits =
        kAutoClusterSameSplits && splits == plan.num_splits && (options.num_splits == 0 || !plan.wgmma);
    const bool pays = options.cluster_merge == 1 ||
                      (!plan.wgmma && (options.num_splits > 0 ||
                                       (per_split(plan.num_splits) == 1 && per_split(splits) <= 2))) ||
                      same_splits;
    if (options.cluster_merge == 1 && !can) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cluster_merge = 1: this configuration (", plan.wgmma ? "wgmma kernel" : "mma.sync kernel", ", ",
          splits, " splits, ", blocks, " clusters) cannot merge in a cluster (needs sm_90+, ",
          "2..", internal::kMaxClusterSplits, " splits, room for the merge in shared memory and every cluster ",
          "resident at once)"));
    }
    if (can && pays) {
      plan.cluster_merge = true;
      plan.num_splits = splits;
    }
  }

  plan.smem_bytes = plan.warps == 16  ? internal::MmaWideSmemBytes(plan.m_tiles)
                    : plan.wgmma_ws   ? internal::MmaWgmmaWsSmemBytes()
                    : plan.wgmma      ? internal::MmaWgmmaSmemBytes()
                                      : internal::MmaSmemBytes(plan.m_tiles, plan.tile_rows);
  if (plan.smem_bytes > smem_optin) {
    return absl::FailedPreconditionError(absl::StrCat("the MMA kernel needs ", plan.smem_bytes,
                                                      " bytes of shared memory per block; this GPU allows ",
                                                      smem_optin));
  }
  plan.workspace_bytes = internal::MmaWorkspaceBytes(max_batch, num_heads, plan.num_splits, plan.cluster_merge);
  if (options.pdl < -1 || options.pdl > 1) {
    return absl::InvalidArgumentError(absl::StrCat("pdl is ", options.pdl, "; use 1 (on), -1 (off) or 0"));
  }
  plan.pdl = cc_major >= 9 && !plan.cluster_merge && (options.pdl == 1 || (options.pdl == 0 && kAutoPdl));
  DSV4_RETURN_IF_ERROR(CudaStatus(plan.warps == 16 ? internal::PrepareMmaWideKernel(plan.m_tiles)
                                  : plan.wgmma_ws  ? internal::PrepareMmaWgmmaWsKernel()
                                  : plan.wgmma     ? internal::PrepareMmaWgmmaKernel()
                                                   : internal::PrepareMmaKernel(plan.m_tiles, plan.tile_rows),
                                  "cudaFuncSetAttribute"));
  return plan;
}

absl::Status LaunchSparseMlaDecode(const SparseMlaParams& params, const SparseMlaPlan& plan,
                                   cudaStream_t stream) {
  DSV4_RETURN_IF_ERROR(ValidateSparseMlaParams(params, /*cuda_head_counts=*/true));
  if (params.num_heads != plan.num_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_heads is ", params.num_heads, " but the plan was made for ", plan.num_heads));
  }
  if (params.batch > plan.max_batch || params.batch > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch is ", params.batch, " but the plan was made for at most ", plan.max_batch));
  }
  // cp.async gathers 16-byte chunks and the kernels read q / write out in 4- to 16-byte words.
  if (!Aligned(params.window.cache, 16) || !Aligned(params.extra.cache, 16)) {
    return absl::InvalidArgumentError("window.cache and extra.cache must be 16-byte aligned");
  }
  if (!Aligned(params.q, 16) || !Aligned(params.out, 16) || !Aligned(params.lse, 4)) {
    return absl::InvalidArgumentError("q and out must be 16-byte aligned, lse 4-byte aligned");
  }
  if (plan.kernel == SparseMlaKernel::kSimt) {
    return CudaStatus(internal::LaunchSimtDecode(params, stream), "SIMT sparse-MLA launch");
  }
  const size_t need =
      internal::MmaWorkspaceBytes(params.batch, params.num_heads, plan.num_splits, plan.cluster_merge);
  if (need > 0 && (params.workspace == nullptr || params.workspace_bytes < need || !Aligned(params.workspace, 16))) {
    return absl::InvalidArgumentError(absl::StrCat("workspace has ", params.workspace_bytes,
                                                   " bytes (or is null or misaligned); this launch needs ",
                                                   need, " bytes, 16-byte aligned"));
  }
  return CudaStatus(internal::LaunchMmaDecode(params, plan.warps == 16, plan.wgmma, plan.wgmma_ws, plan.m_tiles,
                                              plan.tile_rows, plan.num_splits, plan.cluster_merge, plan.pdl,
                                              stream),
                    "MMA sparse-MLA launch");
}

}  // namespace dsv4::kernels::sparse_mla
