// Step-plan validation and broadcast: see step_plan.h.
#include "comm/step_plan.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dsv4::comm {

absl::Status ValidateStepPlan(const StepPlan& plan) {
  switch (plan.op_case()) {
    case StepPlan::kForward: {
      if (plan.forward().chunks_size() == 0) return absl::InvalidArgumentError("step plan: forward with no chunks");
      for (int i = 0; i < plan.forward().chunks_size(); ++i) {
        const PlanChunk& c = plan.forward().chunks(i);
        const std::string who = absl::StrCat("step plan ", plan.seq(), " chunk ", i, ": ");
        if (c.tokens_size() == 0) return absl::InvalidArgumentError(who + "no tokens");
        if (c.state_slot() < 0) return absl::InvalidArgumentError(absl::StrCat(who, "state_slot ", c.state_slot()));
        if (c.start_pos() < 0) return absl::InvalidArgumentError(absl::StrCat(who, "start_pos ", c.start_pos()));
        if (c.pools_size() != kPlanPools) {
          return absl::InvalidArgumentError(absl::StrCat(who, c.pools_size(), " page lists, expected ", kPlanPools));
        }
      }
      return absl::OkStatus();
    }
    case StepPlan::kAllocateCache:
      if (plan.allocate_cache().pages_per_pool_size() != kPlanPools) {
        return absl::InvalidArgumentError(absl::StrCat("step plan ", plan.seq(), ": allocate_cache has ",
                                                       plan.allocate_cache().pages_per_pool_size(),
                                                       " pool sizes, expected ", kPlanPools));
      }
      return absl::OkStatus();
    case StepPlan::kCaptureGraphs:
      for (int32_t b : plan.capture_graphs().buckets()) {
        if (b < 1) return absl::InvalidArgumentError(absl::StrCat("step plan ", plan.seq(), ": graph bucket ", b));
      }
      return absl::OkStatus();
    case StepPlan::kResetState:
    case StepPlan::kHeartbeat:
    case StepPlan::kShutdown:
      return absl::OkStatus();
    case StepPlan::OP_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("step plan ", plan.seq(), ": no operation set"));
}

absl::Status BroadcastStepPlan(Communicator& control, StepPlan* plan, int root) {
  std::string bytes;
  if (control.rank() == root) {
    DSV4_RETURN_IF_ERROR(ValidateStepPlan(*plan));
    if (!plan->SerializeToString(&bytes)) return absl::InternalError("step plan: serialisation failed");
  }
  DSV4_RETURN_IF_ERROR(BroadcastBytes(control, &bytes, root));
  if (control.rank() == root) return absl::OkStatus();
  plan->Clear();
  if (!plan->ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("step plan: ", bytes.size(), " bytes from rank ", root, " do not parse"));
  }
  return ValidateStepPlan(*plan);
}

}  // namespace dsv4::comm
