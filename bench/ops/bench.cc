// Bench helpers shared by the families: see bench.h.
#include "bench/ops/bench.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "bench/ops/synth.h"

namespace dsv4::bench {

int Bench::SetsFor(double bytes_per_set) const {
  if (runner.options().smoke || bytes_per_set <= 0) return 1;
  const double sets = std::ceil(rotate_bytes / bytes_per_set);
  return static_cast<int>(std::clamp<double>(sets, 1.0, std::max(1, max_sets)));
}

void Bench::Fail(const std::string& family, const std::string& op, const std::string& shape, const absl::Status& s) {
  report.Add(Result{.family = family, .op = op, .shape = shape, .error = s.ToString()});
}

absl::Status CheckFinite(kernels::Backend& backend, const float* p, int64_t n, const std::string& what) {
  absl::StatusOr<std::vector<float>> host = DownloadVector<float>(backend, p, n);
  if (!host.ok()) return host.status();
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite((*host)[static_cast<size_t>(i)])) {
      return absl::DataLossError(
          absl::StrCat(what, ": element ", i, " of ", n, " is ", (*host)[static_cast<size_t>(i)]));
    }
  }
  return absl::OkStatus();
}

void Poison(kernels::Backend& backend, float* p, int64_t n) {
  backend.ops().Fill({.x = p, .n = n, .value = std::numeric_limits<float>::quiet_NaN()});
}

}  // namespace dsv4::bench
