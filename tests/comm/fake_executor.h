// A deterministic stand-in for a model shard, for lock-step tests: records every call in a running hash and, in
// Forward, does what a sharded forward does to the group: an all-reduce of per-rank partial results on the data
// communicator. Logits of chunk i are the all-reduced partials, so the leader can check them exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "worker/model_executor.h"

namespace dsv4::comm::testing {

class FakeShardExecutor final : public worker::ModelExecutor {
 public:
  static constexpr int kVocab = 8;
  explicit FakeShardExecutor(Communicator* data) : data_(data) { info_.vocab_size = kVocab; }

  const worker::ModelInfo& info() const override { return info_; }
  int64_t PageBytes(worker::Pool, int page_rows) const override { return page_rows * 10; }
  int64_t RowsNeeded(worker::Pool, int64_t n) const override { return n; }
  absl::Status AllocateCache(const std::array<int64_t, worker::kNumPools>& pages, int page_rows, int slots) override {
    for (int64_t p : pages) Mix(p);
    Mix(page_rows);
    Mix(slots);
    slots_ = slots;
    return absl::OkStatus();
  }
  absl::Status ResetState(int32_t slot) override {
    if (slot < 0 || slot >= slots_) return absl::InvalidArgumentError(absl::StrCat("state_slot ", slot, " out of range"));
    Mix(1000 + slot);
    return absl::OkStatus();
  }
  // Rank r's partial for chunk i, logit v: (r + 1) * (sum of tokens + start_pos + v). Summed over T ranks:
  // T(T+1)/2 * (sum of tokens + start_pos + v).
  absl::Status Forward(std::span<const worker::SeqChunk> chunks, float* logits) override {
    std::vector<float> part(chunks.size() * kVocab);
    for (size_t i = 0; i < chunks.size(); ++i) {
      int64_t s = chunks[i].start_pos;
      for (int32_t t : chunks[i].tokens) s += t;
      Mix(chunks[i].tables->state_slot);
      Mix(s);
      for (const auto& pool : chunks[i].tables->pages) {
        for (int32_t pg : pool) Mix(pg);
      }
      for (int v = 0; v < kVocab; ++v) part[i * kVocab + v] = static_cast<float>((data_->rank() + 1) * (s + v));
    }
    if (absl::Status st = data_->AllReduceSum(part.data(), part.size()); !st.ok()) return st;
    std::copy(part.begin(), part.end(), logits);
    ++forwards_;
    return absl::OkStatus();
  }

  uint64_t hash() const { return hash_; }
  int forwards() const { return forwards_; }

 private:
  void Mix(int64_t v) {
    for (int i = 0; i < 8; ++i) hash_ = (hash_ ^ ((static_cast<uint64_t>(v) >> (8 * i)) & 0xff)) * 1099511628211ull;
  }

  Communicator* data_;
  worker::ModelInfo info_;
  int slots_ = 0;
  int forwards_ = 0;
  uint64_t hash_ = 1469598103934665603ull;
};

}  // namespace dsv4::comm::testing
