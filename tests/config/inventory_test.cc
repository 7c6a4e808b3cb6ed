// Tensor inventory against the published facts of the V4-Flash checkpoints (dsv4-decode.md 4.1-4.3),
// ModelOpt metadata round trips and expert-format detection.
#include "model/config/tensor_inventory.h"

#include <map>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/config/test_util.h"

namespace dsv4 {
namespace {

using ckpt::DType;
using testing_config::ReadSourceFile;
using ::testing::HasSubstr;
using Shape = std::vector<int64_t>;

Config Flash() {
  absl::StatusOr<Config> c = ParseConfig(ReadSourceFile("configs/flash.json"));
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : Config{};
}

std::map<std::string, TensorSpec> ByName(const std::vector<TensorSpec>& tensors) {
  std::map<std::string, TensorSpec> out;
  for (const TensorSpec& t : tensors) EXPECT_TRUE(out.emplace(t.name, t).second) << "duplicate " << t.name;
  return out;
}

void ExpectTensor(const std::map<std::string, TensorSpec>& inv, const std::string& name, DType dtype, Shape shape) {
  auto it = inv.find(name);
  ASSERT_NE(it, inv.end()) << "missing " << name;
  EXPECT_EQ(it->second.dtype, dtype) << name << ": " << ckpt::DTypeName(it->second.dtype);
  EXPECT_EQ(it->second.shape, shape) << name;
}

// RTP-LLM's checkpoint oracle counts 69,187 tensors in the official (MXFP4-expert) V4-Flash release.
TEST(InventoryTest, FlashMxfp4HasThePublishedTensorCount) {
  const auto inv = ByName(TensorInventory(Flash(), ExpertFormat::kMxfp4));
  EXPECT_EQ(inv.size(), 69187u);
}

// NVFP4 stores each main-layer expert linear as 4 tensors instead of 2: +43 x 256 x 3 x 2.
TEST(InventoryTest, FlashNvfp4AddsTwoTensorsPerMainExpertLinear) {
  const auto inv = ByName(TensorInventory(Flash(), ExpertFormat::kNvfp4));
  EXPECT_EQ(inv.size(), 69187u + 43u * 256u * 3u * 2u);
}

TEST(InventoryTest, FlashShapesAndDtypesFollowTheOfficialTable) {
  const auto inv = ByName(TensorInventory(Flash(), ExpertFormat::kNvfp4));
  ExpectTensor(inv, "embed.weight", DType::kBF16, {129280, 4096});
  ExpectTensor(inv, "head.weight", DType::kBF16, {129280, 4096});
  ExpectTensor(inv, "norm.weight", DType::kBF16, {4096});
  ExpectTensor(inv, "hc_head_fn", DType::kF32, {4, 16384});
  ExpectTensor(inv, "hc_head_base", DType::kF32, {4});
  ExpectTensor(inv, "hc_head_scale", DType::kF32, {1});
  ExpectTensor(inv, "layers.5.hc_attn_fn", DType::kF32, {24, 16384});
  ExpectTensor(inv, "layers.5.hc_ffn_base", DType::kF32, {24});
  ExpectTensor(inv, "layers.5.hc_ffn_scale", DType::kF32, {3});
  ExpectTensor(inv, "layers.0.attn.wq_a.weight", DType::kF8E4M3, {1024, 4096});
  ExpectTensor(inv, "layers.0.attn.wq_a.scale", DType::kF8E8M0, {8, 32});
  ExpectTensor(inv, "layers.0.attn.wq_b.scale", DType::kF8E8M0, {256, 8});
  ExpectTensor(inv, "layers.0.attn.wkv.scale", DType::kF8E8M0, {4, 32});
  ExpectTensor(inv, "layers.0.attn.wo_a.weight", DType::kF8E4M3, {8192, 4096});
  ExpectTensor(inv, "layers.0.attn.wo_a.scale", DType::kF8E8M0, {64, 32});
  ExpectTensor(inv, "layers.0.attn.wo_b.scale", DType::kF8E8M0, {32, 64});
  ExpectTensor(inv, "layers.0.attn.attn_sink", DType::kF32, {64});
  ExpectTensor(inv, "layers.2.attn.compressor.wkv.weight", DType::kBF16, {1024, 4096});
  ExpectTensor(inv, "layers.2.attn.compressor.ape", DType::kF32, {4, 1024});
  ExpectTensor(inv, "layers.3.attn.compressor.wgate.weight", DType::kBF16, {512, 4096});
  ExpectTensor(inv, "layers.3.attn.compressor.ape", DType::kF32, {128, 512});
  ExpectTensor(inv, "layers.3.attn.compressor.norm.weight", DType::kBF16, {512});
  ExpectTensor(inv, "layers.2.attn.indexer.wq_b.weight", DType::kF8E4M3, {8192, 1024});
  ExpectTensor(inv, "layers.2.attn.indexer.wq_b.scale", DType::kF8E8M0, {64, 8});
  ExpectTensor(inv, "layers.2.attn.indexer.weights_proj.weight", DType::kBF16, {64, 4096});
  ExpectTensor(inv, "layers.2.attn.indexer.compressor.wkv.weight", DType::kBF16, {256, 4096});
  ExpectTensor(inv, "layers.2.attn.indexer.compressor.ape", DType::kF32, {4, 256});
  ExpectTensor(inv, "layers.2.attn.indexer.compressor.norm.weight", DType::kBF16, {128});
  ExpectTensor(inv, "layers.2.ffn.gate.tid2eid", DType::kI64, {129280, 6});
  ExpectTensor(inv, "layers.3.ffn.gate.weight", DType::kBF16, {256, 4096});
  ExpectTensor(inv, "layers.3.ffn.gate.bias", DType::kF32, {256});
  ExpectTensor(inv, "layers.7.ffn.experts.255.w1.weight", DType::kU8, {2048, 2048});
  ExpectTensor(inv, "layers.7.ffn.experts.255.w1.weight_scale", DType::kF8E4M3, {2048, 256});
  ExpectTensor(inv, "layers.7.ffn.experts.255.w1.weight_scale_2", DType::kF32, {});
  ExpectTensor(inv, "layers.7.ffn.experts.255.w1.input_scale", DType::kF32, {});
  ExpectTensor(inv, "layers.7.ffn.experts.0.w2.weight", DType::kU8, {4096, 1024});
  ExpectTensor(inv, "layers.7.ffn.experts.0.w2.weight_scale", DType::kF8E4M3, {4096, 128});
  ExpectTensor(inv, "layers.0.ffn.shared_experts.w1.weight", DType::kF8E4M3, {2048, 4096});
  ExpectTensor(inv, "layers.0.ffn.shared_experts.w2.scale", DType::kF8E8M0, {32, 16});
  // MTP: window-only, learned router, MXFP4 experts even in the NVFP4 release.
  ExpectTensor(inv, "mtp.0.e_proj.weight", DType::kF8E4M3, {4096, 4096});
  ExpectTensor(inv, "mtp.0.h_proj.scale", DType::kF8E8M0, {32, 32});
  ExpectTensor(inv, "mtp.0.enorm.weight", DType::kBF16, {4096});
  ExpectTensor(inv, "mtp.0.hc_head_fn", DType::kF32, {4, 16384});
  ExpectTensor(inv, "mtp.0.ffn.gate.bias", DType::kF32, {256});
  ExpectTensor(inv, "mtp.0.ffn.experts.3.w1.weight", DType::kI8, {2048, 2048});
  ExpectTensor(inv, "mtp.0.ffn.experts.3.w1.scale", DType::kF8E8M0, {2048, 128});
  ExpectTensor(inv, "mtp.0.ffn.experts.3.w2.scale", DType::kF8E8M0, {4096, 64});
  for (const char* absent : {"layers.0.attn.compressor.ape", "layers.3.attn.indexer.wq_b.weight",
                             "layers.3.ffn.gate.tid2eid", "layers.2.ffn.gate.bias", "mtp.0.attn.compressor.ape",
                             "mtp.0.ffn.gate.tid2eid", "mtp.0.embed.weight", "layers.43.attn_norm.weight"}) {
    EXPECT_EQ(inv.count(absent), 0u) << absent << " should not exist";
  }
}

TEST(InventoryTest, Mxfp4ExpertsUseE8m0ScalesPer32) {
  const auto inv = ByName(TensorInventory(Flash(), ExpertFormat::kMxfp4));
  ExpectTensor(inv, "layers.0.ffn.experts.0.w1.weight", DType::kI8, {2048, 2048});
  ExpectTensor(inv, "layers.0.ffn.experts.0.w1.scale", DType::kF8E8M0, {2048, 128});
  ExpectTensor(inv, "layers.0.ffn.experts.0.w2.scale", DType::kF8E8M0, {4096, 64});
  EXPECT_EQ(inv.count("layers.0.ffn.experts.0.w1.weight_scale_2"), 0u);
}

// Byte totals against the published sizes: the official release is 159.6 GB (moespresso's static check of
// its 46 shards), NVIDIA's NVFP4 re-quant 164-168 GB (its experts' block scales double).
TEST(InventoryTest, FlashByteTotalsMatchThePublishedSizes) {
  int64_t expert_weight_bytes = 0, total = 0;
  for (const TensorSpec& t : TensorInventory(Flash(), ExpertFormat::kMxfp4)) {
    total += t.nbytes();
    if (t.role == TensorRole::kWeight && t.name.find(".ffn.experts.") != std::string::npos) {
      expert_weight_bytes += t.nbytes();
    }
  }
  // 44 blocks x 256 experts x 3 linears x 2048 x 4096 / 2 bytes.
  EXPECT_EQ(expert_weight_bytes, int64_t{44} * 256 * 3 * 2048 * 4096 / 2);
  EXPECT_NEAR(static_cast<double>(total) / 1e9, 159.6, 0.05);
  int64_t nvfp4_total = 0;
  for (const TensorSpec& t : TensorInventory(Flash(), ExpertFormat::kNvfp4)) nvfp4_total += t.nbytes();
  EXPECT_GT(static_cast<double>(nvfp4_total) / 1e9, 164.0);
  EXPECT_LT(static_cast<double>(nvfp4_total) / 1e9, 168.5);
}

TEST(InventoryTest, TensorsOfALinearShareItsParamAndFormat) {
  for (const ParamSpec& p : ParamInventory(Flash(), ExpertFormat::kNvfp4)) {
    const std::vector<TensorSpec> ts = TensorsOf(p);
    ASSERT_FALSE(ts.empty()) << p.name;
    for (const TensorSpec& t : ts) {
      EXPECT_EQ(t.param, p.name);
      EXPECT_EQ(t.format, p.format);
      EXPECT_EQ(t.layer, p.layer);
    }
    if (p.linear) {
      EXPECT_EQ(ts[0].name, p.name + ".weight");
    }
    EXPECT_LT(p.layer, 44);
  }
}

TEST(InventoryTest, ExpertFormatNamesRoundTrip) {
  for (ExpertFormat f : {ExpertFormat::kNvfp4, ExpertFormat::kMxfp4}) {
    absl::StatusOr<ExpertFormat> back = ParseExpertFormat(ExpertFormatName(f));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, f);
  }
  EXPECT_THAT(ParseExpertFormat("fp8").status().message(), HasSubstr("nvfp4 or mxfp4"));
}

TEST(QuantConfigTest, GeneratedModelOptJsonRoundTripsAndIsDetected) {
  Config c = Flash();
  const QuantConfig q = Nvfp4ExpertsQuantConfig(c);
  EXPECT_EQ(q.quantized_layers.size(), 43u * 256u * 3u);
  absl::StatusOr<QuantConfig> back = ParseQuantConfig(QuantConfigToJson(q));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->producer_name, "modelopt");
  EXPECT_EQ(back->quant_algo, "MIXED_PRECISION");
  EXPECT_EQ(back->quantized_layers.size(), q.quantized_layers.size());
  EXPECT_EQ(back->exclude_modules, q.exclude_modules);
  EXPECT_TRUE(back->IsNvfp4("layers.42.ffn.experts.255.w3"));
  EXPECT_FALSE(back->IsNvfp4("mtp.0.ffn.experts.0.w1"));
  EXPECT_FALSE(back->IsNvfp4("layers.0.attn.wq_a"));
  c.hf_quant = *back;
  absl::StatusOr<ExpertFormat> f = DetectExpertFormat(c);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f, ExpertFormat::kNvfp4);
  c.hf_quant.reset();
  EXPECT_EQ(*DetectExpertFormat(c), ExpertFormat::kMxfp4);
}

// A global NVFP4 quant_algo with exclude patterns (the other ModelOpt style).
TEST(QuantConfigTest, GlobalNvfp4WithExcludePatterns) {
  absl::StatusOr<QuantConfig> q = ParseQuantConfig(R"({
    "producer": {"name": "modelopt", "version": "0.31"},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
                     "exclude_modules": ["*.attn.*", "*shared_experts*", "*.ffn.gate*", "embed.weight",
                                         "head.weight", "mtp.*", "*norm*"]}})");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(q->IsNvfp4("layers.3.ffn.experts.9.w2"));
  EXPECT_FALSE(q->IsNvfp4("layers.3.attn.wkv"));
  EXPECT_FALSE(q->IsNvfp4("layers.3.ffn.shared_experts.w1"));
  EXPECT_FALSE(q->IsNvfp4("head"));
  EXPECT_FALSE(q->IsNvfp4("mtp.0.ffn.experts.1.w1"));
  Config c = Flash();
  c.hf_quant = *q;
  EXPECT_EQ(*DetectExpertFormat(c), ExpertFormat::kNvfp4);
  // Without the attention exclusion the attention linears would be NVFP4: refused.
  q->exclude_modules.erase(q->exclude_modules.begin());
  c.hf_quant = *q;
  EXPECT_THAT(DetectExpertFormat(c).status().message(), HasSubstr("layers.0.attn.wq_a"));
}

TEST(QuantConfigTest, PartialExpertMarkingIsRefused) {
  Config c = Flash();
  QuantConfig q = Nvfp4ExpertsQuantConfig(c);
  q.quantized_layers.erase("layers.10.ffn.experts.3.w2");
  c.hf_quant = q;
  const absl::Status s = DetectExpertFormat(c).status();
  EXPECT_THAT(s.message(), HasSubstr("layers.10.ffn.experts.3.w2"));
  q = Nvfp4ExpertsQuantConfig(c);
  q.quantized_layers.emplace("mtp.0.ffn.experts.0.w1", QuantConfig::Layer{.quant_algo = "NVFP4", .group_size = 16});
  c.hf_quant = q;
  EXPECT_THAT(DetectExpertFormat(c).status().message(), HasSubstr("mtp.0.ffn.experts.0.w1"));
}

TEST(QuantConfigTest, BadModelOptFieldsAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"quantization": {"quant_algo": "FP8"}})", "\"quantization.quant_algo\""},
      {R"({"quantization": {"quant_algo": "NVFP4", "group_size": 32}})", "\"quantization.group_size\""},
      {R"({"quantization": {"quant_algo": null, "kv_cache_quant_algo": "FP8"}})", "\"quantization.kv_cache_quant_algo\""},
      {R"({"quantization": {"quantized_layers": {"a.b": {"quant_algo": "INT4"}}}})",
       "\"quantization.quantized_layers.a.b.quant_algo\""},
      {R"({"quantization": {"exclude_modules": "embed.weight"}})", "\"quantization.exclude_modules\""},
      {R"({"quantization": 3})", "\"quantization\""},
      {R"({"producer": "modelopt", "quantization": {}})", "\"producer\""},
  };
  for (const auto& [text, field] : cases) {
    const absl::Status s = ParseQuantConfig(text).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(s.message(), HasSubstr(field)) << text;
    EXPECT_THAT(s.message(), HasSubstr("hf_quant_config.json")) << text;
  }
  EXPECT_THAT(ParseQuantConfig("{").status().message(), HasSubstr("not valid JSON"));
}

// NVIDIA's repos repeat the ModelOpt metadata inside config.json's quantization_config.
TEST(QuantConfigTest, ModelOptKeysInsideConfigJsonAreRead) {
  nlohmann::json j = nlohmann::json::parse(ReadSourceFile("configs/tiny.json"));
  j["quantization_config"]["quant_algo"] = "NVFP4";
  j["quantization_config"]["group_size"] = 16;
  j["quantization_config"]["ignore"] = {"*.attn.*", "*shared_experts*", "*.ffn.gate*", "embed.weight", "head.weight",
                                        "mtp.*", "*norm*"};
  absl::StatusOr<Config> c = ParseConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->hf_quant.has_value());
  EXPECT_EQ(*DetectExpertFormat(*c), ExpertFormat::kNvfp4);
}

}  // namespace
}  // namespace dsv4
