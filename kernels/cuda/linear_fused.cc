// Host side of the multi-weight split-K linear (kernel: linear_fused.cu; contract: linear_params.h
// FusedLinearParams): its plan (PlanFusedLinear, the one place that sizes its work split), the checks of a plan, and
// the launches - the ops interface's FusedLinear (LaunchFusedLinear) and a single linear whose plan names this kernel
// (LaunchLinearWithPlan with LinearPlan::min_blocks > 0, one entry per group).
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/linear_params.h"

namespace dsv4::kernels::cuda {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool PowerOfTwo(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }
bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
int NextPow2(int64_t v) {
  int p = 1;
  while (p < v && p < (1 << 20)) p *= 2;
  return p;
}

// Shared memory one block may take so that `min_blocks` blocks fit an SM of the H200 (228 KB, 1 KB reserved per
// block), and never more than the split-K kernels' limit (kSplitMaxSharedBytes: 99 KB, sm_120's opt-in; sm_120
// has never run this code).
int64_t FusedSmemBudget(int min_blocks) {
  return std::min<int64_t>(kSplitMaxSharedBytes, (int64_t{228} * 1024) / std::max(1, min_blocks) - 1024);
}

int64_t XRows(int64_t t, int n_tiles) { return std::min<int64_t>(t, int64_t{8} * n_tiles); }

// Row blocks of all weights together under `plan` (grid z).
int64_t TotalBlocks(const LinearPlan& plan, std::span<const int64_t> rows) {
  int64_t blocks = 0;
  for (const int64_t r : rows) blocks += CeilDiv(r, int64_t{16} * plan.warps_m);
  return blocks;
}

}  // namespace

namespace internal {

int64_t FusedSharedBytes(const LinearPlan& plan, int64_t x_rows) {
  const int64_t x_bytes = (x_rows * (plan.k_slice + 4) * 2 + 15) / 16 * 16;
  const int64_t acc_bytes = int64_t{4} * 32 * plan.n_tiles * 4;  // one warp's partial sums (one row tile)
  const bool split = plan.warps_k * plan.cluster > 1;
  return x_bytes + (split ? int64_t{plan.warps_m} * plan.warps_k * acc_bytes : 0);
}

}  // namespace internal

absl::Status CheckFusedPlan(const LinearPlan& pl, int64_t t, int64_t k, std::span<const int64_t> rows) {
  const bool shape_ok = pl.kernel == LinearKernel::kSplitK && pl.m_tiles == 1 && pl.stages == 0 &&
                        (pl.n_tiles == 1 || pl.n_tiles == 2 || pl.n_tiles == 4 || pl.n_tiles == 8) &&
                        (pl.min_blocks == kFusedMinBlocks || (pl.min_blocks == kFusedLeanBlocks && pl.n_tiles == 1));
  if (!shape_ok || pl.warps_m < 1 || pl.warps_k < 1 || pl.warps_m * pl.warps_k > kSplitWarps) {
    return absl::InvalidArgumentError(
        absl::StrCat("multi-weight linear plan: ", LinearPlanName(pl), " has no kernel"));
  }
  if (rows.empty() || rows.size() > static_cast<size_t>(kFusedMaxWeights) || t < 1 || t > kSplitMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat("multi-weight linear: ", rows.size(), " weights and ", t,
                                                   " tokens (1..", kFusedMaxWeights, " and 1..", kSplitMaxTokens,
                                                   ")"));
  }
  if (k < 1 || k >= (int64_t{1} << 30) || !PowerOfTwo(pl.cluster) || pl.cluster > 8 || pl.k_slice < 128 ||
      pl.k_slice % 128 != 0 || pl.k_slice + 4 > (int64_t{1} << 20) ||
      pl.cluster * pl.k_slice < k ||
      internal::FusedSharedBytes(pl, XRows(t, pl.n_tiles)) > kSplitMaxSharedBytes ||
      TotalBlocks(pl, rows) > 65535 || CeilDiv(t, 8 * pl.n_tiles) > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("multi-weight linear plan: ", LinearPlanName(pl),
                                                   " over its limits for Kin ", k, " and ", t, " tokens"));
  }
  return absl::OkStatus();
}

namespace {
std::optional<LinearPlan> PlanFusedTiles(int64_t t, std::span<const int64_t> rows, int64_t k, int sms,
                                         int min_blocks, int splits, bool bit_dequant, int n_tiles);
}  // namespace

// Sizes the work split like PlanSplitKLinear over the weights' summed row tiles: K split until about
// kFusedWarpsPerSm warps per SM are busy (8 for the default build, as measured best for the split-K kernel on the
// H200; 16 for the lean build, whose warps keep half the bytes in flight each), each warp with at least one
// 128-wide chunk; the split goes to a cluster first (up to 8 blocks) and then to the warps of a block; a larger
// cluster where the block's x slice would not fit its share of shared memory.
std::optional<LinearPlan> PlanFusedLinear(int64_t t, std::span<const int64_t> rows, int64_t k, int sms,
                                          int min_blocks, int splits, bool bit_dequant) {
  if (t < 1 || t > kSplitMaxTokens || k < 1 || rows.empty() || rows.size() > static_cast<size_t>(kFusedMaxWeights)) {
    return std::nullopt;
  }
  for (const int64_t r : rows) {
    if (r < 1) return std::nullopt;
  }
  if (min_blocks != kFusedMinBlocks && min_blocks != kFusedLeanBlocks) return std::nullopt;
  if (splits != 0 && (!PowerOfTwo(splits) || splits > 64)) return std::nullopt;
  // Above 32 tokens with K >= 4096 the default build's 64-token warp tile (n_tiles 8) where its x slice fits (K =
  // 4096 with a cluster of 8), else 32-token tiles. Measured on the H200 (bench/RESULTS.md fifth session): at K = 4096
  // 6-19% faster at T = 64 (the ratio-4 group 40.9 -> 34.3 us, shared w1+w3 38.0 -> 32.0, wo_a TP 4 21.8 -> 19.5);
  // at K <= 2048 10-30% slower (c_q TP 4 20.5 -> 24.1, wq_b 37.8 -> 46.8: a few K steps per warp with one in flight).
  const int n_tiles = t <= 8 ? 1 : t <= 16 ? 2 : (t <= 32 || k < 4096) ? 4 : 8;
  if (min_blocks == kFusedLeanBlocks && n_tiles > 1) return std::nullopt;  // the lean build: one token tile
  if (n_tiles == 8) {
    if (std::optional<LinearPlan> wide = PlanFusedTiles(t, rows, k, sms, min_blocks, splits, bit_dequant, 8)) {
      return wide;
    }
    return PlanFusedTiles(t, rows, k, sms, min_blocks, splits, bit_dequant, 4);
  }
  return PlanFusedTiles(t, rows, k, sms, min_blocks, splits, bit_dequant, n_tiles);
}

namespace {

// PlanFusedLinear for a given token tile per warp (8 * n_tiles tokens).
std::optional<LinearPlan> PlanFusedTiles(int64_t t, std::span<const int64_t> rows, int64_t k, int sms,
                                         int min_blocks, int splits, bool bit_dequant, int n_tiles) {
  LinearPlan plan{.kernel = LinearKernel::kSplitK, .m_tiles = 1};
  plan.n_tiles = n_tiles;
  plan.min_blocks = min_blocks;
  plan.bit_dequant = bit_dequant;
  const int64_t token_tiles = CeilDiv(t, 8 * plan.n_tiles);
  int64_t row_tiles = 0, max_row_tiles = 0;
  for (const int64_t r : rows) {
    row_tiles += CeilDiv(r, 16);
    max_row_tiles = std::max(max_row_tiles, CeilDiv(r, 16));
  }
  const int64_t tiles = row_tiles * token_tiles;
  const int64_t chunks = CeilDiv(k, 128);
  int s = splits;
  if (s == 0) {
    const int64_t want = int64_t{min_blocks == kFusedLeanBlocks ? 16 : 8} * std::max(1, sms);
    s = 1;
    while (s < 64 && 2 * s <= chunks && tiles * 2 * s <= want) s *= 2;
  }
  int cluster = std::min(s, 8);
  int warps_k = s / cluster;
  const int64_t x_rows = XRows(t, plan.n_tiles);
  const int64_t budget = FusedSmemBudget(min_blocks);
  auto fit = [&] {
    plan.cluster = cluster;
    plan.warps_k = warps_k;
    plan.warps_m = std::min(kSplitWarps / warps_k, NextPow2(max_row_tiles));
    plan.k_slice = CeilDiv(chunks, cluster) * 128;
    return internal::FusedSharedBytes(plan, x_rows) <= budget;
  };
  while (!fit() && cluster < 8) {
    if (warps_k > 1) warps_k /= 2;
    cluster *= 2;
  }
  if (!fit()) return std::nullopt;
  if (!CheckFusedPlan(plan, t, k, rows).ok()) return std::nullopt;
  return plan;
}

}  // namespace

// The lean build up to 8 tokens: measured on the H200 (bench/RESULTS.md, "multi-weight linear, measured") 11-20%
// faster than the default build on every wired group of >= 14 MB at T = 1..8 and within 3% on the small ones (its
// 16 warps per SM keep more bytes in flight in total at one step each); the default build above 8 tokens.
std::optional<LinearPlan> AutoFusedLinearPlan(int64_t t, std::span<const int64_t> rows, int64_t k, int sms) {
  if (t <= 8) {
    if (std::optional<LinearPlan> lean = PlanFusedLinear(t, rows, k, sms, kFusedLeanBlocks)) return lean;
  }
  return PlanFusedLinear(t, rows, k, sms, kFusedMinBlocks);
}

absl::Status LaunchFusedWeights(std::span<const FusedWeightRef> refs, const ActView& x, int64_t t, int64_t x_stride,
                                const LinearPlan& plan, cudaStream_t stream) {
  if (refs.empty() || refs.size() > static_cast<size_t>(kFusedMaxWeights)) {
    return absl::InvalidArgumentError(absl::StrCat("multi-weight linear: ", refs.size(), " weights"));
  }
  const int64_t k = refs[0].w->k();
  std::array<int64_t, kFusedMaxWeights> row_buf{};
  for (size_t i = 0; i < refs.size(); ++i) row_buf[i] = refs[i].n;
  const std::span<const int64_t> rows(row_buf.data(), refs.size());
  const bool wgmma = plan.kernel == LinearKernel::kWgmma;
  DSV4_RETURN_IF_ERROR(wgmma ? CheckWgmmaPlan(plan, t, k, rows) : CheckFusedPlan(plan, t, k, rows));
  if (wgmma && !LinearWgmmaRunsHere()) {
    return absl::FailedPreconditionError("wgmma linear: the current device is not compute capability 9.0 (sm_90a)");
  }
  const bool x_bf16 = x.dtype == DType::kBF16;
  const int64_t x_esize = x_bf16 ? 2 : 4;
  FusedLinearParams p;
  p.x = x.data, p.x_bf16 = x_bf16, p.x_stride = x_stride, p.t = t, p.k = k;
  p.x_rows = wgmma ? std::min<int64_t>(t, WgmmaPlanTokens(plan)) : XRows(t, plan.n_tiles);
  p.count = static_cast<int>(refs.size());
  p.plan = plan;
  const int64_t rows_per_block = wgmma ? int64_t{kWgmmaRows} : int64_t{16} * plan.warps_m;
  int64_t block0 = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    const FusedWeightRef& r = refs[i];
    LinearKernelFormat format;
    int64_t w_esize;
    switch (r.w->format()) {
      case WeightFormat::kFp8Block128: format = LinearKernelFormat::kFp8, w_esize = 1; break;
      case WeightFormat::kBF16: format = LinearKernelFormat::kBf16, w_esize = 2; break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("multi-weight linear: weight ", i, " is ",
                                                       WeightFormatName(r.w->format()), " (FP8 or BF16 only)"));
    }
    if (r.w->k() != k || r.row0 < 0 || r.n < 1 || r.row0 + r.n > r.w->n() || r.y == nullptr || r.y_stride < r.n) {
      return absl::InvalidArgumentError(absl::StrCat("multi-weight linear: weight ", i, " rows [", r.row0, ", +",
                                                     r.n, ") of ", r.w->n(), ", Kin ", r.w->k(), " (want ", k,
                                                     "), y stride ", r.y_stride));
    }
    const void* w = static_cast<const uint8_t*>(r.w->data()) + r.row0 * k * w_esize;
    const void* xc = static_cast<const uint8_t*>(x.data) + r.x_col * x_esize;
    const bool vec = (k * w_esize) % 16 == 0 && (k * x_esize) % 16 == 0 && (x_stride * x_esize) % 16 == 0 &&
                     Aligned16(w) && Aligned16(xc);
    if (wgmma && (format != LinearKernelFormat::kFp8 || !vec || r.row0 % 64 != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "wgmma linear: weight ", i, " is ", WeightFormatName(r.w->format()), ", rows from ", r.row0,
          vec ? "" : ", unaligned rows", " (FP8, a 64-row aligned first row and 16-byte aligned rows only)"));
    }
    p.e[i] = FusedLinearEntry{.format = format, .w = w, .scale = r.w->scale(), .scale_cols = CeilDiv(k, 128),
                              .scale_row0 = r.row0, .n = r.n, .x_col = r.x_col, .y = r.y, .y_stride = r.y_stride,
                              .vec = vec, .block0 = block0};
    block0 += CeilDiv(r.n, rows_per_block);
  }
  if (wgmma) return CudaStatus(internal::LaunchLinearWgmmaKernel(p, stream), "wgmma linear launch");
  return CudaStatus(internal::LaunchFusedLinearKernel(p, stream), "multi-weight linear launch");
}

std::optional<LinearPlan> AutoWgmmaPlan(std::span<const FusedWeightRef> refs, const ActView& x, int64_t t,
                                        int64_t x_stride) {
  if (t < kWgmmaMinTokens || refs.empty() || refs.size() > static_cast<size_t>(kFusedMaxWeights) ||
      !LinearWgmmaEnabled()) {
    return std::nullopt;
  }
  const int64_t x_esize = x.dtype == DType::kBF16 ? 2 : 4;
  const int64_t k = refs[0].w->k();
  if ((x_stride * x_esize) % 16 != 0 || !Aligned16(x.data)) return std::nullopt;
  std::array<int64_t, kFusedMaxWeights> row_buf{};
  for (size_t i = 0; i < refs.size(); ++i) {
    const FusedWeightRef& r = refs[i];
    if (r.w->format() != WeightFormat::kFp8Block128 || r.w->k() != k || r.row0 % 64 != 0 ||
        (r.x_col * x_esize) % 16 != 0 || !Aligned16(r.w->data())) {
      return std::nullopt;
    }
    row_buf[i] = r.n;
  }
  return DeviceWgmmaPlan(t, std::span<const int64_t>(row_buf.data(), refs.size()), k);
}

std::optional<LinearPlan> DeviceWgmmaPlan(int64_t t, std::span<const int64_t> rows, int64_t k) {
  // How many clusters of each size fit at once (a cluster of 8 needs 8 free SMs of one GPC): read once per device
  // for the token tile PlanWgmmaLinear takes at this T.
  const int tokens = WgmmaTileTokens(t);
  std::array<int, 4> max_clusters{};
  bool known = true;
  for (int i = 0; i < 4; ++i) {
    max_clusters[static_cast<size_t>(i)] = internal::WgmmaMaxActiveClusters(1 << i, tokens);
    known = known && max_clusters[static_cast<size_t>(i)] > 0;
  }
  return PlanWgmmaLinear(t, rows, k, CurrentDeviceSms(),
                         known ? std::span<const int>(max_clusters) : std::span<const int>());
}

absl::Status LaunchFusedLinearWithPlan(const FusedLinearArgs& a, const LinearPlan* plan, cudaStream_t stream) {
  if (a.count < 0 || a.count > kMaxFusedLinears) {
    return absl::InvalidArgumentError(
        absl::StrCat("fused linear: ", a.count, " outputs (0..", kMaxFusedLinears, ")"));
  }
  if (a.t < 0) return absl::InvalidArgumentError(absl::StrCat("fused linear: negative token count ", a.t));
  if (a.count == 0 || a.t == 0) return absl::OkStatus();
  if (a.x.data == nullptr) return absl::InvalidArgumentError("fused linear: null x");
  std::vector<FusedWeightRef> refs;
  bool fusable = a.t <= kSplitMaxTokens;
  int64_t k = 0;
  for (int i = 0; i < a.count; ++i) {
    const auto* w = dynamic_cast<const CudaLinearWeight*>(a.out[i].w);
    if (w == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("fused linear: weight ", i, " is missing or was not prepared by the CUDA backend"));
    }
    if (i == 0) k = w->k();
    if (w->k() != k || a.out[i].y == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("fused linear: output ", i, " has Kin ", w->k(), " (want ", k, ") or no y"));
    }
    const int64_t ys = a.out[i].y_stride ? a.out[i].y_stride : w->n();
    if (ys < w->n()) {
      return absl::InvalidArgumentError(
          absl::StrCat("fused linear: output ", i, " row stride ", ys, " below its ", w->n(), " rows"));
    }
    fusable = fusable && (w->format() == WeightFormat::kFp8Block128 || w->format() == WeightFormat::kBF16);
    refs.push_back({.w = w, .row0 = 0, .n = w->n(), .x_col = 0, .y = a.out[i].y, .y_stride = ys});
  }
  const int64_t xs = a.x_stride ? a.x_stride : k;
  if (xs < k) {
    return absl::InvalidArgumentError(absl::StrCat("fused linear: x row stride ", xs, " below Kin ", k));
  }
  if (plan == nullptr) {
    if (std::optional<LinearPlan> wgmma = AutoWgmmaPlan(refs, a.x, a.t, xs)) {
      return LaunchFusedWeights(refs, a.x, a.t, xs, *wgmma, stream);
    }
  }
  if (plan == nullptr && fusable && a.count > 1) {
    std::vector<int64_t> rows;
    for (const FusedWeightRef& r : refs) rows.push_back(r.n);
    if (std::optional<LinearPlan> auto_plan = AutoFusedLinearPlan(a.t, rows, k, CurrentDeviceSms())) {
      return LaunchFusedWeights(refs, a.x, a.t, xs, *auto_plan, stream);
    }
  }
  if (plan != nullptr) {
    if (!fusable && plan->kernel != LinearKernel::kWgmma) {
      return absl::InvalidArgumentError(absl::StrCat("fused linear: a plan for ", a.t,
                                                     " tokens or a weight that is neither FP8 nor BF16"));
    }
    return LaunchFusedWeights(refs, a.x, a.t, xs, *plan, stream);
  }
  // Prefill, F32 weights, a single weight: the single linear's own kernel choice for each.
  for (int i = 0; i < a.count; ++i) {
    DSV4_RETURN_IF_ERROR(LaunchLinear({.w = a.out[i].w, .x = a.x, .y = a.out[i].y, .t = a.t, .x_stride = xs,
                                       .y_stride = refs[i].y_stride},
                                      stream));
  }
  return absl::OkStatus();
}

absl::Status LaunchFusedLinear(const FusedLinearArgs& a, cudaStream_t stream) {
  return LaunchFusedLinearWithPlan(a, nullptr, stream);
}

}  // namespace dsv4::kernels::cuda
