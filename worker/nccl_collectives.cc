// NcclCollectives: see nccl_collectives.h.
#include "worker/nccl_collectives.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/device_control.h"

namespace dsv4::worker {

absl::StatusOr<std::unique_ptr<NcclCollectives>> NcclCollectives::Create(comm::NcclCommunicator* comm,
                                                                         kernels::Backend* backend,
                                                                         model::ShardLayout layout) {
  kernels::DeviceControl* device = backend->device_control();
  if (device == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL collectives need a device backend; backend ", backend->name(), " has none"));
  }
  if (layout.spec.rank != comm->rank() || layout.spec.world != comm->world()) {
    return absl::InvalidArgumentError("NcclCollectives: shard layout is for another rank or world");
  }
  comm->UseStream(device->stream(), /*wait_each_call=*/false);
  return std::unique_ptr<NcclCollectives>(new NcclCollectives(comm, backend, device->stream(), layout));
}

absl::Status NcclCollectives::Reserve(int64_t max_rows) {
  if (max_rows <= reserved_rows_) return absl::OkStatus();
  const int64_t slot = layout_.vocab_slot, world = comm_->world();
  send_.Reset();
  recv_.Reset();
  reserved_rows_ = 0;
  DSV4_ASSIGN_OR_RETURN(send_, backend_->Allocate(max_rows * slot * 4, kernels::MemoryKind::kWorkspace));
  DSV4_ASSIGN_OR_RETURN(recv_, backend_->Allocate(world * max_rows * slot * 4, kernels::MemoryKind::kWorkspace));
  reserved_rows_ = max_rows;
  return absl::OkStatus();
}

absl::Status NcclCollectives::AllReduceSum(float* data, int64_t n) {
  return comm_->AllReduceSum(data, static_cast<size_t>(n));
}

absl::Status NcclCollectives::GatherVocab(const float* local, int64_t rows, int64_t vocab, float* full) {
  const int64_t slot = layout_.vocab_slot, world = comm_->world(), mine = layout_.vocab.size;
  if (slot * world < vocab) return absl::InvalidArgumentError("GatherVocab: layout does not cover the vocabulary");
  if (rows > reserved_rows_) {
    return absl::FailedPreconditionError(absl::StrCat("GatherVocab: ", rows, " rows, buffers reserved for ",
                                                      reserved_rows_, " (NcclCollectives::Reserve)"));
  }
  if (rows == 0) return absl::OkStatus();
  auto stream = static_cast<cudaStream_t>(stream_);
  const float* send = local;
  if (mine != slot) {  // this rank's block is narrower than the slot (the last rank): pad it to [rows, slot]
    DSV4_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(send_.data(), slot * 4, local, mine * 4, mine * 4, rows,
                                                cudaMemcpyDeviceToDevice, stream));
    send = send_.as<const float>();
  }
  float* recv = recv_.as<float>();
  DSV4_RETURN_IF_ERROR(comm_->AllGather(send, recv, static_cast<size_t>(rows * slot * 4)));
  for (int64_t t = 0; t < world; ++t) {
    const int64_t begin = t * slot, width = std::max<int64_t>(0, std::min(vocab, begin + slot) - begin);
    if (width == 0) continue;
    DSV4_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(full + begin, vocab * 4, recv + t * rows * slot, slot * 4, width * 4,
                                                rows, cudaMemcpyDeviceToDevice, stream));
  }
  return absl::OkStatus();
}

absl::Status NcclCollectives::Flush() { return comm_->Synchronize(); }

}  // namespace dsv4::worker
