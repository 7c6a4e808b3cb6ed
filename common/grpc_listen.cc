// See grpc_listen.h.
#include "common/grpc_listen.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"

namespace dsv4 {

void DisallowPortSharing(grpc::ServerBuilder& builder) { builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0); }

absl::Status CheckListening(absl::string_view flag, const std::string& address, bool started, int bound_port) {
  const size_t colon = address.rfind(':');
  int wanted = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &wanted)) wanted = -1;
  const std::string port = wanted >= 0 ? absl::StrCat(wanted) : std::string("?");
  if (!started || bound_port <= 0) {
    return absl::UnavailableError(absl::StrCat(
        flag, " ", address, ": cannot listen on port ", port,
        wanted > 0 ? " (already in use by another process, or not a local address)" : " (not a local address)"));
  }
  if (wanted > 0 && bound_port != wanted) {
    return absl::UnavailableError(
        absl::StrCat(flag, " ", address, ": asked for port ", wanted, " but the server bound port ", bound_port));
  }
  return absl::OkStatus();
}

}  // namespace dsv4
