// Per-token cache work of one attention layer (dsv4-decode.md §2.3), run in token order so a prefill chunk
// leaves exactly the state token-by-token decoding would: write the token's key into its window ring row,
// step the main compressor (emitting a compressed row every r-th token) and, on ratio-4 layers, the
// indexer's own compressor, then list the keys this token attends: its window plus all compressed rows
// (ratio 128) or the indexer's top-k (ratio 4). Whether a row is emitted follows from the position alone,
// so nothing here branches on computed data.
#include <algorithm>

#include "model/dsv4/forward.h"

namespace dsv4::model {
namespace {

KvPool CompressedPool(int ratio) { return ratio == 4 ? KvPool::kCompressed4 : KvPool::kCompressed128; }

// Steps one compressor and, when this token closes a window, normalises, rotates (at the window's first
// position) and stores the new row n = p / r.
void StepCompressor(Dsv4Model::Impl& m, int layer, const SeqBlockTables& tab, int32_t p, bool indexer,
                    const float* kv, const float* gate, const CompressorWeights& w, KvPool pool) {
  const int r = indexer ? 4 : m.config.CompressRatio(layer);
  const int d = static_cast<int>(indexer ? m.config.index_head_dim : m.config.head_dim);
  std::vector<float> pooled(d);
  int32_t emitted = 0;
  m.ops->Compressor({.state_kv = m.cache->StateKv(layer, tab.state_slot, indexer),
                     .state_score = m.cache->StateScore(layer, tab.state_slot, indexer),
                     .kv = kv, .gate = gate, .ape = w.ape.ptr(), .pooled = pooled.data(), .emitted = &emitted,
                     .ratio = r, .d = d, .pos = p});
  if ((p + 1) % r != 0) return;
  m.ops->RmsNorm({.x = pooled.data(), .w = w.norm.ptr(), .out = pooled.data(), .rows = 1, .dim = d,
                  .eps = static_cast<float>(m.config.rms_norm_eps)});
  const int32_t first = p + 1 - r;
  m.ops->Rope({.x = pooled.data(), .pos = &first, .inv_freq = m.inv_freq[layer].data(), .t = 1, .heads = 1,
               .row_dim = d, .pairs = static_cast<int>(m.config.qk_rope_head_dim / 2)});
  if (indexer && m.options.mode == NumericMode::kProduction) m.ops->HadamardFp4RoundTrip(pooled.data(), 1, d);
  const int32_t row = m.PhysicalRow(tab, pool, p / r);
  m.ops->KvWrite({.rows = pooled.data(), .cache = m.cache->View(pool, layer), .row_ids = &row, .t = 1});
}

}  // namespace

void UpdateCacheAndSelect(Dsv4Model::Impl& m, int layer, const StepBatch& batch, int64_t t,
                          const LayerActivations& act, TokenKeys& keys) {
  const Config& c = m.config;
  const LayerWeights& w = m.weights->layers[layer];
  const SeqBlockTables& tab = *batch.tables[batch.chunk_of[t]];
  const int32_t p = batch.pos[t];
  const int r = w.ratio;
  const int64_t dh = c.head_dim;

  const int32_t row = m.PhysicalRow(tab, KvPool::kWindow, p);
  m.ops->KvWrite({.rows = act.kv + t * dh, .cache = m.cache->View(KvPool::kWindow, layer), .row_ids = &row, .t = 1});
  keys.window_count = 0;
  for (int64_t q = std::max<int64_t>(0, p - c.sliding_window + 1); q <= p; ++q) {
    keys.window_rows[keys.window_count++] = m.PhysicalRow(tab, KvPool::kWindow, q);
  }
  keys.compressed_count = 0;
  if (r == 0) return;

  const int64_t cd = (r == 4 ? 2 : 1) * dh;
  StepCompressor(m, layer, tab, p, false, act.comp_kv + t * cd, act.comp_gate + t * cd, w.compressor,
                 CompressedPool(r));
  const int64_t n = (p + 1) / r;  // visible compressed rows, this step's included
  if (r == 128) {
    for (int64_t i = 0; i < n; ++i) keys.compressed_rows[i] = m.PhysicalRow(tab, KvPool::kCompressed128, i);
    keys.compressed_count = static_cast<int32_t>(n);
    return;
  }
  // Ratio 4: the indexer's compressor runs before scoring, so a row emitted now is scoreable now.
  const int64_t id = c.index_head_dim, ih = c.index_n_heads;
  StepCompressor(m, layer, tab, p, true, act.idx_kv + t * 2 * id, act.idx_gate + t * 2 * id, w.idx_compressor,
                 KvPool::kIndexer);
  std::vector<int32_t> index_rows(n), target_rows(n), out_rows(c.index_topk);
  std::vector<float> scratch(n);
  for (int64_t i = 0; i < n; ++i) {
    index_rows[i] = m.PhysicalRow(tab, KvPool::kIndexer, i);
    target_rows[i] = m.PhysicalRow(tab, KvPool::kCompressed4, i);
  }
  const int32_t count = static_cast<int32_t>(n);
  int32_t selected = 0;
  m.ops->Indexer({.q = act.idx_q + t * ih * id, .w = act.idx_w + t * ih,
                  .cache = m.cache->View(KvPool::kIndexer, layer), .index_rows = index_rows.data(),
                  .target_rows = target_rows.data(), .count = &count, .out_rows = out_rows.data(),
                  .out_count = &selected, .scratch = scratch.data(), .b = 1, .heads = ih, .dim = id,
                  .max_rows = n, .k = c.index_topk});
  std::copy_n(out_rows.begin(), selected, keys.compressed_rows.begin());
  keys.compressed_count = selected;
}

}  // namespace dsv4::model
