#include "worker/stall_watch.h"

#include <utility>

namespace dsv4::worker {

StallWatch::StallWatch(std::function<double()> seconds_since_progress, absl::Duration timeout,
                       std::function<void(double)> on_stall, absl::Duration period)
    : seconds_since_progress_(std::move(seconds_since_progress)),
      timeout_(timeout),
      period_(period),
      on_stall_(std::move(on_stall)) {
  thread_ = std::thread([this] { Loop(); });
}

StallWatch::~StallWatch() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void StallWatch::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), period_)) return;
    }
    const double stalled_s = seconds_since_progress_();
    if (absl::Seconds(stalled_s) >= timeout_) {
      on_stall_(stalled_s);
      return;  // once: the process is on its way out
    }
  }
}

}  // namespace dsv4::worker
