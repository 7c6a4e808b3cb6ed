// The engine loop: one thread per worker that owns the executor, the KV manager, the scheduler and sampling.
//
// Each iteration takes new requests and cancellations from the inbox, asks the scheduler for a step, runs one
// Forward over every scheduled chunk, samples a token for each chunk that reached its last known token, and
// sends new tokens (and, when a request ends, finish reason and usage) to the request's sink.
//
// Threads: Submit, Cancel, Drain, GetLoad and Stop are called from any thread (RPC threads) and never wait for
// a step: they take the inbox mutex only. Everything else runs on the engine thread. Sinks are called on the
// engine thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dsv4/v1/generate.pb.h"
#include "dsv4/v1/worker.pb.h"
#include "worker/kv_manager.h"
#include "worker/model_executor.h"
#include "worker/request.h"
#include "worker/sampler.h"
#include "worker/scheduler.h"

namespace dsv4::metrics {
class ServingMetrics;
class PhaseTimer;
}

namespace dsv4::worker {

struct EngineOptions {
  int max_batch = 32;
  int max_waiting = 256;   // queued requests beyond this get RESOURCE_EXHAUSTED
  int prefill_chunk = 256;
  int max_context = 4096;
  // Decode time by phase: BeginStep/EndStep around each step's Forward (the executor marks the phases inside).
  // Null = the executor's own timer (ModelExecutor::phase_timer; none for most fakes). Must outlive the engine;
  // used on the engine thread only.
  metrics::PhaseTimer* phase_timer = nullptr;
};

// Called once on the engine thread when a drain completes: requests that finished normally and that were
// aborted while the drain ran.
using DrainCallback = std::function<void(int finished, int aborted)>;

class Engine {
 public:
  // The executor's cache must already be allocated with `sizing`. metrics may be null.
  Engine(std::unique_ptr<ModelExecutor> executor, const KvSizing& sizing, const EngineOptions& options,
         metrics::ServingMetrics* metrics);
  ~Engine();  // Stop()s

  void Start();
  // Aborts everything still queued or running and joins the engine thread.
  void Stop();

  // Validates engine-side limits (queue full: RESOURCE_EXHAUSTED; draining: UNAVAILABLE) and queues the
  // request; returns the handle for Cancel. The request must already have passed ValidateGenerateRequest.
  absl::StatusOr<uint64_t> Submit(const dsv4::v1::GenerateRequest& request, std::shared_ptr<RequestSink> sink);
  // Aborts the request at the next step boundary and frees its pages; its sink gets FINISH_REASON_ABORT.
  // Unknown or finished handles are ignored.
  void Cancel(uint64_t handle);
  // Stops admitting new requests; when every request has ended, or at the deadline (the rest are aborted),
  // calls done on the engine thread. Further Submits get UNAVAILABLE.
  void Drain(absl::Duration timeout, DrainCallback done);
  bool draining() const;

  dsv4::v1::GetLoadResponse GetLoad() const;
  const ModelInfo& model_info() const { return executor_->info(); }
  const EngineOptions& options() const { return options_; }
  // Steps run so far (tests use it to wait for progress without sleeping blindly).
  int64_t steps() const;
  // Preemptions so far (page pressure made the newest request give way and be recomputed later).
  int64_t preemptions() const;

 private:
  void Loop();
  bool TakeInbox(std::vector<std::unique_ptr<Request>>* fresh, std::vector<uint64_t>* cancels, bool idle);
  void RunStep(const std::vector<ScheduledChunk>& plan);
  void AfterSample(Request* r, int32_t token, std::vector<uint64_t>* done);
  void Finish(uint64_t handle, RequestState state, dsv4::v1::FinishReason reason, const std::string& error);
  void CheckDrain(bool force);
  void PublishLoad(double step_seconds);

  std::unique_ptr<ModelExecutor> executor_;
  const EngineOptions options_;
  metrics::ServingMetrics* metrics_;
  KvManager kv_;
  Scheduler scheduler_;
  Sampler sampler_;
  metrics::PhaseTimer* phase_timer_;  // options_.phase_timer or the executor's; may be null
  std::vector<float> logits_;  // [chunks, vocab] (host sampling)
  std::vector<kernels::SampleParams> sample_params_;  // [chunks] (sampling in the step)
  std::vector<int32_t> sampled_;                       // [chunks] (sampling in the step)
  std::thread thread_;

  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  std::vector<std::unique_ptr<Request>> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> cancels_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time drain_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::vector<DrainCallback> drain_callbacks_ ABSL_GUARDED_BY(mu_);
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  int waiting_in_scheduler_ ABSL_GUARDED_BY(mu_) = 0;
  dsv4::v1::GetLoadResponse load_ ABSL_GUARDED_BY(mu_);
  // The engine heartbeat (GetLoadResponse.seconds_since_progress): when the loop last finished an iteration,
  // or was handed work while it slept (so an idle hour is not a stall).
  absl::Time progress_at_ ABSL_GUARDED_BY(mu_) = absl::Now();
  bool sleeping_ ABSL_GUARDED_BY(mu_) = false;  // the loop waits for work
  bool step_in_flight_ ABSL_GUARDED_BY(mu_) = false;  // from Schedule to the step's PublishLoad
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t preemptions_ ABSL_GUARDED_BY(mu_) = 0;

  // Engine-thread only.
  double step_seconds_avg_ = 0;
  int drain_finished_ = 0;  // requests ended normally / aborted, ever
  int drain_aborted_ = 0;
  bool drain_started_ ABSL_GUARDED_BY(mu_) = false;
  int drain_finished_base_ = 0;
  int drain_aborted_base_ = 0;
};

}  // namespace dsv4::worker
