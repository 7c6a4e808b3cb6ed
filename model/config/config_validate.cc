// ValidateConfig: the invariants the forward pass, the KV cache layout and the weight formats rely on.
// Each check names its config.json field and says why the limit exists.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "model/config/config.h"
#include "model/config/json_fields.h"

namespace dsv4 {
namespace {

using config_internal::FieldError;

absl::Status Bad(std::string_view field, std::string_view what) { return FieldError("config.json", field, what); }

#define DSV4_CONFIG_CHECK(cond, field, ...) \
  do {                                      \
    if (!(cond)) return Bad(field, absl::StrCat(__VA_ARGS__)); \
  } while (0)

absl::Status CheckPositive(std::string_view field, int64_t value) {
  DSV4_CONFIG_CHECK(value > 0, field, "must be > 0, got ", value);
  return absl::OkStatus();
}

// [1, max]: positive, and below the sanity limit of config.h (refused before anything loops or allocates by it).
absl::Status CheckCount(std::string_view field, int64_t value, int64_t max) {
  DSV4_CONFIG_CHECK(value > 0 && value <= max, field, "must be in [1, ", max, "], got ", value);
  return absl::OkStatus();
}

// FP8 weights are stored in 128x128 blocks; every dimension that is a K or N of a block-FP8 linear must
// be a whole number of blocks so that the scale grids have no ragged edge.
absl::Status CheckBlock128(std::string_view field, int64_t value) {
  DSV4_CONFIG_CHECK(value > 0 && value % 128 == 0 && value <= kMaxWidth, field,
                    "must be a positive multiple of 128 (FP8 weights use 128x128 blocks) up to ", kMaxWidth,
                    ", got ", value);
  return absl::OkStatus();
}

absl::Status CheckSizes(const Config& c) {
  DSV4_RETURN_IF_ERROR(CheckCount("vocab_size", c.vocab_size, kMaxVocab));
  DSV4_RETURN_IF_ERROR(CheckBlock128("hidden_size", c.hidden_size));
  DSV4_RETURN_IF_ERROR(CheckCount("num_hidden_layers", c.num_hidden_layers, kMaxLayers));
  DSV4_CONFIG_CHECK(c.num_nextn_predict_layers >= 0 && c.num_nextn_predict_layers <= kMaxMtpLayers,
                    "num_nextn_predict_layers", "must be in [0, ", kMaxMtpLayers, "], got ",
                    c.num_nextn_predict_layers);
  DSV4_CONFIG_CHECK(c.bos_token_id >= 0 && c.bos_token_id < c.vocab_size, "bos_token_id",
                    "must be in [0, vocab_size), got ", c.bos_token_id);
  DSV4_CONFIG_CHECK(!c.eos_token_ids.empty(), "eos_token_id", "must name at least one token");
  for (int64_t eos : c.eos_token_ids) {
    DSV4_CONFIG_CHECK(eos >= 0 && eos < c.vocab_size, "eos_token_id", "must be in [0, vocab_size), got ", eos);
  }
  if (c.pad_token_id) {
    DSV4_CONFIG_CHECK(*c.pad_token_id >= 0 && *c.pad_token_id < c.vocab_size, "pad_token_id",
                      "must be in [0, vocab_size), got ", *c.pad_token_id);
  }
  DSV4_CONFIG_CHECK(!c.tie_word_embeddings, "tie_word_embeddings",
                    "must be false: DeepSeek-V4 stores a separate head.weight");
  DSV4_CONFIG_CHECK(c.hidden_act == "silu", "hidden_act", "must be \"silu\", got \"", c.hidden_act, "\"");
  DSV4_RETURN_IF_ERROR(CheckCount("max_position_embeddings", c.max_position_embeddings, kMaxPositions));
  return absl::OkStatus();
}

// The KV record (584 bytes: 448 FP8 nope dims in 7 tiles of 64, 64 bf16 RoPE dims, 8 scale bytes) and the
// sparse-MLA kernels are built for exactly head_dim 512 = 448 + 64, so nothing else is accepted.
absl::Status CheckAttention(const Config& c) {
  DSV4_RETURN_IF_ERROR(CheckCount("num_attention_heads", c.num_attention_heads, kMaxCount));
  DSV4_CONFIG_CHECK(c.num_key_value_heads == 1, "num_key_value_heads",
                    "must be 1 (one shared latent KV head), got ", c.num_key_value_heads);
  DSV4_CONFIG_CHECK(c.qk_rope_head_dim == 64, "qk_rope_head_dim", "must be 64 (the KV record keeps 64 bf16 RoPE dims), got ",
                    c.qk_rope_head_dim);
  DSV4_CONFIG_CHECK(c.head_dim == 512, "head_dim",
                    "must be 512 = 448 nope + 64 rope (the FP8 KV record and the decode kernels assume it), got ",
                    c.head_dim);
  DSV4_RETURN_IF_ERROR(CheckBlock128("q_lora_rank", c.q_lora_rank));
  DSV4_RETURN_IF_ERROR(CheckPositive("o_groups", c.o_groups));
  DSV4_CONFIG_CHECK(c.num_attention_heads % c.o_groups == 0, "o_groups", "must divide num_attention_heads (",
                    c.num_attention_heads, "), got ", c.o_groups);
  DSV4_RETURN_IF_ERROR(CheckBlock128("o_lora_rank", c.o_lora_rank));
  DSV4_RETURN_IF_ERROR(CheckCount("sliding_window", c.sliding_window, kMaxPositions));
  DSV4_CONFIG_CHECK(c.rope_theta > 0, "rope_theta", "must be > 0, got ", c.rope_theta);
  DSV4_CONFIG_CHECK(c.compress_rope_theta > 0, "compress_rope_theta", "must be > 0, got ", c.compress_rope_theta);
  if (c.rope_scaling) {
    const RopeScaling& s = *c.rope_scaling;
    DSV4_CONFIG_CHECK(s.factor >= 1.0, "rope_scaling.factor", "must be >= 1, got ", s.factor);
    DSV4_CONFIG_CHECK(s.original_max_position_embeddings > 0 && s.original_max_position_embeddings <= kMaxPositions,
                      "rope_scaling.original_max_position_embeddings", "must be in [1, ", kMaxPositions, "], got ",
                      s.original_max_position_embeddings);
    DSV4_CONFIG_CHECK(s.beta_slow > 0 && s.beta_fast > s.beta_slow, "rope_scaling.beta_fast",
                      "need beta_fast > beta_slow > 0, got ", s.beta_fast, " and ", s.beta_slow);
  }
  return absl::OkStatus();
}

// Indexer heads are rotated by a 128-point Hadamard and quantised in 32-blocks (dsv4-decode.md 2.3), and
// its compressed rows are 128 wide, so index_head_dim is fixed at 128.
absl::Status CheckIndexerAndHc(const Config& c) {
  DSV4_RETURN_IF_ERROR(CheckCount("index_n_heads", c.index_n_heads, kMaxCount));
  DSV4_CONFIG_CHECK(c.index_head_dim == 128, "index_head_dim",
                    "must be 128 (Hadamard-128 rotation and 128-wide indexer rows), got ", c.index_head_dim);
  DSV4_RETURN_IF_ERROR(CheckCount("index_topk", c.index_topk, kMaxPositions));
  DSV4_RETURN_IF_ERROR(CheckCount("hc_mult", c.hc_mult, kMaxHcMult));
  DSV4_RETURN_IF_ERROR(CheckCount("hc_sinkhorn_iters", c.hc_sinkhorn_iters, kMaxSinkhornIters));
  DSV4_CONFIG_CHECK(c.hc_eps > 0, "hc_eps", "must be > 0, got ", c.hc_eps);
  DSV4_CONFIG_CHECK(c.rms_norm_eps > 0, "rms_norm_eps", "must be > 0, got ", c.rms_norm_eps);
  return absl::OkStatus();
}

absl::Status CheckSchedule(const Config& c) {
  const int64_t want = c.num_hidden_layers + c.num_nextn_predict_layers;
  DSV4_CONFIG_CHECK(static_cast<int64_t>(c.compress_ratios.size()) == want, "compress_ratios", "has ",
                    c.compress_ratios.size(), " entries, need num_hidden_layers + num_nextn_predict_layers = ", want);
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    const int64_t r = c.compress_ratios[i];
    DSV4_CONFIG_CHECK(r == 0 || r == 4 || r == 128, "compress_ratios", "entry ", i, " is ", r,
                      "; allowed values are 0, 4 and 128");
    DSV4_CONFIG_CHECK(static_cast<int64_t>(i) < c.num_hidden_layers || r == 0, "compress_ratios", "entry ", i,
                      " (an MTP layer) must be 0: MTP blocks are window-only");
  }
  DSV4_CONFIG_CHECK(c.num_hash_layers >= 0 && c.num_hash_layers <= c.num_hidden_layers, "num_hash_layers",
                    "must be in [0, num_hidden_layers], got ", c.num_hash_layers);
  return absl::OkStatus();
}

absl::Status CheckMoe(const Config& c) {
  DSV4_RETURN_IF_ERROR(CheckCount("n_routed_experts", c.n_routed_experts, kMaxCount));
  DSV4_CONFIG_CHECK(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.n_routed_experts, "num_experts_per_tok",
                    "must be in [1, n_routed_experts = ", c.n_routed_experts, "], got ", c.num_experts_per_tok);
  // transformers sizes the shared expert by moe_intermediate_size alone, DeepSeek's code by
  // n_shared_experts * moe_intermediate_size: they agree only for one shared expert.
  DSV4_CONFIG_CHECK(c.n_shared_experts == 1, "n_shared_experts", "must be 1, got ", c.n_shared_experts);
  DSV4_RETURN_IF_ERROR(CheckBlock128("moe_intermediate_size", c.moe_intermediate_size));
  DSV4_CONFIG_CHECK(c.scoring_func == "sqrtsoftplus", "scoring_func", "must be \"sqrtsoftplus\", got \"",
                    c.scoring_func, "\"");
  DSV4_CONFIG_CHECK(c.topk_method == "noaux_tc", "topk_method", "must be \"noaux_tc\", got \"", c.topk_method, "\"");
  DSV4_CONFIG_CHECK(c.norm_topk_prob, "norm_topk_prob", "must be true (sqrtsoftplus weights are always normalised)");
  DSV4_CONFIG_CHECK(c.routed_scaling_factor > 0, "routed_scaling_factor", "must be > 0, got ",
                    c.routed_scaling_factor);
  // transformers clamps even at 0, zeroing the FFN (dsv4-decode.md 6.8).
  DSV4_CONFIG_CHECK(c.swiglu_limit > 0, "swiglu_limit", "must be > 0, got ", c.swiglu_limit);
  return absl::OkStatus();
}

absl::Status CheckQuantization(const Config& c) {
  const Fp8QuantizationConfig& q = c.quantization_config;
  DSV4_CONFIG_CHECK(q.quant_method == "fp8" || q.quant_method == "modelopt", "quantization_config.quant_method",
                    "must be \"fp8\" or \"modelopt\", got \"", q.quant_method, "\"");
  DSV4_CONFIG_CHECK(q.fmt == "e4m3", "quantization_config.fmt", "must be \"e4m3\", got \"", q.fmt, "\"");
  DSV4_CONFIG_CHECK(q.scale_fmt == "ue8m0", "quantization_config.scale_fmt", "must be \"ue8m0\", got \"",
                    q.scale_fmt, "\"");
  DSV4_CONFIG_CHECK(q.weight_block_size == std::vector<int64_t>({128, 128}), "quantization_config.weight_block_size",
                    "must be [128, 128], got [", absl::StrJoin(q.weight_block_size, ", "), "]");
  DSV4_CONFIG_CHECK(q.activation_scheme == "dynamic", "quantization_config.activation_scheme",
                    "must be \"dynamic\", got \"", q.activation_scheme, "\"");
  DSV4_CONFIG_CHECK(c.expert_dtype == "fp4", "expert_dtype", "must be \"fp4\" (FP8 experts are not supported), got \"",
                    c.expert_dtype, "\"");
  return absl::OkStatus();
}

#undef DSV4_CONFIG_CHECK

}  // namespace

absl::Status ValidateConfig(const Config& c) {
  DSV4_RETURN_IF_ERROR(CheckSizes(c));
  DSV4_RETURN_IF_ERROR(CheckAttention(c));
  DSV4_RETURN_IF_ERROR(CheckIndexerAndHc(c));
  DSV4_RETURN_IF_ERROR(CheckSchedule(c));
  DSV4_RETURN_IF_ERROR(CheckMoe(c));
  DSV4_RETURN_IF_ERROR(CheckQuantization(c));
  return absl::OkStatus();
}

}  // namespace dsv4
