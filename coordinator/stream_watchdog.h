// StreamWatchdog: finds upstream Worker.Generate streams whose group has gone silent and abandons them, so the
// call fails over to another group (GenerateCall's kill -9 path: resume_generated, no gap, no duplicate).
//
// A hung worker (SIGSTOP, or a process frozen the way a GPU hang looks from outside) keeps its TCP connections
// open: its streams neither deliver tokens nor fail, and without this they would wait for gRPC keepalive
// (~15 s) or forever. Two deadlines end them:
//   - health deadline: a group that does not answer its GetLoad poll within --health-timeout-ms is not ready
//     (GroupPool), and AbandonSilent is called for it: every stream on it that has received nothing for at
//     least that long is abandoned. A stream that is still delivering tokens is left alone, so a slow poll
//     answer alone never moves a healthy stream.
//   - stream inactivity deadline (--stream-idle-timeout-ms, 0 = off): a stream that has delivered at least one
//     message and then nothing for that long is abandoned even while its group answers polls (a frozen engine
//     behind live RPC threads). Before the first token a stream may legitimately wait (queued, long prefill),
//     so that wait is bounded only by the health deadline and the client's own deadline.
//
// Threads: Watch/AbandonSilent from any thread; one scan thread when the inactivity deadline is on. Abandon is
// always called with no watchdog lock held (gRPC may run the stream's reactions inline).
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dsv4::coordinator {

// What the watchdog sees of one upstream stream. Implemented by GenerateCall's attempts.
class WatchedStream {
 public:
  virtual ~WatchedStream() = default;
  virtual const std::string& group_address() const = 0;
  virtual absl::Time last_activity() const = 0;  // stream start, then each message received
  virtual bool received_any() const = 0;
  virtual bool ended() const = 0;                 // the stream's end was reported to its owner
  // Cancels the stream; its owner treats the end as a dead group with `why` as the reason. Idempotent.
  virtual void Abandon(const std::string& why) = 0;
};

class StreamWatchdog {
 public:
  // idle_timeout: the stream inactivity deadline; zero or negative = off (no scan thread).
  explicit StreamWatchdog(absl::Duration idle_timeout);
  ~StreamWatchdog();
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  // Watches `stream` until it ends or is destroyed (held weakly: the watchdog never keeps one alive).
  void Watch(std::weak_ptr<WatchedStream> stream);

  // The group `address` missed its health deadline: abandons its live streams silent for >= `silence`.
  // Returns how many were abandoned.
  int AbandonSilent(const std::string& address, absl::Duration silence, const std::string& why);

  int watched() const;  // live streams, for tests

 private:
  void ScanLoop();
  // Live streams matching `pick`; prunes ended and destroyed ones.
  template <typename Pick>
  std::vector<std::shared_ptr<WatchedStream>> Collect(Pick pick);

  const absl::Duration idle_timeout_;
  mutable absl::Mutex mu_;
  std::vector<std::weak_ptr<WatchedStream>> streams_ ABSL_GUARDED_BY(mu_);
  size_t prune_at_ ABSL_GUARDED_BY(mu_) = 64;  // Watch prunes ended streams when the list reaches this
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread scan_;
};

}  // namespace dsv4::coordinator
