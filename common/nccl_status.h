// NCCL results as absl::Status, beside common/cuda_status.h: the one helper comm/'s NCCL communicator uses.
// An NCCL failure means a peer, the network or the group is gone, so it maps to kUnavailable (the worker then
// reports NOT_SERVING and the coordinator fails requests over); header-only, for targets that link NCCL.
#pragma once

#include <nccl.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dsv4 {

inline absl::Status NcclStatus(ncclResult_t r, std::string_view what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(std::string(what), ": ", ncclGetErrorString(r)));
}

}  // namespace dsv4
