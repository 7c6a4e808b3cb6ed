// The interfaces the forward calls out through, owned here so that model/ depends on nothing above it:
// tensor-parallel collectives (worker/ adapts comm::Communicator; NCCL on the GPU, Gloo on the CPU) and phase
// marks for decode time by phase (worker/ adapts metrics::PhaseTimer). Both are optional: null = world 1 /
// no timing.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace dsv4::model {

// Collectives of this rank's tensor-parallel group, called by the forward with buffers it owns (backend memory:
// device pointers on the CUDA backend, enqueued on its stream). Every rank makes the same calls in the same order.
class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // data[0, n) <- the sum over the group, in place.
  virtual absl::Status AllReduceSum(float* data, int64_t n) = 0;
  // full[rows, vocab] <- every rank's local[rows, its vocabulary range] (ranges of model/dsv4/shard.h's
  // ShardLayout::vocab, in rank order).
  virtual absl::Status GatherVocab(const float* local, int64_t rows, int64_t vocab, float* full) = 0;
  // Waits until the collectives enqueued so far have completed, within the group's deadline (a dead or hung peer
  // ends in an error instead of a hang). The forward calls it before it copies results to the host. Collectives
  // that complete inside their call (host ones) have nothing to wait for.
  virtual absl::Status Flush() { return absl::OkStatus(); }
};

// Where the forward is: the sublayer phases of decode-time accounting. kIndexer is the indexer's compressor and
// top-k scoring inside the attention sublayer (the worker's metrics count it as attention; bench/decode shows it
// apart).
enum class Phase { kAttention, kMoe, kDense, kComm, kOther, kIndexer };

class PhaseHook {
 public:
  virtual ~PhaseHook() = default;
  virtual void Begin(Phase p) = 0;  // closes the open phase and opens p
  virtual void End() = 0;           // closes the open phase (end of the forward)
};

}  // namespace dsv4::model
