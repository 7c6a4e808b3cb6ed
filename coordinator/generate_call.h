// One Coordinator.Generate call: validation, routing, streaming and failover for a single request.
//
// GenerateCall is the server-side reactor (gRPC callback API). It forwards the request to the group
// GroupPool picks, through a client-side reactor (an "attempt"), and relays the worker's token stream to the
// client. If the group dies mid-stream, the call resubmits to another group as the original prompt plus every
// token received so far (resume_generated = that count), with the same max_new_tokens and the seed pinned at
// admission, so the worker continues the same counter-based sampling stream: the client sees no gap and no
// duplicate. Tokens received are buffered until the client's previous write completes, so a slow client never
// blocks a worker stream, and a failover never loses a token that was received but not yet written. A group that
// hangs instead of dying (SIGSTOP, a frozen process) is found by the StreamWatchdog, which abandons the attempt;
// the call then fails over exactly as for a dead group.
//
// Lifecycle (one enum; every transition happens under the call's mutex):
//
//   kRouting ──Pick ok──▶ kStreaming ──worker final OK──────────────▶ kFinishing ──OnDone──▶ (deleted)
//      ▲   └──Pick fails─────────────────────────────────────────────────▲
//      │                  │ group died / drained / queue full          │ client error, cancel, budget spent,
//      └─ kFailingOver ◀──┘ (attempts left)                            │ no attempts left
//
// Threads: every method runs on gRPC callback threads and never blocks; the mutex is held only to update
// state and decide the next action, which runs after unlocking (gRPC may run a reaction inline).
// Ownership: the call deletes itself when the server side is done and its live attempt (if any) has ended.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/status/statusor.h"
#include "coordinator/group_pool.h"
#include "coordinator/stream_watchdog.h"
#include "dsv4/v1/coordinator.grpc.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "metrics/serving_metrics.h"
#include "prometheus/counter.h"

namespace dsv4::coordinator {

// Counts in-flight Generate calls and gates admission during a drain.
class CallTracker {
 public:
  bool Enter();  // false once StopAdmitting was called
  void Exit();
  void StopAdmitting();
  bool admitting() const;
  // True when no call is in flight, false if `timeout` passed first.
  bool WaitIdle(absl::Duration timeout) const;
  int inflight() const;

 private:
  mutable absl::Mutex mu_;
  int inflight_ ABSL_GUARDED_BY(mu_) = 0;
  bool admitting_ ABSL_GUARDED_BY(mu_) = true;
};

// What every call shares; owned by the server, outlives every call.
struct CallEnv {
  GroupPool* pool = nullptr;
  CallTracker* tracker = nullptr;
  metrics::ServingMetrics* metrics = nullptr;  // may be null (unit tests)
  prometheus::Counter* failovers = nullptr;    // dsv4_coordinator_failovers_total; may be null
  // dsv4_coordinator_failover_prompt_tokens_total: prompt tokens (original prompt + tokens already streamed)
  // that a group prefilled again for a failed-over request; may be null.
  prometheus::Counter* failover_prompt_tokens = nullptr;
  StreamWatchdog* watchdog = nullptr;          // may be null (no hung-stream detection)
  int max_attempts = 4;                        // upstream streams per request, first one included
};

// Writes raw bytes: Coordinator.Generate is a raw method (common/raw_rpc.h), so the request arrives decoded by
// the server (or as the error saying why it could not be) and each response is encoded before its write.
class GenerateCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // `request`: the decoded request, or INVALID_ARGUMENT when it could not be decoded (answered at once).
  GenerateCall(CallEnv* env, grpc::CallbackServerContext* ctx, absl::StatusOr<dsv4::v1::GenerateRequest> request);
  ~GenerateCall() override;

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  class Attempt;
  enum class State { kRouting, kStreaming, kFailingOver, kFinishing };
  // What to do after unlocking.
  enum class Action { kNone, kWrite, kWriteAndFinish, kFinishError, kRoute };

  absl::Status Admit(const absl::StatusOr<dsv4::v1::GenerateRequest>& request);
  void Route();
  void OnChunk(Attempt* attempt, const dsv4::v1::GenerateResponse& chunk);
  void OnAttemptDone(Attempt* attempt, const grpc::Status& status);
  void Run(Action action);
  Action NextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Action FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Action FailoverLocked(Attempt* attempt, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // STOP or LENGTH when the tokens already streamed end the request (so a dead group needs no successor).
  dsv4::v1::FinishReason LocalFinishLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  dsv4::v1::GenerateRequest UpstreamRequestLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool UnrefLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // true: delete this after unlocking
  void RecordFinishLocked(std::string_view reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CallEnv* const env_;
  grpc::CallbackServerContext* const ctx_;
  const absl::Time start_;
  bool entered_ = false;  // counted by the tracker

  absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kRouting;
  int refs_ ABSL_GUARDED_BY(mu_) = 1;  // the server side + the live attempt
  dsv4::v1::GenerateRequest request_ ABSL_GUARDED_BY(mu_);  // as admitted: seed pinned, id set
  int eos_token_id_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<int32_t> generated_ ABSL_GUARDED_BY(mu_);  // every token received, in order
  // The checkpoint of the group that streamed the first token; set from then on.
  std::optional<std::string> stream_checkpoint_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> pending_ ABSL_GUARDED_BY(mu_);    // received, not yet handed to a write
  std::vector<dsv4::v1::TokenLogprob> pending_logprobs_ ABSL_GUARDED_BY(mu_);  // theirs (sampling.logprobs)
  bool logprobs_warned_ ABSL_GUARDED_BY(mu_) = false;
  // Shared with the watchdog (weakly), which may hold one for the length of an Abandon.
  std::vector<std::shared_ptr<Attempt>> attempts_ ABSL_GUARDED_BY(mu_);
  Attempt* current_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::flat_hash_set<std::string> failed_groups_ ABSL_GUARDED_BY(mu_);
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  dsv4::v1::FinishReason final_reason_ ABSL_GUARDED_BY(mu_) = dsv4::v1::FINISH_REASON_UNSPECIFIED;
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // non-OK: finish with it once pending tokens are written
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Time> first_token_ ABSL_GUARDED_BY(mu_);
  absl::Time last_token_ ABSL_GUARDED_BY(mu_);
  dsv4::v1::GenerateResponse out_;  // the message being written; touched only by the one writer
  grpc::ByteBuffer out_bytes_;      // out_ encoded, for the write in flight
};

}  // namespace dsv4::coordinator
