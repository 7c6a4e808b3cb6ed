// Host side of the wgmma FP8 linear (kernel: linear_wgmma.cu; LinearKernel::kWgmma in linear_params.h): whether it
// runs on this device, its work split (PlanWgmmaLinear) and the checks of a plan. The launches go through the
// multi-weight path (linear_fused.cc LaunchFusedWeights), which single and grouped linears use too.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/linear_params.h"

namespace dsv4::kernels::cuda {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::atomic<int> g_override{-1};

// The plan's time model, in units of one 128-wide weight step of one tile (16 KB from HBM at a block's share of the
// bandwidth): staging the x slice (f32 from L2, 2x a tile's weight bytes, at about twice the rate) costs about one
// pass over the slice's steps; a block's fixed cost (launch, ring fill, epilogue) two steps, and the cluster
// reduction two more per tile. A guess until the H200 measures it (bench/RESULTS.md).
constexpr int64_t kBlockOverheadSteps = 2;
constexpr int64_t kClusterOverheadSteps = 2;

}  // namespace

bool LinearWgmmaRunsHere() {
  if (!internal::LinearWgmmaBuilt()) return false;
  // Per device, read once: 0 unknown, 1 no, 2 yes (cudaDeviceGetAttribute is cheap, but this is asked per launch).
  static std::atomic<uint8_t> known[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) return false;
  std::atomic<uint8_t>* slot = device < 64 ? &known[device] : nullptr;
  if (slot != nullptr) {
    if (const uint8_t v = slot->load(std::memory_order_relaxed); v != 0) return v == 2;
  }
  int major = 0, minor = 0;
  const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
                  major == 9 && minor == 0;
  if (slot != nullptr) slot->store(ok ? 2 : 1, std::memory_order_relaxed);
  return ok;
}

bool LinearWgmmaEnabled() {
  const int o = g_override.load(std::memory_order_relaxed);
  if (o >= 0) return o != 0 && LinearWgmmaRunsHere();
  static const bool from_env = [] {
    const char* v = std::getenv("DSV4_LINEAR_WGMMA");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return from_env && LinearWgmmaRunsHere();
}

void SetLinearWgmmaForTesting(int enabled) {
  g_override.store(enabled < 0 ? -1 : enabled != 0, std::memory_order_relaxed);
}

absl::Status CheckWgmmaPlan(const LinearPlan& pl, int64_t t, int64_t k, std::span<const int64_t> rows) {
  if (pl.kernel != LinearKernel::kWgmma) {
    return absl::InvalidArgumentError(absl::StrCat("wgmma linear plan: ", LinearPlanName(pl), " is not one"));
  }
  if (!internal::LinearWgmmaBuilt()) {
    return absl::FailedPreconditionError(
        "wgmma linear: this build has no sm_90a kernels (add 90a to CMAKE_CUDA_ARCHITECTURES)");
  }
  if (pl.n_tiles != 2 && pl.n_tiles != 8) {
    return absl::InvalidArgumentError(absl::StrCat("wgmma linear plan: ", LinearPlanName(pl),
                                                   " has no kernel (16 or 64 tokens a block: n_tiles 2 or 8)"));
  }
  if (rows.empty() || rows.size() > static_cast<size_t>(kFusedMaxWeights) || t < 1 ||
      CeilDiv(t, WgmmaPlanTokens(pl)) > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("wgmma linear: ", rows.size(), " weights and ", t,
                                                   " tokens (1..", kFusedMaxWeights, " weights)"));
  }
  int64_t tiles = 0;
  for (const int64_t r : rows) {
    if (r < 1) return absl::InvalidArgumentError(absl::StrCat("wgmma linear: a weight of ", r, " rows"));
    tiles += CeilDiv(r, kWgmmaRows);
  }
  const bool cluster_ok = pl.cluster == 1 || pl.cluster == 2 || pl.cluster == 4 || pl.cluster == 8;
  if (k < 128 || k % 128 != 0 || !cluster_ok || pl.k_slice < 128 || pl.k_slice % 128 != 0 ||
      pl.k_slice > kWgmmaMaxKSlice || pl.cluster * pl.k_slice < k || pl.row_tiles < 1 ||
      CeilDiv(tiles, pl.row_tiles) > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("wgmma linear plan: ", LinearPlanName(pl),
                                                   " over its limits for Kin ", k,
                                                   " (a multiple of 128, at most 8 slices of <= ", kWgmmaMaxKSlice,
                                                   ", >= 1 row tile a block)"));
  }
  return absl::OkStatus();
}

int WgmmaTileTokens(int64_t t) { return t <= 16 ? 16 : kWgmmaTokens; }

// For each cluster whose K slice fits (<= kWgmmaMaxKSlice): as many blocks as fill one wave (64-token blocks take
// 113-225 KB of shared memory, one per SM; 16-token blocks <= 105 KB, two; max_clusters[log2 c], where given, is how
// many clusters of c such blocks the device
// holds at once - a cluster of 8 needs 8 free SMs of one GPC, so fewer than sms / 8 may fit), each taking row_tiles
// consecutive tiles; the cluster with the least modelled time (waves x per-block time, see above) wins, ties to the
// smaller cluster (fewer reductions).
std::optional<LinearPlan> PlanWgmmaLinear(int64_t t, std::span<const int64_t> rows, int64_t k, int sms,
                                          std::span<const int> max_clusters) {
  if (t < 1 || k < 128 || k % 128 != 0 || rows.empty() || rows.size() > static_cast<size_t>(kFusedMaxWeights)) {
    return std::nullopt;
  }
  int64_t tiles = 0;
  for (const int64_t r : rows) {
    if (r < 1) return std::nullopt;
    tiles += CeilDiv(r, kWgmmaRows);
  }
  const int tokens = WgmmaTileTokens(t);
  const int64_t token_blocks = CeilDiv(t, tokens);
  const int64_t block_tokens = std::min<int64_t>(t, tokens);  // x rows a block stages
  const int64_t chunks = k / 128;
  std::optional<LinearPlan> best;
  int64_t best_cost = 0;
  for (int log2c = 0; log2c <= 3; ++log2c) {
    const int cluster = 1 << log2c;
    const int64_t steps = CeilDiv(chunks, cluster);  // per tile
    if (steps * 128 > kWgmmaMaxKSlice) continue;
    const int64_t resident = static_cast<size_t>(log2c) < max_clusters.size()
                                 ? std::max(1, max_clusters[static_cast<size_t>(log2c)])
                                 : std::max(1, (tokens == 16 ? 2 : 1) * sms / cluster);  // blocks per SM: 2 / 1
    const int64_t groups = std::clamp<int64_t>(resident / token_blocks, 1, tiles);  // clusters per token block
    const int64_t row_tiles = CeilDiv(tiles, groups);
    const int64_t clusters = CeilDiv(tiles, row_tiles) * token_blocks;
    // Staging: one pass over the slice's steps for the 64-token build (as its plans were derived); the 16-token
    // build stages only the block's real rows, a fraction of that.
    const int64_t x_steps = tokens == 16 ? CeilDiv(steps * block_tokens, kWgmmaTokens) : steps;
    const int64_t per_block = row_tiles * steps + x_steps + kBlockOverheadSteps +
                              (cluster > 1 ? kClusterOverheadSteps * row_tiles : 0);
    const int64_t cost = CeilDiv(clusters, resident) * per_block;
    if (!best || cost < best_cost) {
      LinearPlan plan{.kernel = LinearKernel::kWgmma, .n_tiles = tokens / 8, .cluster = cluster,
                      .k_slice = steps * 128};
      plan.row_tiles = static_cast<int>(row_tiles);
      best = plan;
      best_cost = cost;
    }
  }
  if (best && !CheckWgmmaPlan(*best, t, k, rows).ok()) return std::nullopt;
  return best;
}

}  // namespace dsv4::kernels::cuda
