// The CUDA backend's internal contract between op families: one launcher per op family, each in its own .cu
// (with a plain Params struct beside it), all enqueued on the backend's stream. CudaOps (cuda_ops.cc) forwards
// the Ops calls here; families call each other only through these declarations (the MoE's shared expert uses
// LaunchLinear). Scratch comes from CudaScratch, sized by Backend::Reserve before any capture.
//
// A launcher validates what it can on the host (sizes, formats) and returns an error instead of launching;
// a launch failure is returned too. CudaOps keeps the first error for Backend::Synchronize.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "kernels/sparse_mla/sparse_mla_launch.h"

namespace dsv4::kernels::cuda {

// The attention family's host-side launch plans (attention.cu; opaque elsewhere).
struct AttentionPlan;

// Device scratch of one op family, carved from one allocation at Reserve time.
struct CudaScratch {
  void* data = nullptr;
  int64_t bytes = 0;
  // LaunchAttention only: the plans MakeAttentionPlan made at Reserve (kFp8Row584 attention fails without).
  const AttentionPlan* attention_plan = nullptr;
};

// Bytes of scratch each family needs for steps up to `limits`.
int64_t MoeScratchBytes(const StepLimits& limits);
int64_t AttentionScratchBytes(const StepLimits& limits);
int64_t IndexerScratchBytes(const StepLimits& limits);

// dense.cu, linear.cu, hc.cu (the dense family)
absl::Status LaunchEmbed(const EmbedArgs& a, cudaStream_t stream);
absl::Status LaunchLinear(const LinearArgs& a, cudaStream_t stream);
// linear_fused.cc: the weights in one multi-weight launch (linear_fused.cu) up to kSplitMaxTokens tokens when all
// are FP8 or BF16, else one LaunchLinear each.
absl::Status LaunchFusedLinear(const FusedLinearArgs& a, cudaStream_t stream);
absl::Status LaunchRmsNorm(const RmsNormArgs& a, cudaStream_t stream);
absl::Status LaunchRope(const RopeArgs& a, cudaStream_t stream);
// RmsNorm then Rope in one kernel where the rope rotates the normed rows (ops.h NormRopeArgs); else both ops.
absl::Status LaunchNormRope(const NormRopeArgs& a, cudaStream_t stream);
absl::Status LaunchHcPre(const HcPreArgs& a, cudaStream_t stream);
// HcPre then RmsNorm of u, the norm inside HcPre's finish kernel where it normalises u in place (ops.h
// HcPreNormArgs); else both ops.
absl::Status LaunchHcPreNorm(const HcPreNormArgs& a, cudaStream_t stream);
absl::Status LaunchHcPost(const HcPostArgs& a, cudaStream_t stream);
absl::Status LaunchHcHead(const HcHeadArgs& a, cudaStream_t stream);
absl::Status LaunchScale(const ScaleArgs& a, cudaStream_t stream);
absl::Status LaunchHadamardFp4(const HadamardFp4Args& a, cudaStream_t stream);
absl::Status LaunchFill(const FillArgs& a, cudaStream_t stream);
// Prepared weights of the dense family (linear.cu): FP8 block-128, BF16, F32 (and NVFP4/MXFP4 for tests).
absl::StatusOr<LinearHandle> PrepareCudaLinear(const WeightView& w, Backend& backend);

// kv_window.cu, compressor.cu, indexer.cu, attention.cu (the attention family)
absl::Status LaunchKvWindowWrite(const KvWindowWriteArgs& a, cudaStream_t stream);
absl::Status LaunchCompressor(const CompressorArgs& a, cudaStream_t stream);
absl::Status LaunchIndexer(const IndexerArgs& a, const CudaScratch& scratch, cudaStream_t stream);
absl::Status LaunchAttention(const AttentionArgs& a, const CudaScratch& scratch, cudaStream_t stream);
// The sparse-MLA plans of LaunchAttention's FP8 path for steps up to `limits`, with `kernel` (the backend's
// --attention-kernel choice): made at Reserve, before any capture; keep it while launches use it.
absl::StatusOr<std::shared_ptr<const AttentionPlan>> MakeAttentionPlan(const StepLimits& limits,
                                                                       sparse_mla::SparseMlaKernel kernel);

// moe.cu, moe_router.cu (the MoE family)
absl::StatusOr<ExpertsHandle> PrepareCudaExperts(std::span<const WeightView> w1, std::span<const WeightView> w3,
                                                 std::span<const WeightView> w2, Backend& backend);
absl::Status LaunchMoe(const MoeArgs& a, const CudaScratch& scratch, cudaStream_t stream);

// sample.cu (sampling; no scratch: a block per row in shared memory)
absl::Status LaunchSample(const SampleArgs& a, cudaStream_t stream);

}  // namespace dsv4::kernels::cuda
