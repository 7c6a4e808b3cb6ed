// CommCollectives and PhaseTimerHook: see model_hooks.h.
#include "worker/model_hooks.h"

#include <algorithm>

#include "common/status_macros.h"

namespace dsv4::worker {

absl::Status CommCollectives::AllReduceSum(float* data, int64_t n) {
  return comm_->AllReduceSum(data, static_cast<size_t>(n));
}

absl::Status CommCollectives::GatherVocab(const float* local, int64_t rows, int64_t vocab, float* full) {
  const int64_t slot = layout_.vocab_slot, T = comm_->world();
  if (layout_.spec.world != T || layout_.spec.rank != comm_->rank()) {
    return absl::InvalidArgumentError("GatherVocab: layout is for another rank or world");
  }
  if (slot * T < vocab) return absl::InvalidArgumentError("GatherVocab: layout does not cover the vocabulary");
  // Padded send block [rows, slot] so every rank contributes the same number of bytes.
  send_.resize(static_cast<size_t>(rows * slot));
  recv_.resize(static_cast<size_t>(T * rows * slot));
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(local + r * layout_.vocab.size, layout_.vocab.size, send_.data() + r * slot);
    std::fill(send_.data() + r * slot + layout_.vocab.size, send_.data() + (r + 1) * slot, 0.f);
  }
  DSV4_RETURN_IF_ERROR(comm_->AllGather(send_.data(), recv_.data(), rows * slot * sizeof(float)));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t begin = t * slot, width = std::max<int64_t>(0, std::min(vocab, begin + slot) - begin);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(recv_.data() + (t * rows + r) * slot, width, full + r * vocab + begin);
    }
  }
  return absl::OkStatus();
}

metrics::Phase PhaseTimerHook::ToMetrics(model::Phase p) {
  switch (p) {
    case model::Phase::kAttention: return metrics::Phase::kAttention;
    case model::Phase::kIndexer: return metrics::Phase::kAttention;  // the served attention share includes it
    case model::Phase::kMoe: return metrics::Phase::kMoe;
    case model::Phase::kDense: return metrics::Phase::kDense;
    case model::Phase::kComm: return metrics::Phase::kComm;
    case model::Phase::kOther: return metrics::Phase::kOther;
  }
  return metrics::Phase::kOther;
}

}  // namespace dsv4::worker
