// See stats.h.
#include "bench/serving/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_format.h"

namespace dsv4::bench {

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

Distribution Describe(const std::vector<double>& seconds) {
  Distribution d;
  if (seconds.empty()) return d;
  d.mean = 1000.0 * std::accumulate(seconds.begin(), seconds.end(), 0.0) / static_cast<double>(seconds.size());
  d.p50 = 1000.0 * Percentile(seconds, 50);
  d.p90 = 1000.0 * Percentile(seconds, 90);
  d.p99 = 1000.0 * Percentile(seconds, 99);
  return d;
}

Summary Summarize(const std::vector<RequestRecord>& records, double duration_s) {
  Summary s;
  s.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestRecord& r : records) {
    if (!r.ok) {
      ++s.failed;
      if (s.first_error.empty()) s.first_error = r.error;
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.prompt_len;
    s.total_output_tokens += r.output_len;
    ttft.push_back(r.ttft_s);
    e2e.push_back(r.e2e_s);
    if (r.output_len > 1) tpot.push_back((r.e2e_s - r.ttft_s) / (r.output_len - 1));
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
  }
  if (duration_s > 0) {
    s.request_throughput = s.completed / duration_s;
    s.input_tok_s = static_cast<double>(s.total_input_tokens) / duration_s;
    s.output_tok_s = static_cast<double>(s.total_output_tokens) / duration_s;
  }
  s.ttft_ms = Describe(ttft);
  s.tpot_ms = Describe(tpot);
  s.itl_ms = Describe(itl);
  s.e2e_ms = Describe(e2e);
  return s;
}

std::string FormatTable(const std::vector<Summary>& rows) {
  std::string out = absl::StrFormat(
      "%-16s %5s %4s %8s %8s %9s | %-26s | %-26s | %-26s | %9s\n", "run", "ok", "fail", "req/s", "in tok/s",
      "out tok/s", "TTFT ms mean/p50/p90/p99", "TPOT ms mean/p50/p90/p99", "ITL ms mean/p50/p90/p99", "e2e p50 ms");
  auto dist = [](const Distribution& d) {
    return absl::StrFormat("%6.1f/%6.1f/%6.1f/%6.1f", d.mean, d.p50, d.p90, d.p99);
  };
  for (const Summary& s : rows) {
    out += absl::StrFormat("%-16s %5d %4d %8.2f %8.1f %9.1f | %-26s | %-26s | %-26s | %9.1f\n", s.label,
                           s.completed, s.failed, s.request_throughput, s.input_tok_s, s.output_tok_s,
                           dist(s.ttft_ms), dist(s.tpot_ms), dist(s.itl_ms), s.e2e_ms.p50);
  }
  return out;
}

nlohmann::json ToJson(const Summary& s) {
  auto dist = [](const Distribution& d) {
    return nlohmann::json{{"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}};
  };
  nlohmann::json j{{"label", s.label},
                   {"concurrency", s.concurrency},
                   {"request_rate", s.request_rate},
                   {"completed", s.completed},
                   {"failed", s.failed},
                   {"duration_s", s.duration_s},
                   {"request_throughput", s.request_throughput},
                   {"input_tokens_per_s", s.input_tok_s},
                   {"output_tokens_per_s", s.output_tok_s},
                   {"total_input_tokens", s.total_input_tokens},
                   {"total_output_tokens", s.total_output_tokens},
                   {"ttft_ms", dist(s.ttft_ms)},
                   {"tpot_ms", dist(s.tpot_ms)},
                   {"itl_ms", dist(s.itl_ms)},
                   {"e2e_ms", dist(s.e2e_ms)}};
  if (!s.first_error.empty()) j["first_error"] = s.first_error;
  return j;
}

}  // namespace dsv4::bench
