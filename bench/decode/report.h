// dsv4-decode-bench's output: a markdown table on stdout (one row per (batch, context), printed as measured), a
// JSON file with the run and every point (every field of PointResult), and an SVG of step time against batch with
// the byte floor, one line per context (written directly: no plotting dependency).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/decode/decode_bench.h"
#include "nlohmann/json.hpp"

namespace dsv4::bench {

// The table's header and one row.
std::string TableHeader();
std::string TableRow(const PointResult& r, int layers);
// The phase names in model::Phase order ("attention", "moe", "dense", "comm", "other", "indexer").
const char* PhaseName(int phase);

nlohmann::json PointJson(const PointResult& r, int layers, int world);
nlohmann::json RunJson(const RunInfo& info, const DecodeBenchOptions& o);
absl::Status WriteJson(const std::string& path, const nlohmann::json& run, const std::vector<PointResult>& points,
                       int world);
// Step time (solid) and the floor (dashed) against batch, a line pair per context.
absl::Status WriteSvg(const std::string& path, const std::string& title, const std::vector<PointResult>& points);

}  // namespace dsv4::bench
