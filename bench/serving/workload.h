// dsv4-bench workloads: what each benchmark request sends. Random prompts in the style of
// sglang.bench_serving's "random" dataset (lengths drawn uniformly from [len * range_ratio, len], token ids
// uniform over the vocabulary), or a JSON-lines file of token ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dsv4::bench {

struct BenchRequest {
  std::vector<int32_t> prompt;
  int output_len = 0;  // max_new_tokens (sent with ignore_eos, so every request produces exactly this many)
};

struct RandomWorkload {
  int num_prompts = 100;
  int input_len = 256;
  int output_len = 64;
  double range_ratio = 1.0;  // lengths uniform in [max(1, floor(len * ratio)), len]; 1 = fixed lengths
  int vocab_size = 0;
  uint64_t seed = 1;
};

absl::StatusOr<std::vector<BenchRequest>> MakeRandomWorkload(const RandomWorkload& w);

// One request per non-empty line: {"prompt_token_ids": [1, 2, ...], "output_len": 32}; output_len is
// optional (default_output_len). Token ids must lie in [0, vocab_size). Errors name the line.
absl::StatusOr<std::vector<BenchRequest>> LoadTokenFile(const std::string& path, int default_output_len,
                                                        int vocab_size);

}  // namespace dsv4::bench
