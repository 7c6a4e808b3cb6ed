// Listening ports that belong to one process only, for every dsv4 gRPC server (worker ranks, coordinator).
//
// gRPC turns SO_REUSEPORT on for its listening sockets by default, so a second server started on a port that
// another one already serves binds it as well, reports SERVING, and the kernel splits new connections between
// the two processes (issue 16: 6 of 20 new connections reached the newcomer). DisallowPortSharing turns it off
// (GRPC_ARG_ALLOW_REUSEPORT = 0), so the second bind fails; CheckListening turns that failure, or a bound port
// that is not the one asked for, into one error naming the flag and the port, and the process exits non-zero.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "grpcpp/server_builder.h"

namespace dsv4 {

// SO_REUSEPORT off for every port of the server `builder` builds.
void DisallowPortSharing(grpc::ServerBuilder& builder);

// After BuildAndStart: OK when the server started and owns the port `address` asked for (any port for port
// 0); otherwise UNAVAILABLE "<flag> <address>: cannot listen on port P: ...".
absl::Status CheckListening(absl::string_view flag, const std::string& address, bool started, int bound_port);

}  // namespace dsv4
