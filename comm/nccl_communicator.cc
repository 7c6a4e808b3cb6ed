// NcclCommunicator: see nccl_communicator.h.
#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "comm/nccl_convert.h"
#include "common/nccl_status.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace dsv4::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Polling interval while waiting for NCCL/CUDA progress; short so a collective's latency is not padded much.
constexpr auto kPollInterval = std::chrono::microseconds(20);

absl::Status CudaError(const std::string& what, cudaError_t e) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

}  // namespace

struct NcclCommunicator::State {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  bool own_stream = false;
  float* scratch = nullptr;  // bf16 widening buffer and barrier word
  size_t scratch_elems = 0;
};

int NcclCommunicator::DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

absl::StatusOr<std::string> NcclCommunicator::NewUniqueId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  DSV4_RETURN_IF_ERROR(NcclStatus(r, "ncclGetUniqueId"));
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(int rank, int world,
                                                                           const std::string& unique_id,
                                                                           const NcclOptions& options) {
  DSV4_RETURN_IF_ERROR(ValidateRankWorld(rank, world));
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl unique id must be ", NCCL_UNIQUE_ID_BYTES, " bytes, got ", unique_id.size()));
  }
  const int devices = DeviceCount();
  if (options.device < 0 || options.device >= devices) {
    return absl::FailedPreconditionError(
        absl::StrCat("nccl: CUDA device ", options.device, " requested but ", devices, " device(s) are visible"));
  }
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) return CudaError("cudaSetDevice", e);
  auto state = std::make_unique<State>();
  if (options.stream != nullptr) {
    state->stream = static_cast<cudaStream_t>(options.stream);
  } else {
    if (cudaError_t e = cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking); e != cudaSuccess) {
      return CudaError("cudaStreamCreate", e);
    }
    state->own_stream = true;
  }
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&state->comm, world, id, rank, &config);
  const auto deadline = Clock::now() + options.comm.startup_timeout;
  while (r == ncclInProgress) {
    if (Clock::now() >= deadline) {
      ncclCommAbort(state->comm);
      state->comm = nullptr;
      if (state->own_stream) cudaStreamDestroy(state->stream);
      return absl::DeadlineExceededError(absl::StrCat("rank ", rank, " of world ", world,
                                                      ": not every rank joined the NCCL communicator within ",
                                                      options.comm.startup_timeout.count(), " ms"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ncclCommGetAsyncError(state->comm, &r);
  }
  if (r != ncclSuccess) {
    if (state->comm != nullptr) ncclCommAbort(state->comm);
    if (state->own_stream) cudaStreamDestroy(state->stream);
    return NcclStatus(r, "ncclCommInitRankConfig");
  }
  DSV4_LOG_INFO("nccl: rank {} of {} on device {} connected", rank, world, options.device);
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(rank, world, options, std::move(state)));
}

NcclCommunicator::NcclCommunicator(int rank, int world, NcclOptions options, std::unique_ptr<State> state)
    : rank_(rank), world_(world), options_(options), state_(std::move(state)) {}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(options_.device);
  if (state_->comm != nullptr) {
    // Finalize flushes this rank's outstanding work and may wait for peers; with a deadline so a dead peer cannot
    // hang the destructor, then Destroy (local) or, past the deadline, Abort.
    ncclResult_t r = broken_.ok() ? ncclCommFinalize(state_->comm) : ncclInternalError;
    const auto deadline = Clock::now() + options_.comm.timeout;
    while (r == ncclInProgress && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ncclCommGetAsyncError(state_->comm, &r);
    }
    if (r == ncclSuccess) {
      ncclCommDestroy(state_->comm);
    } else {
      ncclCommAbort(state_->comm);
    }
  }
  if (state_->scratch != nullptr) cudaFree(state_->scratch);
  if (state_->own_stream) cudaStreamDestroy(state_->stream);
}

absl::Status NcclCommunicator::Fail(const std::string& op, const std::string& what) {
  if (broken_.ok()) {
    broken_ = absl::UnavailableError(absl::StrCat("nccl ", op, " failed on rank ", rank_, " of world ", world_,
                                                  ": ", what, " (the worker group must be re-formed)"));
    DSV4_LOG_ERROR("{}", broken_.ToString());
    if (state_->comm != nullptr) {
      ncclCommAbort(state_->comm);  // unblocks the kernels still waiting on the dead peer
      state_->comm = nullptr;
    }
  }
  return broken_;
}

absl::Status NcclCommunicator::WaitStream(const std::string& op) {
  const auto deadline = Clock::now() + options_.comm.timeout;
  while (true) {
    const cudaError_t e = cudaStreamQuery(state_->stream);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) return Fail(op, absl::StrCat("CUDA: ", cudaGetErrorString(e)));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(state_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) return Fail(op, ncclGetErrorString(async));
    if (Clock::now() >= deadline) {
      return Fail(op, absl::StrCat("no progress within ", options_.comm.timeout.count(), " ms (peer dead or hung)"));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

absl::Status NcclCommunicator::CheckEnqueue(const std::string& op, int nccl_result) {
  ncclResult_t r = static_cast<ncclResult_t>(nccl_result);
  const auto deadline = Clock::now() + options_.comm.timeout;
  while (r == ncclInProgress) {  // non-blocking communicator: the enqueue itself may still be in progress
    if (Clock::now() >= deadline) return Fail(op, "enqueue did not complete before the deadline");
    std::this_thread::sleep_for(kPollInterval);
    ncclCommGetAsyncError(state_->comm, &r);
  }
  if (r != ncclSuccess) return Fail(op, ncclGetErrorString(r));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Finish(const std::string& op, int nccl_result) {
  DSV4_RETURN_IF_ERROR(CheckEnqueue(op, nccl_result));
  return options_.wait_each_call ? WaitStream(op) : absl::OkStatus();
}

absl::Status NcclCommunicator::Synchronize() {
  if (!broken_.ok()) return broken_;
  cudaSetDevice(options_.device);
  return WaitStream("Synchronize");
}

void NcclCommunicator::UseStream(void* stream, bool wait_each_call) {
  if (state_->own_stream) {
    cudaSetDevice(options_.device);
    cudaStreamSynchronize(state_->stream);  // nothing of ours may still run on the stream we give up
    cudaStreamDestroy(state_->stream);
    state_->own_stream = false;
  }
  state_->stream = static_cast<cudaStream_t>(stream);
  options_.stream = stream;
  options_.wait_each_call = wait_each_call;
}

absl::Status NcclCommunicator::AllReduceSum(float* data, size_t n) {
  if (!broken_.ok()) return broken_;
  if (n == 0) return absl::OkStatus();
  if (data == nullptr) return absl::InvalidArgumentError("AllReduceSum: null data with n > 0");
  cudaSetDevice(options_.device);
  return Finish("AllReduceSum", ncclAllReduce(data, data, n, ncclFloat, ncclSum, state_->comm, state_->stream));
}

absl::Status NcclCommunicator::AllReduceSumBf16(uint16_t* data, size_t n) {
  if (!broken_.ok()) return broken_;
  if (n == 0) return absl::OkStatus();
  if (data == nullptr) return absl::InvalidArgumentError("AllReduceSumBf16: null data with n > 0");
  cudaSetDevice(options_.device);
  if (state_->scratch_elems < n) {
    // Grows outside any graph capture: the engine's warm-up runs every collective size once before capturing.
    if (state_->scratch != nullptr) cudaFree(state_->scratch);
    state_->scratch = nullptr;
    state_->scratch_elems = 0;
    if (cudaError_t e = cudaMalloc(&state_->scratch, n * sizeof(float)); e != cudaSuccess) {
      return CudaError("AllReduceSumBf16 scratch", e);
    }
    state_->scratch_elems = n;
  }
  if (int e = detail::LaunchBf16ToF32(data, state_->scratch, n, state_->stream); e != 0) {
    return Fail("AllReduceSumBf16", cudaGetErrorString(static_cast<cudaError_t>(e)));
  }
  DSV4_RETURN_IF_ERROR(CheckEnqueue("AllReduceSumBf16", ncclAllReduce(state_->scratch, state_->scratch, n, ncclFloat,
                                                                       ncclSum, state_->comm, state_->stream)));
  if (int e = detail::LaunchF32ToBf16(state_->scratch, data, n, state_->stream); e != 0) {
    return Fail("AllReduceSumBf16", cudaGetErrorString(static_cast<cudaError_t>(e)));
  }
  return options_.wait_each_call ? WaitStream("AllReduceSumBf16") : absl::OkStatus();
}

absl::Status NcclCommunicator::AllGather(const void* send, void* recv, size_t bytes_per_rank) {
  if (!broken_.ok()) return broken_;
  if (bytes_per_rank == 0) return absl::OkStatus();
  if (send == nullptr || recv == nullptr) return absl::InvalidArgumentError("AllGather: null buffer");
  cudaSetDevice(options_.device);
  return Finish("AllGather", ncclAllGather(send, recv, bytes_per_rank, ncclUint8, state_->comm, state_->stream));
}

absl::Status NcclCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (!broken_.ok()) return broken_;
  if (root < 0 || root >= world_) {
    return absl::InvalidArgumentError(absl::StrCat("Broadcast: root ", root, " outside world ", world_));
  }
  if (bytes == 0) return absl::OkStatus();
  if (data == nullptr) return absl::InvalidArgumentError("Broadcast: null data with bytes > 0");
  cudaSetDevice(options_.device);
  return Finish("Broadcast", ncclBroadcast(data, data, bytes, ncclUint8, root, state_->comm, state_->stream));
}

absl::Status NcclCommunicator::Barrier() {
  if (!broken_.ok()) return broken_;
  cudaSetDevice(options_.device);
  if (state_->scratch == nullptr) {
    if (cudaError_t e = cudaMalloc(&state_->scratch, sizeof(float)); e != cudaSuccess) {
      return CudaError("Barrier scratch", e);
    }
    state_->scratch_elems = 1;
  }
  // A one-element all-reduce completes on a rank only after every rank has contributed.
  // Always waits, even with wait_each_call off: a barrier that returns before its peers arrive is no barrier.
  DSV4_RETURN_IF_ERROR(CheckEnqueue("Barrier", ncclAllReduce(state_->scratch, state_->scratch, 1, ncclFloat, ncclSum,
                                                             state_->comm, state_->stream)));
  return WaitStream("Barrier");
}

}  // namespace dsv4::comm
