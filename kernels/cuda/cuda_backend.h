// The CUDA backend (GPU-ENGINE.md, docs/cuda-backend.md): device memory counted by kind (cudaMalloc; pinned host
// memory for kHostStaging), one non-blocking stream owned by the backend on which every op and copy is
// enqueued in order, weights prepared into device memory in their checkpoint formats, and the op families'
// scratch sized once by Reserve. Errors of launches and of the stream surface from Synchronize / CopyToHost.
//
// Threading: the backend, its ops and everything it returns are used by one thread at a time (the engine
// thread); each entry point makes the backend's device current on the calling thread.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/launchers.h"
#include "kernels/sparse_mla/sparse_mla_launch.h"

namespace dsv4::kernels::cuda {

class CudaBackend final : public Backend {
 public:
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return name_; }
  Ops& ops() override { return ops_; }
  absl::Status Reserve(const StepLimits& limits) override;
  absl::StatusOr<Buffer> Allocate(int64_t bytes, MemoryKind kind) override;
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override;
  absl::Status Synchronize() override;
  absl::StatusOr<LinearHandle> PrepareLinear(const WeightView& w) override;
  absl::StatusOr<ExpertsHandle> PrepareExperts(std::span<const WeightView> w1, std::span<const WeightView> w3,
                                               std::span<const WeightView> w2) override;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  // The scratch Reserve sized (empty before the first Reserve).
  const CudaScratchSet& scratch() const { return scratch_; }

 private:
  friend absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device, sparse_mla::SparseMlaKernel attention);
  CudaBackend(int device, cudaStream_t stream, std::string name, sparse_mla::SparseMlaKernel attention);

  void Free(void* data, int64_t bytes, MemoryKind kind) override;
  // Makes device_ current on the calling thread.
  absl::Status Bind() const;
  // Grows one family's scratch to `bytes` (never shrinks).
  absl::Status GrowScratch(Buffer& buffer, CudaScratch& scratch, int64_t bytes);

  const int device_;
  cudaStream_t stream_;
  const std::string name_;
  CudaScratchSet scratch_;
  CudaOps ops_;
  Buffer moe_scratch_, attention_scratch_, indexer_scratch_;
  const sparse_mla::SparseMlaKernel attention_kernel_;            // --attention-kernel: mma | simt
  std::shared_ptr<const AttentionPlan> attention_plan_;           // made at Reserve, before any capture
};

// The backend on CUDA device `device`: fails when the device does not exist or cannot run this build's
// kernels (the build targets sm_90 and sm_120). `attention` picks the sparse-MLA decode kernel of the FP8 attention
// path: the tensor-core MMA kernel (default) or the per-head SIMT baseline.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    int device, sparse_mla::SparseMlaKernel attention = sparse_mla::SparseMlaKernel::kMma);

}  // namespace dsv4::kernels::cuda
