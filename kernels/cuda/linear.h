// The CUDA backend's prepared linear weight: the checkpoint's bytes in device memory (FP8 block-128 with its
// scales turned into f32 once, BF16, F32), read by the linear kernels (linear.cu) and dequantised only in
// registers. Made by PrepareCudaLinear (launchers.h); LaunchLinear takes any LinearWeight and refuses the ones
// another backend prepared. Also the linear's plans (which kernel and work split a shape gets) for benchmarks.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/linear_params.h"
#include "kernels/ops.h"
#include "kernels/weights.h"

namespace dsv4::kernels::cuda {

class CudaLinearWeight final : public LinearWeight {
 public:
  CudaLinearWeight(int64_t n, int64_t k, WeightFormat format, Buffer data, Buffer scale)
      : LinearWeight(n, k, format, data.bytes() + scale.bytes()), data_(std::move(data)), scale_(std::move(scale)) {}

  // [N, Kin]: e4m3 bytes (kFp8Block128), bf16 bits (kBF16) or f32 (kF32).
  const void* data() const { return data_.data(); }
  // kFp8Block128: [ceil(N/128), ceil(Kin/128)] f32 block scales; null otherwise.
  const float* scale() const { return scale_.as<const float>(); }

 private:
  Buffer data_;
  Buffer scale_;
};

// Plans of the tensor-core kernels for T tokens of a [groups * n, k] weight on `sms` SMs (linear_params.h).
// AutoLinearPlan is what LaunchLinear runs (the per-shape kernel choice, from measurements: linear.cc; a plan with
// min_blocks > 0 runs on the multi-weight kernel); the others let dsv4-gemm-bench time alternatives in the same run.
LinearPlan AutoLinearPlan(int64_t t, int64_t n, int64_t k, int groups, int sms, LinearKernelFormat format);
// kSplitK with m_tiles (1, 2; 0: chosen) and splits = cluster * warps_k (a power of two <= 64; 0: chosen);
// nullopt above kSplitMaxTokens or when the x slice cannot fit shared memory.
std::optional<LinearPlan> PlanSplitKLinear(int64_t t, int64_t n, int64_t k, int groups, int sms, int m_tiles = 0,
                                           int splits = 0);
LinearPlan PlanTiledLinear(int64_t t, int64_t n, int64_t k, int groups, int sms);
// The FP8 weight-ring plan (kSplitK, stages > 0, linear_ring.cu) with splits = cluster * warps_k (a power of two
// <= 32; 0: chosen) and stages (2..kMaxStages; 0: chosen for the H200's shared memory); nullopt above
// kSplitMaxTokens or where it cannot fit. LaunchLinear runs such a plan with the register ring where the ring
// cannot (not FP8, unaligned rows, a 16-row tile across two scale blocks, less shared memory).
std::optional<LinearPlan> PlanRingLinear(int64_t t, int64_t n, int64_t k, int groups, int sms, int splits = 0,
                                         int stages = 0);
// The multi-weight split-K kernel (linear_fused.cu): the plan for T tokens of weights with `rows` rows each and the
// same Kin (1..kFusedMaxWeights weights; min_blocks kFusedMinBlocks or kFusedLeanBlocks; splits = cluster * warps_k,
// a power of two <= 64, 0: chosen; bit_dequant: the FP8 bit-move dequantisation); nullopt where it has no build
// (T > kSplitMaxTokens, the lean build above 8 tokens) or the x slice cannot fit. Token tiles of 8, 16, 32 tokens
// a warp up to 8, 16, 32 tokens; above, 64 where K >= 4096 and the 64-row x slice fits (else 32).
std::optional<LinearPlan> PlanFusedLinear(int64_t t, std::span<const int64_t> rows, int64_t k, int sms,
                                          int min_blocks = kFusedMinBlocks, int splits = 0, bool bit_dequant = false);
// The plan FusedLinear launches without one: the lean build up to 8 tokens where it plans, the default build
// otherwise (nullopt where neither does).
std::optional<LinearPlan> AutoFusedLinearPlan(int64_t t, std::span<const int64_t> rows, int64_t k, int sms);
// InvalidArgument unless `plan` is a multi-weight plan within that kernel's limits for these sizes.
absl::Status CheckFusedPlan(const LinearPlan& plan, int64_t t, int64_t k, std::span<const int64_t> rows);
// One weight of a multi-weight launch: rows [row0, row0 + n) of w (a group of a grouped weight, or all of it), read
// against x columns [x_col, x_col + Kin), into y [T, y_stride] columns [0, n).
struct FusedWeightRef {
  const CudaLinearWeight* w = nullptr;
  int64_t row0 = 0, n = 0, x_col = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
};
// The one place that decides whether a launch takes the wgmma kernel: its plan when LinearWgmmaEnabled(), T >=
// kWgmmaMinTokens and every ref suits it (FP8, 64-row aligned first row, 16-byte aligned x rows and columns);
// nullopt otherwise (the caller's automatic mma.sync plan then runs).
std::optional<LinearPlan> AutoWgmmaPlan(std::span<const FusedWeightRef> refs, const ActView& x, int64_t t,
                                        int64_t x_stride);
// Launches the multi-weight kernel (or, for a kWgmma plan, the wgmma kernel) with `plan` (checked first) over
// `refs` (FP8 or BF16, one Kin; kWgmma: FP8 only).
absl::Status LaunchFusedWeights(std::span<const FusedWeightRef> refs, const ActView& x, int64_t t, int64_t x_stride,
                                const LinearPlan& plan, cudaStream_t stream);
// The ops' FusedLinear with `plan` instead of the automatic choice (null: LaunchFusedLinear's: AutoFusedLinearPlan's
// build for 2+ FP8/BF16 weights up to kSplitMaxTokens tokens, one LaunchLinear each otherwise).
absl::Status LaunchFusedLinearWithPlan(const FusedLinearArgs& a, const LinearPlan* plan, cudaStream_t stream);
// The wgmma FP8 kernel (sm_90a, linear_wgmma.cu): LaunchLinear and LaunchFusedLinear take it on their own from
// kWgmmaMinTokens tokens when LinearWgmmaEnabled() (a 90a build on a compute capability 9.0 device, and
// DSV4_LINEAR_WGMMA not 0) and every weight suits it (FP8, Kin a multiple of 128 and <= 8192, 16-byte aligned rows,
// groups starting on 64-row boundaries). PlanWgmmaLinear sizes its K split for T tokens of weights with `rows` rows
// (nullopt where it has no plan); CheckWgmmaPlan refuses a plan outside its limits.
inline constexpr int64_t kWgmmaMinTokens = 33;
// Whether this build has the kernel and the current device is compute capability 9.0 (where it may run at all).
bool LinearWgmmaRunsHere();
bool LinearWgmmaEnabled();
// Tests: 1 / 0 force the automatic choice of the wgmma kernel on (where built) / off, -1 returns it to the device
// and the environment.
void SetLinearWgmmaForTesting(int enabled);
// Tokens a block of PlanWgmmaLinear's plan takes at T tokens: 16 up to 16 tokens, 64 above.
int WgmmaTileTokens(int64_t t);
// max_clusters[i]: clusters of 2^i of the kernel's blocks the device holds at once (empty: sms / 2^i).
std::optional<LinearPlan> PlanWgmmaLinear(int64_t t, std::span<const int64_t> rows, int64_t k, int sms,
                                          std::span<const int> max_clusters = {});
absl::Status CheckWgmmaPlan(const LinearPlan& plan, int64_t t, int64_t k, std::span<const int64_t> rows);
// PlanWgmmaLinear for the current device (its SMs and how many clusters of each size it holds at once): the plan
// AutoWgmmaPlan runs.
std::optional<LinearPlan> DeviceWgmmaPlan(int64_t t, std::span<const int64_t> rows, int64_t k);
// "splitk m1 n1 w8x1 c2 ks512 st4", "wgmma n64 c4 ks1024 rt2", "tiled m2 n1 w8x1", "splitk m1 n1 w8x1 c4 ks1024 mb4 bits".
std::string LinearPlanName(const LinearPlan& plan);
// LaunchLinear with `plan` instead of the automatic one (null: automatic); the plan is checked against its
// limits first (InvalidArgument). F32 weights ignore it.
absl::Status LaunchLinearWithPlan(const LinearArgs& a, const LinearPlan* plan, cudaStream_t stream);

}  // namespace dsv4::kernels::cuda
