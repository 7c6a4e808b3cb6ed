// NcclCommunicator: the GPU implementation of Communicator (built only when DSV4_HAVE_CUDA).
//
// Buffers are DEVICE pointers on options.device. Collectives are enqueued on the communicator's stream; with
// wait_each_call (the default) each call then waits for the stream, polling ncclCommGetAsyncError, until the
// deadline, so a dead or hung peer ends in ncclCommAbort and UNAVAILABLE instead of a hang. An engine that
// captures a step into a CUDA graph sets wait_each_call = false (nothing may synchronise during capture) and
// calls Synchronize() after launching the graph, which applies the same deadline.
//
// The communicator is created non-blocking (ncclConfig_t.blocking = 0) so start-up can time out too: a rank that
// never arrives leaves ncclCommInitRankConfig in progress, and Create aborts it at options.comm.startup_timeout.
// Create sets NCCL_NVLS_ENABLE=0 in the process environment before initialising (NVLink SHARP multicast is
// disabled on the machines this runs on).
//
// The control plane (step plans, heartbeats) does not use NCCL: a GPU group also forms a GlooCommunicator and
// broadcasts plans through it (docs/tensor-parallel.md), so this class carries only activation collectives.
//
// bf16: widened to fp32 in a device scratch buffer, summed with ncclFloat, rounded back once (as Gloo does), so
// both backends give the same result; NCCL's native bf16 sum would round at every ring hop.
//
// Threading: one thread at a time (the engine thread that owns the device and the stream).
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace dsv4::comm {

struct NcclOptions {
  CommOptions comm;
  int device = 0;              // CUDA device of this rank
  void* stream = nullptr;      // cudaStream_t to run collectives on; null: the communicator creates its own
  bool wait_each_call = true;  // false under CUDA-graph capture: the caller calls Synchronize()
};

class NcclCommunicator final : public Communicator {
 public:
  // The leader's unique id (128 bytes) for RendezvousResponse.nccl_unique_id. Needs a CUDA driver.
  static absl::StatusOr<std::string> NewUniqueId();
  // Joins the group identified by unique_id (the leader's NewUniqueId bytes).
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(int rank, int world, const std::string& unique_id,
                                                                  const NcclOptions& options);
  // Number of CUDA devices visible to this process (0 when there is no driver or no GPU).
  static int DeviceCount();
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string_view backend() const override { return "nccl"; }

  absl::Status AllReduceSum(float* data, size_t n) override;
  absl::Status AllReduceSumBf16(uint16_t* data, size_t n) override;
  absl::Status AllGather(const void* send, void* recv, size_t bytes_per_rank) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override;
  // Waits for every collective enqueued so far, with the collective deadline.
  absl::Status Synchronize();
  // From now on enqueues on `stream` (a cudaStream_t of this rank's device; the CUDA backend's, so collectives are
  // ordered with its kernels and recorded into its graphs) and, when wait_each_call is false, returns from each
  // collective without waiting: the caller calls Synchronize() before it reads results. Call between collectives,
  // never during a capture. The stream stays the caller's (not destroyed here).
  void UseStream(void* stream, bool wait_each_call);

 private:
  struct State;
  NcclCommunicator(int rank, int world, NcclOptions options, std::unique_ptr<State> state);
  absl::Status Fail(const std::string& op, const std::string& what);
  // Checks an enqueue result; ncclInProgress (non-blocking communicator) is polled until done or the deadline.
  absl::Status CheckEnqueue(const std::string& op, int nccl_result);
  // CheckEnqueue, then (if wait_each_call) waits for the stream.
  absl::Status Finish(const std::string& op, int nccl_result);
  absl::Status WaitStream(const std::string& op);

  const int rank_;
  const int world_;
  NcclOptions options_;
  std::unique_ptr<State> state_;
  absl::Status broken_;
};

}  // namespace dsv4::comm
