// One mapping from absl::Status to grpc::Status (and back), used by every RPC handler.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace dsv4 {

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace dsv4
