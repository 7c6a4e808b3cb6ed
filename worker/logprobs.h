// Log-probabilities of sampled tokens (GenerateResponse.logprobs): the natural-log softmax of the raw logits - the
// model's distribution before temperature, top-k/p and min-p - accumulated in double, and the most likely tokens.
#pragma once

#include <cstdint>
#include <span>

#include "dsv4/v1/generate.pb.h"

namespace dsv4::worker {

// `token`'s log-probability under `logits` and the `top` most likely tokens (descending; ties by smaller id).
dsv4::v1::TokenLogprob TokenLogprobOf(std::span<const float> logits, int32_t token, int top);

}  // namespace dsv4::worker
