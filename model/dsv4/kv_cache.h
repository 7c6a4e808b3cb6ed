// The paged KV pools and the per-sequence compressor state slots of one model replica (layout: model.h and
// dsv4-decode.md §3). Exact mode stores fp32 rows; production mode stores main rows (window, compressed) in
// the 584-byte FP8 record; indexer rows are fp32 in both modes (after the FP4 simulation in production, as
// DeepSeek's reference keeps them in bf16 after it).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/ops.h"
#include "model/config/config.h"
#include "model/dsv4/model.h"

namespace dsv4::model {

class KvCache {
 public:
  KvCache(const Config& config, NumericMode mode);

  // Layers that use `pool`, in order (the pool's per-layer slices follow this order).
  const std::vector<int>& Layers(KvPool pool) const { return layers_[static_cast<int>(pool)]; }
  kernels::KvFormat Format(KvPool pool) const;
  int RowDim(KvPool pool) const;
  // Bytes of one page in one layer's slice.
  int64_t LayerPageBytes(KvPool pool, int page_rows) const;

  absl::Status Allocate(std::array<int64_t, kNumKvPools> pages, int page_rows, int slots);
  bool allocated() const { return page_rows_ > 0; }
  int page_rows() const { return page_rows_; }
  int64_t pages(KvPool pool) const { return pages_[static_cast<int>(pool)]; }
  int slots() const { return slots_; }

  // This layer's slice of the pool; the layer must use the pool.
  kernels::KvCacheView View(KvPool pool, int layer);

  // Compressor state of (layer, slot): kv and score arrays of [C*R, C*d] (main) or [8, 2*index_head_dim]
  // (indexer), fp32, reset to 0 / -inf.
  float* StateKv(int layer, int slot, bool indexer);
  float* StateScore(int layer, int slot, bool indexer);
  void ResetSlot(int slot);
  // Tokens this slot has consumed (the next position it accepts).
  int64_t& next_pos(int slot) { return next_pos_[slot]; }

 private:
  int64_t StateFloats(int layer, bool indexer) const;  // per array, per slot
  float* State(int layer, int slot, bool indexer, bool score);

  const Config& config_;
  NumericMode mode_;
  std::array<std::vector<int>, kNumKvPools> layers_;
  std::vector<int> pool_index_[kNumKvPools];  // layer -> index in layers_[pool] (or -1)
  int page_rows_ = 0, slots_ = 0;
  std::array<int64_t, kNumKvPools> pages_{};
  std::array<std::vector<uint8_t>, kNumKvPools> storage_;
  std::vector<std::vector<float>> state_;  // per layer: slots x [main kv, main score, idx kv, idx score]
  std::vector<int64_t> next_pos_;
};

}  // namespace dsv4::model
