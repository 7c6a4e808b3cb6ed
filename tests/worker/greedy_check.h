// Greedy token streams of two runs that compute the same model with different batching (a GPU worker's padded
// batch against dsv4-generate alone, a tensor-parallel group against world 1): the GPU's rounding depends on the
// batch shape (GEMM split-K, summation order), so where the reference's two best tokens are nearly tied either may
// win, and from there the streams may part. SameGreedyTokens accepts exactly that and nothing else: at the first
// difference it asks dsv4-generate for the logits there (same prefix, --dump-logits) and requires the two tokens'
// logits to lie within `tie` of each other, relative to the row's largest |logit|. Used by the gpu-labelled
// process tests only (it starts dsv4-generate).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace dsv4::worker::testing {

// OK when `got` equals `want`, or when they first differ at a near tie (printed to stdout); otherwise an error
// naming the position, both tokens, their logits and both streams. generate_flags: e.g. {"--backend", "cuda"}.
absl::Status SameGreedyTokens(const std::string& checkpoint, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& got, const std::vector<int32_t>& want,
                              const std::vector<std::string>& generate_flags, const std::string& scratch_dir,
                              double tie = 2e-3);

}  // namespace dsv4::worker::testing
