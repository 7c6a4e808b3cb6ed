// Markdown rows and the JSON file of dsv4-ops-bench: see report.h.
#include "bench/ops/report.h"

#include <cstdio>
#include <fstream>

#include "absl/strings/str_format.h"

namespace dsv4::bench {

void Report::Add(const Result& r) {
  if (r.family != family_) {
    Flush();
    family_ = r.family;
    std::printf("\n### %s\n\n", family_.c_str());
    std::printf("| op | shape | sets | rotated MB | median us | p10 - p90 us | MB moved | GB/s | %% of copy | note |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  }
  if (!r.error.empty() && r.median_us == 0) {
    std::printf("| %s | %s | - | - | - | - | - | - | - | FAILED: %s |\n", r.op.c_str(), r.shape.c_str(),
                r.error.c_str());
  } else {
    std::string note = r.note;
    if (!r.ok) note = "CHECK FAILED: " + r.error + (note.empty() ? "" : "; " + note);
    std::printf("| %s | %s | %d | %.0f | %.2f | %.2f - %.2f | %.2f | %.0f | %.1f%% | %s |\n", r.op.c_str(),
                r.shape.c_str(), r.sets, r.rotated_mb, r.median_us, r.p10_us, r.p90_us, r.bytes / 1e6, r.gbs,
                r.pct_copy, note.c_str());
  }
  std::fflush(stdout);
  results_.push_back(r);
}

void Report::Note(const std::string& line) {
  notes_.push_back(line);
  pending_.push_back(line);
}

void Report::Flush() {
  for (const std::string& line : pending_) std::printf("\n%s\n", line.c_str());
  pending_.clear();
  std::fflush(stdout);
}

int Report::failures() const {
  int n = 0;
  for (const Result& r : results_) n += r.ok ? 0 : 1;
  return n;
}

absl::Status Report::WriteJson() const {
  if (json_path_.empty()) return absl::OkStatus();
  nlohmann::json rows = nlohmann::json::array();
  for (const Result& r : results_) {
    rows.push_back({{"family", r.family},
                    {"op", r.op},
                    {"shape", r.shape},
                    {"params", r.params},
                    {"sets", r.sets},
                    {"rotated_mb", r.rotated_mb},
                    {"median_us", r.median_us},
                    {"p10_us", r.p10_us},
                    {"p90_us", r.p90_us},
                    {"bytes", r.bytes},
                    {"gb_per_s", r.gbs},
                    {"pct_of_copy", r.pct_copy},
                    {"ok", r.ok},
                    {"error", r.error},
                    {"note", r.note}});
  }
  const nlohmann::json doc = {{"run", meta_}, {"notes", notes_}, {"results", rows}};
  std::ofstream out(json_path_);
  if (!out) return absl::UnavailableError(absl::StrFormat("cannot write %s", json_path_));
  out << doc.dump(1) << "\n";
  if (!out) return absl::DataLossError(absl::StrFormat("writing %s failed", json_path_));
  return absl::OkStatus();
}

}  // namespace dsv4::bench
