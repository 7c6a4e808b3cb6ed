// KV pools and compressor state slots: see kv_cache.h.
#include "model/dsv4/kv_cache.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

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
}

kernels::KvFormat KvCache::Format(KvPool pool) const {
  return mode_ == NumericMode::kProduction && pool != KvPool::kIndexer ? kernels::KvFormat::kFp8Row584
                                                                         : kernels::KvFormat::kF32;
}

int KvCache::RowDim(KvPool pool) const {
  return static_cast<int>(pool == KvPool::kIndexer ? config_.index_head_dim : config_.head_dim);
}

int64_t KvCache::LayerPageBytes(KvPool pool, int page_rows) const {
  return kernels::KvPageBytes(Format(pool), RowDim(pool), page_rows);
}

int64_t KvCache::StateFloats(int layer, bool indexer) const {
  const int r = config_.CompressRatio(layer);
  if (indexer) return r == 4 ? 8 * 2 * config_.index_head_dim : 0;
  const int c = r == 4 ? 2 : 1;
  return r == 0 ? 0 : int64_t{c} * r * c * config_.head_dim;
}

absl::Status KvCache::Allocate(kernels::Backend& backend, std::array<int64_t, kNumKvPools> pages, int page_rows,
                               int slots, int64_t max_step_tokens) {
  if (page_rows <= 0) return absl::InvalidArgumentError(absl::StrCat("page_rows must be > 0, got ", page_rows));
  if (slots <= 0) return absl::InvalidArgumentError(absl::StrCat("max_state_slots must be > 0, got ", slots));
  if (max_step_tokens <= 0) return absl::InvalidArgumentError(absl::StrCat("max_step_tokens must be > 0, got ", max_step_tokens));
  for (int p = 0; p < kNumKvPools; ++p) {
    if (pages[p] < 0) return absl::InvalidArgumentError(absl::StrCat("pages_per_pool[", p, "] is negative"));
  }
  page_rows_ = page_rows;
  slots_ = slots;
  pages_ = pages;
  for (int p = 0; p < kNumKvPools; ++p) {
    const auto pool = static_cast<KvPool>(p);
    storage_[p].Reset();
    const int64_t staging = pool == KvPool::kWindow ? (max_step_tokens + page_rows - 1) / page_rows : 0;
    // At least one page per layer slice, so a pool no sequence can reach yet (a context shorter than its ratio)
    // still has a valid base for the ops that step its compressor state.
    layer_pages_[p] = std::max<int64_t>(1, pages[p] + staging);
    const int64_t bytes = static_cast<int64_t>(layers_[p].size()) * layer_pages_[p] * LayerPageBytes(pool, page_rows);
    if (bytes > 0) {
      DSV4_ASSIGN_OR_RETURN(storage_[p], backend.Allocate(bytes, kernels::MemoryKind::kKvCache));
    }
  }
  state_offset_.assign(config_.num_hidden_layers, 0);
  kv_floats_ = 0;
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    state_offset_[l] = kv_floats_;
    kv_floats_ += StateFloats(l, false) + StateFloats(l, true);
  }
  slot_floats_ = 2 * kv_floats_;
  state_.Reset();
  if (slot_floats_ > 0) {
    DSV4_ASSIGN_OR_RETURN(state_, backend.Allocate(slots * slot_floats_ * 4, kernels::MemoryKind::kState));
  }
  next_pos_.assign(slots, 0);
  for (int s = 0; s < slots; ++s) ResetSlot(backend, s);
  return backend.Synchronize();
}

kernels::KvCacheView KvCache::View(KvPool pool, int layer) const {
  const int p = static_cast<int>(pool);
  const int64_t page_bytes = LayerPageBytes(pool, page_rows_);
  return {.base = storage_[p].as<uint8_t>() + pool_index_[p][layer] * layer_pages_[p] * page_bytes,
          .format = Format(pool),
          .dim = RowDim(pool),
          .page_rows = page_rows_,
          .page_bytes = page_bytes};
}

float* KvCache::StateKv(int layer, bool indexer) const {
  return state_.as<float>() + state_offset_[layer] + (indexer ? StateFloats(layer, false) : 0);
}
float* KvCache::StateScore(int layer, bool indexer) const { return StateKv(layer, indexer) + kv_floats_; }

void KvCache::ResetSlot(kernels::Backend& backend, int slot) {
  if (slot_floats_ > 0) {
    float* base = state_.as<float>() + slot * slot_floats_;
    backend.ops().Fill({.x = base, .n = kv_floats_, .value = 0.f});
    backend.ops().Fill({.x = base + kv_floats_, .n = kv_floats_, .value = -std::numeric_limits<float>::infinity()});
  }
  next_pos_[slot] = 0;
}

}  // namespace dsv4::model
