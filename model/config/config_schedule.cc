// The per-layer schedule of config.json: which layers compress (compress_ratios, or transformers'
// layer_types + compress_rates) and which route by hash (num_hash_layers, or mlp_layer_types).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/config/json_fields.h"

namespace dsv4::config_internal {
namespace {

// transformers' layer type names for the three attention kinds and their ratios.
struct LayerTypeName {
  const char* name;
  int64_t ratio;
};
constexpr LayerTypeName kLayerTypes[] = {
    {"sliding_attention", 0},
    {"compressed_sparse_attention", 4},
    {"heavily_compressed_attention", 128},
};

absl::Status ParseLayerTypes(const FieldReader& r, Config* c) {
  std::vector<std::string> types;
  DSV4_RETURN_IF_ERROR(r.StringList("layer_types", &types));
  if (static_cast<int64_t>(types.size()) != c->num_hidden_layers) {
    return r.Error("layer_types", absl::StrCat("has ", types.size(), " entries, num_hidden_layers is ",
                                               c->num_hidden_layers));
  }
  std::vector<int64_t> ratios;
  for (size_t i = 0; i < types.size(); ++i) {
    int64_t ratio = -1;
    for (const LayerTypeName& t : kLayerTypes) {
      if (types[i] == t.name) ratio = t.ratio;
    }
    if (ratio < 0) return r.Error("layer_types", absl::StrCat("entry ", i, " is unknown: \"", types[i], "\""));
    ratios.push_back(ratio);
  }
  // layer_types lists main layers only; MTP layers are window-only (ratio 0). The count is range-checked here,
  // before the loop, because ValidateConfig runs only after parsing (found by fuzz/config_fuzzer: a huge
  // num_nextn_predict_layers made this loop allocate until the process died).
  if (c->num_nextn_predict_layers < 0 || c->num_nextn_predict_layers > kMaxMtpLayers) {
    return r.Error("num_nextn_predict_layers",
                   absl::StrCat("must be in [0, ", kMaxMtpLayers, "], got ", c->num_nextn_predict_layers));
  }
  for (int64_t i = 0; i < c->num_nextn_predict_layers; ++i) ratios.push_back(0);
  if (!c->compress_ratios.empty()) {
    for (size_t i = 0; i < types.size() && i < c->compress_ratios.size(); ++i) {
      if (c->compress_ratios[i] != ratios[i]) {
        return r.Error("layer_types", absl::StrCat("entry ", i, " disagrees with compress_ratios"));
      }
    }
    return absl::OkStatus();
  }
  c->compress_ratios = std::move(ratios);
  return absl::OkStatus();
}

// transformers' compress_rates dict and the older compress_rate_csa / compress_rate_hca scalars:
// accepted only with the values the kernels implement.
absl::Status CheckCompressRates(const FieldReader& r) {
  if (r.Has("compress_rates") && !r.IsNull("compress_rates")) {
    const Json* rates = nullptr;
    DSV4_RETURN_IF_ERROR(r.Object("compress_rates", &rates));
    FieldReader rr(*rates, r.where(), "compress_rates.");
    for (const LayerTypeName& t : kLayerTypes) {
      if (t.ratio == 0 || !rr.Has(t.name)) continue;
      int64_t rate = 0;
      DSV4_RETURN_IF_ERROR(rr.Int(t.name, &rate));
      if (rate != t.ratio) return rr.Error(t.name, absl::StrCat("must be ", t.ratio, ", got ", rate));
    }
  }
  for (const auto& [key, want] : {std::pair<const char*, int64_t>{"compress_rate_csa", 4},
                                  std::pair<const char*, int64_t>{"compress_rate_hca", 128}}) {
    int64_t rate = want;
    DSV4_RETURN_IF_ERROR(r.Int(key, &rate));
    if (rate != want) return r.Error(key, absl::StrCat("must be ", want, ", got ", rate));
  }
  return absl::OkStatus();
}

// mlp_layer_types: "hash_moe" on a prefix of the layers, "moe" after.
absl::Status ParseMlpLayerTypes(const FieldReader& r, Config* c) {
  std::vector<std::string> types;
  DSV4_RETURN_IF_ERROR(r.StringList("mlp_layer_types", &types));
  if (static_cast<int64_t>(types.size()) != c->num_hidden_layers) {
    return r.Error("mlp_layer_types", absl::StrCat("has ", types.size(), " entries, num_hidden_layers is ",
                                                   c->num_hidden_layers));
  }
  int64_t hash_layers = 0;
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] == "hash_moe") {
      if (static_cast<int64_t>(i) != hash_layers) {
        return r.Error("mlp_layer_types", absl::StrCat("entry ", i, ": hash_moe layers must come first"));
      }
      ++hash_layers;
    } else if (types[i] != "moe") {
      return r.Error("mlp_layer_types", absl::StrCat("entry ", i, " is unknown: \"", types[i], "\""));
    }
  }
  if (r.Has("num_hash_layers") && hash_layers != c->num_hash_layers) {
    return r.Error("mlp_layer_types", absl::StrCat("has ", hash_layers, " hash_moe layers, num_hash_layers is ",
                                                   c->num_hash_layers));
  }
  c->num_hash_layers = hash_layers;
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseLayerSchedule(const FieldReader& r, Config* c) {
  DSV4_RETURN_IF_ERROR(r.IntList("compress_ratios", &c->compress_ratios));
  if (r.Has("layer_types") && !r.IsNull("layer_types")) {
    DSV4_RETURN_IF_ERROR(ParseLayerTypes(r, c));
  }
  if (!r.Has("compress_ratios") && c->compress_ratios.empty()) {
    return r.Error("compress_ratios", "missing (one ratio per main layer, then one per MTP layer)");
  }
  DSV4_RETURN_IF_ERROR(CheckCompressRates(r));
  DSV4_RETURN_IF_ERROR(r.Int("num_hash_layers", &c->num_hash_layers));
  if (r.Has("mlp_layer_types") && !r.IsNull("mlp_layer_types")) {
    DSV4_RETURN_IF_ERROR(ParseMlpLayerTypes(r, c));
  }
  return absl::OkStatus();
}

}  // namespace dsv4::config_internal
