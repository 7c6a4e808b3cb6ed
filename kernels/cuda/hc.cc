// Host side of the mHC ops: argument checks and the split plan of the two-pass pre / head mixes (hc_params.h),
// then the kernels of hc.cu.
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/cuda_status.h"
#include "kernels/cuda/hc_params.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/env_flag.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/norm_row.cuh"

namespace dsv4::kernels::cuda {
namespace {

constexpr int64_t kSplitThreads = 256;  // hc.cu's split-pass block
constexpr int64_t kRowsPerBlock = 4;    // hc.cu's rows per split-pass block
constexpr int64_t kFinishThreads = 256; // hc.cu's finish block (the fused norm runs on NormThreads(d) of them)
constexpr int64_t kMaxGrid = (int64_t{1} << 31) - 1;

bool StreamsOk(int64_t s) { return s == 1 || s == 2 || s == 4; }

// Splits the S*D inputs so that about four blocks per SM run (a one-token decode step spreads the mix weights
// over 64 SMs; a prefill chunk has row groups enough and reads them once per 4 rows), within the D floats of an
// output row that hold the partials.
absl::StatusOr<HcMixParams> PlanMix(const char* op, HcMixParams mix) {
  const int64_t width = mix.s * mix.d;
  const int64_t max_splits = mix.d / (mix.mixes + 1);
  if (max_splits < 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": d=", mix.d, " is below the ", mix.mixes + 1,
                                                   " partial sums a row parks in its output"));
  }
  const int64_t row_blocks = (mix.r + kRowsPerBlock - 1) / kRowsPerBlock;
  if (row_blocks > 65535) return absl::InvalidArgumentError(absl::StrCat(op, ": too many rows ", mix.r));
  const int64_t want = std::max<int64_t>(1, 4 * int64_t{CurrentDeviceSms()} / row_blocks);
  const int64_t by_width = (width + kSplitThreads - 1) / kSplitThreads;
  int64_t splits = std::clamp<int64_t>(std::min(want, by_width), 1, max_splits);
  const int64_t slice = ((width + splits - 1) / splits + kSplitThreads - 1) / kSplitThreads * kSplitThreads;
  splits = (width + slice - 1) / slice;
  mix.splits = static_cast<int>(splits);
  mix.slice = slice;
  return mix;
}

// HcPre, with the sublayer's RMSNorm of u fused into the finish kernel where rms_threads > 0.
absl::Status LaunchHcPreWith(const HcPreArgs& a, const float* rms_w, float rms_eps, int rms_threads,
                             cudaStream_t stream) {
  if (a.t < 0 || !StreamsOk(a.s) || a.d < 1 || a.t > kMaxGrid) {
    return absl::InvalidArgumentError(absl::StrCat("hc_pre: bad sizes t=", a.t, " s=", a.s, " d=", a.d,
                                                   " (s must be 1, 2 or 4)"));
  }
  if (a.t == 0) return absl::OkStatus();
  if (a.x == nullptr || a.fn == nullptr || a.base == nullptr || a.scale == nullptr || a.u == nullptr ||
      a.post == nullptr || a.comb == nullptr) {
    return absl::InvalidArgumentError("hc_pre: null input or output");
  }
  absl::StatusOr<HcMixParams> mix = PlanMix(
      "hc_pre", HcMixParams{.x = a.x, .rows = nullptr, .fn = a.fn, .partial = a.u, .r = a.t, .s = a.s, .d = a.d,
                            .mixes = static_cast<int>((2 + a.s) * a.s)});
  if (!mix.ok()) return mix.status();
  const HcPreParams p{.mix = *mix, .base = a.base, .scale = a.scale, .u = a.u, .post = a.post, .comb = a.comb,
                      .sinkhorn_iters = a.sinkhorn_iters, .norm_eps = a.norm_eps, .hc_eps = a.hc_eps,
                      .rms_w = rms_w, .rms_eps = rms_eps, .rms_threads = rms_threads};
  return CudaStatus(internal::LaunchHcPreKernels(p, stream), "hc_pre launch");
}

}  // namespace

absl::Status LaunchHcPre(const HcPreArgs& a, cudaStream_t stream) {
  return LaunchHcPreWith(a, nullptr, 0.f, 0, stream);
}

absl::Status LaunchHcPreNorm(const HcPreNormArgs& a, cudaStream_t stream) {
  const HcPreArgs& pre = a.pre;
  const RmsNormArgs& n = a.norm;
  // DSV4_HC_NORM=0 runs the two ops everywhere (A/B from one binary; read once per process).
  static const bool enabled = EnvFlagOn("DSV4_HC_NORM");
  const bool fused = enabled && n.x == pre.u && n.out == pre.u && n.rows == pre.t && n.dim == pre.d && pre.d > 0 &&
                     static_cast<int64_t>(NormThreads(pre.d)) <= kFinishThreads;
  if (!fused) {
    DSV4_RETURN_IF_ERROR(LaunchHcPre(pre, stream));
    return LaunchRmsNorm(n, stream);
  }
  return LaunchHcPreWith(pre, n.w, n.eps, static_cast<int>(NormThreads(pre.d)), stream);
}

absl::Status LaunchHcHead(const HcHeadArgs& a, cudaStream_t stream) {
  if (a.r < 0 || !StreamsOk(a.s) || a.d < 1 || a.r > kMaxGrid) {
    return absl::InvalidArgumentError(absl::StrCat("hc_head: bad sizes r=", a.r, " s=", a.s, " d=", a.d,
                                                   " (s must be 1, 2 or 4)"));
  }
  if (a.r == 0) return absl::OkStatus();
  if (a.x == nullptr || a.rows == nullptr || a.fn == nullptr || a.base == nullptr || a.scale == nullptr ||
      a.h == nullptr) {
    return absl::InvalidArgumentError("hc_head: null input or output");
  }
  absl::StatusOr<HcMixParams> mix = PlanMix(
      "hc_head", HcMixParams{.x = a.x, .rows = a.rows, .fn = a.fn, .partial = a.h, .r = a.r, .s = a.s, .d = a.d,
                             .mixes = static_cast<int>(a.s)});
  if (!mix.ok()) return mix.status();
  const HcHeadParams p{.mix = *mix, .base = a.base, .scale = a.scale, .h = a.h, .norm_eps = a.norm_eps,
                       .hc_eps = a.hc_eps};
  return CudaStatus(internal::LaunchHcHeadKernels(p, stream), "hc_head launch");
}

absl::Status LaunchHcPost(const HcPostArgs& a, cudaStream_t stream) {
  if (a.t < 0 || !StreamsOk(a.s) || a.d < 0) {
    return absl::InvalidArgumentError(absl::StrCat("hc_post: bad sizes t=", a.t, " s=", a.s, " d=", a.d,
                                                   " (s must be 1, 2 or 4)"));
  }
  if (a.t == 0 || a.d == 0) return absl::OkStatus();
  if (a.x == nullptr || a.y == nullptr || a.post == nullptr || a.comb == nullptr || a.x_out == nullptr) {
    return absl::InvalidArgumentError("hc_post: null input or output");
  }
  if (a.x_out == a.x) return absl::InvalidArgumentError("hc_post: x_out must not alias x");
  const HcPostParams p{.x = a.x, .y = a.y, .post = a.post, .comb = a.comb, .x_out = a.x_out, .t = a.t, .s = a.s,
                       .d = a.d};
  return CudaStatus(internal::LaunchHcPostKernel(p, stream), "hc_post launch");
}

}  // namespace dsv4::kernels::cuda
