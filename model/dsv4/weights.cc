// Loading and dequantising the weights: see weights.h.
#include "model/dsv4/weights.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/float_formats.h"
#include "comm/shard.h"
#include "common/status_macros.h"
#include "model/checkpoint/weight_formats.h"

namespace dsv4::model {
namespace {

std::string Shape(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

// A plain (non-linear) tensor of BF16 or F32 with exactly `shape`; a scalar [] is accepted for shape [1].
absl::StatusOr<Tensor> LoadPlain(const ckpt::Checkpoint& ck, const std::string& name, std::vector<int64_t> shape) {
  DSV4_ASSIGN_OR_RETURN(ckpt::TensorView v, ck.Get(name));
  const bool scalar_ok = v.shape.empty() && shape == std::vector<int64_t>{1};
  if (v.shape != shape && !scalar_ok) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected shape ", Shape(shape), ", found ", Shape(v.shape)));
  }
  Tensor t{shape, std::vector<float>(v.numel())};
  for (int64_t i = 0; i < v.numel(); ++i) {
    if (v.dtype == ckpt::DType::kF32) {
      std::memcpy(&t.data[i], v.data + 4 * i, 4);
    } else if (v.dtype == ckpt::DType::kBF16) {
      uint16_t h;
      std::memcpy(&h, v.data + 2 * i, 2);
      t.data[i] = Bf16ToF32(h);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": expected BF16 or F32, found ", ckpt::DTypeName(v.dtype)));
    }
    if (!std::isfinite(t.data[i])) return absl::DataLossError(absl::StrCat(name, ": non-finite value at ", i));
  }
  return t;
}

// A linear in any checkpoint format, dequantised to [n, k].
absl::StatusOr<Tensor> LoadLinear(const ckpt::Checkpoint& ck, const std::string& base, int64_t n, int64_t k) {
  DSV4_ASSIGN_OR_RETURN(ckpt::LinearWeight w, ckpt::LoadLinearWeight(ck, base));
  if (w.n != n || w.k != k) {
    return absl::InvalidArgumentError(
        absl::StrCat(base, ": expected a [", n, ",", k, "] linear, found [", w.n, ",", w.k, "]"));
  }
  DSV4_ASSIGN_OR_RETURN(std::vector<float> data, ckpt::Dequantize(w));
  return Tensor{{n, k}, std::move(data)};
}

// Tensor parallelism: rows x columns of an [n, k] linear (this rank's shard), dequantised; reads only those bytes.
absl::StatusOr<Tensor> LoadLinearShard(const ckpt::Checkpoint& ck, const std::string& base, int64_t n, int64_t k,
                                       comm::Range rows, comm::Range cols) {
  DSV4_ASSIGN_OR_RETURN(std::vector<float> data, comm::LoadLinearBlock(ck, base, n, k, rows, cols));
  return Tensor{{rows.size, cols.size}, std::move(data)};
}

absl::StatusOr<CompressorWeights> LoadCompressor(const ckpt::Checkpoint& ck, const std::string& p, int ratio,
                                                 int64_t d, int64_t dim) {
  const int64_t cd = (ratio == 4 ? 2 : 1) * d;
  CompressorWeights c;
  DSV4_ASSIGN_OR_RETURN(c.wkv, LoadLinear(ck, p + "wkv", cd, dim));
  DSV4_ASSIGN_OR_RETURN(c.wgate, LoadLinear(ck, p + "wgate", cd, dim));
  DSV4_ASSIGN_OR_RETURN(c.ape, LoadPlain(ck, p + "ape", {ratio, cd}));
  DSV4_ASSIGN_OR_RETURN(c.norm, LoadPlain(ck, p + "norm.weight", {d}));
  return c;
}

absl::Status LoadAttention(const ckpt::Checkpoint& ck, const Config& c, const std::string& p, LayerWeights& l,
                           const comm::ShardLayout* shard) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads, Dh = c.head_dim, G = c.o_groups;
  DSV4_ASSIGN_OR_RETURN(l.wq_a, LoadLinear(ck, p + "wq_a", c.q_lora_rank, D));
  DSV4_ASSIGN_OR_RETURN(l.q_norm, LoadPlain(ck, p + "q_norm.weight", {c.q_lora_rank}));
  if (shard == nullptr) {
    DSV4_ASSIGN_OR_RETURN(l.wq_b, LoadLinear(ck, p + "wq_b", H * Dh, c.q_lora_rank));
  } else {  // this rank's heads
    DSV4_ASSIGN_OR_RETURN(l.wq_b, LoadLinearShard(ck, p + "wq_b", H * Dh, c.q_lora_rank,
                                                  {shard->heads.begin * Dh, shard->heads.size * Dh},
                                                  {0, c.q_lora_rank}));
  }
  DSV4_ASSIGN_OR_RETURN(l.wkv, LoadLinear(ck, p + "wkv", Dh, D));
  DSV4_ASSIGN_OR_RETURN(l.kv_norm, LoadPlain(ck, p + "kv_norm.weight", {Dh}));
  DSV4_ASSIGN_OR_RETURN(l.attn_sink, LoadPlain(ck, p + "attn_sink", {H}));
  if (shard == nullptr) {
    DSV4_ASSIGN_OR_RETURN(l.wo_a, LoadLinear(ck, p + "wo_a", G * c.o_lora_rank, H * Dh / G));
    DSV4_ASSIGN_OR_RETURN(l.wo_b, LoadLinear(ck, p + "wo_b", D, G * c.o_lora_rank));
  } else {  // this rank's groups (or its heads' columns of one group) of wo_a, those groups' columns of wo_b
    const comm::Range group_rows{shard->groups.begin * c.o_lora_rank, shard->groups.size * c.o_lora_rank};
    DSV4_ASSIGN_OR_RETURN(l.wo_a, LoadLinearShard(ck, p + "wo_a", G * c.o_lora_rank, H * Dh / G, group_rows,
                                                  shard->group_cols));
    DSV4_ASSIGN_OR_RETURN(l.wo_b, LoadLinearShard(ck, p + "wo_b", D, G * c.o_lora_rank, {0, D}, group_rows));
    l.attn_sink = Tensor{{shard->heads.size},
                         std::vector<float>(l.attn_sink.data.begin() + shard->heads.begin,
                                            l.attn_sink.data.begin() + shard->heads.end())};
  }
  if (l.ratio > 0) {
    DSV4_ASSIGN_OR_RETURN(l.compressor, LoadCompressor(ck, p + "compressor.", l.ratio, Dh, D));
  }
  if (l.ratio == 4) {
    const int64_t IH = c.index_n_heads, ID = c.index_head_dim;
    DSV4_ASSIGN_OR_RETURN(l.idx_wq_b, LoadLinear(ck, p + "indexer.wq_b", IH * ID, c.q_lora_rank));
    DSV4_ASSIGN_OR_RETURN(l.idx_weights_proj, LoadLinear(ck, p + "indexer.weights_proj", IH, D));
    DSV4_ASSIGN_OR_RETURN(l.idx_compressor, LoadCompressor(ck, p + "indexer.compressor.", 4, ID, D));
  }
  return absl::OkStatus();
}

absl::Status LoadFfn(const ckpt::Checkpoint& ck, const Config& c, const std::string& p, LayerWeights& l,
                     const comm::ShardLayout* shard) {
  const int64_t D = c.hidden_size, E = c.n_routed_experts, I = c.moe_intermediate_size, K = c.num_experts_per_tok;
  DSV4_ASSIGN_OR_RETURN(l.gate, LoadLinear(ck, p + "gate", E, D));
  if (l.hash) {
    const std::string name = p + "gate.tid2eid";
    DSV4_ASSIGN_OR_RETURN(ckpt::TensorView v, ck.Get(name));
    if ((v.dtype != ckpt::DType::kI64 && v.dtype != ckpt::DType::kI32) || v.shape != std::vector<int64_t>{c.vocab_size, K}) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": expected I64 [", c.vocab_size, ",", K, "], found ",
                                                     ckpt::DTypeName(v.dtype), " ", Shape(v.shape)));
    }
    l.tid2eid.resize(v.numel());
    for (int64_t i = 0; i < v.numel(); ++i) {
      int64_t e = 0;
      if (v.dtype == ckpt::DType::kI64) std::memcpy(&e, v.data + 8 * i, 8);
      else { int32_t e32; std::memcpy(&e32, v.data + 4 * i, 4); e = e32; }
      if (e < 0 || e >= E) return absl::InvalidArgumentError(absl::StrCat(name, ": expert id ", e, " at ", i, " out of [0,", E, ")"));
      l.tid2eid[i] = static_cast<int32_t>(e);
    }
  } else {
    DSV4_ASSIGN_OR_RETURN(l.gate_bias, LoadPlain(ck, p + "gate.bias", {E}));
  }
  l.w1.resize(E);
  l.w2.resize(E);
  l.w3.resize(E);
  for (int64_t e = 0; e < E; ++e) {
    // Expert parallel: another rank's expert stays empty (the MoE op skips it).
    if (shard != nullptr && (e < shard->experts.begin || e >= shard->experts.end())) continue;
    const std::string x = absl::StrCat(p, "experts.", e, ".");
    DSV4_ASSIGN_OR_RETURN(l.w1[e], LoadLinear(ck, x + "w1", I, D));
    DSV4_ASSIGN_OR_RETURN(l.w3[e], LoadLinear(ck, x + "w3", I, D));
    DSV4_ASSIGN_OR_RETURN(l.w2[e], LoadLinear(ck, x + "w2", D, I));
  }
  const int64_t Is = I * c.n_shared_experts;
  if (shard == nullptr) {
    DSV4_ASSIGN_OR_RETURN(l.shared_w1, LoadLinear(ck, p + "shared_experts.w1", Is, D));
    DSV4_ASSIGN_OR_RETURN(l.shared_w3, LoadLinear(ck, p + "shared_experts.w3", Is, D));
    DSV4_ASSIGN_OR_RETURN(l.shared_w2, LoadLinear(ck, p + "shared_experts.w2", D, Is));
  } else {  // this rank's intermediate slice: rows of w1/w3, columns of w2
    const comm::Range r = shard->shared_inter;
    DSV4_ASSIGN_OR_RETURN(l.shared_w1, LoadLinearShard(ck, p + "shared_experts.w1", Is, D, r, {0, D}));
    DSV4_ASSIGN_OR_RETURN(l.shared_w3, LoadLinearShard(ck, p + "shared_experts.w3", Is, D, r, {0, D}));
    DSV4_ASSIGN_OR_RETURN(l.shared_w2, LoadLinearShard(ck, p + "shared_experts.w2", D, Is, {0, D}, r));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadWeights(const ckpt::Checkpoint& ck, const Config& c,
                                                          const comm::ShardLayout* shard,
                                                          const std::function<void(int, int)>& on_layer) {
  if (c.n_shared_experts != 1) {
    return absl::InvalidArgumentError(absl::StrCat("n_shared_experts ", c.n_shared_experts, " unsupported (must be 1)"));
  }
  auto w = std::make_unique<ModelWeights>();
  const int64_t D = c.hidden_size, S = c.hc_mult, V = c.vocab_size;
  DSV4_ASSIGN_OR_RETURN(w->embed, LoadLinear(ck, "embed", V, D));
  if (shard == nullptr) {
    DSV4_ASSIGN_OR_RETURN(w->head, LoadLinear(ck, "head", V, D));
  } else {  // this rank's vocabulary rows
    DSV4_ASSIGN_OR_RETURN(w->head, LoadLinearShard(ck, "head", V, D, shard->vocab, {0, D}));
  }
  DSV4_ASSIGN_OR_RETURN(w->norm, LoadPlain(ck, "norm.weight", {D}));
  DSV4_ASSIGN_OR_RETURN(w->hc_head_fn, LoadPlain(ck, "hc_head_fn", {S, S * D}));
  DSV4_ASSIGN_OR_RETURN(w->hc_head_base, LoadPlain(ck, "hc_head_base", {S}));
  DSV4_ASSIGN_OR_RETURN(w->hc_head_scale, LoadPlain(ck, "hc_head_scale", {1}));
  w->layers.resize(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& l = w->layers[i];
    l.ratio = c.CompressRatio(i);
    l.hash = c.IsHashLayer(i);
    const std::string p = absl::StrCat("layers.", i, ".");
    DSV4_ASSIGN_OR_RETURN(l.attn_norm, LoadPlain(ck, p + "attn_norm.weight", {D}));
    DSV4_ASSIGN_OR_RETURN(l.ffn_norm, LoadPlain(ck, p + "ffn_norm.weight", {D}));
    for (auto [site, fn, base, scale] : {std::tuple{"attn", &l.hc_attn_fn, &l.hc_attn_base, &l.hc_attn_scale},
                                         std::tuple{"ffn", &l.hc_ffn_fn, &l.hc_ffn_base, &l.hc_ffn_scale}}) {
      const std::string q = absl::StrCat(p, "hc_", site, "_");
      DSV4_ASSIGN_OR_RETURN(*fn, LoadPlain(ck, q + "fn", {c.hc_mix_dim(), S * D}));
      DSV4_ASSIGN_OR_RETURN(*base, LoadPlain(ck, q + "base", {c.hc_mix_dim()}));
      DSV4_ASSIGN_OR_RETURN(*scale, LoadPlain(ck, q + "scale", {3}));
    }
    DSV4_RETURN_IF_ERROR(LoadAttention(ck, c, p + "attn.", l, shard));
    DSV4_RETURN_IF_ERROR(LoadFfn(ck, c, p + "ffn.", l, shard));
    if (on_layer) on_layer(i + 1, static_cast<int>(c.num_hidden_layers));
  }
  return w;
}

}  // namespace dsv4::model
