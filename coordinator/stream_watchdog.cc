// See stream_watchdog.h.
#include "coordinator/stream_watchdog.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace dsv4::coordinator {

StreamWatchdog::StreamWatchdog(absl::Duration idle_timeout) : idle_timeout_(idle_timeout) {
  if (idle_timeout_ > absl::ZeroDuration()) scan_ = std::thread([this] { ScanLoop(); });
}

StreamWatchdog::~StreamWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (scan_.joinable()) scan_.join();
}

void StreamWatchdog::Watch(std::weak_ptr<WatchedStream> stream) {
  absl::MutexLock lock(&mu_);
  // Without the scan thread (inactivity deadline off) nothing else prunes between failed polls: drop ended
  // streams whenever the list has doubled, so it stays proportional to the live streams.
  if (streams_.size() >= prune_at_) {
    std::erase_if(streams_, [](const std::weak_ptr<WatchedStream>& w) {
      std::shared_ptr<WatchedStream> s = w.lock();
      return s == nullptr || s->ended();
    });
    prune_at_ = 2 * streams_.size() + 64;
  }
  streams_.push_back(std::move(stream));
}

template <typename Pick>
std::vector<std::shared_ptr<WatchedStream>> StreamWatchdog::Collect(Pick pick) {
  std::vector<std::shared_ptr<WatchedStream>> out;
  absl::MutexLock lock(&mu_);
  std::erase_if(streams_, [&](const std::weak_ptr<WatchedStream>& w) {
    std::shared_ptr<WatchedStream> s = w.lock();
    if (s == nullptr || s->ended()) return true;
    if (pick(*s)) out.push_back(std::move(s));
    return false;
  });
  return out;
}

int StreamWatchdog::AbandonSilent(const std::string& address, absl::Duration silence, const std::string& why) {
  const absl::Time now = absl::Now();
  const std::vector<std::shared_ptr<WatchedStream>> hung = Collect([&](const WatchedStream& s) {
    return s.group_address() == address && now - s.last_activity() >= silence;
  });
  for (const auto& s : hung) s->Abandon(why);  // no lock held: reactions may run inline
  return static_cast<int>(hung.size());
}

int StreamWatchdog::watched() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

void StreamWatchdog::ScanLoop() {
  // A tenth of the deadline between scans (10 ms .. 1 s): detection lands within 10% of the deadline.
  const absl::Duration period = std::clamp(idle_timeout_ / 10, absl::Milliseconds(10), absl::Seconds(1));
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), period)) return;
    }
    const absl::Time now = absl::Now();
    const std::vector<std::shared_ptr<WatchedStream>> idle = Collect([&](const WatchedStream& s) {
      return s.received_any() && now - s.last_activity() >= idle_timeout_;
    });
    for (const auto& s : idle) {
      s->Abandon(absl::StrCat("no message for ", absl::FormatDuration(now - s->last_activity()),
                              " (stream inactivity deadline --stream-idle-timeout-ms ",
                              absl::ToInt64Milliseconds(idle_timeout_), ")"));
    }
  }
}

}  // namespace dsv4::coordinator
