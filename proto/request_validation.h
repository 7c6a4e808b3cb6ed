// Validation of GenerateRequest at the edge of every process that accepts one (worker and coordinator).
// Each failure is INVALID_ARGUMENT with a message that names the field, its value and the limit, so a
// client can fix its request without reading server logs. Queue-full (RESOURCE_EXHAUSTED) and drain
// (UNAVAILABLE) are engine state, not request shape, and stay with the engine.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "dsv4/v1/generate.pb.h"

namespace dsv4 {

struct RequestLimits {
  int vocab_size = 0;           // token ids must lie in [0, vocab_size)
  int max_context = 0;          // prompt + generated tokens must fit in this many positions
  int max_stop_tokens = 64;     // stop_token_ids entries
  int max_request_id_bytes = 256;
};

// OK, or INVALID_ARGUMENT naming the first bad field. Rules (proto defaults in generate.proto):
//   prompt_token_ids non-empty, each in [0, vocab_size);
//   0 <= resume_generated < len(prompt_token_ids), resume_generated < max_new_tokens;
//   sampling.max_new_tokens >= 1 and (len(prompt) - resume_generated) + max_new_tokens <= max_context;
//   temperature finite and >= 0; top_k >= 0; top_p 0 (unset) or in (0, 1]; min_p in [0, 1];
//   stop_token_ids in [0, vocab_size), at most max_stop_tokens; request_id at most max_request_id_bytes.
absl::Status ValidateGenerateRequest(const dsv4::v1::GenerateRequest& request, const RequestLimits& limits);

}  // namespace dsv4
