// The KV side of dsv4-decode-bench: pools sized for B sequences of context N, filled with synthetic but valid
// rows (584-byte FP8 records from the real encoder, finite fp32 indexer rows and compressor state) instead of a
// prefill of B x N tokens, and block tables that give sequence b its own pages. A decode step at context N then
// reads exactly what a served step of that context reads.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "model/dsv4/model.h"

namespace dsv4::bench {

struct CachePlan {
  int page_rows = 64;
  int max_batch = 0;
  int64_t max_positions = 0;                      // the longest sequence (context + the token being decoded)
  std::array<int64_t, model::kNumKvPools> pages_per_seq{};  // at max_positions
  std::array<int64_t, model::kNumKvPools> pool_pages{};     // max_batch * pages_per_seq
};
CachePlan PlanCache(const Config& config, int max_batch, int64_t max_positions, int page_rows);

// Fills every pool and the compressor state of `model` (after AllocateCache) with valid synthetic data.
absl::Status FillCache(model::Dsv4Model& model, kernels::Backend& backend, int page_rows, uint64_t seed);

// Block tables of `batch` sequences of `positions` positions each (state slot b, pages of sequence b).
std::vector<model::SeqBlockTables> MakeTables(const Config& config, const CachePlan& plan, int batch,
                                              int64_t positions);

}  // namespace dsv4::bench
