// Decode time by phase for dsv4-decode-bench, under CUDA-graph replay as well as eagerly: a model::PhaseHook that
// records one CUDA event per phase boundary with cudaEventRecordWithFlags(cudaEventRecordExternal). Recorded
// while the stream captures a graph, each becomes an event-record node of the graph (GPU-ENGINE.md §4: "a second,
// timed graph"), so replaying that graph timestamps every boundary of the real graphed step; recorded eagerly, it
// is an ordinary event. (metrics::CudaPhaseTimer, the worker's timer, deliberately skips steps being captured and
// so cannot time a replay; the phase marks are the same model::Phase marks it receives.) On the CPU backend, whose
// ops run synchronously, the host clock is read instead.
//
// One recorder per captured graph: its events are baked into that graph's nodes. Read() after the step has
// completed (the caller synchronised): milliseconds per phase over the intervals between consecutive marks.
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "model/dsv4/hooks.h"

namespace dsv4::bench {

inline constexpr int kNumModelPhases = 6;  // model::Phase: attention, moe, dense, comm, other, indexer
using PhaseMs = std::array<double, kNumModelPhases>;

class PhaseRecorder final : public model::PhaseHook {
 public:
  // stream: the backend's cudaStream_t (DeviceControl::stream()); null: host clock.
  static absl::StatusOr<std::unique_ptr<PhaseRecorder>> Make(void* stream, int max_marks = 8192);
  ~PhaseRecorder() override;

  void Begin(model::Phase p) override;
  void End() override;
  // Forgets the marks (before an eager step; not between the replays of a graph it was captured into).
  void Reset();
  // Milliseconds per phase of the last step (or replay); fails when a mark failed or was cut off.
  absl::StatusOr<PhaseMs> Read() const;
  int marks() const { return used_; }

 private:
  explicit PhaseRecorder(void* stream) : stream_(stream) {}
  void Mark(int label);

  void* stream_;
  std::vector<void*> events_;  // cudaEvent_t
  std::vector<std::chrono::steady_clock::time_point> times_;
  std::vector<int> labels_;    // labels_[i]: phase of the interval mark i .. mark i + 1
  int used_ = 0;
  int open_ = -1;
  bool failed_ = false;
};

}  // namespace dsv4::bench
