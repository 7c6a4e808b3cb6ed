// The step types shared by the worker (which plans steps) and the model (which runs them): one definition,
// no per-step copy between them (worker/model_executor.h aliases these).
//
// KV pools (dsv4-decode.md §3, layout rules in model.h): each sequence has one block table per pool, shared by
// every layer that uses the pool (page id g names the same slot in every layer's slice of the pool).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace dsv4::model {

enum class KvPool { kWindow = 0, kCompressed4 = 1, kCompressed128 = 2, kIndexer = 3 };
inline constexpr int kNumKvPools = 4;
inline constexpr std::array<const char*, kNumKvPools> kKvPoolNames = {"window", "compressed4", "compressed128",
                                                                      "indexer"};

// One sequence's pages: per pool the physical page ids in logical order, plus its compressor state slot.
struct SeqBlockTables {
  std::array<std::vector<int32_t>, kNumKvPools> pages;  // indexed by static_cast<int>(KvPool)
  int32_t state_slot = -1;                               // compressor/indexer state slot of this sequence
};

// One sequence's tokens for this step: positions start_pos .. start_pos + tokens.size() - 1.
struct SeqChunk {
  const SeqBlockTables* tables = nullptr;
  std::span<const int32_t> tokens;
  int32_t start_pos = 0;
};

}  // namespace dsv4::model
