// The output of dsv4-ops-bench: one markdown table per op family on stdout (a row is printed as soon as its case
// is measured, so a run cut short still shows what it measured) and a JSON file with every result and the run's
// metadata (device, copy bandwidth, options), rewritten after each family.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "bench/ops/runner.h"
#include "nlohmann/json.hpp"

namespace dsv4::bench {

class Report {
 public:
  // meta: device, copy bandwidth, options (written under "run" in the JSON file).
  Report(std::string json_path, nlohmann::json meta) : json_path_(std::move(json_path)), meta_(std::move(meta)) {}

  // Records a result and prints its row (with the family's table header when the family changes).
  void Add(const Result& r);
  // A free-form line (e.g. a comparison of two rows), printed under the current table once it is complete.
  void Note(const std::string& line);
  // Prints the notes not printed yet.
  void Flush();
  // Writes the JSON file (all results so far).
  absl::Status WriteJson() const;

  const std::vector<Result>& results() const { return results_; }
  int failures() const;

 private:
  std::string json_path_;
  nlohmann::json meta_;
  std::vector<Result> results_;
  std::vector<std::string> notes_, pending_;
  std::string family_;  // of the table being printed
};

}  // namespace dsv4::bench
