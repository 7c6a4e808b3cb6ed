// CudaDeviceControl: see cuda_graphs.h.
#include "kernels/cuda/cuda_graphs.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace dsv4::kernels::cuda {
namespace {

class CudaStepGraph final : public StepGraph {
 public:
  CudaStepGraph(cudaGraphExec_t exec, int64_t nodes) : exec_(exec), nodes_(nodes) {}
  CudaStepGraph(const CudaStepGraph&) = delete;
  CudaStepGraph& operator=(const CudaStepGraph&) = delete;
  ~CudaStepGraph() override { cudaGraphExecDestroy(exec_); }
  int64_t nodes() const override { return nodes_; }
  cudaGraphExec_t exec() const { return exec_; }

 private:
  cudaGraphExec_t exec_;
  int64_t nodes_;
};

}  // namespace

absl::StatusOr<DeviceMemory> CudaDeviceControl::Memory() {
  DSV4_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  size_t free = 0, total = 0;
  DSV4_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
  return DeviceMemory{.total = static_cast<int64_t>(total), .free = static_cast<int64_t>(free)};
}

absl::StatusOr<std::unique_ptr<StepGraph>> CudaDeviceControl::Capture(const std::function<absl::Status()>& enqueue) {
  DSV4_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (absl::Status before = take_error_(); !before.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("capture: a launch failed before it began: ", before.ToString()));
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  DSV4_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream_, &status));
  if (status != cudaStreamCaptureStatusNone) return absl::FailedPreconditionError("capture: the stream is capturing");
  DSV4_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  const absl::Status enqueued = enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  const absl::Status launches = take_error_();
  if (!enqueued.ok() || !launches.ok() || ended != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // capture errors are not sticky: leave nothing behind for the next call
    // The most specific first: the enqueuing code's own error, then the first refused or failed launch (an op
    // that synchronised or allocated inside the capture fails here), then what ending the capture said.
    const absl::Status end = CudaStatus(ended, "cudaStreamEndCapture");
    const absl::Status& first = !enqueued.ok() ? enqueued : !launches.ok() ? launches : end;
    return absl::Status(first.code(), absl::StrCat("capture: ", first.message(),
                                                   ended != cudaSuccess && &first != &end
                                                       ? absl::StrCat(" (then ", end.message(), ")")
                                                       : std::string()));
  }
  size_t nodes = 0;
  cudaGraphGetNodes(graph, nullptr, &nodes);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  DSV4_RETURN_IF_ERROR(CudaStatus(instantiated, "cudaGraphInstantiate"));
  auto step = std::make_unique<CudaStepGraph>(exec, static_cast<int64_t>(nodes));
  // Uploaded now, so the first replay in serving does not pay for it.
  DSV4_CUDA_RETURN_IF_ERROR(cudaGraphUpload(exec, stream_));
  DSV4_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return std::unique_ptr<StepGraph>(std::move(step));
}

absl::Status CudaDeviceControl::Launch(StepGraph& graph) {
  auto* g = dynamic_cast<CudaStepGraph*>(&graph);
  if (g == nullptr) return absl::InvalidArgumentError("graph launch: not a graph of the CUDA backend");
  DSV4_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  return CudaStatus(cudaGraphLaunch(g->exec(), stream_), "cudaGraphLaunch");
}

}  // namespace dsv4::kernels::cuda
