// The model configuration of a DeepSeek-V4 checkpoint: config.json (Hugging Face names, defaults of
// transformers' DeepseekV4Config written in place) and the optional ModelOpt hf_quant_config.json that
// says which linears are NVFP4. Parsing validates everything the engine relies on and every error names
// the offending field, so a bad checkpoint is refused at load time, never half-run.
//
// Field meanings: /work/shared/design/dsv4-decode.md section 1.1 (values of DeepSeek-V4-Flash) and
// section 6.10 (missing keys take the DeepseekV4Config defaults). Design notes: docs/checkpoint-generator.md.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace dsv4 {

// YaRN context extension, applied only on compressed layers (ratio 4 or 128) with compress_rope_theta
// (dsv4-decode.md section 2.3). The engine implements YaRN without magnitude scaling (attention factor 1).
struct RopeScaling {
  std::string type = "yarn";  // the only supported type
  double factor = 16.0;
  int64_t original_max_position_embeddings = 65536;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

// config.json "quantization_config": the block-FP8 format of the non-expert linears. The engine only
// reads this one layout, so parsing refuses any other value.
struct Fp8QuantizationConfig {
  std::string quant_method = "fp8";
  std::string fmt = "e4m3";
  std::string scale_fmt = "ue8m0";
  std::vector<int64_t> weight_block_size = {128, 128};
  std::string activation_scheme = "dynamic";
};

// ModelOpt hf_quant_config.json (dsv4-decode.md section 4.3). Module names have no ".weight" suffix,
// e.g. "layers.3.ffn.experts.17.w2".
struct QuantConfig {
  struct Layer {
    std::string quant_algo;  // "NVFP4"
    int64_t group_size = 16;
  };
  std::string producer_name;     // "modelopt"
  std::string producer_version;
  std::string quant_algo;        // "NVFP4", "MIXED_PRECISION", or "" (JSON null)
  std::string kv_cache_quant_algo;  // "" (JSON null) is the only value the engine supports
  int64_t group_size = 16;       // NVFP4 block length along K when quant_algo is "NVFP4"
  std::map<std::string, Layer> quantized_layers;  // explicit per-module entries (MIXED_PRECISION)
  std::vector<std::string> exclude_modules;       // glob patterns ('*' matches any run of characters)

  // True when the linear `module` is stored as NVFP4 (weight U8, weight_scale E4M3, weight_scale_2 and
  // input_scale F32): listed in quantized_layers as NVFP4, or covered by a global NVFP4 quant_algo and
  // not excluded.
  bool IsNvfp4(std::string_view module) const;
};

struct Config {
  // ---- sizes ----
  int64_t vocab_size = 129280;
  int64_t hidden_size = 4096;  // D
  int64_t num_hidden_layers = 43;
  int64_t num_nextn_predict_layers = 1;  // MTP layers, stored as mtp.<i>.*
  int64_t bos_token_id = 0;
  std::vector<int64_t> eos_token_ids = {1};  // config.json "eos_token_id": an int or a list
  std::optional<int64_t> pad_token_id;
  bool tie_word_embeddings = false;
  std::string torch_dtype = "bfloat16";
  std::string hidden_act = "silu";

  // ---- attention ----
  int64_t num_attention_heads = 64;  // H
  int64_t num_key_value_heads = 1;   // one shared latent KV head (MQA)
  int64_t head_dim = 512;            // nope (head_dim - qk_rope_head_dim) + rope
  int64_t qk_rope_head_dim = 64;
  int64_t q_lora_rank = 1024;
  int64_t o_groups = 8;
  int64_t o_lora_rank = 1024;
  int64_t sliding_window = 128;
  // One entry per main layer then one per MTP layer, each 0 (window only), 4 (CSA) or 128 (HCA).
  std::vector<int64_t> compress_ratios;
  double compress_rope_theta = 160000.0;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;  // absent: compressed layers use plain compress_rope_theta
  int64_t max_position_embeddings = 1048576;

  // ---- lightning indexer (ratio-4 layers) ----
  int64_t index_n_heads = 64;
  int64_t index_head_dim = 128;
  int64_t index_topk = 512;

  // ---- manifold hyper-connections ----
  int64_t hc_mult = 4;
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-6;

  // ---- mixture of experts ----
  int64_t n_routed_experts = 256;  // E
  int64_t num_experts_per_tok = 6;  // K
  int64_t n_shared_experts = 1;
  int64_t moe_intermediate_size = 2048;  // width of routed and shared experts
  int64_t num_hash_layers = 3;           // layers [0, num_hash_layers) route by gate.tid2eid[token]
  std::string scoring_func = "sqrtsoftplus";
  std::string topk_method = "noaux_tc";
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.5;
  double swiglu_limit = 10.0;

  // ---- quantisation ----
  std::string expert_dtype = "fp4";
  Fp8QuantizationConfig quantization_config;
  // ModelOpt metadata: from hf_quant_config.json (LoadConfig) or, failing that, from ModelOpt keys inside
  // config.json's quantization_config. Absent: routed experts are in the official MXFP4 format.
  std::optional<QuantConfig> hf_quant;

  // Compression ratio of main layer `layer` in [0, num_hidden_layers) or of MTP layer
  // num_hidden_layers + i. Out of range is a programming error (checked by assert).
  int CompressRatio(int layer) const;
  // True for main layers routed by the token-id table instead of the learned gate.
  bool IsHashLayer(int layer) const { return layer >= 0 && layer < num_hash_layers; }
  int64_t qk_nope_head_dim() const { return head_dim - qk_rope_head_dim; }
  // Rows of each hyper-connection "fn" matrix: pre (hc) + post (hc) + comb (hc*hc).
  int64_t hc_mix_dim() const { return (2 + hc_mult) * hc_mult; }
};

// Upper limits ValidateConfig puts on sizes. They sit far above any DeepSeek-V4 checkpoint (V4-Flash: 43 layers,
// 1 MTP layer, 64 heads, 256 experts, hidden 4096, vocab 129280) and exist so that a corrupt or hostile
// config.json is refused before the loader loops over layers and experts or allocates by these sizes, and so that
// every shape product the loader forms (two sizes and a small factor) stays far inside int64.
inline constexpr int64_t kMaxLayers = 1024;           // num_hidden_layers
inline constexpr int64_t kMaxMtpLayers = 16;          // num_nextn_predict_layers
inline constexpr int64_t kMaxVocab = int64_t{1} << 24;  // vocab_size
inline constexpr int64_t kMaxWidth = int64_t{1} << 20;  // hidden_size, q/o_lora_rank, moe_intermediate_size
inline constexpr int64_t kMaxCount = 4096;            // attention heads, indexer heads, routed experts
inline constexpr int64_t kMaxHcMult = 16;             // hc_mult
inline constexpr int64_t kMaxSinkhornIters = 1000;    // hc_sinkhorn_iters
inline constexpr int64_t kMaxPositions = 2147483647;  // max_position_embeddings and windows: positions are int32

// Parses and validates a config.json text. Missing keys take the defaults above (compress_ratios
// excepted: it, or transformers' "layer_types", is required). Errors name the field.
absl::StatusOr<Config> ParseConfig(std::string_view json);

// Parses a ModelOpt hf_quant_config.json text (with or without the "quantization" wrapper object).
absl::StatusOr<QuantConfig> ParseQuantConfig(std::string_view json);

// hf_quant_config.json text for `q` ({"producer": {...}, "quantization": {...}}), two-space indented;
// ParseQuantConfig reads it back to an equal QuantConfig.
std::string QuantConfigToJson(const QuantConfig& q);

// Reads <dir>/config.json and, when present, <dir>/hf_quant_config.json into Config::hf_quant.
absl::StatusOr<Config> LoadConfig(std::string_view dir);

// Checks the invariants the engine relies on; ParseConfig calls it. Exposed so that code which edits a
// Config (e.g. the generator's --layers) can re-check it.
absl::Status ValidateConfig(const Config& config);

}  // namespace dsv4
