// See request_validation.h. Messages follow one pattern: "<field> <value> <what is wrong> (<limit>)".
#include "proto/request_validation.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dsv4 {
namespace {

absl::Status Invalid(auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); }

absl::Status ValidatePrompt(const dsv4::v1::GenerateRequest& r, const RequestLimits& limits) {
  const int n = r.prompt_token_ids_size();
  if (n == 0) return Invalid("prompt_token_ids is empty (need at least 1 token)");
  for (int i = 0; i < n; ++i) {
    const int32_t t = r.prompt_token_ids(i);
    if (t < 0 || t >= limits.vocab_size) {
      return Invalid("prompt_token_ids[", i, "] = ", t, " is outside the vocabulary [0, ", limits.vocab_size, ")");
    }
  }
  if (r.resume_generated() < 0 || r.resume_generated() >= n) {
    return Invalid("resume_generated = ", r.resume_generated(), " must lie in [0, ", n,
                   ") (len(prompt_token_ids) = ", n, ")");
  }
  return absl::OkStatus();
}

absl::Status ValidateSampling(const dsv4::v1::SamplingParams& s, const RequestLimits& limits) {
  if (!std::isfinite(s.temperature()) || s.temperature() < 0.0f) {
    return Invalid("sampling.temperature = ", s.temperature(), " must be finite and >= 0 (0 = greedy)");
  }
  if (s.top_k() < 0) return Invalid("sampling.top_k = ", s.top_k(), " must be >= 0 (0 = off)");
  if (!(s.top_p() >= 0.0f && s.top_p() <= 1.0f)) {  // NaN fails both comparisons
    return Invalid("sampling.top_p = ", s.top_p(), " must lie in (0, 1] (0 = unset = 1)");
  }
  if (!(s.min_p() >= 0.0f && s.min_p() <= 1.0f)) {
    return Invalid("sampling.min_p = ", s.min_p(), " must lie in [0, 1] (0 = off)");
  }
  if (s.top_logprobs() < 0 || s.top_logprobs() > 20) {
    return Invalid("sampling.top_logprobs = ", s.top_logprobs(), " must lie in [0, 20]");
  }
  if (s.top_logprobs() > 0 && !s.logprobs()) {
    return Invalid("sampling.top_logprobs = ", s.top_logprobs(), " needs sampling.logprobs = true");
  }
  if (s.stop_token_ids_size() > limits.max_stop_tokens) {
    return Invalid("sampling.stop_token_ids has ", s.stop_token_ids_size(), " entries (limit ",
                   limits.max_stop_tokens, ")");
  }
  for (int i = 0; i < s.stop_token_ids_size(); ++i) {
    const int32_t t = s.stop_token_ids(i);
    if (t < 0 || t >= limits.vocab_size) {
      return Invalid("sampling.stop_token_ids[", i, "] = ", t, " is outside the vocabulary [0, ",
                     limits.vocab_size, ")");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateGenerateRequest(const dsv4::v1::GenerateRequest& r, const RequestLimits& limits) {
  if (static_cast<int64_t>(r.request_id().size()) > limits.max_request_id_bytes) {
    return Invalid("request_id is ", r.request_id().size(), " bytes (limit ", limits.max_request_id_bytes, ")");
  }
  if (!r.has_sampling()) return Invalid("sampling is missing (sampling.max_new_tokens is required, >= 1)");
  const auto& s = r.sampling();
  if (s.max_new_tokens() < 1) {
    return Invalid("sampling.max_new_tokens = ", s.max_new_tokens(), " must be >= 1");
  }
  if (s.max_new_tokens() > limits.max_context) {
    return Invalid("sampling.max_new_tokens = ", s.max_new_tokens(), " exceeds max context ", limits.max_context);
  }
  DSV4_RETURN_IF_ERROR(ValidatePrompt(r, limits));
  if (r.resume_generated() >= s.max_new_tokens()) {
    return Invalid("resume_generated = ", r.resume_generated(), " must be < sampling.max_new_tokens = ",
                   s.max_new_tokens());
  }
  // Positions used = original prompt + every generated token (resumed ones included).
  const int64_t original_prompt = r.prompt_token_ids_size() - r.resume_generated();
  const int64_t total = original_prompt + s.max_new_tokens();
  if (total > limits.max_context) {
    return Invalid("prompt length ", original_prompt, " + sampling.max_new_tokens ", s.max_new_tokens(), " = ",
                   total, " exceeds max context ", limits.max_context);
  }
  return ValidateSampling(s, limits);
}

}  // namespace dsv4
