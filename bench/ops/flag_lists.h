// Comma-separated flag values of the benchmark programs ("--batches 1,8,32"): one parser for dsv4-ops-bench,
// dsv4-gemm-bench and dsv4-decode-bench, so every bench refuses a bad list with the same message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dsv4::bench {

// The positive integers of `text` (empty items skipped; an empty text gives an empty list). InvalidArgument
// "--<flag>: '<item>' is not a positive integer" on the first bad item.
absl::StatusOr<std::vector<int64_t>> ParsePositiveList(const std::string& flag, const std::string& text);

}  // namespace dsv4::bench
