// See bearer_tokens.h.
#include "common/bearer_tokens.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/tls_options.h"

namespace dsv4 {
namespace {

constexpr size_t kMinTokenLength = 16;  // guessable tokens are no protection
constexpr absl::string_view kScheme = "bearer ";

}  // namespace

BearerTokens::Digest BearerTokens::Sha256(absl::string_view s) {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d.data());
  return d;
}

absl::StatusOr<BearerTokens> BearerTokens::Load(const std::string& flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadSecretFile(flag, path);
  if (!text.ok()) return text.status();
  return Parse(*text, absl::StrCat(flag, " ", path));
}

absl::StatusOr<BearerTokens> BearerTokens::Parse(absl::string_view text, const std::string& source) {
  BearerTokens out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    for (char c : line) {
      if (c <= ' ' || c > '~') {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": line ", line_no, ": a token has only printable characters and no spaces"));
      }
    }
    if (line.size() < kMinTokenLength) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": line ", line_no, ": a token has at least ",
                                                     kMinTokenLength, " characters"));
    }
    out.digests_.push_back(Sha256(line));
  }
  if (out.digests_.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no token in the file"));
  return out;
}

bool BearerTokens::Known(absl::string_view token) const {
  const Digest d = Sha256(token);
  // Every digest is compared (no early exit) so the time taken says nothing about which token nearly matched.
  int matches = 0;
  for (const Digest& known : digests_) matches |= CRYPTO_memcmp(d.data(), known.data(), d.size()) == 0;
  return matches != 0;
}

grpc::Status BearerTokens::Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  const auto [begin, end] = metadata.equal_range("authorization");
  if (begin == end) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing request metadata 'authorization: Bearer <token>' (see docs/security.md)");
  }
  if (std::next(begin) != end) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "more than one 'authorization' metadata entry");
  }
  const absl::string_view value(begin->second.data(), begin->second.size());
  if (value.size() < kScheme.size() || !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the 'authorization' metadata is not 'Bearer <token>'");
  }
  if (!Known(absl::StripAsciiWhitespace(value.substr(kScheme.size())))) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the bearer token is not valid");
  }
  return grpc::Status::OK;
}

}  // namespace dsv4
