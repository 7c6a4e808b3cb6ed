// The collective-communication interface of a worker group (tensor parallelism, ARCHITECTURE.md §1, §3).
//
// A worker group is `world` processes, one per GPU (or CPU worker), that run each step in lock-step. Model code
// calls AllReduceSum after the attention output projection and after the MoE; the leader Broadcasts each step's
// plan; the LM head's vocabulary shards are combined with AllGather. Three implementations:
//   LocalCommunicator  world 1, in-process: every collective is the identity (no copies, never fails).
//   GlooCommunicator   CPU groups: TCP (loopback in tests, real addresses in deployment), comm/gloo_communicator.h.
//   NcclCommunicator   GPU groups: device buffers, comm/nccl_communicator.h (built when DSV4_HAVE_CUDA).
//
// Failure model: every collective has a deadline (CommOptions::timeout). A peer that dies makes its neighbours'
// collectives fail with UNAVAILABLE as soon as the transport notices (a closed socket on TCP: milliseconds), and a
// peer that hangs makes them fail at the deadline; nothing blocks forever. After the first failure the
// communicator is broken for good: it tears down its connections (so the failure cascades to every other rank
// promptly) and returns the same UNAVAILABLE status from every later call. The group must be re-formed.
//
// Threading: a communicator is used by one thread at a time (the engine thread), and every rank must issue the
// same collectives with the same sizes in the same order.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/rank_world.h"

namespace dsv4::comm {

struct CommOptions {
  // Deadline of one collective. A lock-step group waits at each collective for its slowest rank, so this bounds
  // the longest compute between two collectives as well as a hung peer's detection time.
  std::chrono::milliseconds timeout{30'000};
  // Deadline for all ranks to arrive when the group forms (start-up).
  std::chrono::milliseconds startup_timeout{60'000};
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world() const = 0;
  // "local", "gloo" or "nccl": where the buffers passed to the collectives must live (host for local and gloo,
  // device memory for nccl).
  virtual std::string_view backend() const = 0;

  // data[n] <- sum over ranks of data[n], in place. Every rank ends with bit-identical results.
  virtual absl::Status AllReduceSum(float* data, size_t n) = 0;
  // bf16 values (uint16 storage) summed in fp32 and rounded to bf16 once at the end (round-to-nearest-even).
  virtual absl::Status AllReduceSumBf16(uint16_t* data, size_t n) = 0;
  // recv[world * bytes_per_rank] <- the concatenation of every rank's send[bytes_per_rank], rank-major.
  // send and recv must not overlap.
  virtual absl::Status AllGather(const void* send, void* recv, size_t bytes_per_rank) = 0;
  // data[bytes] on every rank <- data[bytes] of `root`. Every rank must pass the same `bytes`.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;
  // Returns once every rank has entered the barrier (or with an error).
  virtual absl::Status Barrier() = 0;
};

// World 1: every collective is the identity; used when a group has one rank so model code needs no branch.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  std::string_view backend() const override { return "local"; }
  absl::Status AllReduceSum(float* data, size_t n) override;
  absl::Status AllReduceSumBf16(uint16_t* data, size_t n) override;
  absl::Status AllGather(const void* send, void* recv, size_t bytes_per_rank) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override { return absl::OkStatus(); }
};

// Broadcast of a variable-length message (a serialized StepPlan): root's *bytes reaches every rank's *bytes.
// Sends the 8-byte length first, then the payload; refuses a payload over max_bytes on every rank (so a corrupt
// length cannot make a follower allocate gigabytes). Host communicators only (local, gloo).
absl::Status BroadcastBytes(Communicator& comm, std::string* bytes, int root, size_t max_bytes = 64u << 20);

// Checks (rank, world) for a communicator being created: InvalidArgument naming the bad value.
using ::dsv4::ValidateRankWorld;  // common/rank_world.h

}  // namespace dsv4::comm
