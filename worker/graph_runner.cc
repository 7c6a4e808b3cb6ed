// GraphRunner: see graph_runner.h.
#include "worker/graph_runner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace dsv4::worker {

struct GraphRunner::Slot {
  int bucket = 0;
  BucketState state = BucketState::kNone;
  std::unique_ptr<kernels::StepGraph> graph;
  int64_t replays = 0;
  int64_t eager = 0;
};

GraphRunner::GraphRunner(model::Dsv4Model& model, kernels::DeviceControl* device, std::vector<int> buckets)
    : model_(model), device_(device), buckets_(std::move(buckets)) {
  for (int b : buckets_) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->bucket = b;
  }
}

GraphRunner::~GraphRunner() {
  // One line at exit: how the decode steps ran (tests and operators read it to see the graphs were used).
  std::string line;
  for (const auto& s : slots_) {
    if (s->replays + s->eager == 0) continue;
    absl::StrAppend(&line, line.empty() ? "" : ", ", "bucket ", s->bucket, ": ", s->replays, " replays ", s->eager,
                    " eager");
  }
  if (!line.empty()) DSV4_LOG_INFO("cuda graphs at exit: {}", line);
}

GraphRunner::Slot* GraphRunner::Find(int bucket) const {
  for (const auto& s : slots_) {
    if (s->bucket == bucket) return s.get();
  }
  return nullptr;
}

int GraphRunner::BucketFor(int64_t n) const {
  for (int b : buckets_) {
    if (b >= n) return b;
  }
  return 0;
}

GraphRunner::BucketState GraphRunner::state(int bucket) const {
  const Slot* s = Find(bucket);
  return s == nullptr ? BucketState::kNone : s->state;
}

int64_t GraphRunner::replays(int bucket) const {
  const Slot* s = Find(bucket);
  return s == nullptr ? 0 : s->replays;
}

int64_t GraphRunner::eager_steps(int bucket) const {
  const Slot* s = Find(bucket);
  return s == nullptr ? 0 : s->eager;
}

void GraphRunner::InvalidateAll() {
  for (auto& s : slots_) {
    if (s->state != BucketState::kCaptured) continue;
    s->graph.reset();
    s->state = BucketState::kInvalid;
  }
}

absl::StatusOr<GraphCaptureReport> GraphRunner::CaptureAll() {
  GraphCaptureReport report;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const int b = buckets_[i];
    if (b < 1 || b > model_.max_step_seqs() || b > model_.max_step_tokens() || (i > 0 && b <= buckets_[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("graph buckets must ascend within [1, ", model_.max_step_seqs(),
                                                     "] (the planned sequences per step); bucket ", b, " does not"));
    }
  }
  if (device_ == nullptr) return report;  // eager only: nothing to capture
  absl::StatusOr<kernels::DeviceMemory> before = device_->Memory();
  const absl::Time t_all = absl::Now();
  // Phase marks are host calls recorded nowhere in a graph: detach the hook while capturing.
  model::PhaseHook* hook = model_.options().phase_hook;
  model_.SetPhaseHook(nullptr);
  absl::Status failed;
  for (auto& slot : slots_) {
    if (slot->state == BucketState::kCaptured) continue;
    const model::StepShape shape = model::StepShape::Decode(slot->bucket);
    const absl::Time t0 = absl::Now();
    // The warm-up runs every launch of the shape once (lazy module loading, NCCL connections, launch plans) before
    // anything is recorded; an all-padding plan touches no sequence's cache or state.
    failed = model_.PrepareStep({}, shape);
    if (failed.ok()) failed = model_.EnqueueStep(shape, /*sample=*/true);
    if (failed.ok()) failed = model_.FinishStep(nullptr, 0);
    if (!failed.ok()) {
      failed = absl::Status(failed.code(), absl::StrCat("graph bucket ", slot->bucket, ": warm-up step failed: ",
                                                        failed.message()));
      break;
    }
    const absl::Time t1 = absl::Now();
    absl::StatusOr<std::unique_ptr<kernels::StepGraph>> graph =
        device_->Capture([this, shape] { return model_.EnqueueStep(shape, /*sample=*/true); });
    if (!graph.ok()) {
      failed = absl::Status(graph.status().code(), absl::StrCat("graph bucket ", slot->bucket, " (", shape.tokens,
                                                                " tokens): ", graph.status().message()));
      break;
    }
    slot->graph = std::move(*graph);
    slot->state = BucketState::kCaptured;
    const GraphCaptureReport::Bucket done{.bucket = slot->bucket,
                                          .warm_up_seconds = absl::ToDoubleSeconds(t1 - t0),
                                          .capture_seconds = absl::ToDoubleSeconds(absl::Now() - t1),
                                          .nodes = slot->graph->nodes()};
    DSV4_LOG_INFO("cuda graph of decode bucket {}: captured in {:.1f} ms (warm-up {:.1f} ms), {} nodes", done.bucket,
                  done.capture_seconds * 1e3, done.warm_up_seconds * 1e3, done.nodes);
    report.buckets.push_back(done);
  }
  model_.SetPhaseHook(hook);
  DSV4_RETURN_IF_ERROR(failed);
  report.seconds = absl::ToDoubleSeconds(absl::Now() - t_all);
  absl::StatusOr<kernels::DeviceMemory> after = device_->Memory();
  if (before.ok() && after.ok()) report.device_bytes = std::max<int64_t>(0, before->free - after->free);
  return report;
}

absl::Status GraphRunner::RunDecode(std::span<const model::SeqChunk> chunks, float* logits, bool eager) {
  return Run(chunks, {}, logits, nullptr, eager);
}

absl::Status GraphRunner::RunDecodeSample(std::span<const model::SeqChunk> chunks,
                                          std::span<const kernels::SampleParams> sampling, int32_t* tokens,
                                          bool eager) {
  return Run(chunks, sampling, nullptr, tokens, eager);
}

absl::Status GraphRunner::Run(std::span<const model::SeqChunk> chunks, std::span<const kernels::SampleParams> sampling,
                              float* logits, int32_t* tokens, bool eager) {
  const int bucket = BucketFor(static_cast<int64_t>(chunks.size()));
  Slot* slot = Find(bucket);
  if (slot == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("decode step of ", chunks.size(), " sequences is above the largest ",
                                                   "graph bucket ", buckets_.empty() ? 0 : buckets_.back()));
  }
  const model::StepShape shape = model::StepShape::Decode(bucket);
  const absl::Time t0 = absl::Now();
  DSV4_RETURN_IF_ERROR(model_.PrepareStep(chunks, shape, sampling));
  const absl::Time t1 = absl::Now();
  if (!eager && slot->state == BucketState::kCaptured) {
    DSV4_RETURN_IF_ERROR(device_->Launch(*slot->graph));
    ++slot->replays;
  } else {
    DSV4_RETURN_IF_ERROR(model_.EnqueueStep(shape, /*sample=*/true));
    ++slot->eager;
  }
  const absl::Time t2 = absl::Now();
  const int64_t rows = static_cast<int64_t>(chunks.size());
  const absl::Status finished =
      tokens != nullptr ? model_.FinishStepTokens(tokens, rows) : model_.FinishStep(logits, rows);
  last_ = {.prepare_s = absl::ToDoubleSeconds(t1 - t0), .launch_s = absl::ToDoubleSeconds(t2 - t1),
           .finish_s = absl::ToDoubleSeconds(absl::Now() - t2)};
  return finished;
}

}  // namespace dsv4::worker
