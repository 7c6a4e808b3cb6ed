// The checkpoint tensor inventory; see tensor_inventory.h for the names and formats.
#include "model/config/tensor_inventory.h"

#include "absl/strings/str_cat.h"

namespace dsv4 {
namespace {

using ckpt::DType;
using ckpt::WeightFormat;

// Appends parameters of one block (a main layer or an MTP layer) under `prefix` ("layers.3.").
class ParamList {
 public:
  ParamList(std::vector<ParamSpec>* out, std::string prefix, int layer)
      : out_(out), prefix_(std::move(prefix)), layer_(layer) {}

  void Linear(std::string_view name, ParamKind kind, WeightFormat format, int64_t n, int64_t k) {
    out_->push_back(ParamSpec{.name = prefix_ + std::string(name), .kind = kind, .linear = true, .format = format,
                              .dtype = WeightDType(format), .shape = {n, k}, .layer = layer_});
  }
  void Plain(std::string_view name, ParamKind kind, DType dtype, std::vector<int64_t> shape) {
    const WeightFormat format = dtype == DType::kF32 ? WeightFormat::kF32 : WeightFormat::kBF16;
    out_->push_back(ParamSpec{.name = prefix_ + std::string(name), .kind = kind, .linear = false, .format = format,
                              .dtype = dtype, .shape = std::move(shape), .layer = layer_});
  }

 private:
  static DType WeightDType(WeightFormat format) {
    switch (format) {
      case WeightFormat::kBF16: return DType::kBF16;
      case WeightFormat::kF32: return DType::kF32;
      case WeightFormat::kFp8Block128: return DType::kF8E4M3;
      case WeightFormat::kNvfp4: return DType::kU8;
      case WeightFormat::kMxfp4: return DType::kI8;
    }
    return DType::kBF16;
  }
  std::vector<ParamSpec>* out_;
  std::string prefix_;
  int layer_;
};

// One softmax-pooling compressor of width d (ratio 4 keeps two overlapping halves: c = 2).
void AddCompressor(ParamList& p, const std::string& prefix, const Config& c, int ratio, int64_t d) {
  const int64_t cd = (ratio == 4 ? 2 : 1) * d;
  p.Linear(absl::StrCat(prefix, "wkv"), ParamKind::kLinear, WeightFormat::kBF16, cd, c.hidden_size);
  p.Linear(absl::StrCat(prefix, "wgate"), ParamKind::kLinear, WeightFormat::kBF16, cd, c.hidden_size);
  p.Plain(absl::StrCat(prefix, "ape"), ParamKind::kApe, DType::kF32, {ratio, cd});
  p.Plain(absl::StrCat(prefix, "norm.weight"), ParamKind::kNorm, DType::kBF16, {d});
}

void AddAttention(ParamList& p, const Config& c, int ratio) {
  constexpr WeightFormat kFp8 = WeightFormat::kFp8Block128;
  const int64_t D = c.hidden_size, H = c.num_attention_heads, Dh = c.head_dim, G = c.o_groups;
  p.Linear("attn.wq_a", ParamKind::kLinear, kFp8, c.q_lora_rank, D);
  p.Plain("attn.q_norm.weight", ParamKind::kNorm, DType::kBF16, {c.q_lora_rank});
  p.Linear("attn.wq_b", ParamKind::kLinear, kFp8, H * Dh, c.q_lora_rank);
  p.Linear("attn.wkv", ParamKind::kLinear, kFp8, Dh, D);
  p.Plain("attn.kv_norm.weight", ParamKind::kNorm, DType::kBF16, {Dh});
  p.Linear("attn.wo_a", ParamKind::kLinear, kFp8, G * c.o_lora_rank, H * Dh / G);
  p.Linear("attn.wo_b", ParamKind::kResidualLinear, kFp8, D, G * c.o_lora_rank);
  p.Plain("attn.attn_sink", ParamKind::kAttnSink, DType::kF32, {H});
  if (ratio > 0) AddCompressor(p, "attn.compressor.", c, ratio, Dh);
  if (ratio == 4) {
    const int64_t IH = c.index_n_heads, ID = c.index_head_dim;
    p.Linear("attn.indexer.wq_b", ParamKind::kLinear, kFp8, IH * ID, c.q_lora_rank);
    p.Linear("attn.indexer.weights_proj", ParamKind::kLinear, WeightFormat::kBF16, IH, D);
    AddCompressor(p, "attn.indexer.compressor.", c, 4, ID);
  }
}

void AddFfn(ParamList& p, const Config& c, bool hash, WeightFormat experts) {
  const int64_t D = c.hidden_size, E = c.n_routed_experts, I = c.moe_intermediate_size;
  p.Linear("ffn.gate", ParamKind::kRouter, WeightFormat::kBF16, E, D);
  if (hash) {
    p.Plain("ffn.gate.tid2eid", ParamKind::kTid2Eid, DType::kI64, {c.vocab_size, c.num_experts_per_tok});
  } else {
    p.Plain("ffn.gate.bias", ParamKind::kRouterBias, DType::kF32, {E});
  }
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = absl::StrCat("ffn.experts.", e, ".");
    p.Linear(x + "w1", ParamKind::kLinear, experts, I, D);
    p.Linear(x + "w2", ParamKind::kResidualLinear, experts, D, I);
    p.Linear(x + "w3", ParamKind::kLinear, experts, I, D);
  }
  const int64_t Is = I * c.n_shared_experts;
  p.Linear("ffn.shared_experts.w1", ParamKind::kLinear, WeightFormat::kFp8Block128, Is, D);
  p.Linear("ffn.shared_experts.w2", ParamKind::kResidualLinear, WeightFormat::kFp8Block128, D, Is);
  p.Linear("ffn.shared_experts.w3", ParamKind::kLinear, WeightFormat::kFp8Block128, Is, D);
}

// The per-block set shared by main and MTP layers: norms, both mHC sites, attention, FFN.
void AddBlock(ParamList& p, const Config& c, int ratio, bool hash, WeightFormat experts) {
  const int64_t D = c.hidden_size, mix = c.hc_mix_dim(), hcD = c.hc_mult * c.hidden_size;
  p.Plain("attn_norm.weight", ParamKind::kNorm, DType::kBF16, {D});
  p.Plain("ffn_norm.weight", ParamKind::kNorm, DType::kBF16, {D});
  for (const char* site : {"hc_attn_", "hc_ffn_"}) {
    p.Plain(absl::StrCat(site, "fn"), ParamKind::kHcFn, DType::kF32, {mix, hcD});
    p.Plain(absl::StrCat(site, "base"), ParamKind::kHcBase, DType::kF32, {mix});
    p.Plain(absl::StrCat(site, "scale"), ParamKind::kHcScale, DType::kF32, {3});
  }
  AddAttention(p, c, ratio);
  AddFfn(p, c, hash, experts);
}

// The final mHC "head" mix and norm: globals of the model and of each MTP block.
void AddHead(ParamList& p, const Config& c) {
  p.Plain("norm.weight", ParamKind::kNorm, DType::kBF16, {c.hidden_size});
  p.Plain("hc_head_fn", ParamKind::kHcFn, DType::kF32, {c.hc_mult, c.hc_mult * c.hidden_size});
  p.Plain("hc_head_base", ParamKind::kHcBase, DType::kF32, {c.hc_mult});
  p.Plain("hc_head_scale", ParamKind::kHcScale, DType::kF32, {1});
}

std::string ModuleOfExpert(int layer, int64_t expert, const char* w) {
  return absl::StrCat("layers.", layer, ".ffn.experts.", expert, ".", w);
}

bool IsRoutedExpert(const ParamSpec& p) { return p.name.find(".ffn.experts.") != std::string::npos; }

}  // namespace

std::string_view ExpertFormatName(ExpertFormat format) {
  return format == ExpertFormat::kNvfp4 ? "nvfp4" : "mxfp4";
}

absl::StatusOr<ExpertFormat> ParseExpertFormat(std::string_view name) {
  if (name == "nvfp4") return ExpertFormat::kNvfp4;
  if (name == "mxfp4") return ExpertFormat::kMxfp4;
  return absl::InvalidArgumentError(absl::StrCat("expert format \"", std::string(name), "\": expected nvfp4 or mxfp4"));
}

std::string_view ParamKindName(ParamKind kind) {
  switch (kind) {
    case ParamKind::kEmbedding: return "embedding";
    case ParamKind::kLinear: return "linear";
    case ParamKind::kResidualLinear: return "residual_linear";
    case ParamKind::kRouter: return "router";
    case ParamKind::kNorm: return "norm";
    case ParamKind::kHcFn: return "hc_fn";
    case ParamKind::kHcBase: return "hc_base";
    case ParamKind::kHcScale: return "hc_scale";
    case ParamKind::kAttnSink: return "attn_sink";
    case ParamKind::kApe: return "ape";
    case ParamKind::kRouterBias: return "router_bias";
    case ParamKind::kTid2Eid: return "tid2eid";
  }
  return "?";
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorSpec::nbytes() const { return numel() * static_cast<int64_t>(ckpt::DTypeSize(dtype)); }

std::vector<ParamSpec> ParamInventory(const Config& c, ExpertFormat experts) {
  std::vector<ParamSpec> out;
  ParamList globals(&out, "", -1);
  globals.Plain("embed.weight", ParamKind::kEmbedding, DType::kBF16, {c.vocab_size, c.hidden_size});
  globals.Linear("head", ParamKind::kLinear, WeightFormat::kBF16, c.vocab_size, c.hidden_size);
  AddHead(globals, c);
  const WeightFormat main_experts = experts == ExpertFormat::kNvfp4 ? WeightFormat::kNvfp4 : WeightFormat::kMxfp4;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    ParamList p(&out, absl::StrCat("layers.", l, "."), l);
    AddBlock(p, c, c.CompressRatio(l), c.IsHashLayer(l), main_experts);
  }
  // MTP blocks: window-only, learned router, MXFP4 experts even in the NVFP4 re-quant (section 4.3).
  for (int i = 0; i < c.num_nextn_predict_layers; ++i) {
    const int layer = static_cast<int>(c.num_hidden_layers) + i;
    ParamList p(&out, absl::StrCat("mtp.", i, "."), layer);
    p.Linear("e_proj", ParamKind::kLinear, WeightFormat::kFp8Block128, c.hidden_size, c.hidden_size);
    p.Linear("h_proj", ParamKind::kLinear, WeightFormat::kFp8Block128, c.hidden_size, c.hidden_size);
    p.Plain("enorm.weight", ParamKind::kNorm, DType::kBF16, {c.hidden_size});
    p.Plain("hnorm.weight", ParamKind::kNorm, DType::kBF16, {c.hidden_size});
    AddHead(p, c);
    AddBlock(p, c, c.CompressRatio(layer), /*hash=*/false, WeightFormat::kMxfp4);
  }
  return out;
}

std::vector<TensorSpec> TensorsOf(const ParamSpec& p) {
  auto spec = [&](std::string name, DType dtype, std::vector<int64_t> shape, TensorRole role) {
    return TensorSpec{.name = std::move(name), .dtype = dtype, .shape = std::move(shape), .format = p.format,
                      .role = role, .param = p.name, .layer = p.layer};
  };
  if (!p.linear) return {spec(p.name, p.dtype, p.shape, TensorRole::kPlain)};
  const int64_t n = p.shape[0], k = p.shape[1];
  const std::string w = p.name + ".weight";
  switch (p.format) {
    case WeightFormat::kBF16:
    case WeightFormat::kF32:
      return {spec(w, p.dtype, {n, k}, TensorRole::kWeight)};
    case WeightFormat::kFp8Block128: {
      const int64_t b = ckpt::kFp8BlockSize;
      return {spec(w, DType::kF8E4M3, {n, k}, TensorRole::kWeight),
              spec(p.name + ".scale", DType::kF8E8M0, {(n + b - 1) / b, (k + b - 1) / b}, TensorRole::kScale)};
    }
    case WeightFormat::kNvfp4:
      return {spec(w, DType::kU8, {n, k / 2}, TensorRole::kWeight),
              spec(p.name + ".weight_scale", DType::kF8E4M3, {n, k / ckpt::kNvfp4BlockSize}, TensorRole::kWeightScale),
              spec(p.name + ".weight_scale_2", DType::kF32, {}, TensorRole::kWeightScale2),
              spec(p.name + ".input_scale", DType::kF32, {}, TensorRole::kInputScale)};
    case WeightFormat::kMxfp4:
      return {spec(w, DType::kI8, {n, k / 2}, TensorRole::kWeight),
              spec(p.name + ".scale", DType::kF8E8M0, {n, k / ckpt::kMxfp4BlockSize}, TensorRole::kScale)};
  }
  return {};
}

std::vector<TensorSpec> TensorInventory(const Config& config, ExpertFormat experts) {
  std::vector<TensorSpec> out;
  for (const ParamSpec& p : ParamInventory(config, experts)) {
    for (TensorSpec& t : TensorsOf(p)) out.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<ExpertFormat> DetectExpertFormat(const Config& config) {
  if (!config.hf_quant) return ExpertFormat::kMxfp4;
  const QuantConfig& q = *config.hf_quant;
  int64_t nvfp4 = 0, total = 0;
  std::string first_marked, first_unmarked;
  for (const ParamSpec& p : ParamInventory(config, ExpertFormat::kMxfp4)) {
    if (!p.linear) continue;
    const bool marked = q.IsNvfp4(p.name);
    const bool main_expert = IsRoutedExpert(p) && p.layer < config.num_hidden_layers;
    if (!main_expert) {
      if (marked) {
        return absl::InvalidArgumentError(absl::StrCat(
            "hf_quant_config.json marks \"", p.name, "\" NVFP4; only the routed experts of the main layers may be"));
      }
      continue;
    }
    ++total;
    if (marked) ++nvfp4;
    std::string& first = marked ? first_marked : first_unmarked;
    if (first.empty()) first = p.name;
  }
  if (nvfp4 == 0) return ExpertFormat::kMxfp4;
  if (nvfp4 == total) return ExpertFormat::kNvfp4;
  return absl::InvalidArgumentError(absl::StrCat("hf_quant_config.json marks ", nvfp4, " of ", total,
                                                 " routed-expert linears NVFP4 (all or none are supported); "
                                                 "e.g. \"", first_marked, "\" is and \"", first_unmarked,
                                                 "\" is not"));
}

QuantConfig Nvfp4ExpertsQuantConfig(const Config& config) {
  QuantConfig q;
  q.producer_name = "modelopt";
  q.producer_version = "dsv4-make-checkpoint";
  q.quant_algo = "MIXED_PRECISION";
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    for (int64_t e = 0; e < config.n_routed_experts; ++e) {
      for (const char* w : {"w1", "w2", "w3"}) {
        q.quantized_layers.emplace(ModuleOfExpert(l, e, w), QuantConfig::Layer{.quant_algo = "NVFP4", .group_size = 16});
      }
    }
  }
  q.exclude_modules = {"*.attn.*", "*.attn_norm.*", "*.ffn.shared_experts.*", "*.ffn.gate.*", "*.ffn_norm.*",
                       "embed.weight", "head.weight", "norm.weight", "mtp.*"};
  return q;
}

}  // namespace dsv4
