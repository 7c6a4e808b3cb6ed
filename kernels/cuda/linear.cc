// Host side of the CUDA linear: weight preparation (PrepareCudaLinear), argument checks, the kernel choice and
// work-split plan (AutoLinearPlan: the one place that decides per shape) and the launch (LaunchLinear).
// Kernels: linear.cu; contract: linear_params.h.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/float_formats.h"
#include "common/status_macros.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/linear_params.h"

namespace dsv4::kernels::cuda {
namespace {

constexpr int64_t kBlock = 128;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int NextPow2(int64_t v) {
  int p = 1;
  while (p < v && p < (1 << 20)) p *= 2;
  return p;
}

// Prefill (kTiled): smaller row tiles and K split over the warps of a block while the blocks alone would not fill
// the GPU twice over.
LinearPlan PlanTiled(int64_t t, int64_t n, int64_t k, int groups, int sms) {
  LinearPlan plan;
  plan.n_tiles = t <= 8 ? 1 : t <= 16 ? 2 : 4;
  const int64_t token_tiles = CeilDiv(t, 8 * plan.n_tiles);
  const int64_t want_blocks = 2 * int64_t{sms};
  plan.m_tiles = (n <= 16 || CeilDiv(n, 32) * groups * token_tiles < want_blocks) ? 1 : 2;
  const int64_t row_tiles = CeilDiv(n, 16 * plan.m_tiles);  // per group
  const int max_warps = plan.n_tiles == 1 ? 16 : 8;
  const int64_t steps = CeilDiv(k, 64);
  auto blocks = [&](int warps_k) {
    const int warps_m = std::min(max_warps / warps_k, NextPow2(row_tiles));
    return CeilDiv(row_tiles, warps_m) * groups * token_tiles;
  };
  int warps_k = 1;
  while (warps_k * 2 <= max_warps && steps >= 2 * (warps_k * 2) && blocks(warps_k) < want_blocks) warps_k *= 2;
  plan.warps_k = warps_k;
  plan.warps_m = std::min(max_warps / warps_k, NextPow2(row_tiles));
  return plan;
}

int64_t SplitXBytes(int n_tiles, int64_t k_slice) { return int64_t{8} * n_tiles * (k_slice + 4) * 2; }

bool PowerOfTwo(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// Plan checks shared by the automatic plans and the ones a benchmark hands in.
absl::Status CheckPlan(const LinearPlan& pl, int64_t t, int64_t n, int64_t k, int groups) {
  const bool tiles_ok = (pl.m_tiles == 1 || pl.m_tiles == 2) && (pl.n_tiles == 1 || pl.n_tiles == 2 || pl.n_tiles == 4) &&
                        !(pl.kernel == LinearKernel::kSplitK && pl.m_tiles == 2 && pl.n_tiles == 4);
  const int64_t rows_per_block = int64_t{16} * pl.m_tiles * pl.warps_m;
  const int64_t token_tiles = CeilDiv(t, 8 * pl.n_tiles);
  if (!tiles_ok || pl.warps_m < 1 || pl.warps_k < 1) {
    return absl::InvalidArgumentError(absl::StrCat("linear plan: ", LinearPlanName(pl), " has no kernel"));
  }
  if (token_tiles > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("linear: ", t, " tokens is too many for one launch"));
  }
  if (pl.kernel == LinearKernel::kTiled) {
    if (pl.warps_m * pl.warps_k > (pl.n_tiles == 1 ? 16 : 8) || groups > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("linear plan: ", LinearPlanName(pl), " over its limits"));
    }
    return absl::OkStatus();
  }
  const bool stages_ok = pl.stages == 0 || (pl.stages >= 2 && pl.stages <= kMaxStages && pl.m_tiles == 1);
  const int64_t smem_limit = pl.stages > 0 ? internal::LinearMaxSharedBytes() : kSplitMaxSharedBytes;
  if (pl.warps_m * pl.warps_k > kSplitWarps || !PowerOfTwo(pl.cluster) || pl.cluster > 8 || pl.k_slice < 128 ||
      pl.k_slice % 128 != 0 || pl.cluster * pl.k_slice < k || !stages_ok ||
      internal::LinearSharedBytes(pl) > smem_limit || CeilDiv(n, rows_per_block) * groups > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("linear plan: ", LinearPlanName(pl), " over its limits for [",
                                                   n, ", ", k, "] x ", groups, " groups"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string LinearPlanName(const LinearPlan& pl) {
  if (pl.kernel == LinearKernel::kWgmma) {
    return absl::StrCat("wgmma n", 8 * pl.n_tiles, " c", pl.cluster, " ks", pl.k_slice, " rt", pl.row_tiles);
  }
  if (pl.kernel == LinearKernel::kTiled) {
    return absl::StrCat("tiled m", pl.m_tiles, " n", pl.n_tiles, " w", pl.warps_m, "x", pl.warps_k);
  }
  return absl::StrCat("splitk m", pl.m_tiles, " n", pl.n_tiles, " w", pl.warps_m, "x", pl.warps_k, " c",
                      pl.cluster, " ks", pl.k_slice, pl.stages > 0 ? absl::StrCat(" st", pl.stages) : "",
                      pl.min_blocks > 0 ? absl::StrCat(" mb", pl.min_blocks) : "", pl.bit_dequant ? " bits" : "");
}

std::optional<LinearPlan> PlanSplitKLinear(int64_t t, int64_t n, int64_t k, int groups, int sms, int m_tiles,
                                           int splits) {
  if (t < 1 || t > kSplitMaxTokens || n < 1 || k < 1 || groups < 1) return std::nullopt;
  if (splits != 0 && (!PowerOfTwo(splits) || splits > 64)) return std::nullopt;
  LinearPlan plan{.kernel = LinearKernel::kSplitK};
  plan.n_tiles = t <= 8 ? 1 : t <= 16 ? 2 : 4;
  const int64_t token_tiles = CeilDiv(t, 8 * plan.n_tiles);
  // One row tile per warp: the most warps for memory-bound decode. Two halve the x reads per weight byte, but a
  // 2 x 4 tile would spill (no such kernel).
  plan.m_tiles = m_tiles > 0 ? m_tiles : 1;
  if (plan.m_tiles < 1 || plan.m_tiles > 2 || (plan.m_tiles == 2 && plan.n_tiles == 4)) return std::nullopt;
  const int64_t row_tiles = CeilDiv(n, 16 * plan.m_tiles);
  const int64_t tiles = row_tiles * groups * token_tiles;
  const int64_t chunks = CeilDiv(k, 128);  // K slices are whole 128-wide chunks (an FP8 step, two BF16 steps)
  int s = splits;
  if (s == 0) {
    // About 8 warps per SM (measured on the H200: more warps, i.e. more and shorter-lived blocks, cost more in
    // per-block latency than they add in loads in flight), each warp with at least one 128-wide chunk.
    const int64_t want = int64_t{8} * sms;
    s = 1;
    while (s < 64 && 2 * s <= chunks && tiles * 2 * s <= want) s *= 2;
  }
  int cluster = std::min(s, 8);
  const int warps_k = s / cluster;
  // The block's x slice must fit its shared memory: more blocks per cluster make it shorter.
  while (SplitXBytes(plan.n_tiles, CeilDiv(chunks, cluster) * 128) > kSplitXBytes && cluster < 8) cluster *= 2;
  if (SplitXBytes(plan.n_tiles, CeilDiv(chunks, cluster) * 128) > kSplitXBytes) return std::nullopt;
  plan.cluster = cluster;
  plan.warps_k = warps_k;
  plan.k_slice = CeilDiv(chunks, cluster) * 128;
  plan.warps_m = std::min(kSplitWarps / warps_k, NextPow2(row_tiles));
  return plan;
}

// FP8 decode through the weight ring (linear_ring.cu). ncu on the H200 (bench/RESULTS.md) put the split-K kernel
// at ~15 warps per SM, each issuing an instruction every ~7 cycles: the ring kernel's cheap steps pay off with
// more warps in flight, so the plan aims at 32 warps per SM up to 8 tokens (16 above: x staging grows), each warp
// with at least two 128-wide steps; stages: the most (<= kMaxStages) that keep the blocks an SM can hold (by
// registers, and by the grid's size) in its shared memory.
std::optional<LinearPlan> PlanRingLinear(int64_t t, int64_t n, int64_t k, int groups, int sms, int splits,
                                         int stages) {
  if (t < 1 || t > kSplitMaxTokens || n < 1 || k < 1 || groups < 1) return std::nullopt;
  if (splits != 0 && (!PowerOfTwo(splits) || splits > 32)) return std::nullopt;
  if (stages != 0 && (stages < 2 || stages > kMaxStages)) return std::nullopt;
  LinearPlan plan{.kernel = LinearKernel::kSplitK, .m_tiles = 1};
  plan.n_tiles = t <= 8 ? 1 : t <= 16 ? 2 : 4;
  const int64_t token_tiles = CeilDiv(t, 8 * plan.n_tiles);
  const int64_t row_tiles = CeilDiv(n, 16);
  const int64_t tiles = row_tiles * groups * token_tiles;
  const int64_t chunks = CeilDiv(k, 128);
  int s = splits;
  if (s == 0) {
    const int64_t want = int64_t{t <= 8 ? 32 : 16} * sms;
    s = 1;
    while (s < 32 && 4 * s <= chunks && tiles * 2 * s <= want) s *= 2;
  }
  // Every block stages x[tokens, K slice] from global memory: splitting K over the warps of a block makes more,
  // smaller row blocks (more x reads per weight byte), over a cluster it does not. One or two tokens read
  // almost no x: warps first (no cluster barrier); more tokens: the cluster first.
  int warps_k = t <= 2 ? std::min(s, 4) : std::max(1, s / 8);
  int cluster = s / warps_k;
  if (cluster > 8) return std::nullopt;
  // The block's x slice must fit (kSplitXBytes, so the register ring can run the same plan): a larger cluster
  // makes it shorter.
  while (SplitXBytes(plan.n_tiles, CeilDiv(chunks, cluster) * 128) > kSplitXBytes && cluster < 8) {
    if (warps_k > 1) warps_k /= 2;
    cluster *= 2;
  }
  if (SplitXBytes(plan.n_tiles, CeilDiv(chunks, cluster) * 128) > kSplitXBytes) return std::nullopt;
  plan.cluster = cluster;
  plan.warps_k = warps_k;
  plan.k_slice = CeilDiv(chunks, cluster) * 128;
  plan.warps_m = std::min(kSplitWarps / warps_k, NextPow2(row_tiles));
  if (stages == 0) {
    const int reg_blocks = plan.n_tiles == 1 ? 4 : 2;  // linear_ring.cu kRingMinBlocks
    const int64_t grid = CeilDiv(row_tiles, plan.warps_m) * groups * token_tiles * cluster;
    const int64_t blocks = std::clamp<int64_t>(CeilDiv(grid, sms), 1, reg_blocks);
    const int64_t per_block = (228 * 1024) / blocks - 1024;
    stages = kMaxStages;
    for (; stages > 2; --stages) {
      plan.stages = stages;
      if (internal::LinearSharedBytes(plan) <= per_block) break;
    }
  }
  plan.stages = stages;
  if (internal::LinearSharedBytes(plan) > kStreamMaxSharedBytes) return std::nullopt;
  return plan;
}

LinearPlan PlanTiledLinear(int64_t t, int64_t n, int64_t k, int groups, int sms) {
  return PlanTiled(t, n, k, groups, sms);
}

// The one place that picks a kernel per shape, from dsv4-gemm-bench on the H200 (bench/RESULTS.md; every plan
// variant timed side by side in one run). Up to 8 tokens (second session, b7eed59): the split-K kernel with its
// register ring wins on FP8 weights of >= 8192 rows (wq_b 15.8 vs 20.6 us tiled at T = 1) and of <= 512 rows (wkv
// 5.4 us); the tiled kernel wins or ties on the 1024-4096-row FP8 weights and on BF16; FP8 weights of >= 16 MiB with
// K >= 4096 take the multi-weight kernel's lean build (fourth session: wo_a 19.9 vs 23.0 us, wo_b 19.9 vs 23.2 at
// T = 1). From 9 to 128 tokens (fifth session, after the split-K kernel's x staging and epilogue were rewritten:
// 1.3-1.6x faster there) the split-K kernel wins on every flash shape - over the FP8 weight ring (linear_ring.cu)
// too, which the planner no longer picks (wq_b 21.0 vs 34.4 us at T = 32, 73 vs 97 at T = 128; wo_b 53.7 vs 67.6 at
// T = 64) - except the short-row 4096-row FP8 weight (shared w2 at TP 4, [4096, 512]: tiled 4.9 / 6.8 us vs 5.7 /
// 7.1 at T = 16 / 32). Prefill (> kSplitMaxTokens tokens) is tiled. cuBLASLt - faster from T = 16 (bf16 on
// dequantised weights, twice the bytes) and on the largest FP8 weights (block-scaled FP8, activations quantised to
// e4m3: 2.5e-2 error) - is not called: docs/cuda-backend.md.
LinearPlan AutoLinearPlan(int64_t t, int64_t n, int64_t k, int groups, int sms, LinearKernelFormat format) {
  const int64_t rows = n * groups;
  const bool fp8 = format == LinearKernelFormat::kFp8;
  // The groups as the multi-weight kernel's entries (one per group), without a heap allocation per launch.
  std::array<int64_t, kFusedMaxWeights> group_buf{};
  const bool fusable_groups = groups >= 1 && groups <= kFusedMaxWeights;
  if (fusable_groups) group_buf.fill(n);
  const std::span<const int64_t> group_rows(group_buf.data(), fusable_groups ? static_cast<size_t>(groups) : 0);
  if (fp8 && t <= 8) {
    const int64_t bytes = rows * k;
    // The multi-weight kernel's lean build (4 blocks of <= 64-register warps per SM, one group per entry) on large
    // weights with long rows at decode sizes: wo_a (8 groups of 1024 x 4096) 23.0 -> 19.9 us at T = 1 and 27.1 ->
    // 22.5 at T = 8, wo_b (4096 x 8192) 23.2 -> 19.6 / 26.3 -> 22.1 on the H200 (bench/RESULTS.md "Fourth
    // session"); at K = 1024 (wq_b) and below 16 MB the split-K / tiled kernels stay as fast or faster.
    if (bytes >= (int64_t{16} << 20) && k >= 4096 && fusable_groups) {
      if (std::optional<LinearPlan> lean = PlanFusedLinear(t, group_rows, k, sms, kFusedLeanBlocks)) return *lean;
    }
  }
  if (t > 32 && k >= 4096 && fusable_groups && format != LinearKernelFormat::kF32) {
    // 33-128 tokens, K >= 4096: the multi-weight kernel's 64-token warp tile where it fits (K = 4096): every weight
    // row is read and dequantised once per 64 tokens instead of once per 32 (PlanFusedLinear; bench/RESULTS.md
    // fifth session: wo_a TP 4 21.8 -> 19.5 us, shared w1 21.5 -> 19.1, BF16 compressor 14.0 -> 13.9 at T = 64 and
    // 22.0 -> 20.0 at T = 128; wo_b, K = 8192, only at T = 33 where its slice fits: 52.7 -> 50.9; slower at K <= 2048).
    std::optional<LinearPlan> wide = PlanFusedLinear(t, group_rows, k, sms, kFusedMinBlocks);
    if (wide && wide->n_tiles == 8) return *wide;
  }
  bool split = true;
  if (t <= 8) {
    split = fp8 && (rows >= 8192 || rows <= 512);
  } else if (t <= 32) {
    split = !(fp8 && groups == 1 && rows >= 4096 && rows < 8192 && k <= 512);
  }
  if (split) {
    if (std::optional<LinearPlan> plan = PlanSplitKLinear(t, n, k, groups, sms)) return *plan;
  }
  return PlanTiled(t, n, k, groups, sms);
}

absl::StatusOr<LinearHandle> PrepareCudaLinear(const WeightView& w, Backend& backend) {
  if (w.n <= 0 || w.k <= 0 || w.data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear weight ", w.name, ": empty (", w.n, " x ", w.k, ") or without data"));
  }
  int64_t data_bytes = 0;
  switch (w.format) {
    case WeightFormat::kF32: data_bytes = w.n * w.k * 4; break;
    case WeightFormat::kBF16: data_bytes = w.n * w.k * 2; break;
    case WeightFormat::kFp8Block128: data_bytes = w.n * w.k; break;
    case WeightFormat::kNvfp4:
    case WeightFormat::kMxfp4:
      return absl::UnimplementedError(absl::StrCat(
          "linear weight ", w.name, " is ", WeightFormatName(w.format),
          ": the CUDA backend runs 4-bit weights only as routed experts (PrepareExperts), not as a plain linear"));
  }
  // FP8: one f32 per 128x128 block (ue8m0 -> f32 is exact), so the kernel reads one scale format. Checked
  // before anything is allocated.
  std::vector<float> scales;
  if (w.format == WeightFormat::kFp8Block128) {
    if (w.scale == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("linear weight ", w.name, ": FP8_BLOCK128 without scales"));
    }
    scales.resize(CeilDiv(w.n, kBlock) * CeilDiv(w.k, kBlock));
    for (size_t i = 0; i < scales.size(); ++i) {
      if (w.scale_f32) {
        std::memcpy(&scales[i], w.scale + 4 * i, 4);
      } else {
        scales[i] = Ue8m0ToF32(w.scale[i]);
      }
      if (!std::isfinite(scales[i])) {
        return absl::DataLossError(absl::StrCat("linear weight ", w.name, ": FP8 block scale ", i, " is ", scales[i],
                                                " (corrupt scale)"));
      }
    }
  }
  DSV4_ASSIGN_OR_RETURN(Buffer data, backend.Allocate(data_bytes, MemoryKind::kWeights));
  DSV4_RETURN_IF_ERROR(backend.CopyToDevice(data.data(), w.data, data_bytes));
  Buffer scale;
  if (!scales.empty()) {
    const int64_t bytes = static_cast<int64_t>(scales.size() * sizeof(float));
    DSV4_ASSIGN_OR_RETURN(scale, backend.Allocate(bytes, MemoryKind::kWeights));
    DSV4_RETURN_IF_ERROR(backend.CopyToDevice(scale.data(), scales.data(), bytes));
  }
  DSV4_RETURN_IF_ERROR(backend.Synchronize());  // the view's memory and `scales` may go away after we return
  return std::make_unique<CudaLinearWeight>(w.n, w.k, w.format, std::move(data), std::move(scale));
}

absl::Status LaunchLinearWithPlan(const LinearArgs& a, const LinearPlan* plan, cudaStream_t stream) {
  if (a.w == nullptr) return absl::InvalidArgumentError("linear: no weight");
  const auto* w = dynamic_cast<const CudaLinearWeight*>(a.w);
  if (w == nullptr) return absl::InvalidArgumentError("linear: the weight was not prepared by the CUDA backend");
  if (a.groups < 1 || w->n() % a.groups != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear: ", w->n(), " weight rows do not split into ", a.groups, " groups"));
  }
  if (a.t < 0) return absl::InvalidArgumentError(absl::StrCat("linear: negative token count ", a.t));
  if (a.t == 0) return absl::OkStatus();
  const int64_t n = w->n() / a.groups, k = w->k();
  const int64_t xs = a.x_stride ? a.x_stride : a.groups * k;
  const int64_t ys = a.y_stride ? a.y_stride : a.groups * n;
  if (xs < a.groups * k || ys < a.groups * n) {
    return absl::InvalidArgumentError(absl::StrCat("linear: row strides x ", xs, " / y ", ys, " below the ",
                                                   a.groups * k, " / ", a.groups * n, " elements of a row"));
  }
  if (a.x.data == nullptr || a.y == nullptr) return absl::InvalidArgumentError("linear: null x or y");
  LinearKernelFormat format = LinearKernelFormat::kF32;
  int64_t w_esize = 4;
  switch (w->format()) {
    case WeightFormat::kFp8Block128: format = LinearKernelFormat::kFp8, w_esize = 1; break;
    case WeightFormat::kBF16: format = LinearKernelFormat::kBf16, w_esize = 2; break;
    case WeightFormat::kF32: break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("linear: unsupported format ", WeightFormatName(w->format())));
  }
  const bool x_bf16 = a.x.dtype == DType::kBF16;
  const int64_t x_esize = x_bf16 ? 2 : 4;
  const bool vec = (k * w_esize) % 16 == 0 && (k * x_esize) % 16 == 0 && (xs * x_esize) % 16 == 0 &&
                   Aligned16(w->data()) && Aligned16(a.x.data);
  // The groups as entries of the multi-weight launch (its kernel or the wgmma one), without a heap allocation.
  std::array<FusedWeightRef, kFusedMaxWeights> group_refs{};
  const int entries = a.groups <= kFusedMaxWeights ? a.groups : 0;
  for (int g = 0; g < entries; ++g) {
    group_refs[g] = {.w = w, .row0 = g * n, .n = n, .x_col = g * k, .y = a.y + g * n, .y_stride = ys};
  }
  const std::span<const FusedWeightRef> refs(group_refs.data(), static_cast<size_t>(entries));
  LinearPlan pl;
  if (plan != nullptr) {
    pl = *plan;
  } else if (format != LinearKernelFormat::kF32) {
    // sm_90a from kWgmmaMinTokens where the weight suits it (AutoWgmmaPlan), else the mma.sync kernels' plan.
    std::optional<LinearPlan> wgmma;
    if (format == LinearKernelFormat::kFp8 && entries > 0) wgmma = AutoWgmmaPlan(refs, a.x, a.t, xs);
    pl = wgmma ? *wgmma : AutoLinearPlan(a.t, n, k, a.groups, CurrentDeviceSms(), format);
  }
  if ((pl.min_blocks > 0 || pl.kernel == LinearKernel::kWgmma) && format != LinearKernelFormat::kF32) {
    // The multi-weight kernel (linear_fused.cu) or the wgmma one (linear_wgmma.cu), one entry per group.
    if (entries == 0) {
      return absl::InvalidArgumentError(absl::StrCat("linear plan: ", LinearPlanName(pl), " takes at most ",
                                                     kFusedMaxWeights, " groups, got ", a.groups));
    }
    return LaunchFusedWeights(refs, a.x, a.t, xs, pl, stream);
  }
  if (format == LinearKernelFormat::kF32) {
    if (CeilDiv(a.t, 4) > 65535 || a.groups > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("linear: ", a.t, " tokens x ", a.groups, " groups is too large"));
    }
  } else {
    if (pl.kernel == LinearKernel::kSplitK && pl.stages > 0) {
      // The ring streams FP8 only, with cp.async of whole 16-byte units (vec), one block scale per 16-row tile
      // (groups == 1 or N % 16 == 0), and within this device's shared memory; otherwise the register ring.
      if (format != LinearKernelFormat::kFp8 || !vec || (a.groups > 1 && n % 16 != 0)) {
        pl.stages = 0;
      } else {
        while (pl.stages > 2 && internal::LinearSharedBytes(pl) > internal::LinearMaxSharedBytes()) --pl.stages;
        if (internal::LinearSharedBytes(pl) > internal::LinearMaxSharedBytes()) pl.stages = 0;
      }
    }
    DSV4_RETURN_IF_ERROR(CheckPlan(pl, a.t, n, k, a.groups));
  }
  const LinearParams p{.format = format, .w = w->data(), .scale = w->scale(), .scale_cols = CeilDiv(k, kBlock),
                       .x = a.x.data, .x_bf16 = x_bf16, .y = a.y, .t = a.t, .n = n, .k = k, .groups = a.groups,
                       .x_stride = xs, .y_stride = ys, .vec = vec, .plan = pl};
  return CudaStatus(internal::LaunchLinearKernel(p, stream), "linear launch");
}

absl::Status LaunchLinear(const LinearArgs& a, cudaStream_t stream) { return LaunchLinearWithPlan(a, nullptr, stream); }

}  // namespace dsv4::kernels::cuda
