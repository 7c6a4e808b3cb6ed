// KV pools and compressor state slots: see kv_cache.h.
#include "model/dsv4/kv_cache.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"

namespace dsv4::model {

KvCache::KvCache(const Config& config, NumericMode mode) : config_(config), mode_(mode) {
  for (int p = 0; p < kNumKvPools; ++p) pool_index_[p].assign(config.num_hidden_layers, -1);
  auto add = [&](KvPool pool, int layer) {
    const int p = static_cast<int>(pool);
    pool_index_[p][layer] = static_cast<int>(layers_[p].size());
    layers_[p].push_back(layer);
  };
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    add(KvPool::kWindow, l);
    const int r = config.CompressRatio(l);
    if (r == 4) add(KvPool::kCompressed4, l), add(KvPool::kIndexer, l);
    if (r == 128) add(KvPool::kCompressed128, l);
  }
  state_.resize(config.num_hidden_layers);
}

kernels::KvFormat KvCache::Format(KvPool pool) const {
  return mode_ == NumericMode::kProduction && pool != KvPool::kIndexer ? kernels::KvFormat::kFp8Row584
                                                                         : kernels::KvFormat::kF32;
}

int KvCache::RowDim(KvPool pool) const {
  return static_cast<int>(pool == KvPool::kIndexer ? config_.index_head_dim : config_.head_dim);
}

int64_t KvCache::LayerPageBytes(KvPool pool, int page_rows) const {
  return kernels::cpu::KvPageBytes(Format(pool), RowDim(pool), page_rows);
}

int64_t KvCache::StateFloats(int layer, bool indexer) const {
  const int r = config_.CompressRatio(layer);
  if (indexer) return r == 4 ? 8 * 2 * config_.index_head_dim : 0;
  const int c = r == 4 ? 2 : 1;
  return r == 0 ? 0 : int64_t{c} * r * c * config_.head_dim;
}

absl::Status KvCache::Allocate(std::array<int64_t, kNumKvPools> pages, int page_rows, int slots) {
  if (page_rows <= 0) return absl::InvalidArgumentError(absl::StrCat("page_rows must be > 0, got ", page_rows));
  if (slots <= 0) return absl::InvalidArgumentError(absl::StrCat("max_state_slots must be > 0, got ", slots));
  for (int p = 0; p < kNumKvPools; ++p) {
    if (pages[p] < 0) return absl::InvalidArgumentError(absl::StrCat("pages_per_pool[", p, "] is negative"));
  }
  page_rows_ = page_rows;
  slots_ = slots;
  pages_ = pages;
  for (int p = 0; p < kNumKvPools; ++p) {
    const auto pool = static_cast<KvPool>(p);
    storage_[p].assign(layers_[p].size() * pages[p] * LayerPageBytes(pool, page_rows), 0);
  }
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    state_[l].assign(slots * 2 * (StateFloats(l, false) + StateFloats(l, true)), 0.f);
  }
  next_pos_.assign(slots, 0);
  for (int s = 0; s < slots; ++s) ResetSlot(s);
  return absl::OkStatus();
}

kernels::KvCacheView KvCache::View(KvPool pool, int layer) {
  const int p = static_cast<int>(pool);
  const int64_t page_bytes = LayerPageBytes(pool, page_rows_);
  return {.base = storage_[p].data() + pool_index_[p][layer] * pages_[p] * page_bytes,
          .format = Format(pool),
          .dim = RowDim(pool),
          .page_rows = page_rows_,
          .page_bytes = page_bytes};
}

float* KvCache::State(int layer, int slot, bool indexer, bool score) {
  const int64_t main = StateFloats(layer, false), idx = StateFloats(layer, true);
  float* base = state_[layer].data() + slot * 2 * (main + idx);
  if (!indexer) return base + (score ? main : 0);
  return base + 2 * main + (score ? idx : 0);
}
float* KvCache::StateKv(int layer, int slot, bool indexer) { return State(layer, slot, indexer, false); }
float* KvCache::StateScore(int layer, int slot, bool indexer) { return State(layer, slot, indexer, true); }

void KvCache::ResetSlot(int slot) {
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    for (bool indexer : {false, true}) {
      const int64_t n = StateFloats(l, indexer);
      std::fill_n(StateKv(l, slot, indexer), n, 0.f);
      std::fill_n(StateScore(l, slot, indexer), n, -std::numeric_limits<float>::infinity());
    }
  }
  next_pos_[slot] = 0;
}

}  // namespace dsv4::model
