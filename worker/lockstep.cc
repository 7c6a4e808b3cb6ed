// LockstepLeader and RunFollower: see lockstep.h.
#include "worker/lockstep.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace dsv4::worker {
namespace {

using Clock = std::chrono::steady_clock;

// A local error on the leader that is a communicator failure breaks the group; a validation error does not
// (every rank refuses the same input the same way and stays in step).
bool IsCommFailure(const absl::Status& s) { return s.code() == absl::StatusCode::kUnavailable; }

void FillChunk(const SeqChunk& in, comm::PlanChunk* out) {
  out->set_state_slot(in.tables->state_slot);
  out->set_start_pos(in.start_pos);
  out->mutable_tokens()->Add(in.tokens.begin(), in.tokens.end());
  for (int p = 0; p < kNumPools; ++p) {
    const auto& pages = in.tables->pages[p];
    out->add_pools()->mutable_pages()->Add(pages.begin(), pages.end());
  }
}

}  // namespace

LockstepLeader::LockstepLeader(std::unique_ptr<ModelExecutor> local, comm::Communicator* control,
                               LockstepOptions options)
    : local_(std::move(local)), control_(control), options_(std::move(options)), last_send_(Clock::now()) {
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
}

LockstepLeader::~LockstepLeader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  heartbeat_.join();
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_.ok()) {
    comm::StepPlan plan;
    plan.mutable_shutdown()->set_reason("leader shutting down");
    const absl::Status s = SendLocked(plan);
    if (!s.ok()) DSV4_LOG_WARN("lockstep: could not tell followers to shut down: {}", s.ToString());
  }
}

absl::Status LockstepLeader::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

absl::Status LockstepLeader::Broken(const absl::Status& s) {
  if (broken_.ok()) {
    broken_ = absl::UnavailableError(absl::StrCat("worker group broken: ", s.message()));
    DSV4_LOG_ERROR("lockstep: {}", broken_.ToString());
    if (options_.on_failure) options_.on_failure(broken_);
  }
  return broken_;
}

absl::Status LockstepLeader::SendLocked(comm::StepPlan& plan) {
  if (!broken_.ok()) return broken_;
  plan.set_seq(++seq_);
  const absl::Status s = comm::BroadcastStepPlan(*control_, &plan, 0);
  last_send_ = Clock::now();
  if (!s.ok()) return IsCommFailure(s) ? Broken(s) : s;
  return absl::OkStatus();
}

absl::Status LockstepLeader::AllocateCache(const std::array<int64_t, kNumPools>& pages_per_pool,
                                           int page_rows, int max_state_slots) {
  std::lock_guard<std::mutex> lock(mu_);
  comm::StepPlan plan;
  auto* op = plan.mutable_allocate_cache();
  op->mutable_pages_per_pool()->Add(pages_per_pool.begin(), pages_per_pool.end());
  op->set_page_rows(page_rows);
  op->set_max_state_slots(max_state_slots);
  DSV4_RETURN_IF_ERROR(SendLocked(plan));
  const absl::Status s = local_->AllocateCache(pages_per_pool, page_rows, max_state_slots);
  return IsCommFailure(s) ? Broken(s) : s;
}

absl::Status LockstepLeader::ResetState(int32_t state_slot) {
  std::lock_guard<std::mutex> lock(mu_);
  comm::StepPlan plan;
  plan.mutable_reset_state()->set_state_slot(state_slot);
  DSV4_RETURN_IF_ERROR(SendLocked(plan));
  const absl::Status s = local_->ResetState(state_slot);
  return IsCommFailure(s) ? Broken(s) : s;
}

absl::Status LockstepLeader::Forward(std::span<const SeqChunk> chunks, float* logits) {
  return Step(chunks, [&] { return local_->Forward(chunks, logits); });
}

absl::Status LockstepLeader::ForwardSample(std::span<const SeqChunk> chunks,
                                           std::span<const kernels::SampleParams> sampling, int32_t* tokens) {
  return Step(chunks, [&] { return local_->ForwardSample(chunks, sampling, tokens); });
}

absl::Status LockstepLeader::Step(std::span<const SeqChunk> chunks, const std::function<absl::Status()>& local) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  // Refuse here what could not be serialised; the model validates the rest identically on every rank.
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].tables == nullptr) return absl::InvalidArgumentError(absl::StrCat("chunk ", i, ": tables is null"));
  }
  comm::StepPlan plan;
  for (const auto& c : chunks) FillChunk(c, plan.mutable_forward()->add_chunks());
  DSV4_RETURN_IF_ERROR(SendLocked(plan));
  const absl::Status s = local();
  return IsCommFailure(s) ? Broken(s) : s;
}

absl::StatusOr<GraphCaptureReport> LockstepLeader::CaptureGraphs(const std::vector<int>& buckets, bool capture) {
  std::lock_guard<std::mutex> lock(mu_);
  comm::StepPlan plan;
  plan.mutable_capture_graphs()->mutable_buckets()->Add(buckets.begin(), buckets.end());
  plan.mutable_capture_graphs()->set_eager(!capture);
  DSV4_RETURN_IF_ERROR(SendLocked(plan));
  absl::StatusOr<GraphCaptureReport> report = local_->CaptureGraphs(buckets, capture);
  if (!report.ok() && IsCommFailure(report.status())) return Broken(report.status());
  return report;
}

void LockstepLeader::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const auto due = last_send_ + options_.heartbeat_interval;
    if (Clock::now() < due) {
      cv_.wait_until(lock, due, [&] { return stop_; });
      continue;
    }
    if (!broken_.ok()) {
      cv_.wait(lock, [&] { return stop_; });
      break;
    }
    comm::StepPlan plan;
    plan.mutable_heartbeat();
    absl::Status s = SendLocked(plan);
    // The barrier makes a hung (not just dead) follower visible at the communicator's deadline.
    if (s.ok()) {
      s = control_->Barrier();
      if (!s.ok()) (void)Broken(s);
    }
  }
}

absl::Status RunFollower(comm::Communicator& control, ModelExecutor& local) {
  if (control.rank() == 0) return absl::InvalidArgumentError("RunFollower runs on ranks >= 1");
  uint64_t expect = 1;
  std::vector<BlockTables> tables;
  std::vector<SeqChunk> chunks;
  std::vector<float> logits;
  const int64_t vocab = local.info().vocab_size;
  // A forward has at most one chunk per state slot (the model refuses a slot used twice), so the last
  // AllocateCache bounds it. Checked before logits are sized by it: a plan of millions of one-token chunks fits
  // in a 64 MiB message and would otherwise make this follower allocate terabytes.
  int64_t max_chunks = 0;
  while (true) {
    comm::StepPlan plan;
    DSV4_RETURN_IF_ERROR(comm::BroadcastStepPlan(control, &plan, 0));
    if (plan.seq() != expect) {
      return absl::DataLossError(absl::StrCat("rank ", control.rank(), ": step plan ", plan.seq(), " after ",
                                              expect - 1, " (lost lock-step)"));
    }
    ++expect;
    absl::Status s;
    switch (plan.op_case()) {
      case comm::StepPlan::kShutdown:
        DSV4_LOG_INFO("lockstep: leader shut down ({})", plan.shutdown().reason());
        return absl::OkStatus();
      case comm::StepPlan::kHeartbeat:
        DSV4_RETURN_IF_ERROR(control.Barrier());
        continue;
      case comm::StepPlan::kResetState:
        s = local.ResetState(plan.reset_state().state_slot());
        break;
      case comm::StepPlan::kAllocateCache: {
        const auto& op = plan.allocate_cache();
        std::array<int64_t, kNumPools> pages{};
        for (int p = 0; p < kNumPools; ++p) pages[p] = op.pages_per_pool(p);
        s = local.AllocateCache(pages, op.page_rows(), op.max_state_slots());
        max_chunks = s.ok() ? op.max_state_slots() : 0;
        break;
      }
      case comm::StepPlan::kCaptureGraphs: {
        const auto& op = plan.capture_graphs();
        s = local.CaptureGraphs(std::vector<int>(op.buckets().begin(), op.buckets().end()), !op.eager()).status();
        break;
      }
      case comm::StepPlan::kForward: {
        const auto& op = plan.forward();
        if (op.chunks_size() > max_chunks) {
          s = absl::InvalidArgumentError(absl::StrCat("step plan ", plan.seq(), ": forward with ", op.chunks_size(),
                                                      " chunks but the cache has ", max_chunks, " state slots"));
          break;
        }
        tables.resize(op.chunks_size());
        chunks.resize(op.chunks_size());
        for (int i = 0; i < op.chunks_size(); ++i) {
          const comm::PlanChunk& c = op.chunks(i);
          for (int p = 0; p < kNumPools; ++p) {
            tables[i].pages[p].assign(c.pools(p).pages().begin(), c.pools(p).pages().end());
          }
          tables[i].state_slot = c.state_slot();
          chunks[i] = {.tables = &tables[i], .tokens = {c.tokens().data(), static_cast<size_t>(c.tokens_size())},
                       .start_pos = c.start_pos()};
        }
        logits.resize(static_cast<size_t>(op.chunks_size()) * vocab);
        s = local.Forward(chunks, logits.data());
        break;
      }
      case comm::StepPlan::OP_NOT_SET:
        return absl::DataLossError("step plan without an operation");
    }
    // A communicator failure ends the loop. Any other refusal is what the leader's executor returned for the
    // same call (same code, same input): the group stays in step.
    if (IsCommFailure(s)) return s;
    if (!s.ok()) DSV4_LOG_WARN("lockstep: plan {} refused as on the leader: {}", plan.seq(), s.ToString());
  }
}

}  // namespace dsv4::worker
