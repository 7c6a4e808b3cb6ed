// PhaseRecorder: see phase_recorder.h.
#include "bench/decode/phase_recorder.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"

namespace dsv4::bench {

absl::StatusOr<std::unique_ptr<PhaseRecorder>> PhaseRecorder::Make(void* stream, int max_marks) {
  std::unique_ptr<PhaseRecorder> r(new PhaseRecorder(stream));
  if (stream != nullptr) {
    // Created up front: nothing is allocated while a graph is being captured.
    r->events_.resize(static_cast<size_t>(max_marks), nullptr);
    for (void*& e : r->events_) {
      cudaEvent_t ev = nullptr;
      if (const cudaError_t err = cudaEventCreate(&ev); err != cudaSuccess) {
        return absl::InternalError(absl::StrCat("cudaEventCreate: ", cudaGetErrorString(err)));
      }
      e = ev;
    }
  } else {
    r->times_.resize(static_cast<size_t>(max_marks));
  }
  r->labels_.reserve(static_cast<size_t>(max_marks));
  return r;
}

PhaseRecorder::~PhaseRecorder() {
  for (void* e : events_) {
    if (e != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
}

void PhaseRecorder::Mark(int label) {
  const int capacity = static_cast<int>(stream_ != nullptr ? events_.size() : times_.size());
  if (failed_ || used_ >= capacity) {
    failed_ = true;
    return;
  }
  if (stream_ != nullptr) {
    // Capturing: an event-record node of the graph; otherwise an ordinary record.
    auto* stream = static_cast<cudaStream_t>(stream_);
    auto* event = static_cast<cudaEvent_t>(events_[used_]);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
        (capture == cudaStreamCaptureStatusActive ? cudaEventRecordWithFlags(event, stream, cudaEventRecordExternal)
                                                  : cudaEventRecord(event, stream)) != cudaSuccess) {
      failed_ = true;
      return;
    }
  } else {
    times_[used_] = std::chrono::steady_clock::now();
  }
  if (used_ > 0) labels_.push_back(label < 0 ? static_cast<int>(model::Phase::kOther) : label);
  ++used_;
}

void PhaseRecorder::Begin(model::Phase p) {
  Mark(open_);
  open_ = static_cast<int>(p);
}

void PhaseRecorder::End() {
  Mark(open_);
  open_ = -1;
}

void PhaseRecorder::Reset() {
  used_ = 0;
  open_ = -1;
  failed_ = false;
  labels_.clear();
}

absl::StatusOr<PhaseMs> PhaseRecorder::Read() const {
  if (failed_) return absl::InternalError("phase recorder: a mark failed or the marks overflowed");
  PhaseMs ms{};
  for (int i = 0; i + 1 < used_; ++i) {
    double d = 0;
    if (stream_ != nullptr) {
      float f = 0;
      const cudaError_t err = cudaEventElapsedTime(&f, static_cast<cudaEvent_t>(events_[i]),
                                                   static_cast<cudaEvent_t>(events_[i + 1]));
      if (err != cudaSuccess) return absl::InternalError(absl::StrCat("cudaEventElapsedTime: ", cudaGetErrorString(err)));
      d = f;
    } else {
      d = std::chrono::duration<double, std::milli>(times_[i + 1] - times_[i]).count();
    }
    ms[labels_[i]] += d;
  }
  return ms;
}

}  // namespace dsv4::bench
