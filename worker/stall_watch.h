// StallWatch: turns a hung engine into a failed health check. It reads the engine's heartbeat
// (GetLoadResponse.seconds_since_progress: time without a finished step while there is work) twice a second and,
// once it passes the timeout, calls on_stall one time - the worker then answers NOT_SERVING, so the kubelet's
// liveness probe restarts the pod (the coordinator has moved the group's requests away long before, through its
// own --engine-stall-ms). A step that legitimately takes that long is not one this server runs.
#pragma once

#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dsv4::worker {

class StallWatch {
 public:
  // timeout <= 0: never fires (the watch then only feeds on_sample, e.g. a heartbeat gauge). on_sample (may be
  // empty) gets every reading.
  StallWatch(std::function<double()> seconds_since_progress, absl::Duration timeout,
             std::function<void(double stalled_s)> on_stall, absl::Duration period = absl::Milliseconds(500),
             std::function<void(double seconds)> on_sample = nullptr);
  ~StallWatch();  // stops and joins
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

 private:
  void Loop();
  const std::function<double()> seconds_since_progress_;
  const absl::Duration timeout_, period_;
  const std::function<void(double)> on_stall_;
  const std::function<void(double)> on_sample_;
  bool fired_ = false;  // watch thread only
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace dsv4::worker
