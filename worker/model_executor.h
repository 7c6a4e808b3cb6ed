// The engine's only view of a model: the few operations continuous batching needs. One implementation adapts
// dsv4::model::Dsv4Model (dsv4_executor.h); a deterministic fake lives in tests/worker for fast scheduler,
// allocator and sampling tests. Keeping the engine behind this interface is what lets the CUDA backend and
// tensor-parallel groups plug in later without touching the scheduler.
//
// Threads: an executor is used by the engine thread only.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/dsv4/step.h"

namespace dsv4::worker {

// The step types are the model's (model/dsv4/step.h): one definition for the planner and the forward.
using Pool = model::KvPool;
inline constexpr int kNumPools = model::kNumKvPools;
inline constexpr const auto& kPoolNames = model::kKvPoolNames;
using BlockTables = model::SeqBlockTables;
using SeqChunk = model::SeqChunk;

struct ModelInfo {
  std::string model_name;
  std::string weight_format;
  int vocab_size = 0;
  std::vector<int32_t> eos_token_ids;  // any of them ends a request unless ignore_eos
  int bos_token_id = -1;
  int num_layers = 0;
};

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;
  virtual const ModelInfo& info() const = 0;
  // Bytes of one page of page_rows rows of `pool`, over all layers; 0 when no layer uses the pool.
  virtual int64_t PageBytes(Pool pool, int page_rows) const = 0;
  // Rows of `pool` a sequence with num_positions cached tokens occupies.
  virtual int64_t RowsNeeded(Pool pool, int64_t num_positions) const = 0;
  virtual absl::Status AllocateCache(const std::array<int64_t, kNumPools>& pages_per_pool, int page_rows,
                                     int max_state_slots) = 0;
  virtual absl::Status ResetState(int32_t state_slot) = 0;
  // Runs every chunk and writes the logits of each chunk's last token to logits[i * vocab_size].
  virtual absl::Status Forward(std::span<const SeqChunk> chunks, float* logits) = 0;
};

}  // namespace dsv4::worker
