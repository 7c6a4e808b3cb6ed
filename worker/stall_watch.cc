#include "worker/stall_watch.h"

#include <utility>

namespace dsv4::worker {

StallWatch::StallWatch(std::function<double()> seconds_since_progress, absl::Duration timeout,
                       std::function<void(double)> on_stall, absl::Duration period,
                       std::function<void(double)> on_sample)
    : seconds_since_progress_(std::move(seconds_since_progress)),
      timeout_(timeout),
      period_(period),
      on_stall_(std::move(on_stall)),
      on_sample_(std::move(on_sample)) {
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
    if (on_sample_) on_sample_(stalled_s);
    if (!fired_ && timeout_ > absl::ZeroDuration() && absl::Seconds(stalled_s) >= timeout_) {
      fired_ = true;  // once: the process is on its way out (the gauge keeps following)
      on_stall_(stalled_s);
    }
  }
}

}  // namespace dsv4::worker
