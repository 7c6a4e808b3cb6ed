// Fuzz target: hf_quant_config.json text through ParseQuantConfig. An accepted config must survive the round trip
// the checkpoint generator relies on (QuantConfigToJson, then ParseQuantConfig again gives the same config), and
// IsNvfp4 (the glob matcher over exclude_modules) must answer for any module name without crashing.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "fuzz/json_mutator.h"
#include "model/config/config.h"

namespace {

bool Same(const dsv4::QuantConfig& a, const dsv4::QuantConfig& b) {
  if (a.producer_name != b.producer_name || a.producer_version != b.producer_version ||
      a.quant_algo != b.quant_algo || a.kv_cache_quant_algo != b.kv_cache_quant_algo ||
      a.exclude_modules != b.exclude_modules || a.quantized_layers.size() != b.quantized_layers.size()) {
    return false;
  }
  if (a.quant_algo == "NVFP4" && a.group_size != b.group_size) return false;
  for (const auto& [name, layer] : a.quantized_layers) {
    auto it = b.quantized_layers.find(name);
    if (it == b.quantized_layers.end() || it->second.quant_algo != layer.quant_algo ||
        it->second.group_size != layer.group_size) {
      return false;
    }
  }
  return true;
}

}  // namespace

DSV4_FUZZ_JSON_MUTATOR()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto q = dsv4::ParseQuantConfig(text);
  if (!q.ok()) {
    FUZZ_CHECK(q.status().code() == absl::StatusCode::kInvalidArgument, "unexpected code: %s",
               q.status().ToString().c_str());
    return 0;
  }
  const std::string json = dsv4::QuantConfigToJson(*q);
  auto again = dsv4::ParseQuantConfig(json);
  FUZZ_CHECK(again.ok(), "QuantConfigToJson output does not parse: %s", again.status().ToString().c_str());
  FUZZ_CHECK(Same(*q, *again), "round trip changed the config:\n%s", json.c_str());
  for (std::string_view module : {"layers.0.ffn.experts.0.w1", "layers.3.attn.wq_a", "mtp.0.ffn.experts.1.w2",
                                  "embed", "", "*"}) {
    (void)q->IsNvfp4(module);
  }
  for (const auto& [name, layer] : q->quantized_layers) {
    FUZZ_CHECK(q->IsNvfp4(name), "quantized_layers lists %s as NVFP4 but IsNvfp4 says no", name.c_str());
  }
  for (const std::string& pattern : q->exclude_modules) (void)q->IsNvfp4(pattern);
  return 0;
}
