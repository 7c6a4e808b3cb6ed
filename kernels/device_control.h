// What a device backend offers a server beyond Backend (optional: Backend::device_control() is null for the CPU
// backend): CUDA graphs of whole steps, the device's memory for start-up planning, and its stream for the libraries
// that enqueue work on it (NCCL collectives, CUDA-event phase timing). worker/ uses it (worker/graph_runner.h,
// worker/nccl_collectives.h); model/ never does, so the model stays free of any device API.
//
// Threading: like the Backend it belongs to, used by one thread at a time (the engine thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dsv4::kernels {

// One captured and instantiated step (a CUDA graph executable). Destroying it frees the executable; it must not
// outlive the backend nor the buffers its nodes point at.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  virtual int64_t nodes() const = 0;  // kernel, copy and memset nodes recorded
};

struct DeviceMemory {
  int64_t total = 0;  // bytes of the device
  int64_t free = 0;   // bytes free on the device now (all processes' allocations counted)
};

class DeviceControl {
 public:
  virtual ~DeviceControl() = default;
  // The device's memory now.
  virtual absl::StatusOr<DeviceMemory> Memory() = 0;
  // The stream every op and copy of the backend is enqueued on (a cudaStream_t): NCCL collectives and phase-timer
  // events go on it so they are ordered with the ops and captured with them.
  virtual void* stream() = 0;
  // Records what `enqueue` puts on the stream - without running it - and instantiates the graph. Nothing is
  // executed, so enqueue must neither synchronise, nor allocate, nor read results on the host; a launch refused or
  // failed during the capture, or an error of enqueue itself, fails the capture (and leaves the stream usable).
  virtual absl::StatusOr<std::unique_ptr<StepGraph>> Capture(const std::function<absl::Status()>& enqueue) = 0;
  // Enqueues one replay of the graph on the stream; execution errors surface at Backend::Synchronize.
  virtual absl::Status Launch(StepGraph& graph) = 0;
};

}  // namespace dsv4::kernels
