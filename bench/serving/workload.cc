// See workload.h.
#include "bench/serving/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace dsv4::bench {

absl::StatusOr<std::vector<BenchRequest>> MakeRandomWorkload(const RandomWorkload& w) {
  if (w.num_prompts < 1) return absl::InvalidArgumentError(absl::StrCat("--num-prompts = ", w.num_prompts, " (need >= 1)"));
  if (w.input_len < 1) return absl::InvalidArgumentError(absl::StrCat("--random-input-len = ", w.input_len, " (need >= 1)"));
  if (w.output_len < 1) return absl::InvalidArgumentError(absl::StrCat("--random-output-len = ", w.output_len, " (need >= 1)"));
  if (!(w.range_ratio >= 0.0 && w.range_ratio <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("--random-range-ratio = ", w.range_ratio, " (need [0, 1])"));
  }
  if (w.vocab_size < 2) return absl::InvalidArgumentError(absl::StrCat("vocab size ", w.vocab_size, " (need >= 2)"));
  std::mt19937_64 rng(w.seed);
  auto length = [&](int len) {
    const int lo = std::max(1, static_cast<int>(std::floor(len * w.range_ratio)));
    return std::uniform_int_distribution<int>(lo, len)(rng);
  };
  std::uniform_int_distribution<int32_t> token(0, w.vocab_size - 1);
  std::vector<BenchRequest> out(w.num_prompts);
  for (BenchRequest& r : out) {
    r.prompt.resize(length(w.input_len));
    for (int32_t& t : r.prompt) t = token(rng);
    r.output_len = length(w.output_len);
  }
  return out;
}

absl::StatusOr<std::vector<BenchRequest>> LoadTokenFile(const std::string& path, int default_output_len,
                                                        int vocab_size) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open --dataset-path ", path));
  std::vector<BenchRequest> out;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", n, ": ");
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(where + "not a JSON object");
    if (!j.contains("prompt_token_ids") || !j["prompt_token_ids"].is_array() || j["prompt_token_ids"].empty()) {
      return absl::InvalidArgumentError(where + "needs a non-empty array prompt_token_ids");
    }
    BenchRequest r;
    for (const auto& t : j["prompt_token_ids"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(where, "token ", t.dump(), " is not an id in [0, ", vocab_size, ")"));
      }
      r.prompt.push_back(t.get<int32_t>());
    }
    r.output_len = default_output_len;
    if (j.contains("output_len")) {
      if (!j["output_len"].is_number_integer() || j["output_len"].get<int64_t>() < 1) {
        return absl::InvalidArgumentError(where + "output_len must be an integer >= 1");
      }
      r.output_len = j["output_len"].get<int>();
    }
    out.push_back(std::move(r));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no requests"));
  return out;
}

}  // namespace dsv4::bench
