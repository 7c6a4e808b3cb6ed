// Lock-step execution of a tensor-parallel worker group behind the worker's ModelExecutor interface.
//
// The leader's engine keeps calling a ModelExecutor as for world 1; LockstepLeader wraps the leader's own
// (sharded) executor and, before each state-changing call (AllocateCache, ResetState, Forward), broadcasts it as a
// comm::StepPlan over the control communicator. Every follower runs RunFollower: receive a plan, apply the same call to
// its own shard, repeat (CaptureGraphs too). The collectives inside the forward then pair up across ranks because every rank makes
// the same calls in the same order.
//
//   leader engine thread                 follower main thread (ranks 1..T-1)
//   Forward(chunks) ─ plan seq n ──────▶ receive plan n ─▶ local.Forward(same chunks)
//   local.Forward(chunks)  ◀═ all-reduces inside the forward, on the data communicator ═▶
//   idle ≥ heartbeat_interval: heartbeat plan + barrier (keeps followers' receives alive; finds dead followers)
//   destructor: shutdown plan            returns OK
//
// Failures: the first communicator failure (a follower died or hung; UNAVAILABLE) breaks the leader for good:
// the failing call and every later one return UNAVAILABLE (the engine fails its in-flight requests with it), and
// options.on_failure runs once (the worker flips its health to NOT_SERVING there). A dead follower is noticed by
// the next collective: within milliseconds during a step, within heartbeat_interval when idle; a hung one at the
// communicator's deadline. A follower's loop ends with UNAVAILABLE when the leader goes away.
//
// Threading: the engine thread calls the executor methods; one internal thread sends heartbeats. A mutex makes
// each call (broadcast + local work) atomic with respect to heartbeats, which is needed because on CPU groups the
// control and data communicators are the same Gloo connection.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "comm/communicator.h"
#include "comm/step_plan.h"
#include "worker/model_executor.h"

namespace dsv4::worker {

struct LockstepOptions {
  std::chrono::milliseconds heartbeat_interval{1000};  // must stay well below the control communicator's timeout
  std::function<void(const absl::Status&)> on_failure;  // called once, from whichever thread saw the failure
};

class LockstepLeader final : public ModelExecutor {
 public:
  // `control` (rank 0 of its group) must outlive this object.
  LockstepLeader(std::unique_ptr<ModelExecutor> local, comm::Communicator* control, LockstepOptions options);
  // Stops heartbeats and tells the followers to leave (best effort).
  ~LockstepLeader() override;

  const ModelInfo& info() const override { return local_->info(); }
  int64_t PageBytes(Pool pool, int page_rows) const override { return local_->PageBytes(pool, page_rows); }
  int64_t RowsNeeded(Pool pool, int64_t n) const override { return local_->RowsNeeded(pool, n); }
  absl::Status AllocateCache(const std::array<int64_t, kNumPools>& pages_per_pool, int page_rows,
                             int max_state_slots) override;
  absl::Status ResetState(int32_t state_slot) override;
  absl::Status Forward(std::span<const SeqChunk> chunks, float* logits) override;
  // The leader samples; followers run the same step with Forward (the Sample op has no collectives).
  bool SamplesInStep() const override { return local_->SamplesInStep(); }
  // The leader's own step (its gathered, full-vocabulary logits): no collective, nothing for the followers.
  bool StepLogitsAvailable() const override { return local_->StepLogitsAvailable(); }
  absl::Status CopyStepLogits(std::span<const int> rows, float* out) override {
    return local_->CopyStepLogits(rows, out);
  }
  absl::Status ForwardSample(std::span<const SeqChunk> chunks, std::span<const kernels::SampleParams> sampling,
                             int32_t* tokens) override;
  // Broadcast like the steps: every rank captures the same buckets (and so pads decode steps alike).
  absl::StatusOr<GraphCaptureReport> CaptureGraphs(const std::vector<int>& buckets, bool capture) override;
  ExecutorMemory Memory() override { return local_->Memory(); }
  metrics::PhaseTimer* phase_timer() override { return local_->phase_timer(); }

  // OK while the group is healthy; the first failure afterwards.
  absl::Status health() const;

 private:
  // Broadcasts the forward plan of `chunks`, then runs `local` (this rank's part of the step).
  absl::Status Step(std::span<const SeqChunk> chunks, const std::function<absl::Status()>& local);
  // Broadcasts `plan` (stamped with the next seq); caller holds mu_.
  absl::Status SendLocked(comm::StepPlan& plan);
  // Records the failure (first one wins) and notifies on_failure once; returns it.
  absl::Status Broken(const absl::Status& s);
  void HeartbeatLoop();

  std::unique_ptr<ModelExecutor> local_;
  comm::Communicator* control_;
  const LockstepOptions options_;
  mutable std::mutex mu_;  // one plan + its local work at a time
  std::condition_variable cv_;
  uint64_t seq_ = 0;                                  // guarded by mu_
  std::chrono::steady_clock::time_point last_send_;   // guarded by mu_
  absl::Status broken_;                               // guarded by mu_
  bool stop_ = false;                                 // guarded by mu_
  std::thread heartbeat_;
};

// Follower side: applies the leader's plans to `local` until a shutdown plan (OK) or a failure (the
// communicator's UNAVAILABLE when the leader is gone, or the local executor's error). `control` is this rank's
// control communicator (rank >= 1). A forward with more chunks than the last AllocateCache's state slots is
// refused before anything is sized by it (the model would refuse it too); fuzz/step_plan_fuzzer drives this loop.
absl::Status RunFollower(comm::Communicator& control, ModelExecutor& local);

}  // namespace dsv4::worker
