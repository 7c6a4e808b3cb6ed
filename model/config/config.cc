// config.json parsing: Hugging Face names (and the transformers 5 spellings layer_types,
// mlp_layer_types, rope_parameters, partial_rotary_factor, dtype) into a validated Config.
#include "model/config/config.h"

#include <cassert>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/config/json_fields.h"

namespace dsv4 {
namespace {

using config_internal::FieldReader;
using config_internal::Json;
using config_internal::ParseLayerSchedule;
using config_internal::ParseQuantization;

constexpr std::string_view kWhere = "config.json";

absl::Status ParseSizes(const FieldReader& r, Config* c) {
  DSV4_RETURN_IF_ERROR(r.Int("vocab_size", &c->vocab_size));
  DSV4_RETURN_IF_ERROR(r.Int("hidden_size", &c->hidden_size));
  DSV4_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c->num_hidden_layers));
  DSV4_RETURN_IF_ERROR(r.Int("num_nextn_predict_layers", &c->num_nextn_predict_layers));
  DSV4_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c->tie_word_embeddings));
  DSV4_RETURN_IF_ERROR(r.String("hidden_act", &c->hidden_act));
  if (r.Has("torch_dtype") && r.Has("dtype")) return r.Error("dtype", "give dtype or torch_dtype, not both");
  DSV4_RETURN_IF_ERROR(r.String("torch_dtype", &c->torch_dtype));
  DSV4_RETURN_IF_ERROR(r.String("dtype", &c->torch_dtype));  // transformers 5 name
  DSV4_RETURN_IF_ERROR(r.Int("num_attention_heads", &c->num_attention_heads));
  DSV4_RETURN_IF_ERROR(r.Int("num_key_value_heads", &c->num_key_value_heads));
  DSV4_RETURN_IF_ERROR(r.Int("head_dim", &c->head_dim));
  DSV4_RETURN_IF_ERROR(r.Int("q_lora_rank", &c->q_lora_rank));
  DSV4_RETURN_IF_ERROR(r.Int("o_groups", &c->o_groups));
  DSV4_RETURN_IF_ERROR(r.Int("o_lora_rank", &c->o_lora_rank));
  DSV4_RETURN_IF_ERROR(r.Int("sliding_window", &c->sliding_window));
  DSV4_RETURN_IF_ERROR(r.Int("max_position_embeddings", &c->max_position_embeddings));
  DSV4_RETURN_IF_ERROR(r.Int("index_n_heads", &c->index_n_heads));
  DSV4_RETURN_IF_ERROR(r.Int("index_head_dim", &c->index_head_dim));
  DSV4_RETURN_IF_ERROR(r.Int("index_topk", &c->index_topk));
  DSV4_RETURN_IF_ERROR(r.Int("hc_mult", &c->hc_mult));
  DSV4_RETURN_IF_ERROR(r.Int("hc_sinkhorn_iters", &c->hc_sinkhorn_iters));
  DSV4_RETURN_IF_ERROR(r.Double("hc_eps", &c->hc_eps));
  DSV4_RETURN_IF_ERROR(r.Double("rms_norm_eps", &c->rms_norm_eps));
  DSV4_RETURN_IF_ERROR(r.Int("n_routed_experts", &c->n_routed_experts));
  DSV4_RETURN_IF_ERROR(r.Int("num_experts_per_tok", &c->num_experts_per_tok));
  DSV4_RETURN_IF_ERROR(r.Int("n_shared_experts", &c->n_shared_experts));
  DSV4_RETURN_IF_ERROR(r.Int("moe_intermediate_size", &c->moe_intermediate_size));
  DSV4_RETURN_IF_ERROR(r.String("scoring_func", &c->scoring_func));
  DSV4_RETURN_IF_ERROR(r.String("topk_method", &c->topk_method));
  DSV4_RETURN_IF_ERROR(r.Bool("norm_topk_prob", &c->norm_topk_prob));
  DSV4_RETURN_IF_ERROR(r.Double("routed_scaling_factor", &c->routed_scaling_factor));
  DSV4_RETURN_IF_ERROR(r.Double("swiglu_limit", &c->swiglu_limit));
  DSV4_RETURN_IF_ERROR(r.Double("rope_theta", &c->rope_theta));
  DSV4_RETURN_IF_ERROR(r.Double("compress_rope_theta", &c->compress_rope_theta));
  return absl::OkStatus();
}

// bos/eos/pad: eos may be one id or a list (generation stops on any of them); pad may be null.
absl::Status ParseTokenIds(const FieldReader& r, Config* c) {
  DSV4_RETURN_IF_ERROR(r.Int("bos_token_id", &c->bos_token_id));
  if (r.Has("eos_token_id")) {
    if (r.Get("eos_token_id").is_array()) {
      DSV4_RETURN_IF_ERROR(r.IntList("eos_token_id", &c->eos_token_ids));
    } else {
      int64_t eos = 0;
      DSV4_RETURN_IF_ERROR(r.Int("eos_token_id", &eos));
      c->eos_token_ids = {eos};
    }
  }
  if (r.Has("pad_token_id") && !r.IsNull("pad_token_id")) {
    int64_t pad = 0;
    DSV4_RETURN_IF_ERROR(r.Int("pad_token_id", &pad));
    c->pad_token_id = pad;
  }
  return absl::OkStatus();
}

// Keys whose other values describe a different architecture than the one implemented.
absl::Status CheckFixedKeys(const FieldReader& r) {
  std::string model_type = "deepseek_v4";
  DSV4_RETURN_IF_ERROR(r.String("model_type", &model_type));
  if (model_type != "deepseek_v4") {
    return r.Error("model_type", absl::StrCat("expected \"deepseek_v4\", got \"", model_type, "\""));
  }
  int64_t first_dense = 0;
  DSV4_RETURN_IF_ERROR(r.Int("first_k_dense_replace", &first_dense));
  if (first_dense != 0) return r.Error("first_k_dense_replace", "must be 0: DeepSeek-V4 has no dense FFN layers");
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    bool bias = false;
    DSV4_RETURN_IF_ERROR(r.Bool(key, &bias));
    if (bias) return r.Error(key, "must be false: DeepSeek-V4 linears have no bias");
  }
  return absl::OkStatus();
}

// One RoPE parameter block: config.json rope_scaling, a flat rope_parameters, or
// rope_parameters.{main,compress}. Returns nullopt for type "default" (plain RoPE).
// `nested_compress` marks rope_parameters.compress, where transformers derives attention_factor
// 1 + 0.1 ln(factor) when the key is missing (dsv4-decode.md 6.4): refused, the engine has no mscale.
absl::StatusOr<std::optional<RopeScaling>> ParseRopeBlock(const FieldReader& r, bool nested_compress) {
  std::string type, rope_type;
  DSV4_RETURN_IF_ERROR(r.String("type", &type));
  DSV4_RETURN_IF_ERROR(r.String("rope_type", &rope_type));
  if (!type.empty() && !rope_type.empty() && type != rope_type) {
    return r.Error("rope_type", absl::StrCat("disagrees with \"type\" (\"", type, "\")"));
  }
  if (type.empty()) type = rope_type;
  if (type.empty()) return r.Error("type", "missing (expected \"yarn\" or \"default\")");
  if (type == "default") return std::optional<RopeScaling>();
  if (type != "yarn") return r.Error("type", absl::StrCat("unsupported RoPE type \"", type, "\" (only yarn)"));
  RopeScaling s;
  if (!r.Has("factor")) return r.Error("factor", "missing (required for yarn)");
  DSV4_RETURN_IF_ERROR(r.Double("factor", &s.factor));
  if (!r.Has("original_max_position_embeddings")) {
    return r.Error("original_max_position_embeddings", "missing (required for yarn; V4-Flash uses 65536)");
  }
  DSV4_RETURN_IF_ERROR(r.Int("original_max_position_embeddings", &s.original_max_position_embeddings));
  DSV4_RETURN_IF_ERROR(r.Double("beta_fast", &s.beta_fast));
  DSV4_RETURN_IF_ERROR(r.Double("beta_slow", &s.beta_slow));
  if (r.Has("attention_factor")) {
    double attention_factor = 0;
    DSV4_RETURN_IF_ERROR(r.Double("attention_factor", &attention_factor));
    if (attention_factor != 1.0) {
      return r.Error("attention_factor", "must be 1.0: DeepSeek-V4 does not scale cos/sin (no mscale)");
    }
  } else if (nested_compress) {
    return r.Error("attention_factor",
                   "missing: with nested rope_parameters transformers scales cos/sin by 1+0.1*ln(factor); "
                   "set it to 1.0 or use rope_scaling (dsv4-decode.md 6.4)");
  }
  bool truncate = true;
  DSV4_RETURN_IF_ERROR(r.Bool("truncate", &truncate));
  if (!truncate) return r.Error("truncate", "false is not supported (the YaRN ramp uses floor/ceil bounds)");
  return std::optional<RopeScaling>(s);
}

absl::Status ParseNestedRope(const Json& rp, Config* c) {
  FieldReader outer(rp, std::string(kWhere), "rope_parameters.");
  const Json* main = nullptr;
  const Json* compress = nullptr;
  DSV4_RETURN_IF_ERROR(outer.Object("main", &main));
  DSV4_RETURN_IF_ERROR(outer.Object("compress", &compress));
  FieldReader m(*main, std::string(kWhere), "rope_parameters.main.");
  DSV4_ASSIGN_OR_RETURN(std::optional<RopeScaling> main_scaling, ParseRopeBlock(m, false));
  if (main_scaling) {
    return m.Error("rope_type", "must be \"default\": sliding-window layers use plain RoPE");
  }
  DSV4_RETURN_IF_ERROR(m.Double("rope_theta", &c->rope_theta));
  FieldReader k(*compress, std::string(kWhere), "rope_parameters.compress.");
  DSV4_ASSIGN_OR_RETURN(c->rope_scaling, ParseRopeBlock(k, true));
  DSV4_RETURN_IF_ERROR(k.Double("rope_theta", &c->compress_rope_theta));
  return absl::OkStatus();
}

absl::Status ParseRope(const FieldReader& r, Config* c) {
  const bool has_scaling = r.Has("rope_scaling") && !r.IsNull("rope_scaling");
  const bool has_params = r.Has("rope_parameters") && !r.IsNull("rope_parameters");
  if (has_scaling && has_params) {
    return r.Error("rope_parameters", "give rope_scaling or rope_parameters, not both");
  }
  if (has_scaling) {
    const Json* s = nullptr;
    DSV4_RETURN_IF_ERROR(r.Object("rope_scaling", &s));
    DSV4_ASSIGN_OR_RETURN(c->rope_scaling, ParseRopeBlock(FieldReader(*s, std::string(kWhere), "rope_scaling."), false));
  } else if (has_params) {
    const Json* p = nullptr;
    DSV4_RETURN_IF_ERROR(r.Object("rope_parameters", &p));
    if (p->contains("main") || p->contains("compress")) {
      DSV4_RETURN_IF_ERROR(ParseNestedRope(*p, c));
    } else {
      // Flat form: transformers applies it to the compress RoPE with attention_factor defaulting to 1.
      FieldReader f(*p, std::string(kWhere), "rope_parameters.");
      DSV4_ASSIGN_OR_RETURN(c->rope_scaling, ParseRopeBlock(f, false));
    }
  }
  // qk_rope_head_dim, or transformers' partial_rotary_factor = qk_rope_head_dim / head_dim.
  DSV4_RETURN_IF_ERROR(r.Int("qk_rope_head_dim", &c->qk_rope_head_dim));
  if (r.Has("partial_rotary_factor") && !r.IsNull("partial_rotary_factor")) {
    double factor = 0;
    DSV4_RETURN_IF_ERROR(r.Double("partial_rotary_factor", &factor));
    if (!(factor > 0.0 && factor <= 1.0)) {
      return r.Error("partial_rotary_factor", absl::StrCat("must lie in (0, 1], got ", factor));
    }
    // head_dim is range-checked only later (ValidateConfig): bound the product before converting it, since a
    // double outside int64's range does not convert (found by fuzz/config_fuzzer).
    const double rope = factor * static_cast<double>(c->head_dim);
    if (!(std::fabs(rope) < 0x1p62) || rope != std::floor(rope)) {
      return r.Error("partial_rotary_factor", "head_dim * partial_rotary_factor is not an integer");
    }
    if (r.Has("qk_rope_head_dim") && static_cast<int64_t>(rope) != c->qk_rope_head_dim) {
      return r.Error("partial_rotary_factor", "disagrees with qk_rope_head_dim");
    }
    c->qk_rope_head_dim = static_cast<int64_t>(rope);
  }
  return absl::OkStatus();
}

}  // namespace

int Config::CompressRatio(int layer) const {
  assert(layer >= 0 && static_cast<size_t>(layer) < compress_ratios.size());
  return static_cast<int>(compress_ratios.at(static_cast<size_t>(layer)));
}

absl::StatusOr<Config> ParseConfig(std::string_view json) {
  Json root = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("config.json: not valid JSON");
  if (!root.is_object()) return absl::InvalidArgumentError("config.json: top level is not an object");
  FieldReader r(root, std::string(kWhere));
  Config c;
  DSV4_RETURN_IF_ERROR(CheckFixedKeys(r));
  DSV4_RETURN_IF_ERROR(ParseSizes(r, &c));
  DSV4_RETURN_IF_ERROR(ParseTokenIds(r, &c));
  DSV4_RETURN_IF_ERROR(ParseRope(r, &c));
  DSV4_RETURN_IF_ERROR(ParseLayerSchedule(r, &c));
  DSV4_RETURN_IF_ERROR(ParseQuantization(r, &c));
  DSV4_RETURN_IF_ERROR(ValidateConfig(c));
  return c;
}

namespace {
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return text.str();
}
}  // namespace

absl::StatusOr<Config> LoadConfig(std::string_view dir) {
  const std::string base(dir);
  DSV4_ASSIGN_OR_RETURN(std::string text, ReadFile(base + "/config.json"));
  absl::StatusOr<Config> config = ParseConfig(text);
  if (!config.ok()) {
    return absl::Status(config.status().code(), absl::StrCat(base, "/", config.status().message()));
  }
  const std::string quant_path = base + "/hf_quant_config.json";
  if (std::ifstream(quant_path).good()) {
    DSV4_ASSIGN_OR_RETURN(std::string quant_text, ReadFile(quant_path));
    absl::StatusOr<QuantConfig> quant = ParseQuantConfig(quant_text);
    if (!quant.ok()) {
      return absl::Status(quant.status().code(), absl::StrCat(base, "/", quant.status().message()));
    }
    config->hf_quant = *std::move(quant);  // the separate file takes precedence over config.json
    DSV4_RETURN_IF_ERROR(ValidateConfig(*config));
  }
  return config;
}

}  // namespace dsv4
