// Fuzz target: the bytes of a GenerateRequest as they arrive on the wire, parsed as gRPC parses them, then
// ValidateGenerateRequest under three sets of server limits (the tiny test model, V4-Flash, and the largest int
// limits). An accepted request must satisfy every rule request_validation.h promises, since the engine and the
// coordinator index and size buffers by these fields without checking again; and the request the coordinator
// builds to resume it on another worker after k streamed tokens must be accepted too (failover relies on it).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "proto/request_validation.h"
#include "fuzz/fuzz_check.h"
#include "google/protobuf/stubs/logging.h"

namespace {

using dsv4::RequestLimits;
using dsv4::v1::GenerateRequest;

constexpr RequestLimits kLimits[] = {
    {.vocab_size = 512, .max_context = 256},
    {.vocab_size = 129280, .max_context = 1 << 20},
    {.vocab_size = std::numeric_limits<int>::max(), .max_context = std::numeric_limits<int>::max()},
};

void CheckAccepted(const GenerateRequest& r, const RequestLimits& l) {
  const auto& s = r.sampling();
  const int64_t n = r.prompt_token_ids_size();
  FUZZ_CHECK(static_cast<int64_t>(r.request_id().size()) <= l.max_request_id_bytes, "request_id too long");
  FUZZ_CHECK(r.has_sampling(), "no sampling");
  FUZZ_CHECK(n >= 1, "empty prompt");
  for (int32_t t : r.prompt_token_ids()) FUZZ_CHECK(t >= 0 && t < l.vocab_size, "prompt token %d", t);
  FUZZ_CHECK(r.resume_generated() >= 0 && r.resume_generated() < n, "resume_generated %d", r.resume_generated());
  FUZZ_CHECK(s.max_new_tokens() >= 1 && r.resume_generated() < s.max_new_tokens(), "max_new_tokens %d",
             s.max_new_tokens());
  FUZZ_CHECK(n - r.resume_generated() + s.max_new_tokens() <= l.max_context, "context overflow");
  FUZZ_CHECK(std::isfinite(s.temperature()) && s.temperature() >= 0, "temperature");
  FUZZ_CHECK(s.top_k() >= 0, "top_k");
  FUZZ_CHECK(s.top_p() >= 0 && s.top_p() <= 1, "top_p");
  FUZZ_CHECK(s.min_p() >= 0 && s.min_p() <= 1, "min_p");
  FUZZ_CHECK(s.stop_token_ids_size() <= l.max_stop_tokens, "stop_token_ids count");
  for (int32_t t : s.stop_token_ids()) FUZZ_CHECK(t >= 0 && t < l.vocab_size, "stop token %d", t);
}

// The coordinator's failover request (GenerateCall::UpstreamRequestLocked) after k more streamed tokens.
GenerateRequest Resumed(const GenerateRequest& r, int k) {
  GenerateRequest up = r;
  for (int i = 0; i < k; ++i) up.add_prompt_token_ids(0);
  up.set_resume_generated(r.resume_generated() + k);
  return up;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in request_id is logged on every parse otherwise
    return true;
  }();
  (void)quiet;
  GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (const RequestLimits& limits : kLimits) {
    const absl::Status s = dsv4::ValidateGenerateRequest(request, limits);
    if (!s.ok()) {
      FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument && !s.message().empty(), "bad refusal: %s",
                 s.ToString().c_str());
      continue;
    }
    CheckAccepted(request, limits);
    // Resume after one more token and after all but the last one (bounded: the prompt grows by k).
    const int left = request.sampling().max_new_tokens() - request.resume_generated() - 1;
    for (int k : {1, left}) {
      if (k < 1 || k > left || k > 4096) continue;
      const GenerateRequest up = Resumed(request, k);
      const absl::Status again = dsv4::ValidateGenerateRequest(up, limits);
      FUZZ_CHECK(again.ok(), "resume after %d tokens refused: %s", k, again.ToString().c_str());
    }
  }
  return 0;
}
