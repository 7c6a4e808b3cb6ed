// DeviceControl of the CUDA backend (kernels/device_control.h): step graphs captured on the backend's stream in
// thread-local capture mode (a forbidden call on the engine thread fails the capture; other threads - gRPC, NCCL's
// proxy - are not affected), instantiated and uploaded once, replayed with cudaGraphLaunch; memory from
// cudaMemGetInfo. Owned by CudaBackend, which hands it out through Backend::device_control().
//
// Threading: the engine thread, like the backend.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device_control.h"

namespace dsv4::kernels::cuda {

class CudaDeviceControl final : public DeviceControl {
 public:
  // take_error: the backend's first launch error since the last call (CudaOps::TakeError), so a launcher that
  // refuses its arguments during a capture fails the capture with its own message.
  CudaDeviceControl(int device, cudaStream_t stream, std::function<absl::Status()> take_error)
      : device_(device), stream_(stream), take_error_(std::move(take_error)) {}

  absl::StatusOr<DeviceMemory> Memory() override;
  void* stream() override { return stream_; }
  absl::StatusOr<std::unique_ptr<StepGraph>> Capture(const std::function<absl::Status()>& enqueue) override;
  absl::Status Launch(StepGraph& graph) override;

 private:
  const int device_;
  cudaStream_t stream_;
  std::function<absl::Status()> take_error_;
};

}  // namespace dsv4::kernels::cuda
