// The model's tensor-parallel collectives on the GPU (model/dsv4/hooks.h over comm::NcclCommunicator): device
// buffers, enqueued on the CUDA backend's stream so they are ordered with its kernels and recorded into its step
// graphs (worker/graph_runner.h) - no call waits, so a step with collectives is capturable. Flush waits for the
// stream within the group's collective deadline (a dead or hung peer aborts the communicator: UNAVAILABLE, the
// leader's lock-step wrapper turns the group NOT_SERVING) and is called by the model before it copies results out.
//
//   AllReduceSum  ncclAllReduce in place (after the attention output projection and after the MoE)
//   GatherVocab   local [rows, Vr] -> padded send [rows, slot] (a 2-D device copy, only where Vr < slot)
//                 -> ncclAllGather -> [world][rows, slot] -> full [rows, V] by one 2-D copy per rank
//
// NCCL_NVLS_ENABLE=0 is set by NcclCommunicator::Create (NVLink SHARP multicast stays off on these machines).
// Built only with CUDA (DSV4_HAVE_NCCL); the CPU build uses CommCollectives over Gloo (model_hooks.h).
//
// Threads: the engine thread (the one that owns the backend's stream), like the model.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/nccl_communicator.h"
#include "kernels/backend.h"
#include "model/dsv4/hooks.h"
#include "model/dsv4/shard.h"

namespace dsv4::worker {

class NcclCollectives final : public model::Collectives {
 public:
  // Moves `comm`'s collectives onto `backend`'s stream (no per-call wait). `comm` and `backend` (a CUDA backend:
  // FailedPrecondition otherwise) must outlive the object; `layout` is this rank's.
  static absl::StatusOr<std::unique_ptr<NcclCollectives>> Create(comm::NcclCommunicator* comm,
                                                                 kernels::Backend* backend, model::ShardLayout layout);
  int rank() const override { return comm_->rank(); }
  int world() const override { return comm_->world(); }
  absl::Status AllReduceSum(float* data, int64_t n) override;
  // rows must be <= the rows Reserve sized for (the model's head pass: Dsv4Model::max_head_rows).
  absl::Status GatherVocab(const float* local, int64_t rows, int64_t vocab, float* full) override;
  absl::Status Flush() override;
  // Sizes the gather's device buffers for head passes of up to max_rows rows (backend workspace memory, counted).
  // Call outside any step and capture (after AllocateCache).
  absl::Status Reserve(int64_t max_rows);

 private:
  NcclCollectives(comm::NcclCommunicator* comm, kernels::Backend* backend, void* stream, model::ShardLayout layout)
      : comm_(comm), backend_(backend), stream_(stream), layout_(layout) {}

  comm::NcclCommunicator* comm_;
  kernels::Backend* backend_;
  void* stream_;  // cudaStream_t
  model::ShardLayout layout_;
  int64_t reserved_rows_ = 0;
  kernels::Buffer send_, recv_;  // [rows, slot], [world, rows, slot] floats
};

}  // namespace dsv4::worker
