// One-process drivers of Dsv4Model: see runner.h.
#include "tools/generate/runner.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dsv4::generate {

using model::Dsv4Model;
using model::KvPool;
using model::SeqChunk;

absl::StatusOr<TablePlan> AllocateSequences(Dsv4Model& m, int num_seqs, int64_t max_len, int page_rows) {
  if (num_seqs <= 0 || max_len <= 0 || page_rows <= 0)
    return absl::InvalidArgumentError(absl::StrCat("bad sequence plan: ", num_seqs, " seqs, ", max_len, " positions, ", page_rows, " page rows"));
  TablePlan plan;
  plan.page_rows = page_rows;
  plan.tables.resize(num_seqs);
  for (int p = 0; p < model::kNumKvPools; ++p) {
    const int64_t rows = Dsv4Model::RowsNeeded(m.config(), static_cast<KvPool>(p), max_len);
    const int64_t per_seq = (rows + page_rows - 1) / page_rows;
    plan.pages_per_pool[p] = per_seq * num_seqs;
    for (int s = 0; s < num_seqs; ++s) {
      for (int64_t k = 0; k < per_seq; ++k) plan.tables[s].pages[p].push_back(static_cast<int32_t>(plan.pages_per_pool[p] - 1 - (s * per_seq + k)));
    }
  }
  DSV4_RETURN_IF_ERROR(m.AllocateCache(plan.pages_per_pool, page_rows, num_seqs));
  for (int s = 0; s < num_seqs; ++s) {
    plan.tables[s].state_slot = s;
    DSV4_RETURN_IF_ERROR(m.ResetState(s));
  }
  return plan;
}

absl::StatusOr<std::vector<float>> TeacherForce(Dsv4Model& m, const model::SeqBlockTables& tables,
                                                std::span<const int32_t> tokens, int chunk) {
  if (chunk <= 0) return absl::InvalidArgumentError(absl::StrCat("chunk must be > 0, got ", chunk));
  DSV4_RETURN_IF_ERROR(m.ResetState(tables.state_slot));
  std::vector<float> all, part;
  for (size_t start = 0; start < tokens.size(); start += chunk) {
    const size_t n = std::min<size_t>(chunk, tokens.size() - start);
    const SeqChunk c{.tables = &tables, .tokens = tokens.subspan(start, n), .start_pos = static_cast<int32_t>(start)};
    DSV4_RETURN_IF_ERROR(m.ForwardAllLogits({&c, 1}, &part));
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

absl::StatusOr<Generation> Greedy(Dsv4Model& m, const model::SeqBlockTables& tables, std::span<const int32_t> prompt,
                                  int max_new, int prefill_chunk, bool keep_logits) {
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  const int64_t V = m.config().vocab_size;
  Generation g;
  const auto t0 = std::chrono::steady_clock::now();
  DSV4_ASSIGN_OR_RETURN(std::vector<float> logits,
                        TeacherForce(m, tables, prompt, prefill_chunk > 0 ? prefill_chunk : static_cast<int>(prompt.size())));
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<float> row(logits.end() - V, logits.end());
  if (keep_logits) g.logits = std::move(logits);
  for (int i = 0; i < max_new; ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    g.tokens.push_back(next);
    const SeqChunk c{.tables = &tables, .tokens = {&g.tokens.back(), 1},
                     .start_pos = static_cast<int32_t>(prompt.size() + i)};
    DSV4_RETURN_IF_ERROR(m.Forward({&c, 1}, row.data()));
    if (keep_logits) g.logits.insert(g.logits.end(), row.begin(), row.end());
  }
  const auto t2 = std::chrono::steady_clock::now();
  g.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  g.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  return g;
}

}  // namespace dsv4::generate
