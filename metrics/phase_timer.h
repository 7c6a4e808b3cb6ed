// Decode time by phase: the timer the engine calls around the phases of each decode step.
//
//   timer->BeginStep();               // start of a decode step (also harvests earlier GPU samples)
//   timer->Begin(Phase::kAttention);  ... attention kernels ...
//   timer->Begin(Phase::kMoe);        ... (Begin while a phase is open closes it: phases form a flat sequence)
//   timer->End(Phase::kMoe);
//   timer->EndStep();
//
// Time inside a phase goes to that phase; time in the step outside any phase goes to kOther, so the phase sums
// add up to the step time. Only 1 in sample_every steps is measured, so that the cost stays under 1% of step
// time (a sampled GPU step records two CUDA events per phase, a few microseconds of CPU each).
//
// Two implementations behind one interface:
//  - CPU (MakeCpuPhaseTimer): a monotonic clock (std::chrono::steady_clock) read at each call; right for the CPU
//    backend, whose ops run synchronously on the calling thread.
//  - CUDA (MakeCudaPhaseTimer, only when DSV4_HAVE_CUDA): CUDA events recorded on the step's stream; a sampled
//    step's events are read back at the start of a later step with cudaEventQuery, never synchronizing inside a
//    step. Steps recorded while the stream is capturing a CUDA graph are not sampled (events in a capture are
//    graph nodes, not timestamps). An engine that replays captured graphs checks sampling() after BeginStep and
//    launches a sampled step eagerly, so that its phases can be timed; other steps replay the graph as usual.
//
// Threads: a PhaseTimer belongs to the engine thread that owns the stream; it is not thread-safe. The sink is
// called on that thread (ServingMetrics::AddPhaseSeconds is thread-safe).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "metrics/serving_metrics.h"

#if defined(DSV4_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace dsv4::metrics {

// Receives measured seconds per phase; usually [&m](Phase p, double s) { m.AddPhaseSeconds(p, s); }.
using PhaseSink = std::function<void(Phase, double)>;

// A sink that feeds ServingMetrics::AddPhaseSeconds. `metrics` must outlive the timer.
PhaseSink SinkTo(ServingMetrics* metrics);

struct PhaseTimerOptions {
  // Measure 1 step in sample_every (1 = every step). Workers expose it as --phase-timing-every.
  int sample_every = 64;
  // CUDA only: sampled steps whose events are not yet complete, at most; a step is not sampled while this many
  // are pending, so a stalled stream cannot grow the event pool without bound.
  int max_pending = 4;
};

class PhaseTimer {
 public:
  virtual ~PhaseTimer() = default;
  virtual void BeginStep() = 0;
  virtual void Begin(Phase p) = 0;
  virtual void End(Phase p) = 0;  // closes p if p is open; otherwise does nothing
  virtual void EndStep() = 0;     // closes an open phase
  // Whether the current step (between BeginStep and EndStep) is being measured.
  virtual bool sampling() const = 0;
  // Measured steps handed to the sink so far (CUDA: only those already read back).
  virtual int64_t steps_reported() const = 0;
};

// sample_every must be >= 1.
absl::StatusOr<std::unique_ptr<PhaseTimer>> MakeCpuPhaseTimer(PhaseSink sink, const PhaseTimerOptions& options);

#if defined(DSV4_HAVE_CUDA)
// Records on `stream` (which the engine thread owns). Call Flush() at shutdown to wait for pending samples.
class CudaPhaseTimer : public PhaseTimer {
 public:
  // Reads back every pending sample, waiting for the stream if needed (never call inside a step).
  virtual absl::Status Flush() = 0;
};
absl::StatusOr<std::unique_ptr<CudaPhaseTimer>> MakeCudaPhaseTimer(PhaseSink sink, cudaStream_t stream,
                                                                   const PhaseTimerOptions& options);
#endif

}  // namespace dsv4::metrics
