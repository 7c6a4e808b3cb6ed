// Implementation of metrics/load_progress.h.
#include "metrics/load_progress.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace dsv4::metrics {

LoadProgress::LoadProgress(std::string what, int64_t total_bytes, double log_interval_s)
    : what_(std::move(what)), total_(total_bytes), interval_s_(log_interval_s), start_(Clock::now()) {
  absl::MutexLock lock(&mu_);
  last_log_ = start_;
}

double LoadProgress::elapsed_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

int LoadProgress::lines_logged() const {
  absl::MutexLock lock(&mu_);
  return lines_;
}

std::string LoadProgress::FormatLine(const std::string& what, int64_t bytes, int64_t total, double seconds) {
  const double gb = static_cast<double>(bytes) * 1e-9;
  const double gbps = seconds > 0 ? gb / seconds : 0.0;
  if (total > 0) {
    return absl::StrFormat("%s: %.1f%% %.1f GB of %.1f GB, %.2f GB/s, %.1f s", what,
                           100.0 * static_cast<double>(bytes) / static_cast<double>(total), gb,
                           static_cast<double>(total) * 1e-9, gbps, seconds);
  }
  return absl::StrFormat("%s: %.1f GB, %.2f GB/s, %.1f s", what, gb, gbps, seconds);
}

void LoadProgress::Add(int64_t bytes) {
  const int64_t now_bytes = bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  const Clock::time_point now = Clock::now();
  absl::MutexLock lock(&mu_);
  if (finished_s_ >= 0 || std::chrono::duration<double>(now - last_log_).count() < interval_s_) return;
  last_log_ = now;
  ++lines_;
  DSV4_LOG_INFO("{}", FormatLine(what_, now_bytes, total_, std::chrono::duration<double>(now - start_).count()));
}

double LoadProgress::Finish() {
  absl::MutexLock lock(&mu_);
  if (finished_s_ >= 0) return finished_s_;
  finished_s_ = elapsed_s();
  ++lines_;
  DSV4_LOG_INFO("{} done", FormatLine(what_, bytes(), total_, finished_s_));
  return finished_s_;
}

}  // namespace dsv4::metrics
