// The routed half of the CUDA MoE: scratch carving, the router, the expert GEMMs and the combine, launched in
// order on one stream with host-fixed sizes (graph-capturable: no allocation, no sync, no host read of device
// data). LaunchMoe (moe_launch.cc) validates and adds the shared expert in front.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/moe_internal.h"

namespace dsv4::kernels::cuda {
namespace moe {

absl::StatusOr<ScratchPointers> CarveScratch(const CudaScratch& scratch, const ScratchPlan& plan) {
  if (scratch.bytes < plan.bytes || (plan.bytes > 0 && scratch.data == nullptr)) {
    return absl::FailedPreconditionError(absl::StrCat("MoE: the step needs ", plan.bytes,
                                                      " bytes of MoE scratch, Reserve gave ", scratch.bytes,
                                                      " (Reserve with max_tokens >= this step's T)"));
  }
  uint8_t* base = static_cast<uint8_t*>(scratch.data);
  return ScratchPointers{
      .logits = reinterpret_cast<float*>(base + plan.logits),
      .x_bf16 = reinterpret_cast<uint16_t*>(base + plan.x_bf16),
      .entry_expert = reinterpret_cast<int32_t*>(base + plan.entry_expert),
      .entry_weight = reinterpret_cast<float*>(base + plan.entry_weight),
      .expert_count = reinterpret_cast<int32_t*>(base + plan.expert_count),
      .expert_offset = reinterpret_cast<int32_t*>(base + plan.expert_offset),
      .expert_entries = reinterpret_cast<int32_t*>(base + plan.expert_entries),
      .active = reinterpret_cast<int32_t*>(base + plan.active),
      .num_active = reinterpret_cast<int32_t*>(base + plan.num_active),
      .h = reinterpret_cast<uint16_t*>(base + plan.h),
      .out = reinterpret_cast<float*>(base + plan.out),
      .shared_g = reinterpret_cast<float*>(base + plan.shared_g),
      .shared_v = reinterpret_cast<float*>(base + plan.shared_v),
  };
}

absl::Status LaunchRouted(const MoeArgs& a, const uint16_t* gate_rows, const CudaExperts& ex,
                          const ScratchPointers& s, bool accumulate, cudaStream_t stream) {
  const int64_t E = ex.experts(), D = ex.dim(), I = ex.inter();
  if (a.x == nullptr || a.pos == nullptr || a.y == nullptr) {
    return absl::InvalidArgumentError("MoE: x, pos and y are required");
  }
  if (a.t == 0) return absl::OkStatus();
  DSV4_RETURN_IF_ERROR(LaunchMoeRoute({.x = a.x,
                                       .gate = gate_rows,
                                       .bias = a.tid2eid != nullptr ? nullptr : a.bias,
                                       .tid2eid = a.tid2eid,
                                       .tokens = a.tokens,
                                       .pos = a.pos,
                                       .expert_slot = ex.expert_slot(),
                                       .t = a.t,
                                       .d = D,
                                       .experts = static_cast<int>(E),
                                       .topk = a.topk,
                                       .routed_scale = a.routed_scale,
                                       .logits = s.logits,
                                       .x_bf16 = s.x_bf16,
                                       .entry_expert = s.entry_expert,
                                       .entry_weight = s.entry_weight,
                                       .expert_count = s.expert_count,
                                       .expert_offset = s.expert_offset,
                                       .expert_entries = s.expert_entries,
                                       .active = s.active,
                                       .num_active = s.num_active},
                                      stream));
  DSV4_RETURN_IF_ERROR(LaunchMoeExperts({.weights = ex.weights(),
                                         .expert_scale = ex.expert_scale(),
                                         .layout = ex.layout(),
                                         .kind = ex.kind(),
                                         .expert_slot = ex.expert_slot(),
                                         .expert_count = s.expert_count,
                                         .expert_offset = s.expert_offset,
                                         .expert_entries = s.expert_entries,
                                         .active = s.active,
                                         .num_active = s.num_active,
                                         .x_bf16 = s.x_bf16,
                                         .entry_weight = s.entry_weight,
                                         .h = s.h,
                                         .out = s.out,
                                         .d = D,
                                         .inter = I,
                                         .topk = a.topk,
                                         .max_active = static_cast<int>(std::min<int64_t>(ex.held(), a.t * a.topk)),
                                         .swiglu_limit = a.swiglu_limit},
                                        stream));
  return LaunchMoeCombine({.y = a.y,
                           .out = s.out,
                           .entry_expert = s.entry_expert,
                           .pos = a.pos,
                           .t = a.t,
                           .d = D,
                           .topk = a.topk,
                           .accumulate = accumulate},
                          stream);
}

}  // namespace moe

int64_t MoeScratchBytes(const StepLimits& limits) {
  if (limits.experts <= 0 || limits.experts_per_token <= 0) return 0;
  return moe::MakeScratchPlan(limits.max_tokens, limits.experts, limits.experts_per_token, limits.hidden,
                              limits.moe_inter, limits.shared_inter)
      .bytes;
}

}  // namespace dsv4::kernels::cuda
