// Quantisation metadata: config.json's quantization_config (block FP8 + expert_dtype) and the ModelOpt
// hf_quant_config.json of NVIDIA's NVFP4 re-quant (dsv4-decode.md section 4.3), which lists the NVFP4
// linears either one by one (MIXED_PRECISION + quantized_layers) or globally (NVFP4 + exclude_modules).
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/config/config.h"
#include "model/config/json_fields.h"

namespace dsv4 {
namespace {

using config_internal::Describe;
using config_internal::FieldReader;
using config_internal::Json;

// Shell-style match where '*' matches any run of characters (ModelOpt's fnmatch patterns use only '*').
bool GlobMatch(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == text[t] || pattern[p] == '?')) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

// NVFP4 block length: "group_size" (or "awq_block_size" in some ModelOpt versions); only 16 exists.
absl::Status ReadGroupSize(const FieldReader& r, int64_t* out) {
  DSV4_RETURN_IF_ERROR(r.Int("awq_block_size", out));
  DSV4_RETURN_IF_ERROR(r.Int("group_size", out));
  if (*out != 16) return r.Error(r.Has("group_size") ? "group_size" : "awq_block_size", "NVFP4 needs 16");
  return absl::OkStatus();
}

absl::Status ParseQuantizedLayers(const FieldReader& r, QuantConfig* q) {
  const Json* layers = nullptr;
  DSV4_RETURN_IF_ERROR(r.Object("quantized_layers", &layers));
  for (const auto& [module, entry] : layers->items()) {
    const std::string prefix = absl::StrCat(r.Path("quantized_layers"), ".", module, ".");
    if (!entry.is_object()) {
      return config_internal::FieldError(r.where(), r.Path("quantized_layers"),
                                         absl::StrCat("entry \"", module, "\" is not an object"));
    }
    FieldReader lr(entry, r.where(), prefix);
    QuantConfig::Layer layer;
    DSV4_RETURN_IF_ERROR(lr.String("quant_algo", &layer.quant_algo));
    if (layer.quant_algo != "NVFP4") {
      return lr.Error("quant_algo", absl::StrCat("only NVFP4 is supported, got \"", layer.quant_algo, "\""));
    }
    DSV4_RETURN_IF_ERROR(ReadGroupSize(lr, &layer.group_size));
    q->quantized_layers.emplace(module, layer);
  }
  return absl::OkStatus();
}

}  // namespace

bool QuantConfig::IsNvfp4(std::string_view module) const {
  auto it = quantized_layers.find(std::string(module));
  if (it != quantized_layers.end()) return it->second.quant_algo == "NVFP4";
  if (quant_algo != "NVFP4") return false;
  const std::string with_weight = std::string(module) + ".weight";
  for (const std::string& pattern : exclude_modules) {
    if (GlobMatch(pattern, module) || GlobMatch(pattern, with_weight)) return false;
  }
  return true;
}

namespace config_internal {

absl::StatusOr<QuantConfig> ParseQuantConfigObject(const Json& object, const Json* producer,
                                                   std::string where, std::string prefix) {
  FieldReader r(object, where, prefix);
  QuantConfig q;
  if (producer != nullptr) {
    if (!producer->is_object()) return FieldError(where, "producer", "expected an object");
    FieldReader pr(*producer, where, "producer.");
    DSV4_RETURN_IF_ERROR(pr.String("name", &q.producer_name));
    DSV4_RETURN_IF_ERROR(pr.String("version", &q.producer_version));
  }
  if (!r.IsNull("quant_algo")) DSV4_RETURN_IF_ERROR(r.String("quant_algo", &q.quant_algo));
  if (!q.quant_algo.empty() && q.quant_algo != "NVFP4" && q.quant_algo != "MIXED_PRECISION") {
    return r.Error("quant_algo", absl::StrCat("expected NVFP4, MIXED_PRECISION or null, got \"", q.quant_algo, "\""));
  }
  if (!r.IsNull("kv_cache_quant_algo")) DSV4_RETURN_IF_ERROR(r.String("kv_cache_quant_algo", &q.kv_cache_quant_algo));
  if (!q.kv_cache_quant_algo.empty()) {
    return r.Error("kv_cache_quant_algo", "must be null: the engine keeps its own FP8 KV cache format");
  }
  if (q.quant_algo == "NVFP4") DSV4_RETURN_IF_ERROR(ReadGroupSize(r, &q.group_size));
  if (r.Has("quantized_layers") && !r.IsNull("quantized_layers")) {
    DSV4_RETURN_IF_ERROR(ParseQuantizedLayers(r, &q));
  }
  if (r.Has("exclude_modules") && r.Has("ignore")) {
    return r.Error("ignore", "give exclude_modules or ignore, not both");
  }
  DSV4_RETURN_IF_ERROR(r.StringList("exclude_modules", &q.exclude_modules));
  DSV4_RETURN_IF_ERROR(r.StringList("ignore", &q.exclude_modules));
  return q;
}

absl::Status ParseQuantization(const FieldReader& r, Config* c) {
  DSV4_RETURN_IF_ERROR(r.String("expert_dtype", &c->expert_dtype));
  if (!r.Has("quantization_config") || r.IsNull("quantization_config")) return absl::OkStatus();
  const Json* object = nullptr;
  DSV4_RETURN_IF_ERROR(r.Object("quantization_config", &object));
  FieldReader q(*object, r.where(), "quantization_config.");
  Fp8QuantizationConfig& f = c->quantization_config;
  DSV4_RETURN_IF_ERROR(q.String("quant_method", &f.quant_method));
  DSV4_RETURN_IF_ERROR(q.String("fmt", &f.fmt));
  DSV4_RETURN_IF_ERROR(q.String("scale_fmt", &f.scale_fmt));
  DSV4_RETURN_IF_ERROR(q.String("activation_scheme", &f.activation_scheme));
  DSV4_RETURN_IF_ERROR(q.IntList("weight_block_size", &f.weight_block_size));
  if (q.Has("expert_dtype")) {
    std::string inner;
    DSV4_RETURN_IF_ERROR(q.String("expert_dtype", &inner));
    if (r.Has("expert_dtype") && inner != c->expert_dtype) return q.Error("expert_dtype", "disagrees with the top-level expert_dtype");
    c->expert_dtype = inner;
  }
  // NVIDIA's NVFP4 repos repeat the ModelOpt metadata inside quantization_config.
  if (q.Has("quant_algo") || q.Has("quantized_layers") || q.Has("producer")) {
    const Json* producer = q.Has("producer") ? &q.Get("producer") : nullptr;
    DSV4_ASSIGN_OR_RETURN(c->hf_quant, ParseQuantConfigObject(*object, producer, r.where(), "quantization_config."));
  }
  return absl::OkStatus();
}

}  // namespace config_internal

absl::StatusOr<QuantConfig> ParseQuantConfig(std::string_view json) {
  constexpr std::string_view kWhere = "hf_quant_config.json";
  Json root = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("hf_quant_config.json: not valid JSON");
  if (!root.is_object()) return absl::InvalidArgumentError("hf_quant_config.json: top level is not an object");
  const Json* producer = root.contains("producer") ? &root["producer"] : nullptr;
  if (root.contains("quantization")) {
    const Json& inner = root["quantization"];
    if (!inner.is_object()) {
      return config_internal::FieldError(kWhere, "quantization", absl::StrCat("expected an object, got ", Describe(inner)));
    }
    return config_internal::ParseQuantConfigObject(inner, producer, std::string(kWhere), "quantization.");
  }
  return config_internal::ParseQuantConfigObject(root, producer, std::string(kWhere), "");
}

std::string QuantConfigToJson(const QuantConfig& q) {
  Json quantization = Json::object();
  quantization["quant_algo"] = q.quant_algo.empty() ? Json(nullptr) : Json(q.quant_algo);
  quantization["kv_cache_quant_algo"] = q.kv_cache_quant_algo.empty() ? Json(nullptr) : Json(q.kv_cache_quant_algo);
  if (q.quant_algo == "NVFP4") quantization["group_size"] = q.group_size;
  Json layers = Json::object();
  for (const auto& [module, layer] : q.quantized_layers) {
    layers[module] = {{"quant_algo", layer.quant_algo}, {"group_size", layer.group_size}};
  }
  if (!layers.empty()) quantization["quantized_layers"] = std::move(layers);
  quantization["exclude_modules"] = q.exclude_modules;
  Json root = {{"producer", {{"name", q.producer_name}, {"version", q.producer_version}}},
               {"quantization", std::move(quantization)}};
  return root.dump(2) + "\n";
}

}  // namespace dsv4
