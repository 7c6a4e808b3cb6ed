// Internals of Dsv4Model shared by the sublayer files: the model state (Impl) and one step's flattened batch.
// The forward reads top to bottom as: embed -> per layer { attention sublayer (attention.cc, with the cache
// updates of kv_update.cc), FFN sublayer (ffn.cc) } -> head (head.cc); model.cc validates and drives it.
#pragma once

#include <memory>
#include <vector>

#include "comm/shard.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "metrics/phase_timer.h"
#include "model/dsv4/kv_cache.h"
#include "model/dsv4/model.h"
#include "model/dsv4/weights.h"

namespace dsv4::model {

// One step's tokens, flattened chunk-major. Token i belongs to chunk chunk_of[i] at absolute position pos[i].
struct StepBatch {
  std::vector<int32_t> tokens, pos, chunk_of;
  std::vector<const SeqBlockTables*> tables;  // per chunk
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

struct Dsv4Model::Impl {
  Config config;       // the forward's view: with tensor parallelism, this rank's heads and output groups
  Config full_config;  // the whole model's, returned by config()
  ModelOptions options;
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<kernels::cpu::CpuOps> cpu;
  kernels::Ops* ops = nullptr;  // the backend every sublayer calls (the CPU one here)
  std::vector<std::vector<float>> inv_freq;  // per layer
  std::unique_ptr<KvCache> cache;
  comm::Communicator* tp = nullptr;          // null for world 1
  std::unique_ptr<comm::ShardLayout> shard;  // this rank's share; null for world 1
  absl::Status tp_status;                    // first collective failure of the running forward
  metrics::PhaseTimer* phase_timer = nullptr;  // null = no phase timing (Dsv4Model::SetPhaseTimer)
  metrics::Phase phase = metrics::Phase::kOther;  // the phase last begun, so a collective can resume it

  // Marks the start of phase p for the timer (phases form a flat sequence); nothing without a timer.
  void BeginPhase(metrics::Phase p) {
    if (phase_timer == nullptr) return;
    phase = p;
    phase_timer->Begin(p);
  }

  // Sums a partial [n] result over the group in place (no-op for world 1); keeps the first failure in tp_status
  // (later collectives of a broken communicator fail at once, so the step just runs out).
  void AllReduce(float* y, int64_t n);

  // Physical row id of a sequence's logical row in a pool (window: ring row p mod window).
  int32_t PhysicalRow(const SeqBlockTables& t, KvPool pool, int64_t logical_row) const;
};

// x: [T, S, D] residual streams, updated in place.
void AttentionSublayer(Dsv4Model::Impl& m, int layer, const StepBatch& batch, std::vector<float>& x);
void FfnSublayer(Dsv4Model::Impl& m, int layer, const StepBatch& batch, std::vector<float>& x);
// Logits [rows.size(), V] of the selected tokens.
void Head(Dsv4Model::Impl& m, const std::vector<float>& x, const std::vector<int64_t>& rows, float* logits);

// Per-token cache work of one attention layer, in token order (kv_update.cc): writes the window row, steps the
// compressor(s), and fills this token's key lists for attention.
struct TokenKeys {
  std::vector<int32_t> window_rows;      // [window]
  std::vector<int32_t> compressed_rows;  // [max compressed]
  int32_t window_count = 0, compressed_count = 0;
};
struct LayerActivations {  // this layer's projections for all T tokens
  const float* a = nullptr;         // [T, D] normed sublayer input
  const float* kv = nullptr;        // [T, Dh] rotated window key
  const float* comp_kv = nullptr;   // [T, C*Dh]
  const float* comp_gate = nullptr; // [T, C*Dh]
  const float* idx_q = nullptr;     // [T, IH*ID]
  const float* idx_w = nullptr;     // [T, IH]
  const float* idx_kv = nullptr;    // [T, 2*ID]
  const float* idx_gate = nullptr;  // [T, 2*ID]
};
void UpdateCacheAndSelect(Dsv4Model::Impl& m, int layer, const StepBatch& batch, int64_t t,
                          const LayerActivations& act, TokenKeys& keys);

}  // namespace dsv4::model
