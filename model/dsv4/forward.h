// Internals of Dsv4Model shared by the sublayer files: the model state (Impl), the step workspace planned at
// AllocateCache, and what one sublayer call gets (StepContext). The forward reads top to bottom as:
// embed -> per layer { attention sublayer (attention.cc), FFN sublayer (ffn.cc) } -> head (head.cc); model.cc
// validates the step, packs its plan and drives it.
#pragma once

#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "model/dsv4/kv_cache.h"
#include "model/dsv4/model.h"
#include "model/dsv4/weights.h"

namespace dsv4::model {

// Every activation buffer of the largest step, in backend memory, allocated once: a step reuses the same
// addresses (CUDA-graph capturable) and allocates nothing. Shapes at capacity (T = max_tokens rows).
struct Workspace {
  int64_t max_tokens = 0;  // T capacity
  int64_t max_seqs = 0;    // B capacity
  int64_t head_rows = 0;   // rows of logits computed per head pass
  kernels::Buffer x[2];    // [T, S, D] residual streams (ping-pong: x_out of a sublayer becomes its next x)
  kernels::Buffer a;       // [T, D] normed sublayer input
  kernels::Buffer post, comb;       // [T, S], [T, S, S]
  kernels::Buffer cq, q, kv;        // [T, q_lora], [T, H, Dh], [T, Dh]
  kernels::Buffer comp_kv, comp_gate;  // [T, 2*Dh]
  kernels::Buffer idx_q, idx_w, idx_kv, idx_gate;  // [T, IH, ID], [T, IH], [T, 2*ID] x2
  kernels::Buffer selected, selected_count;        // int32 [T, Ksel], [T]
  kernels::Buffer o, z, y;          // [T, H, Dh], [T, G*o_lora], [T, D]
  kernels::Buffer h, logits, logits_full;  // [R, D], [R, V local], [R, V] (world > 1)
  kernels::Buffer sampled;                 // int32 [R] the Sample op's tokens
  // The step's plan, packed as int32 in this order (offsets in PlanLayout), on the host and in backend memory.
  kernels::Buffer plan_host, plan;
};

// int32s of one kernels::SampleParams in the packed plan.
inline constexpr int64_t kSampleParamsInts = sizeof(kernels::SampleParams) / 4;

// Offsets (in int32s) of each array in the packed plan; pool tables are [B capacity, stride[pool]]; sample is
// [B capacity] SampleParams (at offset 0: 8-byte aligned).
struct PlanLayout {
  int64_t sample = 0;
  int64_t tokens = 0, pos = 0, seq = 0, seq_first = 0, seq_len = 0, slot = 0, head_rows = 0;
  std::array<int64_t, kNumKvPools> table{}, stride{};
  int64_t total = 0;
};

// What a sublayer uses for one step.
struct StepContext {
  kernels::Ops& ops;
  const Config& config;  // this rank's view (local heads and groups)
  NumericMode mode;
  const KvCache& cache;
  const Workspace& ws;
  kernels::StepIndex step;
  const int32_t* tokens = nullptr;  // [T] backend memory
  std::array<kernels::BlockTables, kNumKvPools> tables;
  const std::vector<kernels::Buffer>* inv_freq = nullptr;  // per layer, backend memory [pairs]
};

struct Dsv4Model::Impl {
  Config config;       // the forward's view: with tensor parallelism, this rank's heads and output groups
  Config full_config;  // the whole model's, returned by config()
  ModelOptions options;
  kernels::Backend* backend = nullptr;
  std::unique_ptr<ShardLayout> shard;  // this rank's share; null for world 1
  std::unique_ptr<ModelWeights> weights;
  std::vector<kernels::Buffer> inv_freq;  // per layer [pairs], backend memory
  std::unique_ptr<KvCache> cache;
  Workspace ws;
  PlanLayout plan;
  std::vector<uint8_t> slot_seen;  // per state slot, step validation scratch (sized at AllocateCache)
  absl::Status tp_status;  // first collective failure of the running forward
  Phase phase = Phase::kOther;  // the phase last begun, so a collective can resume it

  // Marks the start of phase p for the hook (phases form a flat sequence); nothing without a hook.
  void BeginPhase(Phase p) {
    if (options.phase_hook == nullptr) return;
    phase = p;
    options.phase_hook->Begin(p);
  }
  // Sums a partial [n] result over the group in place (no-op for world 1); keeps the first failure in tp_status
  // (later collectives of a broken group fail at once, so the step just runs out).
  void AllReduce(float* y, int64_t n);
};

// x / x_out: [T, S, D] residual streams; the sublayer reads x and writes x_out.
void AttentionSublayer(Dsv4Model::Impl& m, const StepContext& s, int layer, const float* x, float* x_out);
void FfnSublayer(Dsv4Model::Impl& m, const StepContext& s, int layer, const float* x, float* x_out);
// Logits of the rows' tokens: [rows, V] into logits (backend memory, ws.logits or ws.logits_full).
void Head(Dsv4Model::Impl& m, const StepContext& s, const float* x, const int32_t* rows, int64_t r, float* logits);

}  // namespace dsv4::model
