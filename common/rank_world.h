// The one check of a (rank, world) pair, shared by the communicators (comm/) and the shard planner (model/).
#pragma once

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dsv4 {

inline absl::Status ValidateRankWorld(int rank, int world) {
  if (world < 1) return absl::InvalidArgumentError(absl::StrCat("world must be >= 1, got ", world));
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("rank must be in [0, ", world, "), got ", rank));
  }
  return absl::OkStatus();
}

}  // namespace dsv4
