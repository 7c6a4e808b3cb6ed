// dsv4-bench statistics: per-request records and the summary sglang.bench_serving reports (request
// throughput, input/output tokens per second, TTFT, TPOT, ITL and end-to-end latency mean/p50/p90/p99).
// Definitions: TTFT = first token's arrival - send time; TPOT = (e2e - TTFT) / (output tokens - 1) per
// request with >1 token; ITL = gap between consecutive chunks (a chunk of k tokens after gap g counts as k
// gaps of g/k); percentiles interpolate linearly between order statistics (numpy's default).
#pragma once

#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace dsv4::bench {

struct RequestRecord {
  bool ok = false;
  std::string error = "";   // status message when !ok
  int prompt_len = 0;
  int output_len = 0;       // tokens received
  double ttft_s = 0;
  double e2e_s = 0;
  std::vector<double> itl_s = {};
};

struct Distribution {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;  // milliseconds
};

struct Summary {
  std::string label;        // e.g. "concurrency=4"
  int concurrency = 0;
  double request_rate = 0;  // requested; 0 = as fast as concurrency allows
  int completed = 0;
  int failed = 0;
  double duration_s = 0;
  double request_throughput = 0;  // completed requests / s
  double input_tok_s = 0;
  double output_tok_s = 0;
  long total_input_tokens = 0, total_output_tokens = 0;
  Distribution ttft_ms, tpot_ms, itl_ms, e2e_ms;
  std::string first_error;
};

double Percentile(std::vector<double> values, double p);  // p in [0, 100]; 0 for an empty input
Distribution Describe(const std::vector<double>& seconds);
Summary Summarize(const std::vector<RequestRecord>& records, double duration_s);
std::string FormatTable(const std::vector<Summary>& rows);
nlohmann::json ToJson(const Summary& s);

}  // namespace dsv4::bench
