// The paged KV pools and the per-sequence compressor state slots of one model replica (layout: model.h and
// dsv4-decode.md §3), in backend memory. Exact mode stores fp32 rows; production mode stores main rows (window,
// compressed) in the 584-byte FP8 record; indexer rows are fp32 in both modes (after the FP4 simulation in
// production, as DeepSeek's reference keeps them in bf16 after it).
//
// The window pool of each layer has, after its pages, a staging area of max_step_tokens rows: this step's keys,
// so that a prefill chunk's tokens can attend keys that later tokens of the chunk overwrite in the ring
// (kernels/ops.h, KvWindowWriteArgs).
//
// Compressor state is slot-major: slot s holds [kv of every layer | score of every layer], so resetting a slot
// is two fills.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
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

  absl::Status Allocate(kernels::Backend& backend, std::array<int64_t, kNumKvPools> pages, int page_rows, int slots,
                        int64_t max_step_tokens);
  bool allocated() const { return page_rows_ > 0; }
  int page_rows() const { return page_rows_; }
  int64_t pages(KvPool pool) const { return pages_[static_cast<int>(pool)]; }
  int slots() const { return slots_; }
  // First physical row of the window pool's staging area.
  int32_t staging_row0() const { return static_cast<int32_t>(pages_[0] * page_rows_); }

  // This layer's slice of the pool; the layer must use the pool.
  kernels::KvCacheView View(KvPool pool, int layer) const;

  // Compressor state of `layer` in slot 0 (slot s at + s * StateStride()): kv and score arrays of [C*R, C*d]
  // (main) or [8, 2*index_head_dim] (indexer), fp32.
  float* StateKv(int layer, bool indexer) const;
  float* StateScore(int layer, bool indexer) const;
  int64_t StateStride() const { return slot_floats_; }
  // The whole storage of a pool (every layer's slice) and of the state: for a benchmark's synthetic fill.
  const kernels::Buffer& Storage(KvPool pool) const { return storage_[static_cast<int>(pool)]; }
  float* StateBase() const { return state_.as<float>(); }
  // Enqueues the reset of a slot's state (kv 0, score -inf) on the backend.
  void ResetSlot(kernels::Backend& backend, int slot);
  // Tokens this slot has consumed (the next position it accepts); host bookkeeping.
  int64_t& next_pos(int slot) { return next_pos_[slot]; }
  int64_t next_pos(int slot) const { return next_pos_[slot]; }

 private:
  int64_t StateFloats(int layer, bool indexer) const;  // per array, per slot

  const Config& config_;
  NumericMode mode_;
  std::array<std::vector<int>, kNumKvPools> layers_;
  std::array<std::vector<int>, kNumKvPools> pool_index_;  // layer -> index in layers_[pool] (or -1)
  int page_rows_ = 0, slots_ = 0;
  std::array<int64_t, kNumKvPools> pages_{};
  std::array<int64_t, kNumKvPools> layer_pages_{};  // pages per layer slice (window: + staging pages)
  std::array<kernels::Buffer, kNumKvPools> storage_;
  kernels::Buffer state_;
  std::vector<int64_t> state_offset_;  // per layer: offset of its main kv within a slot's kv region
  int64_t kv_floats_ = 0;              // floats of one slot's kv region (= its score region)
  int64_t slot_floats_ = 0;            // 2 * kv_floats_
  std::vector<int64_t> next_pos_;
};

}  // namespace dsv4::model
