// The byte floor's counts: see byte_floor.h.
#include "bench/decode/byte_floor.h"

#include <algorithm>
#include <string>

namespace dsv4::bench {
namespace {

bool Contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

WeightBytes CountWeightBytes(const Config& c, ExpertFormat experts, int world) {
  WeightBytes w;
  const int64_t T = std::max(1, world);
  w.experts_held = c.n_routed_experts / T;
  for (const ParamSpec& p : ParamInventory(c, experts)) {
    if (p.layer >= c.num_hidden_layers) continue;  // MTP
    int64_t bytes = 0;
    for (const TensorSpec& t : TensorsOf(p)) bytes += t.nbytes();
    const std::string& n = p.name;
    if (Contains(n, ".ffn.experts.")) {
      if (n.rfind("layers.0.ffn.experts.0.", 0) == 0) w.per_expert += bytes;  // w1, w2, w3 of one expert
      continue;
    }
    if (p.kind == ParamKind::kTid2Eid) {
      w.resident += bytes;
      continue;
    }
    if (p.kind == ParamKind::kEmbedding) {
      w.resident += bytes;
      w.embed_row = bytes / c.vocab_size;
      continue;
    }
    const bool sharded = Contains(n, "attn.wq_b") || Contains(n, "attn.wo_a") || Contains(n, "attn.wo_b") ||
                         Contains(n, "attn_sink") || Contains(n, "shared_experts.") || n == "head";
    w.dense += sharded ? bytes / T : bytes;
  }
  w.resident += w.dense + w.per_expert * w.experts_held * c.num_hidden_layers;
  return w;
}

KvBytes CountKvBytes(const Config& c, int64_t context) {
  constexpr int64_t kRow = 584;
  KvBytes kv;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    kv.attention += std::min<int64_t>(context, c.sliding_window) * kRow;
    const int r = c.CompressRatio(l);
    if (r == 4) {
      kv.attention += std::min<int64_t>(c.index_topk, context / 4) * kRow;
      kv.indexer += context / 4 * c.index_head_dim * 4;
    } else if (r == 128) {
      kv.attention += context / 128 * kRow;
    }
  }
  return kv;
}

}  // namespace dsv4::bench
