// Loading the weights into the backend: see weights.h.
#include "model/dsv4/weights.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/float_formats.h"
#include "common/status_macros.h"

namespace dsv4::model {
namespace {

std::string Shape(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

// A plain tensor of BF16 or F32 with exactly `shape` (a scalar [] is accepted for shape [1]) as host fp32.
absl::StatusOr<std::vector<float>> ReadPlain(const ckpt::Checkpoint& ck, const std::string& name,
                                             const std::vector<int64_t>& shape) {
  DSV4_ASSIGN_OR_RETURN(ckpt::TensorView v, ck.Get(name));
  const bool scalar_ok = v.shape.empty() && shape == std::vector<int64_t>{1};
  if (v.shape != shape && !scalar_ok) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected shape ", Shape(shape), ", found ", Shape(v.shape)));
  }
  std::vector<float> out(v.numel());
  for (int64_t i = 0; i < v.numel(); ++i) {
    if (v.dtype == ckpt::DType::kF32) {
      std::memcpy(&out[i], v.data + 4 * i, 4);
    } else if (v.dtype == ckpt::DType::kBF16) {
      uint16_t h;
      std::memcpy(&h, v.data + 2 * i, 2);
      out[i] = Bf16ToF32(h);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(name, ": expected BF16 or F32, found ", ckpt::DTypeName(v.dtype)));
    }
    if (!std::isfinite(out[i])) return absl::DataLossError(absl::StrCat(name, ": non-finite value at ", i));
  }
  return out;
}

// Loads tensors into one layer (or the model) through the backend; `shard` is null for world 1.
class Loader {
 public:
  Loader(const ckpt::Checkpoint& ck, kernels::Backend& backend) : ck_(ck), backend_(backend) {}

  absl::StatusOr<PlainTensor> Plain(const std::string& name, std::vector<int64_t> shape) {
    DSV4_ASSIGN_OR_RETURN(std::vector<float> host, ReadPlain(ck_, name, shape));
    return Upload(std::move(shape), host);
  }
  absl::StatusOr<PlainTensor> Upload(std::vector<int64_t> shape, std::span<const float> host) {
    DSV4_ASSIGN_OR_RETURN(kernels::Buffer b, backend_.UploadF32(host));
    return PlainTensor{std::move(shape), std::move(b)};
  }
  // Linear `base` of logical [n, k]: rows x cols of it (all when the ranges are empty).
  absl::StatusOr<kernels::LinearHandle> Linear(const std::string& base, int64_t n, int64_t k, Range rows = {},
                                               Range cols = {}) {
    if (rows.size == 0) rows = {0, n};
    if (cols.size == 0) cols = {0, k};
    DSV4_ASSIGN_OR_RETURN(HostLinear h, ReadLinearBlock(ck_, base, n, k, rows, cols));
    return backend_.PrepareLinear(h.view);
  }
  kernels::Backend& backend() { return backend_; }
  const ckpt::Checkpoint& checkpoint() { return ck_; }

 private:
  const ckpt::Checkpoint& ck_;
  kernels::Backend& backend_;
};

absl::StatusOr<CompressorWeights> LoadCompressor(Loader& ld, const std::string& p, int ratio, int64_t d, int64_t dim) {
  const int64_t cd = (ratio == 4 ? 2 : 1) * d;
  CompressorWeights c;
  DSV4_ASSIGN_OR_RETURN(c.wkv, ld.Linear(p + "wkv", cd, dim));
  DSV4_ASSIGN_OR_RETURN(c.wgate, ld.Linear(p + "wgate", cd, dim));
  DSV4_ASSIGN_OR_RETURN(c.ape, ld.Plain(p + "ape", {ratio, cd}));
  DSV4_ASSIGN_OR_RETURN(c.norm, ld.Plain(p + "norm.weight", {d}));
  return c;
}

absl::Status LoadAttention(Loader& ld, const Config& c, const std::string& p, LayerWeights& l, const ShardLayout* shard) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads, Dh = c.head_dim, G = c.o_groups, OL = c.o_lora_rank;
  DSV4_ASSIGN_OR_RETURN(l.wq_a, ld.Linear(p + "wq_a", c.q_lora_rank, D));
  DSV4_ASSIGN_OR_RETURN(l.q_norm, ld.Plain(p + "q_norm.weight", {c.q_lora_rank}));
  DSV4_ASSIGN_OR_RETURN(l.wkv, ld.Linear(p + "wkv", Dh, D));
  DSV4_ASSIGN_OR_RETURN(l.kv_norm, ld.Plain(p + "kv_norm.weight", {Dh}));
  DSV4_ASSIGN_OR_RETURN(std::vector<float> sink, ReadPlain(ld.checkpoint(), p + "attn_sink", {H}));
  if (shard == nullptr) {
    DSV4_ASSIGN_OR_RETURN(l.wq_b, ld.Linear(p + "wq_b", H * Dh, c.q_lora_rank));
    DSV4_ASSIGN_OR_RETURN(l.wo_a, ld.Linear(p + "wo_a", G * OL, H * Dh / G));
    DSV4_ASSIGN_OR_RETURN(l.wo_b, ld.Linear(p + "wo_b", D, G * OL));
    DSV4_ASSIGN_OR_RETURN(l.attn_sink, ld.Upload({H}, sink));
  } else {  // this rank's heads; its groups (or its heads' columns of one group) of wo_a; those groups' columns of wo_b
    const Range group_rows{shard->groups.begin * OL, shard->groups.size * OL};
    DSV4_ASSIGN_OR_RETURN(l.wq_b, ld.Linear(p + "wq_b", H * Dh, c.q_lora_rank,
                                            {shard->heads.begin * Dh, shard->heads.size * Dh}));
    DSV4_ASSIGN_OR_RETURN(l.wo_a, ld.Linear(p + "wo_a", G * OL, H * Dh / G, group_rows, shard->group_cols));
    DSV4_ASSIGN_OR_RETURN(l.wo_b, ld.Linear(p + "wo_b", D, G * OL, {0, D}, group_rows));
    DSV4_ASSIGN_OR_RETURN(l.attn_sink, ld.Upload({shard->heads.size}, std::span<const float>(sink).subspan(
                                                                          shard->heads.begin, shard->heads.size)));
  }
  if (l.ratio > 0) {
    DSV4_ASSIGN_OR_RETURN(l.compressor, LoadCompressor(ld, p + "compressor.", l.ratio, Dh, D));
  }
  if (l.ratio == 4) {
    const int64_t IH = c.index_n_heads, ID = c.index_head_dim;
    DSV4_ASSIGN_OR_RETURN(l.idx_wq_b, ld.Linear(p + "indexer.wq_b", IH * ID, c.q_lora_rank));
    DSV4_ASSIGN_OR_RETURN(l.idx_weights_proj, ld.Linear(p + "indexer.weights_proj", IH, D));
    DSV4_ASSIGN_OR_RETURN(l.idx_compressor, LoadCompressor(ld, p + "indexer.compressor.", 4, ID, D));
  }
  return absl::OkStatus();
}

absl::StatusOr<kernels::Buffer> LoadTid2eid(Loader& ld, const Config& c, const std::string& name) {
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok;
  DSV4_ASSIGN_OR_RETURN(ckpt::TensorView v, ld.checkpoint().Get(name));
  if ((v.dtype != ckpt::DType::kI64 && v.dtype != ckpt::DType::kI32) || v.shape != std::vector<int64_t>{c.vocab_size, K}) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected I64 [", c.vocab_size, ",", K, "], found ",
                                                   ckpt::DTypeName(v.dtype), " ", Shape(v.shape)));
  }
  std::vector<int32_t> ids(v.numel());
  for (int64_t i = 0; i < v.numel(); ++i) {
    int64_t e = 0;
    if (v.dtype == ckpt::DType::kI64) {
      std::memcpy(&e, v.data + 8 * i, 8);
    } else {
      int32_t e32;
      std::memcpy(&e32, v.data + 4 * i, 4);
      e = e32;
    }
    if (e < 0 || e >= E) return absl::InvalidArgumentError(absl::StrCat(name, ": expert id ", e, " at ", i, " out of [0,", E, ")"));
    ids[i] = static_cast<int32_t>(e);
  }
  return ld.backend().UploadI32(ids);
}

absl::Status LoadFfn(Loader& ld, const Config& c, const std::string& p, LayerWeights& l, const ShardLayout* shard) {
  const int64_t D = c.hidden_size, E = c.n_routed_experts, I = c.moe_intermediate_size;
  DSV4_ASSIGN_OR_RETURN(l.gate, ld.Linear(p + "gate", E, D));
  if (l.hash) {
    DSV4_ASSIGN_OR_RETURN(l.tid2eid, LoadTid2eid(ld, c, p + "gate.tid2eid"));
  } else {
    DSV4_ASSIGN_OR_RETURN(l.gate_bias, ld.Plain(p + "gate.bias", {E}));
  }
  // The routed experts as views into the mapped checkpoint (no copy); another rank's expert has an empty view.
  std::vector<HostLinear> w1(E), w3(E), w2(E);
  for (int64_t e = 0; e < E; ++e) {
    if (shard != nullptr && (e < shard->experts.begin || e >= shard->experts.end())) continue;
    const std::string x = absl::StrCat(p, "experts.", e, ".");
    DSV4_ASSIGN_OR_RETURN(w1[e], ReadLinear(ld.checkpoint(), x + "w1", I, D));
    DSV4_ASSIGN_OR_RETURN(w3[e], ReadLinear(ld.checkpoint(), x + "w3", I, D));
    DSV4_ASSIGN_OR_RETURN(w2[e], ReadLinear(ld.checkpoint(), x + "w2", D, I));
  }
  std::vector<kernels::WeightView> v1(E), v3(E), v2(E);
  for (int64_t e = 0; e < E; ++e) v1[e] = w1[e].view, v3[e] = w3[e].view, v2[e] = w2[e].view;
  DSV4_ASSIGN_OR_RETURN(l.experts, ld.backend().PrepareExperts(v1, v3, v2));
  const int64_t Is = I * c.n_shared_experts;
  const Range r = shard != nullptr ? shard->shared_inter : Range{0, Is};  // rows of w1/w3, columns of w2
  DSV4_ASSIGN_OR_RETURN(l.shared_w1, ld.Linear(p + "shared_experts.w1", Is, D, r, {0, D}));
  DSV4_ASSIGN_OR_RETURN(l.shared_w3, ld.Linear(p + "shared_experts.w3", Is, D, r, {0, D}));
  DSV4_ASSIGN_OR_RETURN(l.shared_w2, ld.Linear(p + "shared_experts.w2", D, Is, {0, D}, r));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadWeights(const ckpt::Checkpoint& ck, const Config& c,
                                                          kernels::Backend& backend, const ShardLayout* shard,
                                                          const std::function<void(int, int)>& on_layer) {
  if (c.n_shared_experts != 1) {
    return absl::InvalidArgumentError(absl::StrCat("n_shared_experts ", c.n_shared_experts, " unsupported (must be 1)"));
  }
  Loader ld(ck, backend);
  auto w = std::make_unique<ModelWeights>();
  const int64_t D = c.hidden_size, S = c.hc_mult, V = c.vocab_size;
  DSV4_ASSIGN_OR_RETURN(w->embed, ld.Linear("embed", V, D));
  DSV4_ASSIGN_OR_RETURN(w->head, ld.Linear("head", V, D, shard != nullptr ? shard->vocab : Range{0, V}, {0, D}));
  DSV4_ASSIGN_OR_RETURN(w->norm, ld.Plain("norm.weight", {D}));
  DSV4_ASSIGN_OR_RETURN(w->hc_head_fn, ld.Plain("hc_head_fn", {S, S * D}));
  DSV4_ASSIGN_OR_RETURN(w->hc_head_base, ld.Plain("hc_head_base", {S}));
  DSV4_ASSIGN_OR_RETURN(w->hc_head_scale, ld.Plain("hc_head_scale", {1}));
  w->layers.resize(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& l = w->layers[i];
    l.ratio = c.CompressRatio(i);
    l.hash = c.IsHashLayer(i);
    const std::string p = absl::StrCat("layers.", i, ".");
    DSV4_ASSIGN_OR_RETURN(l.attn_norm, ld.Plain(p + "attn_norm.weight", {D}));
    DSV4_ASSIGN_OR_RETURN(l.ffn_norm, ld.Plain(p + "ffn_norm.weight", {D}));
    for (auto [site, fn, base, scale] : {std::tuple{"attn", &l.hc_attn_fn, &l.hc_attn_base, &l.hc_attn_scale},
                                         std::tuple{"ffn", &l.hc_ffn_fn, &l.hc_ffn_base, &l.hc_ffn_scale}}) {
      const std::string q = absl::StrCat(p, "hc_", site, "_");
      DSV4_ASSIGN_OR_RETURN(*fn, ld.Plain(q + "fn", {c.hc_mix_dim(), S * D}));
      DSV4_ASSIGN_OR_RETURN(*base, ld.Plain(q + "base", {c.hc_mix_dim()}));
      DSV4_ASSIGN_OR_RETURN(*scale, ld.Plain(q + "scale", {3}));
    }
    DSV4_RETURN_IF_ERROR(LoadAttention(ld, c, p + "attn.", l, shard));
    DSV4_RETURN_IF_ERROR(LoadFfn(ld, c, p + "ffn.", l, shard));
    if (on_layer) on_layer(i + 1, static_cast<int>(c.num_hidden_layers));
  }
  return w;
}

}  // namespace dsv4::model
