// CUDA graphs of decode steps (GPU-ENGINE.md §1, issue 15): one graph per decode batch bucket, captured at
// start-up, replayed by every decode-only step padded to its bucket, so a decode step costs the host one plan
// copy (tokens, positions, block tables, sampling parameters), one graph launch and one copy of the sampled token
// ids (or of the logits, for a caller that samples itself). Prefill and mixed steps run eagerly.
//
// The model stays free of CUDA: a graph is Dsv4Model::EnqueueStep(StepShape::Decode(b), sample = true) recorded
// through the backend's optional DeviceControl (kernels/device_control.h). Because EnqueueStep reads everything
// that changes from step to step (tokens, positions, block tables, slots, sampling parameters) from the plan in
// device memory, a replay after PrepareStep(chunks, Decode(b), sampling) runs exactly the step an eager
// EnqueueStep would.
//
// Lifecycle of one bucket's graph (BucketState):
//
//   kNone ──CaptureAll: warm-up step (all padding, eager), capture, instantiate, upload──▶ kCaptured ◀──┐
//     │                                                                                     │  │       │
//     └─ the capture fails: CaptureAll returns the error naming    InvalidateAll: the model │  └───────┘
//        the bucket (start-up fails; health never SERVING)         re-planned its memory    │  RunDecode: plan in,
//                                                                  (AllocateCache); the     │  launch, tokens out
//                                                                  executable is freed      ▼  (replays++)
//   kInvalid ──CaptureAll again──▶ kCaptured     (meanwhile the bucket's steps run their padded plan eagerly)
//
// A step run with eager = true (one the phase timer measures) also runs the padded plan eagerly, and so does every
// step with device == null (--cuda-graphs=false): every rank of a tensor-parallel group pads the same steps to the
// same shape, so their collectives pair up whether a rank replays a graph or not, and graphs on or off compute the
// same thing. Buckets come from GraphBuckets (worker/options.h) and, in a group, from the leader.
//
// Threading: the engine thread (the one that owns the backend's stream), like the model.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device_control.h"
#include "model/dsv4/model.h"
#include "worker/model_executor.h"

namespace dsv4::worker {

class GraphRunner {
 public:
  enum class BucketState { kNone, kCaptured, kInvalid };

  // `model` and `device` must outlive the runner. device == null (a backend without graphs): nothing is captured
  // and every decode step of a bucket runs its padded plan eagerly. `buckets`: ascending, each in
  // [1, model.max_step_seqs()] (checked by CaptureAll).
  GraphRunner(model::Dsv4Model& model, kernels::DeviceControl* device, std::vector<int> buckets);
  ~GraphRunner();  // logs "cuda graphs at exit: bucket b: R replays E eager, ..."

  // Captures every bucket not captured yet, smallest first: an eager all-padding warm-up step of its shape (it
  // touches no sequence), then the capture of EnqueueStep. The model's phase hook is detached meanwhile. Logs one
  // line per bucket.
  absl::StatusOr<GraphCaptureReport> CaptureAll();
  // Frees every graph (kCaptured -> kInvalid); call when the model's memory is re-planned.
  void InvalidateAll();

  // The bucket a decode-only step of n sequences pads to (the smallest >= n); 0 when n is above every bucket.
  int BucketFor(int64_t n) const;
  // One decode-only step (every chunk one token; chunks.size() <= the largest bucket): the plan padded to its
  // bucket, then the bucket's graph replayed - or the same padded plan enqueued eagerly when `eager` or the graph
  // is not captured - and chunks.size() logit rows copied to `logits`.
  absl::Status RunDecode(std::span<const model::SeqChunk> chunks, float* logits, bool eager);
  // The same step with sampling on the device (every graph ends with the Sample op): sampling[i] is chunk i's
  // parameters, and the chunks.size() drawn token ids are what comes back (no logits leave the device).
  absl::Status RunDecodeSample(std::span<const model::SeqChunk> chunks, std::span<const kernels::SampleParams> sampling,
                               int32_t* tokens, bool eager);

  // Host wall time of the last RunDecode: packing + plan copy enqueue, graph launch (or eager enqueue), and the
  // logits copy with the wait for the device (which holds the GPU time of the step).
  struct StepTimes {
    double prepare_s = 0, launch_s = 0, finish_s = 0;
  };
  const StepTimes& last_step_times() const { return last_; }

  const std::vector<int>& buckets() const { return buckets_; }
  kernels::DeviceControl* device() const { return device_; }
  BucketState state(int bucket) const;
  int64_t replays(int bucket) const;       // graph launches of the bucket so far
  int64_t eager_steps(int bucket) const;   // steps of the bucket run eagerly so far

 private:
  struct Slot;
  Slot* Find(int bucket) const;
  absl::Status Run(std::span<const model::SeqChunk> chunks, std::span<const kernels::SampleParams> sampling,
                   float* logits, int32_t* tokens, bool eager);

  model::Dsv4Model& model_;
  kernels::DeviceControl* device_;
  std::vector<int> buckets_;
  std::vector<std::unique_ptr<Slot>> slots_;  // one per bucket, same order
  StepTimes last_;
};

}  // namespace dsv4::worker
