// Continuous batching: which requests run in the next step, and with how many tokens.
//
// Each step: every running request in kDecode gets one token; running requests in kPrefill share a token budget
// (--prefill-chunk) oldest first; then waiting requests are admitted in arrival order (FCFS: the head of the
// queue is never skipped) while there is budget, a free state slot, room under --max-batch and pages for the
// first chunk. When a running request cannot get pages for its tokens, the newest running request is preempted
// (all its pages returned; it waits again at its original place in the queue and is recomputed later); if the
// request itself is the newest it is the one preempted. Because one request of --max-context always fits
// (PlanKvSizing checks), the oldest request always progresses: no deadlock, no crash for lack of pages.
//
// Threads: owned by the engine thread; not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "worker/kv_manager.h"
#include "worker/request.h"

namespace dsv4::worker {

struct SchedulerOptions {
  int max_batch = 32;      // running requests at most (also the number of state slots)
  int prefill_chunk = 256; // prefill tokens per step, over all requests
};

// One request's share of a step: tokens [start, start + count) of request->tokens.
struct ScheduledChunk {
  Request* request = nullptr;
  int start = 0;
  int count = 0;
  bool samples = false;  // the chunk reaches the last known token: sample a new one from its logits
};

class Scheduler {
 public:
  Scheduler(KvManager* kv, const SchedulerOptions& options);

  // Queues a new request (state kWaiting, no pages) in arrival order.
  void Add(std::unique_ptr<Request> request);
  // Plans the next step; may admit and preempt. Empty when there is nothing to run.
  std::vector<ScheduledChunk> Schedule();
  // Takes a request out of the scheduler (finished, aborted or failed) and returns all its pages.
  std::unique_ptr<Request> Remove(uint64_t handle);
  Request* Find(uint64_t handle);

  // Every request the scheduler holds, running first (oldest first), then waiting.
  std::vector<Request*> All();
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int64_t running_tokens() const;
  int64_t waiting_tokens() const;
  int64_t preemptions() const { return preemptions_; }

 private:
  void Preempt(size_t running_index);
  void InsertWaiting(std::unique_ptr<Request> request);
  void Admit(int* budget, std::vector<ScheduledChunk>* plan);

  KvManager* kv_;
  SchedulerOptions options_;
  std::vector<std::unique_ptr<Request>> running_;  // sorted by arrival, oldest first
  std::deque<std::unique_ptr<Request>> waiting_;   // sorted by arrival
  int64_t preemptions_ = 0;
};

}  // namespace dsv4::worker
