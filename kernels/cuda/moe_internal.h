// What the MoE family's files share (moe_prepare.cu, moe_router.cu, moe.cu, moe_routed.cc, moe_launch.cc) and
// what its test reaches below LaunchMoe (the layout checks, the router's counts in the scratch): the prepared
// experts, the scratch plan and the per-kernel launchers. Nothing here is for other families: they use
// launchers.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/moe_params.h"

namespace dsv4::kernels::cuda::moe {

// The routed experts of one layer on the device. Held experts are packed into slots 0..slots-1 of one
// allocation in ascending expert id; expert_slot maps an expert to its slot (-1: held by another rank).
class CudaExperts final : public ExpertWeights {
 public:
  CudaExperts(int64_t experts, int64_t inter, int64_t dim, Fp4Kind kind, std::vector<int32_t> host_slot,
              Buffer weights, Buffer tables);
  bool Holds(int64_t e) const override { return e >= 0 && e < experts() && host_slot_[e] >= 0; }

  Fp4Kind kind() const { return kind_; }
  const ExpertLayout& layout() const { return layout_; }
  int64_t held() const { return held_; }
  const uint8_t* weights() const { return weights_.as<const uint8_t>(); }
  const int32_t* expert_slot() const { return tables_.as<const int32_t>(); }    // [E]
  const float* expert_scale() const {                                             // [slots, 4]
    return reinterpret_cast<const float*>(tables_.as<const uint8_t>() + TableScaleOffset(experts()));
  }
  static int64_t TableScaleOffset(int64_t experts) { return (experts * 4 + 15) / 16 * 16; }

 private:
  Fp4Kind kind_;
  ExpertLayout layout_;
  std::vector<int32_t> host_slot_;
  int64_t held_ = 0;
  Buffer weights_;  // [slots, layout_.bytes]
  Buffer tables_;   // expert_slot [E] int32, then expert_scale [slots, 4] f32
};

// The MoE scratch, carved in this order from CudaScratch (offsets 256-byte aligned).
struct ScratchPlan {
  int64_t logits = 0, x_bf16 = 0, entry_expert = 0, entry_weight = 0, expert_count = 0, expert_offset = 0,
          expert_entries = 0, active = 0, num_active = 0, h = 0, out = 0, shared_g = 0, shared_v = 0;
  int64_t bytes = 0;
};
ScratchPlan MakeScratchPlan(int64_t t, int64_t experts, int64_t topk, int64_t dim, int64_t inter,
                            int64_t shared_inter);

// The plan's buffers inside one CudaScratch (shapes: moe_params.h).
struct ScratchPointers {
  float* logits = nullptr;            // [T, E]
  uint16_t* x_bf16 = nullptr;         // [T, D]
  int32_t* entry_expert = nullptr;    // [T, Ek]
  float* entry_weight = nullptr;      // [T, Ek]
  int32_t* expert_count = nullptr;    // [E]
  int32_t* expert_offset = nullptr;   // [E]
  int32_t* expert_entries = nullptr;  // [T * Ek]
  int32_t* active = nullptr;          // [E]
  int32_t* num_active = nullptr;      // [1]
  uint16_t* h = nullptr;              // [T * Ek, I]
  float* out = nullptr;               // [T * Ek, D]
  float* shared_g = nullptr;          // [T, Is]
  float* shared_v = nullptr;          // [T, Is]
};
// FailedPrecondition when the scratch is smaller than the plan (Reserve was sized for fewer tokens).
absl::StatusOr<ScratchPointers> CarveScratch(const CudaScratch& scratch, const ScratchPlan& plan);

// Router, routed experts and combine: y = (accumulate ? y : 0) + the routed sum (zeros for padding tokens).
// gate_rows: [E, D] bf16 bits, row-major. The caller has validated a's shapes against ex.
absl::Status LaunchRouted(const MoeArgs& a, const uint16_t* gate_rows, const CudaExperts& ex,
                          const ScratchPointers& s, bool accumulate, cudaStream_t stream);

// One kernel launch each (the router is two: logits, then selection and lists).
absl::Status LaunchMoeRoute(const MoeRouteParams& p, cudaStream_t stream);
absl::Status LaunchMoeExperts(const MoeExpertParams& p, cudaStream_t stream);  // up, then down

absl::Status LaunchMoeCombine(const MoeCombineParams& p, cudaStream_t stream);
absl::Status LaunchMoeSwiglu(const MoeSwigluParams& p, cudaStream_t stream);

}  // namespace dsv4::kernels::cuda::moe
