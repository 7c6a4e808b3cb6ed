// The backend seam: what the model needs from a compute backend besides the ops themselves - memory with
// byte accounting, copies between host and backend memory, one ordered stream of work with a sync point,
// and weight preparation. The model receives a Backend from outside (the worker or a tool constructs it);
// model/ never names a concrete backend. docs/backend.md says who owns which memory and what may happen
// inside a step.
//
// Threading: a Backend and everything it returns are used by one thread at a time (the engine thread).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "kernels/weights.h"

namespace dsv4::kernels {

// What an allocation is for (the start-up memory table reports bytes per kind).
enum class MemoryKind { kWeights = 0, kKvCache, kState, kWorkspace, kHostStaging };
inline constexpr int kNumMemoryKinds = 5;
const char* MemoryKindName(MemoryKind kind);

class Backend;
class DeviceControl;  // kernels/device_control.h

// The largest step the model will run and the model sizes the ops depend on. Backend::Reserve sizes every
// op's scratch (and plans launch configurations) for it once, before any step or graph capture, so that no
// op allocates afterwards.
struct StepLimits {
  int64_t max_tokens = 0;     // T of the largest step
  int64_t max_seqs = 0;       // B of the largest step
  int64_t max_context = 0;    // positions per sequence (bounds compressed rows and indexer rows)
  int64_t hidden = 0;         // D
  int64_t hc_mult = 4;        // S
  int64_t heads = 0;          // H held by this rank
  int64_t head_dim = 512;     // Dh
  int64_t window = 128;       // W
  int64_t index_heads = 0;    // IH
  int64_t index_dim = 0;      // ID
  int64_t index_topk = 0;     // Ksel
  int64_t experts = 0;        // E (all of the model's)
  int64_t experts_per_token = 0;  // Ek
  int64_t moe_inter = 0;      // I
  int64_t shared_inter = 0;   // Is held by this rank
  int64_t vocab = 0;          // V rows of the head held by this rank
};

// Backend memory, owned; freed (and un-counted) on destruction. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* owner, void* data, int64_t bytes, MemoryKind kind)
      : owner_(owner), data_(data), bytes_(bytes), kind_(kind) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  int64_t bytes() const { return bytes_; }
  bool empty() const { return data_ == nullptr; }
  void Reset();

 private:
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::kWorkspace;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;  // "cpu", "cuda:0 (NVIDIA H200, sm_90)"
  virtual Ops& ops() = 0;
  // Sizes the ops' scratch for steps up to `limits` (may be called again with larger limits, never inside a
  // step or a capture).
  virtual absl::Status Reserve(const StepLimits& limits) = 0;

  // Zero-filled memory of `bytes` (kHostStaging: host memory the backend copies from fastest, e.g. pinned).
  virtual absl::StatusOr<Buffer> Allocate(int64_t bytes, MemoryKind kind) = 0;
  // Bytes currently held per kind.
  std::array<int64_t, kNumMemoryKinds> allocated() const { return allocated_; }

  // Copies ordered with the ops on the backend's stream. CopyToDevice's source must stay unchanged until the
  // next Synchronize (host staging buffers are reused step after step); CopyToHost waits for the copy.
  virtual absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) = 0;
  // Waits for all enqueued work; returns the first launch or execution error since the last call.
  virtual absl::Status Synchronize() = 0;

  // Weight preparation at load (the views' host memory may go away afterwards).
  virtual absl::StatusOr<LinearHandle> PrepareLinear(const WeightView& w) = 0;
  // w1/w3/w2 hold E views each; an expert this rank does not hold has a view with data == nullptr.
  virtual absl::StatusOr<ExpertsHandle> PrepareExperts(std::span<const WeightView> w1,
                                                       std::span<const WeightView> w3,
                                                       std::span<const WeightView> w2) = 0;
  // A plain fp32 tensor (norm weights, mHC parameters, sinks, ape, router bias) in backend memory.
  absl::StatusOr<Buffer> UploadF32(std::span<const float> host, MemoryKind kind = MemoryKind::kWeights);
  // An int32 table (tid2eid) in backend memory.
  absl::StatusOr<Buffer> UploadI32(std::span<const int32_t> host, MemoryKind kind = MemoryKind::kWeights);

  // Graphs, device memory and the native stream (kernels/device_control.h); null for a backend without a device.
  virtual DeviceControl* device_control() { return nullptr; }

 protected:
  friend class Buffer;
  // Releases memory Allocate returned.
  virtual void Free(void* data, int64_t bytes, MemoryKind kind) = 0;
  void Count(MemoryKind kind, int64_t bytes) { allocated_[static_cast<int>(kind)] += bytes; }

 private:
  std::array<int64_t, kNumMemoryKinds> allocated_{};
};

}  // namespace dsv4::kernels
