// Host side of the CUDA linear: weight preparation (PrepareCudaLinear), argument checks, the work-split plan
// and the launch (LaunchLinear). Kernels: linear.cu; contract: linear_params.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
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

// Decode (few tokens, memory-bound) wants many warps streaming weights: smaller row tiles and K split over the
// warps of a block while the blocks alone would not fill the GPU twice over; prefill has tiles to spare.
LinearPlan PlanLinear(int64_t t, int64_t n, int64_t k, int groups, int sms) {
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

}  // namespace

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

absl::Status LaunchLinear(const LinearArgs& a, cudaStream_t stream) {
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
  const LinearPlan plan =
      format == LinearKernelFormat::kF32 ? LinearPlan{} : PlanLinear(a.t, n, k, a.groups, CurrentDeviceSms());
  const int64_t token_tiles = CeilDiv(a.t, format == LinearKernelFormat::kF32 ? 4 : 8 * plan.n_tiles);
  if (token_tiles > 65535 || a.groups > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("linear: ", a.t, " tokens x ", a.groups, " groups is too large"));
  }
  const LinearParams p{.format = format, .w = w->data(), .scale = w->scale(), .scale_cols = CeilDiv(k, kBlock),
                       .x = a.x.data, .x_bf16 = x_bf16, .y = a.y, .t = a.t, .n = n, .k = k, .groups = a.groups,
                       .x_stride = xs, .y_stride = ys, .vec = vec, .plan = plan};
  return CudaStatus(internal::LaunchLinearKernel(p, stream), "linear launch");
}

}  // namespace dsv4::kernels::cuda
