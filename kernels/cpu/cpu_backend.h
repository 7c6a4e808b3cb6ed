// The CPU backend: host memory, synchronous memcpy "copies", a no-op stream, weights dequantised to fp32 at
// load, and CpuOps (cpu_ops.h) as its ops. The reference every other backend is compared with, and the
// backend of the CPU service (dsv4-worker --backend cpu).
//
// Memory: Allocate returns zero-filled, 64-byte-aligned host memory, counted per MemoryKind; the ops' scratch
// is counted as kWorkspace once Reserve has sized it. Buffers and prepared weights must not outlive the
// backend that made them.
//
// Threading: one thread at a time (the engine thread), as every Backend.
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"

namespace dsv4::kernels::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int num_threads);
  ~CpuBackend() override;

  std::string name() const override;
  Ops& ops() override { return ops_; }
  CpuOps& cpu_ops() { return ops_; }
  absl::Status Reserve(const StepLimits& limits) override;

  absl::StatusOr<Buffer> Allocate(int64_t bytes, MemoryKind kind) override;
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override;
  absl::Status Synchronize() override;

  absl::StatusOr<LinearHandle> PrepareLinear(const WeightView& w) override;
  absl::StatusOr<ExpertsHandle> PrepareExperts(std::span<const WeightView> w1, std::span<const WeightView> w3,
                                               std::span<const WeightView> w2) override;

 protected:
  void Free(void* data, int64_t bytes, MemoryKind kind) override;

 private:
  // Brings the kWorkspace count in line with the ops' scratch (it grows only in Reserve or, for a caller that
  // skipped Reserve, inside an op).
  void CountScratch();

  CpuOps ops_;
  int64_t counted_scratch_ = 0;
};

// The CPU backend with a pool of num_threads threads (the caller's thread included; >= 1).
std::unique_ptr<Backend> MakeCpuBackend(int num_threads);

}  // namespace dsv4::kernels::cpu
