// Start-up progress: log lines with percent and GB/s while weights load, and the timings for the start-up gauges.
//
//   LoadProgress progress("weights", total_bytes);
//   for (...) { read a tensor; progress.Add(tensor_bytes); }   // logs at most every log_interval_s
//   progress.Finish();                                         // one final line; returns seconds
//
// Threads: Add may be called from several loader threads (the byte count is atomic, logging takes a mutex).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dsv4::metrics {

class LoadProgress {
 public:
  using Clock = std::chrono::steady_clock;
  // total_bytes may be 0 when unknown (lines then show bytes and GB/s, no percent).
  LoadProgress(std::string what, int64_t total_bytes, double log_interval_s = 5.0);

  void Add(int64_t bytes);
  // Logs the final line once and returns the elapsed seconds (later calls return the same value).
  double Finish();

  int64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  double elapsed_s() const;
  int lines_logged() const;  // progress lines so far, Finish's included (for tests)

  // "weights: 42.0% 12.3 GB of 29.3 GB, 4.10 GB/s, 3.0 s" (percent omitted when total is unknown).
  static std::string FormatLine(const std::string& what, int64_t bytes, int64_t total, double seconds);

 private:
  const std::string what_;
  const int64_t total_;
  const double interval_s_;
  const Clock::time_point start_;
  std::atomic<int64_t> bytes_{0};
  mutable absl::Mutex mu_;
  Clock::time_point last_log_ ABSL_GUARDED_BY(mu_);
  int lines_ ABSL_GUARDED_BY(mu_) = 0;
  double finished_s_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace dsv4::metrics
