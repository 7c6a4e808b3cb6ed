// CPU phase timer (steady clock) and the ServingMetrics sink; see metrics/phase_timer.h.
#include "metrics/phase_timer.h"

#include <array>
#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dsv4::metrics {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

class CpuPhaseTimer final : public PhaseTimer {
 public:
  CpuPhaseTimer(PhaseSink sink, int sample_every) : sink_(std::move(sink)), sample_every_(sample_every) {}

  void BeginStep() override {
    // The first step is sampled, then every sample_every-th: short runs still report something.
    sampling_ = (step_++ % sample_every_) == 0;
    open_ = -1;
    sums_.fill(0.0);
    if (sampling_) step_start_ = Clock::now();
  }

  void Begin(Phase p) override {
    if (!sampling_) return;
    const Clock::time_point now = Clock::now();
    Close(now);
    open_ = static_cast<int>(p);
    phase_start_ = now;
  }

  void End(Phase p) override {
    if (!sampling_ || open_ != static_cast<int>(p)) return;
    Close(Clock::now());
  }

  void EndStep() override {
    if (!sampling_) return;
    const Clock::time_point now = Clock::now();
    Close(now);
    // Whatever the step spent outside every phase is "other", so the phases add up to the step.
    double inside = 0;
    for (double s : sums_) inside += s;
    const double outside = Seconds(step_start_, now) - inside;
    if (outside > 0) sums_[static_cast<int>(Phase::kOther)] += outside;
    for (int i = 0; i < kNumPhases; ++i) {
      if (sums_[i] > 0) sink_(static_cast<Phase>(i), sums_[i]);
    }
    ++reported_;
    sampling_ = false;
  }

  bool sampling() const override { return sampling_; }
  int64_t steps_reported() const override { return reported_; }

 private:
  void Close(Clock::time_point now) {
    if (open_ < 0) return;
    sums_[open_] += Seconds(phase_start_, now);
    open_ = -1;
  }

  PhaseSink sink_;
  const int sample_every_;
  int64_t step_ = 0;
  int64_t reported_ = 0;
  bool sampling_ = false;
  int open_ = -1;  // the open phase, -1 if none
  Clock::time_point step_start_;
  Clock::time_point phase_start_;
  std::array<double, kNumPhases> sums_ = {};
};

}  // namespace

PhaseSink SinkTo(ServingMetrics* metrics) {
  return [metrics](Phase p, double s) { metrics->AddPhaseSeconds(p, s); };
}

absl::StatusOr<std::unique_ptr<PhaseTimer>> MakeCpuPhaseTimer(PhaseSink sink, const PhaseTimerOptions& options) {
  if (options.sample_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("phase timing sample_every must be >= 1, got ", options.sample_every));
  }
  if (!sink) return absl::InvalidArgumentError("phase timer needs a sink");
  return std::unique_ptr<PhaseTimer>(new CpuPhaseTimer(std::move(sink), options.sample_every));
}

}  // namespace dsv4::metrics
