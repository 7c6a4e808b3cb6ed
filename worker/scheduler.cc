// See scheduler.h.
#include "worker/scheduler.h"

#include <algorithm>
#include <utility>

#include "common/logging.h"

namespace dsv4::worker {

const char* RequestStateName(RequestState s) {
  switch (s) {
    case RequestState::kWaiting: return "waiting";
    case RequestState::kPrefill: return "prefill";
    case RequestState::kDecode: return "decode";
    case RequestState::kFinished: return "finished";
    case RequestState::kAborted: return "aborted";
    case RequestState::kFailed: return "failed";
  }
  return "unknown";
}

Scheduler::Scheduler(KvManager* kv, const SchedulerOptions& options) : kv_(kv), options_(options) {}

void Scheduler::Add(std::unique_ptr<Request> request) {
  request->state = RequestState::kWaiting;
  InsertWaiting(std::move(request));
}

void Scheduler::InsertWaiting(std::unique_ptr<Request> request) {
  auto it = std::upper_bound(waiting_.begin(), waiting_.end(), request->arrival,
                             [](uint64_t arrival, const auto& r) { return arrival < r->arrival; });
  waiting_.insert(it, std::move(request));
}

void Scheduler::Preempt(size_t index) {
  std::unique_ptr<Request> r = std::move(running_[index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
  kv_->Release(&r->tables);
  r->num_computed = 0;  // recompute prompt + generated tokens on re-admission
  r->state = RequestState::kWaiting;
  ++r->preemptions;
  ++preemptions_;
  DSV4_LOG_INFO("req={} preempted after {} tokens (pages short); recomputed later", r->request_id,
                r->tokens.size());
  InsertWaiting(std::move(r));
}

std::vector<ScheduledChunk> Scheduler::Schedule() {
  std::vector<ScheduledChunk> plan;
  int budget = options_.prefill_chunk;
  bool preempted = false;
  for (size_t i = 0; i < running_.size();) {
    Request* r = running_[i].get();
    const int want = r->state == RequestState::kDecode ? 1 : std::min(r->remaining_to_compute(), budget);
    if (want == 0) {
      ++i;
      continue;
    }
    bool self_preempted = false;
    while (!kv_->Reserve(&r->tables, r->num_computed + want)) {
      preempted = true;
      if (running_.size() - 1 == i) {  // r is the newest: it gives way to the older ones
        Preempt(i);
        self_preempted = true;
        break;
      }
      Preempt(running_.size() - 1);
    }
    if (self_preempted) continue;  // running_[i] is now the next request (or the end)
    const bool samples = r->num_computed + want == static_cast<int>(r->tokens.size());
    plan.push_back({.request = r, .start = r->num_computed, .count = want, .samples = samples});
    if (r->state == RequestState::kPrefill) budget -= want;
    ++i;
  }
  // New admissions only when no page pressure this step; otherwise they would be preempted straight away.
  if (!preempted) Admit(&budget, &plan);
  return plan;
}

void Scheduler::Admit(int* budget, std::vector<ScheduledChunk>* plan) {
  while (!waiting_.empty() && *budget > 0 && static_cast<int>(running_.size()) < options_.max_batch &&
         kv_->free_slots() > 0) {
    Request* r = waiting_.front().get();
    const int want = std::min(r->remaining_to_compute(), *budget);
    // Headroom of one page per running request: admitting into a pool that is about to run dry would only
    // preempt the newcomer again a few steps later (recompute thrash). With nothing running it is 0, so the
    // head of the queue always gets in eventually.
    if (!kv_->CanReserveWithHeadroom(r->tables, r->num_computed + want, static_cast<int64_t>(running_.size()))) {
      break;
    }
    std::unique_ptr<Request> owned = std::move(waiting_.front());
    waiting_.pop_front();
    kv_->AcquireSlot(&r->tables);
    kv_->Reserve(&r->tables, r->num_computed + want);
    r->state = RequestState::kPrefill;
    r->needs_state_reset = true;
    const bool samples = r->num_computed + want == static_cast<int>(r->tokens.size());
    plan->push_back({.request = r, .start = r->num_computed, .count = want, .samples = samples});
    *budget -= want;
    auto it = std::upper_bound(running_.begin(), running_.end(), r->arrival,
                               [](uint64_t arrival, const auto& q) { return arrival < q->arrival; });
    running_.insert(it, std::move(owned));
  }
}

std::unique_ptr<Request> Scheduler::Remove(uint64_t handle) {
  auto take = [&](auto& list) -> std::unique_ptr<Request> {
    for (auto it = list.begin(); it != list.end(); ++it) {
      if ((*it)->handle != handle) continue;
      std::unique_ptr<Request> r = std::move(*it);
      list.erase(it);
      kv_->Release(&r->tables);
      return r;
    }
    return nullptr;
  };
  if (auto r = take(running_)) return r;
  return take(waiting_);
}

Request* Scheduler::Find(uint64_t handle) {
  for (auto& r : running_) {
    if (r->handle == handle) return r.get();
  }
  for (auto& r : waiting_) {
    if (r->handle == handle) return r.get();
  }
  return nullptr;
}

std::vector<Request*> Scheduler::All() {
  std::vector<Request*> out;
  for (auto& r : running_) out.push_back(r.get());
  for (auto& r : waiting_) out.push_back(r.get());
  return out;
}

int64_t Scheduler::running_tokens() const {
  int64_t n = 0;
  for (const auto& r : running_) n += static_cast<int64_t>(r->tokens.size());
  return n;
}

int64_t Scheduler::waiting_tokens() const {
  int64_t n = 0;
  for (const auto& r : waiting_) n += static_cast<int64_t>(r->tokens.size());
  return n;
}

}  // namespace dsv4::worker
