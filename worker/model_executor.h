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

namespace dsv4::worker {

// The KV pools of dsv4-decode.md section 3.2, in dsv4::model::KvPool order.
enum class Pool { kWindow = 0, kCompressed4 = 1, kCompressed128 = 2, kIndexer = 3 };
inline constexpr int kNumPools = 4;
inline constexpr std::array<const char*, kNumPools> kPoolNames = {"window", "compressed4", "compressed128",
                                                                  "indexer"};

// One sequence's pages: per pool the physical page ids in logical order, plus its compressor state slot.
struct BlockTables {
  std::array<std::vector<int32_t>, kNumPools> pages;
  int32_t state_slot = -1;
};

// One sequence's tokens in a step, at positions start_pos .. start_pos + tokens.size() - 1.
struct SeqChunk {
  const BlockTables* tables = nullptr;
  std::span<const int32_t> tokens;
  int32_t start_pos = 0;
};

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
