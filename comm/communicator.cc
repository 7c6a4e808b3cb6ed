// LocalCommunicator and the helpers shared by every communicator.
#include "comm/communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dsv4::comm {

absl::Status LocalCommunicator::AllReduceSum(float* data, size_t n) {
  if (data == nullptr && n > 0) return absl::InvalidArgumentError("AllReduceSum: null data with n > 0");
  return absl::OkStatus();
}

absl::Status LocalCommunicator::AllReduceSumBf16(uint16_t* data, size_t n) {
  if (data == nullptr && n > 0) return absl::InvalidArgumentError("AllReduceSumBf16: null data with n > 0");
  return absl::OkStatus();
}

absl::Status LocalCommunicator::AllGather(const void* send, void* recv, size_t bytes_per_rank) {
  if (bytes_per_rank == 0) return absl::OkStatus();
  if (send == nullptr || recv == nullptr) return absl::InvalidArgumentError("AllGather: null buffer");
  if (send != recv) std::memmove(recv, send, bytes_per_rank);
  return absl::OkStatus();
}

absl::Status LocalCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (root != 0) return absl::InvalidArgumentError(absl::StrCat("Broadcast: root ", root, " outside world 1"));
  if (data == nullptr && bytes > 0) return absl::InvalidArgumentError("Broadcast: null data with bytes > 0");
  return absl::OkStatus();
}

absl::Status BroadcastBytes(Communicator& comm, std::string* bytes, int root, size_t max_bytes) {
  if (comm.backend() == "nccl") {
    return absl::InvalidArgumentError("BroadcastBytes needs a host communicator (local or gloo), not nccl");
  }
  if (root < 0 || root >= comm.world()) {
    return absl::InvalidArgumentError(absl::StrCat("BroadcastBytes: root ", root, " outside world ", comm.world()));
  }
  uint64_t len = comm.rank() == root ? bytes->size() : 0;
  if (comm.rank() == root && len > max_bytes) {
    // The root still sends the length so followers fail the same way instead of waiting for a payload.
    len = UINT64_MAX;
  }
  DSV4_RETURN_IF_ERROR(comm.Broadcast(&len, sizeof(len), root));
  if (len > max_bytes) {
    const std::string size = comm.rank() == root ? absl::StrCat(bytes->size()) : "oversized";
    return absl::InvalidArgumentError(absl::StrCat("BroadcastBytes: root ", root, "'s message (", size,
                                                   " bytes) exceeds the limit of ", max_bytes, " bytes"));
  }
  if (comm.rank() != root) bytes->resize(len);
  if (len == 0) return absl::OkStatus();
  return comm.Broadcast(bytes->data(), len, root);
}

}  // namespace dsv4::comm
