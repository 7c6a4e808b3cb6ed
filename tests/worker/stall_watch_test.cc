// StallWatch (worker/stall_watch.h): fires once when the heartbeat passes the timeout, never below it, and stops
// cleanly when destroyed first.
#include "worker/stall_watch.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dsv4::worker {
namespace {

TEST(StallWatch, FiresOnceWhenTheHeartbeatPassesTheTimeout) {
  std::atomic<double> heartbeat{0.0};
  std::atomic<int> fired{0};
  absl::Notification done;
  double seen = 0;
  StallWatch watch([&] { return heartbeat.load(); }, absl::Seconds(2),
                   [&](double s) {
                     seen = s;
                     if (++fired == 1) done.Notify();
                   },
                   absl::Milliseconds(5));
  heartbeat = 1.9;  // below: nothing
  absl::SleepFor(absl::Milliseconds(60));
  EXPECT_EQ(fired.load(), 0);
  heartbeat = 2.5;
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(seen, 2.5);
  absl::SleepFor(absl::Milliseconds(60));
  EXPECT_EQ(fired.load(), 1) << "fires once";
}

TEST(StallWatch, WithoutATimeoutItOnlySamples) {
  std::atomic<int> fired{0}, samples{0};
  std::atomic<double> last{-1};
  {
    StallWatch watch([] { return 1e6; }, absl::ZeroDuration(), [&](double) { ++fired; }, absl::Milliseconds(5),
                     [&](double s) {
                       last = s;
                       ++samples;
                     });
    absl::SleepFor(absl::Milliseconds(60));
  }
  EXPECT_EQ(fired.load(), 0) << "no timeout: never fires";
  EXPECT_GE(samples.load(), 3);
  EXPECT_EQ(last.load(), 1e6);
}

TEST(StallWatch, DestroyedBeforeAStallNeverFires) {
  std::atomic<int> fired{0};
  {
    StallWatch watch([] { return 0.0; }, absl::Seconds(1), [&](double) { ++fired; }, absl::Milliseconds(5));
    absl::SleepFor(absl::Milliseconds(30));
  }
  EXPECT_EQ(fired.load(), 0);
}

}  // namespace
}  // namespace dsv4::worker
