// One-process drivers of Dsv4Model without the engine: block tables for a few sequences with disjoint pages,
// teacher-forced runs (logits of every position) and greedy generation. Used by dsv4-generate and the model
// tests; the worker engine has its own scheduler and page allocator.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "model/dsv4/model.h"

namespace dsv4::generate {

struct TablePlan {
  std::array<int64_t, model::kNumKvPools> pages_per_pool{};
  int page_rows = 64;
  std::vector<model::SeqBlockTables> tables;  // one per sequence, state_slot = its index
};

// Pages for num_seqs sequences of up to max_len positions each (sequence i gets its own pages; pages are
// handed out in reverse order so physical ids differ from logical ones), allocated in the model's cache with
// every state slot reset.
absl::StatusOr<TablePlan> AllocateSequences(model::Dsv4Model& m, int num_seqs, int64_t max_len, int page_rows = 64);

// Feeds tokens[0..] to a fresh sequence in chunks of `chunk` tokens (1 = token by token); logits of every
// position, [tokens.size(), vocab].
absl::StatusOr<std::vector<float>> TeacherForce(model::Dsv4Model& m, const model::SeqBlockTables& tables,
                                                std::span<const int32_t> tokens, int chunk);

struct Generation {
  std::vector<int32_t> tokens;   // generated tokens
  std::vector<float> logits;     // every position's logits (prompt then generated) when requested
  double prefill_seconds = 0, decode_seconds = 0;
};
// Greedy decoding of max_new tokens after prefilling `prompt` in chunks of prefill_chunk (0 = one chunk).
// Every generated token is fed back, so logits (when keep_logits) has prompt.size() + max_new rows.
absl::StatusOr<Generation> Greedy(model::Dsv4Model& m, const model::SeqBlockTables& tables,
                                  std::span<const int32_t> prompt, int max_new, int prefill_chunk, bool keep_logits);

}  // namespace dsv4::generate
