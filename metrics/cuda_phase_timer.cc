// CUDA-event phase timer; see metrics/phase_timer.h. Built only when DSV4_HAVE_CUDA.
//
// A sampled step records one event at each boundary (BeginStep, each Begin/End, EndStep) on the step's stream and
// labels each interval between consecutive events with the phase open during it (kOther when none). Events of
// one stream complete in order, so when the last event of a sample is complete, all are: BeginStep polls that one
// event with cudaEventQuery and, once it is done, turns the intervals into seconds per phase. Nothing here ever
// waits for the GPU inside a step; only Flush() (at shutdown) synchronizes.
#include <array>
#include <deque>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "metrics/phase_timer.h"

namespace dsv4::metrics {
namespace {

// The events of one sampled step, reused across samples.
struct Sample {
  std::vector<cudaEvent_t> events;  // created lazily, kept for reuse
  std::vector<int> labels;          // labels[i]: phase of the interval events[i] .. events[i + 1]
  int used = 0;                     // events recorded in this sample
};

class CudaPhaseTimerImpl final : public CudaPhaseTimer {
 public:
  CudaPhaseTimerImpl(PhaseSink sink, cudaStream_t stream, const PhaseTimerOptions& o)
      : sink_(std::move(sink)), stream_(stream), sample_every_(o.sample_every), max_pending_(o.max_pending) {}

  ~CudaPhaseTimerImpl() override {
    // Destroying an event whose record is still pending is allowed: CUDA frees it once it completes.
    for (auto* pool : {&pending_, &free_}) {
      for (Sample& s : *pool) {
        for (cudaEvent_t e : s.events) cudaEventDestroy(e);
      }
    }
    for (cudaEvent_t e : current_.events) cudaEventDestroy(e);
  }

  void BeginStep() override {
    sampling_ = false;
    if (failed_) return;
    // While capturing a graph, events would be graph nodes, not timestamps, and querying events may invalidate
    // the capture: neither sample nor read back.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (!Check(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing")) return;
    if (capture != cudaStreamCaptureStatusNone) return;
    Harvest();
    if (failed_ || (step_++ % sample_every_) != 0) return;
    if (static_cast<int>(pending_.size()) >= max_pending_) return;
    if (!free_.empty()) {
      current_ = std::move(free_.front());
      free_.pop_front();
    }
    current_.used = 0;
    current_.labels.clear();
    open_ = -1;
    sampling_ = Record(-1);  // the step's start; no interval ends here
  }

  void Begin(Phase p) override {
    if (!sampling_) return;
    if (!Record(open_)) return;
    open_ = static_cast<int>(p);
  }

  void End(Phase p) override {
    if (!sampling_ || open_ != static_cast<int>(p)) return;
    if (!Record(open_)) return;
    open_ = -1;
  }

  void EndStep() override {
    if (!sampling_) return;
    sampling_ = false;
    if (!Record(open_)) return;
    pending_.push_back(std::move(current_));
    current_ = Sample{};
  }

  bool sampling() const override { return sampling_; }
  int64_t steps_reported() const override { return reported_; }

  absl::Status Flush() override {
    for (Sample& s : pending_) {
      DSV4_RETURN_IF_ERROR(
          CudaStatus(cudaEventSynchronize(s.events[s.used - 1]), "phase timer: cudaEventSynchronize"));
    }
    Harvest();
    if (failed_) return absl::InternalError("phase timer disabled after a CUDA error (see log)");
    return absl::OkStatus();
  }

 private:
  // Records the next boundary event; `label` is the phase of the interval it closes (-1 for the first event).
  bool Record(int label) {
    Sample& s = current_;
    if (s.used == static_cast<int>(s.events.size())) {
      cudaEvent_t e = nullptr;
      if (!Check(cudaEventCreate(&e), "cudaEventCreate")) return sampling_ = false;
      s.events.push_back(e);
    }
    if (!Check(cudaEventRecord(s.events[s.used], stream_), "cudaEventRecord")) return sampling_ = false;
    if (s.used > 0) s.labels.push_back(label < 0 ? static_cast<int>(Phase::kOther) : label);
    ++s.used;
    return true;
  }

  // Reports every pending sample whose last event is complete, oldest first; stops at the first one not done.
  void Harvest() {
    while (!pending_.empty()) {
      Sample& s = pending_.front();
      const cudaError_t q = cudaEventQuery(s.events[s.used - 1]);
      if (q == cudaErrorNotReady) return;
      if (!Check(q, "cudaEventQuery")) return;
      std::array<double, kNumPhases> sums = {};
      for (int i = 0; i + 1 < s.used; ++i) {
        float ms = 0;
        if (!Check(cudaEventElapsedTime(&ms, s.events[i], s.events[i + 1]), "cudaEventElapsedTime")) return;
        sums[s.labels[i]] += ms * 1e-3;
      }
      for (int i = 0; i < kNumPhases; ++i) {
        if (sums[i] > 0) sink_(static_cast<Phase>(i), sums[i]);
      }
      ++reported_;
      free_.push_back(std::move(s));
      pending_.pop_front();
    }
  }

  // A CUDA error disables the timer for good (measurement must never break serving); logged once.
  bool Check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    if (!failed_) DSV4_LOG_ERROR("phase timer disabled: {}: {}", what, cudaGetErrorString(e));
    failed_ = true;
    sampling_ = false;
    while (!pending_.empty()) {  // keep the events for the destructor to free
      free_.push_back(std::move(pending_.front()));
      pending_.pop_front();
    }
    return false;
  }

  PhaseSink sink_;
  cudaStream_t stream_;
  const int sample_every_;
  const int max_pending_;
  int64_t step_ = 0;
  int64_t reported_ = 0;
  bool sampling_ = false;
  bool failed_ = false;
  int open_ = -1;
  Sample current_;
  std::deque<Sample> pending_;
  std::deque<Sample> free_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaPhaseTimer>> MakeCudaPhaseTimer(PhaseSink sink, cudaStream_t stream,
                                                                   const PhaseTimerOptions& options) {
  if (options.sample_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("phase timing sample_every must be >= 1, got ", options.sample_every));
  }
  if (options.max_pending < 1) {
    return absl::InvalidArgumentError(absl::StrCat("phase timing max_pending must be >= 1, got ", options.max_pending));
  }
  if (!sink) return absl::InvalidArgumentError("phase timer needs a sink");
  return std::unique_ptr<CudaPhaseTimer>(new CudaPhaseTimerImpl(std::move(sink), stream, options));
}

}  // namespace dsv4::metrics
