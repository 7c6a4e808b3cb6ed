// See generate_call.h: one Generate call's routing, token relay and failover stitching.
#include "coordinator/generate_call.h"

#include <algorithm>
#include <atomic>
#include <random>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/raw_rpc.h"
#include "proto/request_validation.h"

namespace dsv4::coordinator {

using dsv4::v1::FinishReason;
using dsv4::v1::GenerateRequest;
using dsv4::v1::GenerateResponse;

// ---------------------------------------------------------------------------------------------------------
// CallTracker

bool CallTracker::Enter() {
  absl::MutexLock lock(&mu_);
  if (!admitting_) return false;
  ++inflight_;
  return true;
}

void CallTracker::Exit() {
  absl::MutexLock lock(&mu_);
  --inflight_;
}

void CallTracker::StopAdmitting() {
  absl::MutexLock lock(&mu_);
  admitting_ = false;
}

bool CallTracker::admitting() const {
  absl::MutexLock lock(&mu_);
  return admitting_;
}

bool CallTracker::WaitIdle(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return inflight_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

int CallTracker::inflight() const {
  absl::MutexLock lock(&mu_);
  return inflight_;
}

// ---------------------------------------------------------------------------------------------------------
// Attempt: one upstream Worker.Generate stream. Owned by its GenerateCall (never outlives it but for the
// length of a watchdog Abandon, which touches only the attempt's own state); reports every chunk and its end
// to the call.

class GenerateCall::Attempt final : public grpc::ClientReadReactor<GenerateResponse>, public WatchedStream {
 public:
  Attempt(GenerateCall* call, GroupHandle group, GenerateRequest request)
      : call_(call), group_(std::move(group)), request_(std::move(request)) {}

  void Start(std::chrono::system_clock::time_point deadline) {
    // The client's deadline bounds the upstream stream too (gRPC reports "none" as time_point::max()).
    if (deadline != std::chrono::system_clock::time_point::max()) ctx_.set_deadline(deadline);
    last_activity_ns_.store(absl::ToUnixNanos(absl::Now()));
    group_.stub->async()->Generate(&ctx_, &request_, this);
    StartRead(&chunk_);
    StartCall();
  }
  void Cancel() { ctx_.TryCancel(); }  // safe before Start and after the end

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows with its status
    last_activity_ns_.store(absl::ToUnixNanos(absl::Now()));
    received_any_.store(true);
    call_->OnChunk(this, chunk_);
    StartRead(&chunk_);
  }
  // Nothing may touch `this` after OnAttemptDone: it may delete the call, which owns this attempt.
  void OnDone(const grpc::Status& status) override {
    ended_.store(true);
    call_->OnAttemptDone(this, status);
  }

  // WatchedStream
  const std::string& group_address() const override { return group_.address; }
  absl::Time last_activity() const override { return absl::FromUnixNanos(last_activity_ns_.load()); }
  bool received_any() const override { return received_any_.load(); }
  bool ended() const override { return ended_.load(); }
  void Abandon(const std::string& why) override {
    {
      absl::MutexLock lock(&abandon_mu_);
      if (!abandoned_why_.empty()) return;
      abandoned_why_ = why;
    }
    ctx_.TryCancel();
  }
  // Why the watchdog abandoned this stream ("" = it did not).
  std::string abandoned_why() const {
    absl::MutexLock lock(&abandon_mu_);
    return abandoned_why_;
  }

  const GroupHandle& group() const { return group_; }
  int prompt_size() const { return request_.prompt_token_ids_size(); }  // original prompt + resumed tokens
  int tokens = 0;  // received on this attempt (guarded by the call's mutex)
  FinishReason finish = dsv4::v1::FINISH_REASON_UNSPECIFIED;

 private:
  GenerateCall* const call_;
  const GroupHandle group_;
  const GenerateRequest request_;
  grpc::ClientContext ctx_;
  GenerateResponse chunk_;
  std::atomic<int64_t> last_activity_ns_{0};
  std::atomic<bool> received_any_{false};
  std::atomic<bool> ended_{false};
  mutable absl::Mutex abandon_mu_;
  std::string abandoned_why_ ABSL_GUARDED_BY(abandon_mu_);
};

// ---------------------------------------------------------------------------------------------------------
// GenerateCall

namespace {

std::string_view ReasonName(FinishReason r) {
  switch (r) {
    case dsv4::v1::FINISH_REASON_STOP: return "stop";
    case dsv4::v1::FINISH_REASON_LENGTH: return "length";
    case dsv4::v1::FINISH_REASON_ABORT: return "abort";
    default: return "error";
  }
}

// Errors about the request itself: another group would answer the same, so they go back to the client.
bool IsRequestError(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::DEADLINE_EXCEEDED:  // the client's own deadline, propagated upstream
      return true;
    default:
      return false;
  }
}

}  // namespace

GenerateCall::GenerateCall(CallEnv* env, grpc::CallbackServerContext* ctx, absl::StatusOr<GenerateRequest> request)
    : env_(env), ctx_(ctx), start_(absl::Now()) {
  absl::Status admitted = Admit(request);
  if (!admitted.ok()) {
    {
      absl::MutexLock lock(&mu_);
      state_ = State::kFinishing;
      finish_started_ = true;
      RecordFinishLocked("error");
    }
    Finish(ToGrpcStatus(admitted));
    return;
  }
  Route();
}

GenerateCall::~GenerateCall() {
  if (entered_) env_->tracker->Exit();
}

absl::Status GenerateCall::Admit(const absl::StatusOr<GenerateRequest>& parsed) {
  if (!env_->tracker->Enter()) {
    return absl::UnavailableError("coordinator is draining and admits no new requests; send to another one");
  }
  entered_ = true;
  if (!parsed.ok()) return parsed.status();  // the bytes were not a GenerateRequest
  const GenerateRequest& request = *parsed;
  std::optional<dsv4::v1::GetModelInfoResponse> info = env_->pool->ModelInfo();
  if (!info.has_value() || info->ready_groups() == 0) {
    return absl::UnavailableError(absl::StrCat("no worker group is ready (",
                                               info.has_value() ? info->total_groups() : 0, " known)",
                                               env_->pool->NotReadySummary()));
  }
  if (request.resume_generated() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("resume_generated = ", request.resume_generated(),
                                                   " is reserved for coordinator failover and must be 0"));
  }
  RequestLimits limits;
  limits.vocab_size = info->vocab_size();
  limits.max_context = info->max_context();
  if (absl::Status s = ValidateGenerateRequest(request, limits); !s.ok()) return s;

  absl::MutexLock lock(&mu_);
  request_ = request;
  eos_token_id_ = info->eos_token_id();
  // Pin the seed before the first submission: a resubmitted request must draw the same random stream.
  if (!request_.sampling().has_seed()) request_.mutable_sampling()->set_seed(absl::Uniform<uint64_t>(absl::BitGen()));
  if (request_.request_id().empty()) {
    request_.set_request_id(absl::StrCat("c-", absl::Hex(absl::Uniform<uint64_t>(absl::BitGen()))));
  }
  return absl::OkStatus();
}

GenerateRequest GenerateCall::UpstreamRequestLocked() const {
  GenerateRequest up = request_;
  for (int32_t t : generated_) up.add_prompt_token_ids(t);
  up.set_resume_generated(static_cast<int32_t>(generated_.size()));
  return up;
}

void GenerateCall::Route() {
  Attempt* attempt = nullptr;
  Action action = Action::kNone;
  const auto deadline = ctx_->deadline();
  {
    absl::MutexLock lock(&mu_);
    if (finish_started_) return;
    if (cancelled_) {
      action = FailLocked(absl::CancelledError("the client cancelled the call"));
    } else {
      const int64_t tokens = request_.prompt_token_ids_size() + request_.sampling().max_new_tokens();
      // Once tokens were streamed, only a group on the same checkpoint may continue them.
      absl::StatusOr<GroupHandle> group = env_->pool->Pick(tokens, failed_groups_, stream_checkpoint_);
      if (!group.ok()) {
        action = FailLocked(group.status());
      } else {
        attempts_.push_back(std::make_shared<Attempt>(this, *std::move(group), UpstreamRequestLocked()));
        attempt = current_ = attempts_.back().get();
        if (env_->watchdog != nullptr) env_->watchdog->Watch(attempts_.back());
        ++refs_;
        state_ = State::kStreaming;
        DSV4_LOG_DEBUG("req={} routed to {} (attempt {})", request_.request_id(), attempt->group().address,
                       attempts_.size());
      }
    }
  }
  if (attempt != nullptr) attempt->Start(deadline);
  Run(action);
}

void GenerateCall::OnChunk(Attempt* attempt, const GenerateResponse& chunk) {
  Action action = Action::kNone;
  {
    absl::MutexLock lock(&mu_);
    if (attempt != current_ || finish_started_) return;
    const absl::Time now = absl::Now();
    const int n = chunk.token_ids_size();
    if (n > 0 && attempt->tokens == 0 && env_->metrics != nullptr) {
      // Prompt tokens count once a group has prefilled them (its first token arrived), as the worker counts
      // them: the client's prompt on the request's first token; on a failover attempt the prompt that group
      // prefilled again (original prompt + resumed tokens) goes to the failover counter instead.
      if (!first_token_.has_value()) {
        env_->metrics->AddPromptTokens(request_.prompt_token_ids_size());
      } else if (env_->failover_prompt_tokens != nullptr) {
        env_->failover_prompt_tokens->Increment(attempt->prompt_size());
      }
    }
    if (n > 0) {
      if (!first_token_.has_value()) {
        first_token_ = now;
        if (env_->metrics != nullptr) env_->metrics->ObserveTtft(absl::ToDoubleSeconds(now - start_));
      } else if (env_->metrics != nullptr) {
        // A chunk of n tokens after a gap g counts as n inter-token gaps of g / n.
        for (int i = 0; i < n; ++i) env_->metrics->ObserveItl(absl::ToDoubleSeconds(now - last_token_) / n);
      }
      last_token_ = now;
      if (env_->metrics != nullptr) env_->metrics->AddGenerationTokens(n);
    }
    if (n > 0 && !stream_checkpoint_.has_value()) stream_checkpoint_ = attempt->group().checkpoint;
    for (int32_t t : chunk.token_ids()) {
      generated_.push_back(t);
      pending_.push_back(t);
    }
    if (chunk.logprobs_size() == n) {
      for (const dsv4::v1::TokenLogprob& lp : chunk.logprobs()) pending_logprobs_.push_back(lp);
    } else if (request_.sampling().logprobs() && n > 0 && !logprobs_warned_) {
      // Only a worker that does not know the field (another version) sends tokens without them; said once.
      logprobs_warned_ = true;
      DSV4_LOG_WARN("req={} group {} sent {} tokens with {} logprobs; forwarding its tokens without",
                    request_.request_id(), attempt->group().address, n, chunk.logprobs_size());
    }
    attempt->tokens += n;
    if (chunk.finish_reason() != dsv4::v1::FINISH_REASON_UNSPECIFIED) {
      // Hold these tokens for the final message (sent once the stream's status confirms the finish), so the
      // client's last chunk carries the last tokens together with finish_reason and usage.
      attempt->finish = chunk.finish_reason();
      return;
    }
    action = NextWriteLocked();
  }
  Run(action);
}

void GenerateCall::OnAttemptDone(Attempt* attempt, const grpc::Status& status) {
  Action action = Action::kNone;
  bool destroy = false;
  env_->pool->Release(attempt->group());
  {
    absl::MutexLock lock(&mu_);
    current_ = nullptr;
    const FinishReason finish = attempt->finish;
    const std::string abandoned = attempt->abandoned_why();
    if (finish_started_) {
      // Nothing left to decide.
    } else if (cancelled_) {
      action = FailLocked(absl::CancelledError("the client cancelled the call"));
    } else if (status.ok() && finish != dsv4::v1::FINISH_REASON_UNSPECIFIED &&
               finish != dsv4::v1::FINISH_REASON_ABORT) {
      final_reason_ = finish;
      state_ = State::kFinishing;
      action = NextWriteLocked();
    } else if (!abandoned.empty()) {
      action = FailoverLocked(attempt, abandoned);  // the watchdog found the group hung
    } else if (status.ok()) {
      // ABORT without a client cancel means the group drained past its timeout; no finish at all means the
      // stream broke. Either way the request lives on elsewhere.
      action = FailoverLocked(attempt, finish == dsv4::v1::FINISH_REASON_ABORT
                                           ? "group aborted the request (draining)"
                                           : "stream ended without a finish reason");
    } else if (IsRequestError(status.error_code())) {
      action = FailLocked(FromGrpcStatus(status));
    } else if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      failed_groups_.insert(attempt->group().address);  // full, not dead: no MarkDown
      state_ = State::kFailingOver;
      action = static_cast<int>(attempts_.size()) < env_->max_attempts ? Action::kRoute
                                                                        : FailLocked(FromGrpcStatus(status));
    } else {
      action = FailoverLocked(attempt, absl::StrCat("stream failed: ", status.error_message(), " (code ",
                                                    static_cast<int>(status.error_code()), ")"));
    }
    destroy = UnrefLocked();
  }
  if (destroy) {
    delete this;
    return;
  }
  Run(action);
}

GenerateCall::Action GenerateCall::FailoverLocked(Attempt* attempt, const std::string& why) {
  const std::string& address = attempt->group().address;
  env_->pool->MarkDown(address, why);
  failed_groups_.insert(address);
  if (const FinishReason local = LocalFinishLocked(); local != dsv4::v1::FINISH_REASON_UNSPECIFIED) {
    final_reason_ = local;  // the group died after the last token but before saying so
    state_ = State::kFinishing;
    return NextWriteLocked();
  }
  if (static_cast<int>(attempts_.size()) >= env_->max_attempts) {
    return FailLocked(absl::UnavailableError(absl::StrCat("request failed on ", attempts_.size(),
                                                          " worker groups; last: ", address, ": ", why)));
  }
  DSV4_LOG_WARN("req={} failover from {} after {} tokens: {}", request_.request_id(), address, generated_.size(),
                why);
  if (env_->failovers != nullptr) env_->failovers->Increment();
  state_ = State::kFailingOver;
  return Action::kRoute;
}

FinishReason GenerateCall::LocalFinishLocked() const {
  if (generated_.empty()) return dsv4::v1::FINISH_REASON_UNSPECIFIED;
  const int32_t last = generated_.back();
  const auto& s = request_.sampling();
  if (std::find(s.stop_token_ids().begin(), s.stop_token_ids().end(), last) != s.stop_token_ids().end() ||
      (last == eos_token_id_ && !s.ignore_eos())) {
    return dsv4::v1::FINISH_REASON_STOP;
  }
  if (static_cast<int>(generated_.size()) >= s.max_new_tokens()) return dsv4::v1::FINISH_REASON_LENGTH;
  return dsv4::v1::FINISH_REASON_UNSPECIFIED;
}

GenerateCall::Action GenerateCall::FailLocked(absl::Status status) {
  state_ = State::kFinishing;
  error_ = std::move(status);
  return NextWriteLocked();
}

// Decides the next write: pending tokens first, then the final message (tokens + finish + usage) or the
// error status. At most one write is in flight, and nothing is written after the finish.
GenerateCall::Action GenerateCall::NextWriteLocked() {
  if (write_in_flight_ || finish_started_) return Action::kNone;
  const bool final_ok = final_reason_ != dsv4::v1::FINISH_REASON_UNSPECIFIED;
  if (!error_.ok() && (pending_.empty() || cancelled_)) {
    finish_started_ = true;
    RecordFinishLocked(cancelled_ ? "abort" : "error");
    return Action::kFinishError;
  }
  if (pending_.empty() && !final_ok) return Action::kNone;
  out_.Clear();
  out_.set_request_id(request_.request_id());
  out_.mutable_token_ids()->Add(pending_.begin(), pending_.end());
  pending_.clear();
  // Kept only while aligned with the tokens (a chunk from a worker that sent none breaks the alignment).
  if (pending_logprobs_.size() == static_cast<size_t>(out_.token_ids_size())) {
    for (dsv4::v1::TokenLogprob& lp : pending_logprobs_) *out_.add_logprobs() = std::move(lp);
  }
  pending_logprobs_.clear();
  if (final_ok && error_.ok()) {
    out_.set_finish_reason(final_reason_);
    dsv4::v1::Usage* usage = out_.mutable_usage();
    usage->set_prompt_tokens(request_.prompt_token_ids_size());
    usage->set_completion_tokens(static_cast<int32_t>(generated_.size()));
    usage->set_time_to_first_token_s(first_token_.has_value() ? absl::ToDoubleSeconds(*first_token_ - start_) : 0);
    usage->set_seed(request_.sampling().seed());
    finish_started_ = true;
    RecordFinishLocked(ReasonName(final_reason_));
    return Action::kWriteAndFinish;
  }
  write_in_flight_ = true;
  return Action::kWrite;
}

void GenerateCall::RecordFinishLocked(std::string_view reason) {
  if (env_->metrics == nullptr) return;
  env_->metrics->RequestFinished(reason);
  env_->metrics->ObserveE2e(absl::ToDoubleSeconds(absl::Now() - start_));
}

void GenerateCall::Run(Action action) {
  switch (action) {
    case Action::kNone: return;
    case Action::kWrite:
      SerializeTo(out_, &out_bytes_);
      StartWrite(&out_bytes_);
      return;
    case Action::kWriteAndFinish:
      SerializeTo(out_, &out_bytes_);
      StartWriteAndFinish(&out_bytes_, grpc::WriteOptions(), grpc::Status::OK);
      return;
    case Action::kFinishError: {
      absl::Status error;
      {
        absl::MutexLock lock(&mu_);
        error = error_;
      }
      // Saturation carries its retry hint as machine-readable trailing metadata too.
      if (auto retry = error.GetPayload(kRetryAfterMsPayload); retry.has_value()) {
        ctx_->AddTrailingMetadata("retry-after-ms", std::string(*retry));
      }
      Finish(ToGrpcStatus(error));
      return;
    }
    case Action::kRoute: Route(); return;
  }
}

void GenerateCall::OnWriteDone(bool ok) {
  Action action = Action::kNone;
  Attempt* to_cancel = nullptr;
  {
    absl::MutexLock lock(&mu_);
    write_in_flight_ = false;
    if (!ok && !cancelled_) {  // the client is gone: stop the worker too
      cancelled_ = true;
      to_cancel = current_;
      if (to_cancel == nullptr) action = FailLocked(absl::CancelledError("the client went away"));
    } else {
      action = NextWriteLocked();
    }
  }
  if (to_cancel != nullptr) to_cancel->Cancel();
  Run(action);
}

void GenerateCall::OnCancel() {
  Action action = Action::kNone;
  Attempt* to_cancel = nullptr;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    to_cancel = current_;
    // With an attempt live, its OnDone finishes the call; between attempts, finish here.
    if (to_cancel == nullptr && !finish_started_ && state_ != State::kFailingOver) {
      action = FailLocked(absl::CancelledError("the client cancelled the call"));
    }
  }
  if (to_cancel != nullptr) to_cancel->Cancel();  // the worker aborts the request and frees its pages
  Run(action);
}

void GenerateCall::OnDone() {
  bool destroy = false;
  {
    absl::MutexLock lock(&mu_);
    destroy = UnrefLocked();
  }
  if (destroy) delete this;
}

bool GenerateCall::UnrefLocked() { return --refs_ == 0; }

}  // namespace dsv4::coordinator
