// See engine.h.
#include "worker/engine.h"

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "proto/request_validation.h"
#include "common/status_macros.h"
#include "metrics/phase_timer.h"
#include "metrics/serving_metrics.h"
#include "worker/logprobs.h"

namespace dsv4::worker {
namespace {

const char* ReasonName(dsv4::v1::FinishReason reason) {
  switch (reason) {
    case dsv4::v1::FINISH_REASON_STOP: return "stop";
    case dsv4::v1::FINISH_REASON_LENGTH: return "length";
    case dsv4::v1::FINISH_REASON_ABORT: return "abort";
    default: return "error";
  }
}

uint64_t ServerSeed() {
  static absl::Mutex mu(absl::kConstInit);
  static absl::BitGen* gen = new absl::BitGen();
  absl::MutexLock lock(&mu);
  return absl::Uniform<uint64_t>(*gen);
}

}  // namespace

Engine::Engine(std::unique_ptr<ModelExecutor> executor, const KvSizing& sizing, const EngineOptions& options,
               metrics::ServingMetrics* metrics)
    : executor_(std::move(executor)),
      options_(options),
      metrics_(metrics),
      kv_(*executor_, sizing),
      scheduler_(&kv_, SchedulerOptions{.max_batch = options.max_batch, .prefill_chunk = options.prefill_chunk}),
      phase_timer_(options.phase_timer != nullptr ? options.phase_timer : executor_->phase_timer()) {
  PublishLoad(0);
}

Engine::~Engine() { Stop(); }

void Engine::Start() { thread_ = std::thread([this] { Loop(); }); }

void Engine::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<uint64_t> Engine::Submit(const dsv4::v1::GenerateRequest& g, std::shared_ptr<RequestSink> sink) {
  const RequestLimits limits{.vocab_size = executor_->info().vocab_size, .max_context = options_.max_context};
  DSV4_RETURN_IF_ERROR(ValidateGenerateRequest(g, limits));
  auto r = std::make_unique<Request>();
  r->request_id = g.request_id();
  r->tokens.assign(g.prompt_token_ids().begin(), g.prompt_token_ids().end());
  r->prompt_tokens = g.prompt_token_ids_size() - g.resume_generated();
  r->generated = g.resume_generated();
  const auto& s = g.sampling();
  r->max_new_tokens = s.max_new_tokens();
  r->sampling = {.temperature = s.temperature(),
                 .top_k = s.top_k(),
                 .top_p = s.top_p() == 0.0f ? 1.0f : s.top_p(),
                 .min_p = s.min_p(),
                 .seed = s.has_seed() ? s.seed() : ServerSeed()};
  r->stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  r->ignore_eos = s.ignore_eos();
  r->logprobs = s.logprobs();
  r->top_logprobs = s.top_logprobs();
  r->sink = std::move(sink);
  r->arrival_time = absl::Now();
  absl::MutexLock lock(&mu_);
  if (stop_ || draining_) {
    return absl::UnavailableError("worker is draining: not admitting new requests (retry on another worker)");
  }
  const int waiting = static_cast<int>(inbox_.size()) + waiting_in_scheduler_;
  if (waiting >= options_.max_waiting) {
    return absl::ResourceExhaustedError(absl::StrCat("waiting queue is full: ", waiting,
                                                     " requests waiting (limit --max-waiting ",
                                                     options_.max_waiting, ")"));
  }
  r->handle = next_handle_++;
  r->arrival = r->handle;
  if (r->request_id.empty()) r->request_id = absl::StrCat("w", r->handle);
  const uint64_t handle = r->handle;
  if (sleeping_ && inbox_.empty()) progress_at_ = absl::Now();  // the stall clock starts with the work
  inbox_.push_back(std::move(r));
  wake_.Signal();
  return handle;
}

void Engine::Cancel(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  cancels_.push_back(handle);
  wake_.Signal();
}

void Engine::Drain(absl::Duration timeout, DrainCallback done) {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  drain_deadline_ = std::min(drain_deadline_, absl::Now() + timeout);
  drain_callbacks_.push_back(std::move(done));
  wake_.Signal();
}

bool Engine::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

dsv4::v1::GetLoadResponse Engine::GetLoad() const {
  absl::MutexLock lock(&mu_);
  dsv4::v1::GetLoadResponse load = load_;
  // Stalled = work the loop has not moved: it is inside a step, or was handed work and has not woken. A loop asleep
  // with nothing new to do is not stalled even if requests wait (nothing can be scheduled until one ends).
  const bool busy = step_in_flight_ || load_.running() > 0 || waiting_in_scheduler_ > 0 || !inbox_.empty();
  if (busy && (!sleeping_ || !inbox_.empty())) {
    load.set_seconds_since_progress(absl::ToDoubleSeconds(absl::Now() - progress_at_));
  }
  return load;
}

int64_t Engine::preemptions() const {
  absl::MutexLock lock(&mu_);
  return preemptions_;
}

int64_t Engine::steps() const {
  absl::MutexLock lock(&mu_);
  return steps_;
}

bool Engine::TakeInbox(std::vector<std::unique_ptr<Request>>* fresh, std::vector<uint64_t>* cancels, bool idle) {
  absl::MutexLock lock(&mu_);
  if (idle) {
    // Sleep until there is work; wake at the drain deadline too, so a drain with stuck work still ends.
    auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || !inbox_.empty() || !cancels_.empty() || !drain_callbacks_.empty();
    };
    sleeping_ = true;
    while (!has_work()) wake_.WaitWithTimeout(&mu_, absl::Milliseconds(200));
    sleeping_ = false;
  }
  for (auto& r : inbox_) fresh->push_back(std::move(r));
  // They wait in the scheduler from here until the next PublishLoad recounts: GetLoad (the heartbeat's "busy")
  // and Submit's queue bound must see them during the step that takes them, the first one after an idle spell.
  waiting_in_scheduler_ += static_cast<int>(inbox_.size());
  inbox_.clear();
  cancels->swap(cancels_);
  return !stop_;
}

void Engine::Loop() {
  bool idle = true;
  while (true) {
    std::vector<std::unique_ptr<Request>> fresh;
    std::vector<uint64_t> cancels;
    const bool keep_running = TakeInbox(&fresh, &cancels, idle);
    for (auto& r : fresh) scheduler_.Add(std::move(r));
    if (!keep_running) break;
    for (uint64_t h : cancels) Finish(h, RequestState::kAborted, dsv4::v1::FINISH_REASON_ABORT, "cancelled");
    CheckDrain(false);
    const std::vector<ScheduledChunk> plan = scheduler_.Schedule();
    {
      // What Submit's queue bound and GetLoad's heartbeat see while this step runs: the scheduler's real queue
      // (admitted requests no longer wait) and that a step is in flight.
      absl::MutexLock lock(&mu_);
      waiting_in_scheduler_ = scheduler_.num_waiting();
      step_in_flight_ = !plan.empty();
    }
    idle = plan.empty();
    const absl::Time t0 = absl::Now();
    if (!plan.empty()) RunStep(plan);
    PublishLoad(plan.empty() ? 0 : absl::ToDoubleSeconds(absl::Now() - t0));
  }
  // Stopping: everything still queued or running ends as ABORT, pages returned.
  {
    absl::MutexLock lock(&mu_);
    for (auto& r : inbox_) scheduler_.Add(std::move(r));
    inbox_.clear();
  }
  for (Request* r : scheduler_.All()) {
    Finish(r->handle, RequestState::kAborted, dsv4::v1::FINISH_REASON_ABORT, "worker stopping");
  }
  CheckDrain(true);
  PublishLoad(0);
}

void Engine::CheckDrain(bool force) {
  std::vector<DrainCallback> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (!draining_ || drain_callbacks_.empty()) return;
    if (!drain_started_) {  // count only what ends after the drain began
      drain_started_ = true;
      drain_finished_base_ = drain_finished_;
      drain_aborted_base_ = drain_aborted_;
    }
    const bool idle = inbox_.empty() && scheduler_.num_running() == 0 && scheduler_.num_waiting() == 0;
    if (!idle && !force && absl::Now() < drain_deadline_) return;
    callbacks.swap(drain_callbacks_);
  }
  for (Request* r : scheduler_.All()) {
    Finish(r->handle, RequestState::kAborted, dsv4::v1::FINISH_REASON_ABORT, "drain timeout");
  }
  const int finished = drain_finished_ - drain_finished_base_;
  const int aborted = drain_aborted_ - drain_aborted_base_;
  DSV4_LOG_INFO("drain done: {} finished, {} aborted", finished, aborted);
  for (auto& cb : callbacks) cb(finished, aborted);
}

void Engine::PublishLoad(double step_seconds) {
  if (step_seconds > 0) {
    step_seconds_avg_ = step_seconds_avg_ == 0 ? step_seconds : 0.9 * step_seconds_avg_ + 0.1 * step_seconds;
  }
  dsv4::v1::GetLoadResponse load;
  load.set_running(scheduler_.num_running());
  load.set_waiting(scheduler_.num_waiting());
  load.set_running_tokens(scheduler_.running_tokens());
  load.set_waiting_tokens(scheduler_.waiting_tokens());
  const auto usage = kv_.Usage();
  for (int p = 0; p < kNumPools; ++p) {
    if (usage[p].total == 0) continue;
    auto* pool = load.add_kv_pools();
    pool->set_pool(kPoolNames[p]);
    pool->set_pages_used(usage[p].used);
    pool->set_pages_total(usage[p].total);
  }
  load.set_kv_usage_ratio(kv_.UsageRatio());
  load.set_recent_step_seconds(step_seconds_avg_);
  load.set_max_batch(options_.max_batch);
  load.set_max_waiting(options_.max_waiting);
  if (metrics_) {
    metrics_->SetRunning(load.running());
    metrics_->SetWaiting(load.waiting());
    metrics_->SetKvUsage(load.kv_usage_ratio());
  }
  absl::MutexLock lock(&mu_);
  load.set_waiting(load.waiting() + static_cast<int>(inbox_.size()));
  load.set_draining(draining_);
  waiting_in_scheduler_ = scheduler_.num_waiting();
  if (step_seconds > 0) ++steps_;
  progress_at_ = absl::Now();
  step_in_flight_ = false;
  preemptions_ = scheduler_.preemptions();
  load_ = std::move(load);
}

void Engine::RunStep(const std::vector<ScheduledChunk>& plan) {
  const int vocab = executor_->info().vocab_size;
  std::vector<SeqChunk> chunks;
  chunks.reserve(plan.size());
  for (const ScheduledChunk& c : plan) {
    Request* r = c.request;
    if (r->needs_state_reset) {
      const absl::Status s = executor_->ResetState(r->tables.state_slot);
      if (!s.ok()) DSV4_LOG_ERROR("req={} state reset failed: {}", r->request_id, s.ToString());
      r->needs_state_reset = false;
    }
    chunks.push_back({.tables = &r->tables,
                      .tokens = std::span<const int32_t>(r->tokens).subspan(c.start, c.count),
                      .start_pos = c.start});
  }
  // Sampling inside the step (the executor's Sample op: token ids come back, logits stay on the device), or on
  // the host from the returned logits; the same token either way (one reference sampler, worker/sampler.h). The
  // rows of requests that asked for log-probabilities are copied off after the step (CopyStepLogits) - only
  // theirs; an executor that cannot do that runs the step on the logits path instead.
  std::vector<int> logprob_rows;  // chunk indices
  for (size_t i = 0; i < plan.size(); ++i) {
    if (plan[i].samples && plan[i].request->logprobs) logprob_rows.push_back(static_cast<int>(i));
  }
  const bool in_step =
      executor_->SamplesInStep() && (logprob_rows.empty() || executor_->StepLogitsAvailable());
  if (in_step) {
    sample_params_.resize(plan.size());
    sampled_.assign(plan.size(), -1);
    for (size_t i = 0; i < plan.size(); ++i) {
      const Request* r = plan[i].request;
      sample_params_[i] = plan[i].samples ? kernels::SampleParams{.temperature = std::max(r->sampling.temperature, 0.f),
                                                                  .top_k = r->sampling.top_k,
                                                                  .top_p = r->sampling.top_p,
                                                                  .min_p = r->sampling.min_p,
                                                                  .seed = r->sampling.seed,
                                                                  .index = static_cast<uint64_t>(r->generated)}
                                          : kernels::SampleParams{.temperature = -1.f};  // a chunk mid-prefill
    }
  } else {
    logits_.resize(plan.size() * static_cast<size_t>(vocab));
  }
  if (phase_timer_ != nullptr) phase_timer_->BeginStep();
  absl::Status status = in_step ? executor_->ForwardSample(chunks, sample_params_, sampled_.data())
                                : executor_->Forward(chunks, logits_.data());
  if (status.ok() && in_step && !logprob_rows.empty()) {
    logits_.resize(logprob_rows.size() * static_cast<size_t>(vocab));
    status = executor_->CopyStepLogits(logprob_rows, logits_.data());
  }
  if (phase_timer_ != nullptr) phase_timer_->EndStep();
  if (!status.ok()) {
    DSV4_LOG_ERROR("forward failed for a batch of {}: {}", plan.size(), status.ToString());
    for (const ScheduledChunk& c : plan) {
      // UNAVAILABLE: the tensor-parallel group lost a rank; the stream ends with that status (retry elsewhere).
      if (absl::IsUnavailable(status)) c.request->sink->OnFailure(status);
      Finish(c.request->handle, RequestState::kFailed, dsv4::v1::FINISH_REASON_ERROR, status.ToString());
    }
    return;
  }
  std::vector<uint64_t> done;
  int decode = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    Request* r = plan[i].request;
    if (r->state == RequestState::kDecode) ++decode;
    r->num_computed += plan[i].count;
    if (!plan[i].samples) continue;
    int32_t token = -1;
    if (in_step) {
      token = sampled_[i];
    } else {
      const std::span<const float> row(logits_.data() + i * vocab, vocab);
      token = sampler_.Sample(row, r->sampling, static_cast<uint64_t>(r->generated));
    }
    if (token < 0 || token >= vocab) {  // a broken step: never stream an id outside the vocabulary
      Finish(r->handle, RequestState::kFailed, dsv4::v1::FINISH_REASON_ERROR,
             absl::StrCat("the step sampled token ", token, " outside [0, ", vocab, ")"));
      continue;
    }
    if (r->logprobs) {
      // Its logits row: row i of the step's logits, or its place among the rows copied after a sampled step.
      const size_t row = in_step ? static_cast<size_t>(std::lower_bound(logprob_rows.begin(), logprob_rows.end(),
                                                                        static_cast<int>(i)) -
                                                       logprob_rows.begin())
                                 : i;
      r->last_logprob = TokenLogprobOf(std::span<const float>(logits_.data() + row * vocab, vocab), token,
                                       r->top_logprobs);
    }
    AfterSample(r, token, &done);
  }
  if (metrics_) {
    if (decode > 0) metrics_->ObserveBatchSize(decode);
    metrics_->AddGenerationTokens(static_cast<int64_t>(std::count_if(plan.begin(), plan.end(),
                                                                     [](const auto& c) { return c.samples; })));
  }
  for (uint64_t h : done) {
    Request* r = scheduler_.Find(h);
    const bool length = r->generated >= r->max_new_tokens && !(r->state == RequestState::kFinished);
    Finish(h, RequestState::kFinished, length ? dsv4::v1::FINISH_REASON_LENGTH : dsv4::v1::FINISH_REASON_STOP,
           "");
  }
}

void Engine::AfterSample(Request* r, int32_t token, std::vector<uint64_t>* done) {
  r->tokens.push_back(token);
  ++r->generated;
  r->state = RequestState::kDecode;
  const absl::Time now = absl::Now();
  if (metrics_) {
    if (r->first_token_time == absl::InfinitePast()) {
      // dsv4_prompt_tokens_total: the prompt this worker prefilled, counted once its prefill is done (the first
      // token): after a failover that includes the resumed tokens the coordinator sent (docs/metrics.md).
      // Recomputation after a preemption is not counted again (first_token_time survives it).
      metrics_->AddPromptTokens(static_cast<int64_t>(r->tokens.size()) - 1);
      metrics_->ObserveTtft(absl::ToDoubleSeconds(now - r->arrival_time));
    } else {
      metrics_->ObserveItl(absl::ToDoubleSeconds(now - r->last_token_time));
    }
  }
  if (r->first_token_time == absl::InfinitePast()) r->first_token_time = now;
  r->last_token_time = now;
  const std::vector<int32_t>& eos = executor_->info().eos_token_ids;
  const bool stop = std::find(r->stop_token_ids.begin(), r->stop_token_ids.end(), token) !=
                        r->stop_token_ids.end() ||
                    (!r->ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end());
  if (stop || r->generated >= r->max_new_tokens) {
    if (stop) r->state = RequestState::kFinished;  // marks STOP for RunStep; LENGTH otherwise
    done->push_back(r->handle);
    return;  // the final response carries this token
  }
  dsv4::v1::GenerateResponse response;
  response.set_request_id(r->request_id);
  response.add_token_ids(token);
  if (r->logprobs) *response.add_logprobs() = r->last_logprob;
  r->sink->OnResponse(std::move(response), false);
}

void Engine::Finish(uint64_t handle, RequestState state, dsv4::v1::FinishReason reason,
                    const std::string& error) {
  std::unique_ptr<Request> r = scheduler_.Remove(handle);  // returns every page first
  if (!r) return;
  r->state = state;
  dsv4::v1::GenerateResponse response;
  response.set_request_id(r->request_id);
  // A normal finish carries the token sampled this step (it was not streamed yet).
  if (state == RequestState::kFinished) {
    response.add_token_ids(r->tokens.back());
    if (r->logprobs) *response.add_logprobs() = r->last_logprob;
  }
  response.set_finish_reason(reason);
  auto* usage = response.mutable_usage();
  usage->set_prompt_tokens(r->prompt_tokens);
  usage->set_completion_tokens(r->generated);
  usage->set_seed(r->sampling.seed);
  if (r->first_token_time != absl::InfinitePast()) {
    usage->set_time_to_first_token_s(absl::ToDoubleSeconds(r->first_token_time - r->arrival_time));
  }
  if (metrics_) {
    metrics_->RequestFinished(ReasonName(reason));
    metrics_->ObserveE2e(absl::ToDoubleSeconds(absl::Now() - r->arrival_time));
  }
  PublishLoad(0);  // GetLoad shows the freed pages before the client sees the final message
  if (state == RequestState::kFinished) {
    ++drain_finished_;
  } else {
    ++drain_aborted_;
  }
  if (!error.empty() && state != RequestState::kFinished) {
    DSV4_LOG_INFO("req={} ended {}: {}", r->request_id, RequestStateName(state), error);
  }
  r->sink->OnResponse(std::move(response), true);
}

}  // namespace dsv4::worker
