// Step plans on the wire: the leader serialises each dsv4.comm.StepPlan (comm/step_plan.proto) and broadcasts it
// over the group's control communicator; followers parse and validate it before touching their model.
//
// Cost: a decode step of B sequences carries B chunks of one token plus their block tables (4 bytes or less per
// page id, varint-packed), e.g. B = 64 at 8k context with 64-row pages is ~20 KB; see docs/tensor-parallel.md for
// the delta encoding that long contexts will want.
#pragma once

#include "absl/status/status.h"
#include "comm/communicator.h"
#include "comm/step_plan.pb.h"

namespace dsv4::comm {

inline constexpr int kPlanPools = 4;  // window, compressed4, compressed128, indexer (worker::Pool order)

// Structural checks a follower makes before applying a plan: an op is set, every chunk has tokens, a
// non-negative state slot and position, and exactly kPlanPools page lists; AllocateCache has kPlanPools sizes.
// InvalidArgument naming the chunk and field. (Range checks against the cache are the model's.)
absl::Status ValidateStepPlan(const StepPlan& plan);

// Root: serialises *plan and broadcasts it. Others: receive, parse and validate into *plan.
// Errors: the communicator's (UNAVAILABLE), or DataLoss/InvalidArgument for a plan that does not parse/validate.
absl::Status BroadcastStepPlan(Communicator& control, StepPlan* plan, int root = 0);

}  // namespace dsv4::comm
