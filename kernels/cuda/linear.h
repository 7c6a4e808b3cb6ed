// The CUDA backend's prepared linear weight: the checkpoint's bytes in device memory (FP8 block-128 with its
// scales turned into f32 once, BF16, F32), read by the linear kernels (linear.cu) and dequantised only in
// registers. Made by PrepareCudaLinear (launchers.h); LaunchLinear takes any LinearWeight and refuses the ones
// another backend prepared. Also the linear's plans (which kernel and work split a shape gets) for benchmarks.
#pragma once

#include <cstdint>
#include <optional>
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
// AutoLinearPlan is what LaunchLinear runs (the per-shape kernel choice, from measurements: linear.cc); the
// others let dsv4-gemm-bench time alternatives in the same run.
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
// "splitk m1 n1 w8x1 c2 ks512 st4", "tiled m2 n1 w8x1".
std::string LinearPlanName(const LinearPlan& plan);
// LaunchLinear with `plan` instead of the automatic one (null: automatic); the plan is checked against its
// limits first (InvalidArgument). F32 weights ignore it.
absl::Status LaunchLinearWithPlan(const LinearArgs& a, const LinearPlan* plan, cudaStream_t stream);

}  // namespace dsv4::kernels::cuda
