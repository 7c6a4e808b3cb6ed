// Config parsing: the three shipped configs, defaults, transformers spellings, and that every
// validation error names its field.
#include "model/config/config.h"

#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/config/test_util.h"

namespace dsv4 {
namespace {

using nlohmann::json;
using testing_config::ReadSourceFile;
using testing_config::TempDir;
using testing_config::TinyJson;
using testing_config::WriteFile;
using ::testing::HasSubstr;

Config MustParse(const std::string& text) {
  absl::StatusOr<Config> c = ParseConfig(text);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : Config{};
}

TEST(ConfigTest, FlashConfigMatchesTheModelCard) {
  const Config c = MustParse(ReadSourceFile("configs/flash.json"));
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_hidden_layers, 43);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  ASSERT_EQ(c.compress_ratios.size(), 44u);
  int c4 = 0, c128 = 0;
  for (int l = 0; l < 44; ++l) {
    const int want = l < 2 || l == 43 ? 0 : (l % 2 == 0 ? 4 : 128);  // ds4's ds4_layer_compress_ratio
    EXPECT_EQ(c.CompressRatio(l), want) << "layer " << l;
    c4 += want == 4;
    c128 += want == 128;
  }
  EXPECT_EQ(c4, 21);
  EXPECT_EQ(c128, 20);
  EXPECT_TRUE(c.IsHashLayer(0));
  EXPECT_TRUE(c.IsHashLayer(2));
  EXPECT_FALSE(c.IsHashLayer(3));
  EXPECT_FALSE(c.IsHashLayer(43));  // the MTP block routes by its gate
  EXPECT_EQ(c.qk_nope_head_dim(), 448);
  EXPECT_EQ(c.hc_mix_dim(), 24);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->factor, 16.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 65536);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});
  EXPECT_FALSE(c.hf_quant.has_value());
}

TEST(ConfigTest, TinyAndSmallConfigsParse) {
  const Config tiny = MustParse(ReadSourceFile("configs/tiny.json"));
  EXPECT_EQ(tiny.hidden_size, 512);
  EXPECT_EQ(tiny.vocab_size, 4096);
  EXPECT_EQ(tiny.num_attention_heads, 8);
  EXPECT_EQ(tiny.o_groups, 2);
  EXPECT_EQ(tiny.index_n_heads, 8);
  EXPECT_EQ(tiny.index_topk, 16);
  EXPECT_EQ(tiny.compress_ratios, (std::vector<int64_t>{0, 0, 4, 128, 0}));
  const Config small = MustParse(ReadSourceFile("configs/small.json"));
  EXPECT_EQ(small.hidden_size, 4096);
  EXPECT_EQ(small.num_attention_heads, 64);
  EXPECT_EQ(small.n_routed_experts, 16);
  EXPECT_EQ(small.moe_intermediate_size, 2048);
  EXPECT_EQ(small.compress_ratios, (std::vector<int64_t>{0, 0, 4, 128}));
}

// Missing keys take DeepseekV4Config's defaults (dsv4-decode.md 6.10); only the schedule is required.
TEST(ConfigTest, MissingKeysTakeTheDefaults) {
  json j = {{"compress_ratios", json::parse(ReadSourceFile("configs/flash.json"))["compress_ratios"]}};
  const Config c = MustParse(j.dump());
  EXPECT_EQ(c.num_hash_layers, 3);
  EXPECT_EQ(c.swiglu_limit, 10.0);
  EXPECT_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.scoring_func, "sqrtsoftplus");
  EXPECT_FALSE(c.rope_scaling.has_value());  // no rope_scaling: compressed layers use plain theta
  EXPECT_EQ(c.quantization_config.weight_block_size, (std::vector<int64_t>{128, 128}));
}

TEST(ConfigTest, TransformersSpellingsGiveTheSameConfig) {
  json j = TinyJson();
  j.erase("compress_ratios");
  j.erase("num_hash_layers");
  j.erase("qk_rope_head_dim");
  j.erase("rope_scaling");
  j.erase("torch_dtype");
  j["dtype"] = "float32";
  j["layer_types"] = {"sliding_attention", "sliding_attention", "compressed_sparse_attention",
                      "heavily_compressed_attention"};
  j["mlp_layer_types"] = {"hash_moe", "hash_moe", "hash_moe", "moe"};
  j["partial_rotary_factor"] = 0.125;
  j["compress_rates"] = {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 128}};
  j["rope_parameters"] = {
      {"main", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
      {"compress",
       {{"rope_type", "yarn"}, {"rope_theta", 160000.0}, {"factor", 16}, {"original_max_position_embeddings", 65536},
        {"beta_fast", 32}, {"beta_slow", 1}, {"attention_factor", 1.0}}}};
  const Config hf = MustParse(j.dump());
  const Config ref = MustParse(TinyJson().dump());
  EXPECT_EQ(hf.compress_ratios, ref.compress_ratios);
  EXPECT_EQ(hf.num_hash_layers, 3);
  EXPECT_EQ(hf.qk_rope_head_dim, 64);
  EXPECT_EQ(hf.torch_dtype, "float32");
  ASSERT_TRUE(hf.rope_scaling.has_value());
  EXPECT_EQ(hf.rope_scaling->factor, ref.rope_scaling->factor);
  EXPECT_EQ(hf.rope_scaling->beta_fast, ref.rope_scaling->beta_fast);
  EXPECT_EQ(hf.compress_rope_theta, 160000.0);
}

TEST(ConfigTest, EosMayBeAListAndPadMayBeNull) {
  json j = TinyJson();
  j["eos_token_id"] = {1, 7};
  j["pad_token_id"] = nullptr;
  const Config c = MustParse(j.dump());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 7}));
  EXPECT_FALSE(c.pad_token_id.has_value());
}

TEST(ConfigTest, RefusesTextThatIsNotAJsonObject) {
  EXPECT_THAT(ParseConfig("{\"hidden_size\": ").status().message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseConfig("[1, 2]").status().message(), HasSubstr("not an object"));
}

struct BadField {
  const char* field;  // what the message must quote
  std::function<void(json&)> edit;
};

// One edit per validation rule; each must fail with InvalidArgument quoting the field's name.
std::vector<BadField> BadFields() {
  return {
      {"hidden_size", [](json& j) { j["hidden_size"] = 500; }},
      {"hidden_size", [](json& j) { j["hidden_size"] = "512"; }},
      {"vocab_size", [](json& j) { j["vocab_size"] = 0; }},
      {"num_hidden_layers", [](json& j) { j["num_hidden_layers"] = 0; }},
      {"num_nextn_predict_layers", [](json& j) { j["num_nextn_predict_layers"] = -1; }},
      {"bos_token_id", [](json& j) { j["bos_token_id"] = 4096; }},
      {"eos_token_id", [](json& j) { j["eos_token_id"] = {1, 9999}; }},
      {"pad_token_id", [](json& j) { j["pad_token_id"] = -2; }},
      {"tie_word_embeddings", [](json& j) { j["tie_word_embeddings"] = true; }},
      {"hidden_act", [](json& j) { j["hidden_act"] = "gelu"; }},
      {"max_position_embeddings", [](json& j) { j["max_position_embeddings"] = 0; }},
      {"num_attention_heads", [](json& j) { j["num_attention_heads"] = 0; }},
      {"num_key_value_heads", [](json& j) { j["num_key_value_heads"] = 2; }},
      {"head_dim", [](json& j) { j["head_dim"] = 576; }},
      {"qk_rope_head_dim", [](json& j) { j["qk_rope_head_dim"] = 32; }},
      {"q_lora_rank", [](json& j) { j["q_lora_rank"] = 100; }},
      {"o_groups", [](json& j) { j["o_groups"] = 3; }},
      {"o_groups", [](json& j) { j["o_groups"] = 0; }},
      {"o_lora_rank", [](json& j) { j["o_lora_rank"] = 0; }},
      {"sliding_window", [](json& j) { j["sliding_window"] = 0; }},
      {"rope_theta", [](json& j) { j["rope_theta"] = -1; }},
      {"compress_rope_theta", [](json& j) { j["compress_rope_theta"] = 0; }},
      {"index_n_heads", [](json& j) { j["index_n_heads"] = 0; }},
      {"index_head_dim", [](json& j) { j["index_head_dim"] = 64; }},
      {"index_topk", [](json& j) { j["index_topk"] = 0; }},
      {"hc_mult", [](json& j) { j["hc_mult"] = 0; }},
      {"hc_sinkhorn_iters", [](json& j) { j["hc_sinkhorn_iters"] = 0; }},
      {"hc_eps", [](json& j) { j["hc_eps"] = 0; }},
      {"rms_norm_eps", [](json& j) { j["rms_norm_eps"] = -1e-6; }},
      {"compress_ratios", [](json& j) { j.erase("compress_ratios"); }},
      {"compress_ratios", [](json& j) { j["compress_ratios"] = {0, 0, 4, 128}; }},
      {"compress_ratios", [](json& j) { j["compress_ratios"] = {0, 0, 8, 128, 0}; }},
      {"compress_ratios", [](json& j) { j["compress_ratios"] = {0, 0, 4, 128, 4}; }},
      {"compress_ratios", [](json& j) { j["compress_ratios"] = {0, 0, "4", 128, 0}; }},
      {"num_hash_layers", [](json& j) { j["num_hash_layers"] = 5; }},
      {"n_routed_experts", [](json& j) { j["n_routed_experts"] = 0; }},
      {"num_experts_per_tok", [](json& j) { j["num_experts_per_tok"] = 9; }},
      {"num_experts_per_tok", [](json& j) { j["num_experts_per_tok"] = 0; }},
      {"n_shared_experts", [](json& j) { j["n_shared_experts"] = 2; }},
      {"moe_intermediate_size", [](json& j) { j["moe_intermediate_size"] = 200; }},
      {"scoring_func", [](json& j) { j["scoring_func"] = "softmax"; }},
      {"topk_method", [](json& j) { j["topk_method"] = "greedy"; }},
      {"norm_topk_prob", [](json& j) { j["norm_topk_prob"] = false; }},
      {"norm_topk_prob", [](json& j) { j["norm_topk_prob"] = 1; }},
      {"routed_scaling_factor", [](json& j) { j["routed_scaling_factor"] = 0; }},
      {"swiglu_limit", [](json& j) { j["swiglu_limit"] = 0.0; }},
      {"expert_dtype", [](json& j) { j["expert_dtype"] = "fp8"; }},
      {"model_type", [](json& j) { j["model_type"] = "deepseek_v3"; }},
      {"first_k_dense_replace", [](json& j) { j["first_k_dense_replace"] = 1; }},
      {"attention_bias", [](json& j) { j["attention_bias"] = true; }},
      {"quantization_config.quant_method", [](json& j) { j["quantization_config"]["quant_method"] = "gptq"; }},
      {"quantization_config.fmt", [](json& j) { j["quantization_config"]["fmt"] = "e5m2"; }},
      {"quantization_config.scale_fmt", [](json& j) { j["quantization_config"]["scale_fmt"] = "fp32"; }},
      {"quantization_config.weight_block_size", [](json& j) { j["quantization_config"]["weight_block_size"] = {64, 64}; }},
      {"quantization_config.activation_scheme", [](json& j) { j["quantization_config"]["activation_scheme"] = "static"; }},
      {"rope_scaling.type", [](json& j) { j["rope_scaling"]["type"] = "linear"; }},
      {"rope_scaling.factor", [](json& j) { j["rope_scaling"].erase("factor"); }},
      {"rope_scaling.factor", [](json& j) { j["rope_scaling"]["factor"] = 0.5; }},
      {"rope_scaling.original_max_position_embeddings", [](json& j) { j["rope_scaling"].erase("original_max_position_embeddings"); }},
      {"rope_scaling.beta_fast", [](json& j) { j["rope_scaling"]["beta_fast"] = 0.5; }},
      {"rope_scaling.attention_factor", [](json& j) { j["rope_scaling"]["attention_factor"] = 1.277; }},
      {"rope_scaling.truncate", [](json& j) { j["rope_scaling"]["truncate"] = false; }},
      {"rope_parameters", [](json& j) { j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 16}}; }},
      // The section 6.4 trap: nested rope_parameters without attention_factor.
      {"rope_parameters.compress.attention_factor",
       [](json& j) {
         j.erase("rope_scaling");
         j["rope_parameters"] = {{"main", {{"rope_type", "default"}}},
                                 {"compress", {{"rope_type", "yarn"}, {"factor", 16},
                                               {"original_max_position_embeddings", 65536}}}};
       }},
      {"rope_parameters.main.rope_type",
       [](json& j) {
         j.erase("rope_scaling");
         j["rope_parameters"] = {{"main", {{"rope_type", "yarn"}, {"factor", 2},
                                           {"original_max_position_embeddings", 4096}}},
                                 {"compress", {{"rope_type", "default"}}}};
       }},
      {"partial_rotary_factor", [](json& j) { j["partial_rotary_factor"] = 0.25; }},
      {"layer_types", [](json& j) { j["layer_types"] = {"sliding_attention", "x", "y", "z"}; }},
      {"layer_types", [](json& j) { j["layer_types"] = {"sliding_attention"}; }},
      {"mlp_layer_types", [](json& j) { j["mlp_layer_types"] = {"moe", "hash_moe", "moe", "moe"}; }},
      {"compress_rates.compressed_sparse_attention",
       [](json& j) { j["compress_rates"] = {{"compressed_sparse_attention", 8}}; }},
      // The sanity limits of config.h (a hostile config must not make the loader loop or allocate without end).
      {"vocab_size", [](json& j) { j["vocab_size"] = kMaxVocab + 1; }},
      {"hidden_size", [](json& j) { j["hidden_size"] = kMaxWidth + 128; }},
      {"num_hidden_layers", [](json& j) { j["num_hidden_layers"] = kMaxLayers + 1; }},
      {"num_nextn_predict_layers", [](json& j) { j["num_nextn_predict_layers"] = kMaxMtpLayers + 1; }},
      {"num_attention_heads", [](json& j) { j["num_attention_heads"] = 2 * kMaxCount; }},
      {"n_routed_experts", [](json& j) { j["n_routed_experts"] = kMaxCount + 1; }},
      {"hc_mult", [](json& j) { j["hc_mult"] = kMaxHcMult + 1; }},
      {"hc_sinkhorn_iters", [](json& j) { j["hc_sinkhorn_iters"] = kMaxSinkhornIters + 1; }},
      {"max_position_embeddings", [](json& j) { j["max_position_embeddings"] = kMaxPositions + 1; }},
      {"moe_intermediate_size", [](json& j) { j["moe_intermediate_size"] = int64_t{1} << 40; }},
      {"partial_rotary_factor", [](json& j) { j["partial_rotary_factor"] = 1.5; }},
  };
}

TEST(ConfigTest, EveryValidationErrorNamesItsField) {
  for (const BadField& bad : BadFields()) {
    json j = TinyJson();
    bad.edit(j);
    const absl::StatusOr<Config> c = ParseConfig(j.dump());
    ASSERT_FALSE(c.ok()) << "accepted a config with bad " << bad.field;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad.field;
    EXPECT_THAT(c.status().message(), HasSubstr(std::string("\"") + bad.field + "\"")) << c.status();
    EXPECT_THAT(c.status().message(), HasSubstr("config.json")) << c.status();
  }
}

// Found by fuzz/config_fuzzer: head_dim * partial_rotary_factor was converted to int64 before any range check,
// which is undefined for 1e300 * 512 (UBSan: "outside the range of representable values").
TEST(ConfigTest, HugePartialRotaryFactorIsRefusedBeforeConversion) {
  json j = TinyJson();
  j["partial_rotary_factor"] = 1e300;
  const absl::StatusOr<Config> c = ParseConfig(j.dump());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("\"partial_rotary_factor\": must lie in (0, 1]"));
}

// Found by fuzz/config_fuzzer: with layer_types, num_nextn_predict_layers drove a loop before validation, so a
// huge value allocated until the process died. It is refused by value now, before the loop.
TEST(ConfigTest, MtpLayerCountIsBoundedBeforeTheScheduleIsBuilt) {
  for (int64_t mtp : {int64_t{-1}, kMaxMtpLayers + 1, int64_t{1} << 50}) {
    json j = TinyJson();
    j.erase("compress_ratios");
    j["layer_types"] = {"sliding_attention", "sliding_attention", "compressed_sparse_attention",
                        "heavily_compressed_attention"};
    j["num_nextn_predict_layers"] = mtp;
    const absl::StatusOr<Config> c = ParseConfig(j.dump());
    ASSERT_FALSE(c.ok()) << mtp;
    EXPECT_THAT(c.status().message(), HasSubstr("\"num_nextn_predict_layers\": must be in [0, 16]")) << mtp;
  }
  json ok = TinyJson();
  ok.erase("compress_ratios");
  ok["layer_types"] = {"sliding_attention", "sliding_attention", "compressed_sparse_attention",
                       "heavily_compressed_attention"};
  ok["num_nextn_predict_layers"] = kMaxMtpLayers;
  const absl::StatusOr<Config> c = ParseConfig(ok.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->compress_ratios.size(), static_cast<size_t>(4 + kMaxMtpLayers));
}

TEST(ConfigTest, LoadConfigReadsTheFolderAndNamesMissingFiles) {
  TempDir dir;
  WriteFile(dir.Sub("config.json"), ReadSourceFile("configs/tiny.json"));
  absl::StatusOr<Config> c = LoadConfig(dir.path());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->hf_quant.has_value());

  TempDir empty;
  const absl::Status missing = LoadConfig(empty.path()).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr(empty.path() + "/config.json"));

  json bad = TinyJson();
  bad["head_dim"] = 128;
  WriteFile(dir.Sub("config.json"), bad.dump());
  const absl::Status invalid = LoadConfig(dir.path()).status();
  EXPECT_THAT(invalid.message(), HasSubstr(dir.path()));
  EXPECT_THAT(invalid.message(), HasSubstr("\"head_dim\""));
}

}  // namespace
}  // namespace dsv4
