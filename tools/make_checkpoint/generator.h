// The synthetic checkpoint generator behind dsv4-make-checkpoint: from a config.json and a seed it
// writes a Hugging Face-style folder (config.json, hf_quant_config.json for NVFP4 experts, safetensors
// with every tensor of TensorInventory) whose bytes depend only on (config, seed, experts, layers,
// shards): not on the machine, the thread count or the order tensors are produced in.
// Values: tools/make_checkpoint/param_init.cc. Usage and design: docs/checkpoint-generator.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "model/config/config.h"
#include "model/config/tensor_inventory.h"

namespace dsv4::gen {

struct GeneratorOptions {
  uint64_t seed = 0;
  std::string out_dir;
  int shards = 1;                               // 1: model.safetensors; K: K shards + index
  ExpertFormat experts = ExpertFormat::kNvfp4;  // routed experts of the main layers
  int64_t layers = 0;                           // > 0: keep only the first `layers` main layers
  int threads = 0;                              // 0: one per hardware thread (output is the same)
  bool overwrite = false;                       // replace an existing checkpoint in out_dir
};

struct GenerateSummary {
  Config config;  // the config as written (after --layers)
  int64_t params = 0;
  int64_t tensors = 0;
  int64_t bytes = 0;  // tensor data bytes, headers excluded
  std::map<std::string, int64_t> tensors_by_dtype;  // "BF16" -> count
  std::map<std::string, int64_t> bytes_by_dtype;
  std::map<std::string, int64_t> params_by_format;  // "FP8_BLOCK128" -> count of parameters

  std::string ToString() const;  // the multi-line report the program prints
};

// config.json text with only the first `layers` main layers: num_hidden_layers, compress_ratios (main
// part cut, MTP tail kept), layer_types / mlp_layer_types cut, num_hash_layers = min(its value, layers).
// Also normalises quantization_config to the block-FP8 fields (ModelOpt keys live in
// hf_quant_config.json). layers == 0 keeps every layer. Errors name the flag or the field.
absl::StatusOr<std::string> OutputConfigJson(std::string_view config_json, int64_t layers);

// Writes the checkpoint; see the file comment. Refuses an existing checkpoint unless overwrite.
absl::StatusOr<GenerateSummary> GenerateCheckpoint(std::string_view config_json, const GeneratorOptions& options);

}  // namespace dsv4::gen
