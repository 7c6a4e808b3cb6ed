// Which experts a step actually touched, per layer, read from the CUDA MoE op's own routing (the per-expert token
// counts its router leaves in the MoE scratch: kernels/cuda/moe_internal.h) during one eager probe step: the
// probe is a model::PhaseHook that, when the forward leaves an MoE phase, waits for the stream and copies the
// counts out. The byte floor counts exactly these experts' bytes. (It reads the scratch layout of the MoE family,
// so a change there must keep MakeScratchPlan / CarveScratch meaningful; the probe fails loudly otherwise: a
// layer whose counts do not add up to tokens x top-k is an error.)
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "model/dsv4/hooks.h"

namespace dsv4::bench {

struct ProbeShape {
  int64_t tokens = 0;   // T of the step (the decode bucket)
  int64_t experts = 0, topk = 0, dim = 0, inter = 0, shared_inter = 0;  // shared_inter: this rank's
  int64_t held_begin = 0, held_end = 0;                                  // the rank's experts
  std::vector<std::vector<int32_t>> hot{};  // per layer: its hot experts (skewed routing), sorted; empty: none
};

struct LayerRouting {
  int64_t touched = 0;    // held experts with at least one token
  int64_t pairs = 0;      // token-expert pairs routed to held experts
  int64_t hot_pairs = 0;  // of which to hot experts
};

class RoutingProbe final : public model::PhaseHook {
 public:
  RoutingProbe(kernels::Backend& backend, ProbeShape shape) : backend_(backend), shape_(std::move(shape)) {}
  void Begin(model::Phase p) override;
  void End() override;
  const std::vector<LayerRouting>& layers() const { return layers_; }
  const absl::Status& status() const { return status_; }

 private:
  void Read();
  kernels::Backend& backend_;
  ProbeShape shape_;
  std::vector<LayerRouting> layers_;
  absl::Status status_;
  bool in_moe_ = false;
};

}  // namespace dsv4::bench
