// Typed reads of JSON object members with errors that name the field ("config.json \"hidden_size\":
// expected an integer, got \"4096\""). Internal to dsv4_config (the config.json / hf_quant_config.json parsers).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/config/config.h"
#include "nlohmann/json.hpp"

namespace dsv4::config_internal {

using Json = nlohmann::json;

// The error every parse and validation failure uses: `<where> "<field>": <what>`.
absl::Status FieldError(std::string_view where, std::string_view field, std::string_view what);

// Reads members of one JSON object. Each getter leaves *out unchanged when the key is absent (so the
// default written in the struct stays) and fails when the value has the wrong type.
class FieldReader {
 public:
  // `where` names the file ("config.json"), `prefix` the enclosing object ("rope_scaling." or "").
  FieldReader(const Json& object, std::string where, std::string prefix = "")
      : object_(object), where_(std::move(where)), prefix_(std::move(prefix)) {}

  // True when the key is present, even with a null value (getters refuse null: a null is never
  // silently replaced by a default). IsNull lets callers accept null where it has a meaning.
  bool Has(std::string_view key) const;
  bool IsNull(std::string_view key) const { return Has(key) && Get(key).is_null(); }
  const Json& Get(std::string_view key) const { return object_.at(std::string(key)); }
  std::string Path(std::string_view key) const { return prefix_ + std::string(key); }
  absl::Status Error(std::string_view key, std::string_view what) const {
    return FieldError(where_, Path(key), what);
  }
  const std::string& where() const { return where_; }

  absl::Status Int(std::string_view key, int64_t* out) const;
  absl::Status Double(std::string_view key, double* out) const;
  absl::Status Bool(std::string_view key, bool* out) const;
  absl::Status String(std::string_view key, std::string* out) const;
  absl::Status IntList(std::string_view key, std::vector<int64_t>* out) const;
  absl::Status StringList(std::string_view key, std::vector<std::string>* out) const;
  // Child object reader; fails unless the member is an object.
  absl::Status Object(std::string_view key, const Json** out) const;

 private:
  const Json& object_;
  std::string where_;
  std::string prefix_;
};

// Parses the ModelOpt members (producer, quant_algo, quantized_layers, exclude_modules, ...) of `object`,
// which is hf_quant_config.json's "quantization" object or config.json's quantization_config.
absl::StatusOr<QuantConfig> ParseQuantConfigObject(const Json& object, const Json* producer,
                                                   std::string where, std::string prefix);

// config.json parts parsed outside config.cc: compress_ratios / layer_types / num_hash_layers /
// mlp_layer_types (config_schedule.cc) and quantization_config + expert_dtype (quant_config.cc).
absl::Status ParseLayerSchedule(const FieldReader& r, Config* c);
absl::Status ParseQuantization(const FieldReader& r, Config* c);

// Short rendering of a JSON value for error messages (truncated).
std::string Describe(const Json& value);

}  // namespace dsv4::config_internal
