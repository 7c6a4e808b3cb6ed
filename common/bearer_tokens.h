// Bearer-token authentication of the gateway API (docs/security.md): a client sends the request metadata
// "authorization: Bearer <token>" (what gRPC's AccessTokenCredentials sends), and the token must be one of the
// lines of the token file. The check runs at the top of each RPC handler that needs it; health checking and
// server reflection do not (Kubernetes probes carry no token).
//
// The file: one token per line, surrounding whitespace trimmed, blank lines and lines starting with '#' skipped;
// a token is at least 16 printable characters without spaces. It is read once at start-up (no reload).
// Only SHA-256 digests of the tokens are kept, compared in constant time, and no message or log line ever
// contains a token (what was wrong is said instead: missing, not Bearer, not a known token).
//
// Thread-safe: immutable after Load; Check may run on any number of gRPC threads at once.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/support/status.h"
#include "grpcpp/support/string_ref.h"

namespace dsv4 {

class BearerTokens {
 public:
  // Reads and parses the token file named by `flag` (e.g. "--auth-token-file"); errors name the flag, the file
  // and the line number, never the line.
  static absl::StatusOr<BearerTokens> Load(const std::string& flag, const std::string& path);
  // The same from text (tests); `source` names it in errors.
  static absl::StatusOr<BearerTokens> Parse(absl::string_view text, const std::string& source);

  // OK when the metadata carries exactly one "authorization: Bearer <known token>"; UNAUTHENTICATED saying
  // what was wrong otherwise.
  grpc::Status Check(const std::multimap<grpc::string_ref, grpc::string_ref>& client_metadata) const;

  size_t size() const { return digests_.size(); }

 private:
  using Digest = std::array<uint8_t, 32>;
  static Digest Sha256(absl::string_view s);
  bool Known(absl::string_view token) const;

  std::vector<Digest> digests_;
};

}  // namespace dsv4
