// Adapters from the worker's services to the interfaces the model owns (model/dsv4/hooks.h), so that model/
// depends on neither comm/ nor metrics/:
//  - CommCollectives: the group's all-reduce and vocabulary gather over a comm::Communicator (Gloo on the CPU;
//    NCCL on device buffers).
//  - PhaseTimerHook: the forward's phase marks into a metrics::PhaseTimer.
// Threads: used by the engine thread (the one running the forward) only.
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "metrics/phase_timer.h"
#include "model/dsv4/hooks.h"
#include "model/dsv4/shard.h"

namespace dsv4::worker {

class CommCollectives final : public model::Collectives {
 public:
  // `comm` must outlive this object; `layout` is this rank's (PlanShardLayout for comm's rank and world).
  CommCollectives(comm::Communicator* comm, model::ShardLayout layout) : comm_(comm), layout_(layout) {}
  int rank() const override { return comm_->rank(); }
  int world() const override { return comm_->world(); }
  absl::Status AllReduceSum(float* data, int64_t n) override;
  // AllGather of vocab_slot-wide blocks (every rank sends the same bytes), reassembled in vocabulary order. The
  // send/receive buffers grow on first use and are reused (no allocation in later steps of the same size).
  absl::Status GatherVocab(const float* local, int64_t rows, int64_t vocab, float* full) override;

 private:
  comm::Communicator* comm_;
  model::ShardLayout layout_;
  std::vector<float> send_, recv_;
};

class PhaseTimerHook final : public model::PhaseHook {
 public:
  explicit PhaseTimerHook(metrics::PhaseTimer* timer) : timer_(timer) {}
  void Begin(model::Phase p) override { timer_->Begin(open_ = ToMetrics(p)); }
  void End() override { timer_->End(open_); }
  static metrics::Phase ToMetrics(model::Phase p);

 private:
  metrics::PhaseTimer* timer_;
  metrics::Phase open_ = metrics::Phase::kOther;
};

}  // namespace dsv4::worker
