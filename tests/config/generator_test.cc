// The checkpoint generator, run in-process on configs/tiny.json: determinism, read-back through the
// checkpoint reader against the inventory, --layers, sharding, both expert formats, value statistics.
#include "tools/make_checkpoint/generator.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/float_formats.h"
#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/weight_formats.h"
#include "tests/config/test_util.h"
#include "tools/make_checkpoint/param_init.h"
#include "tools/make_checkpoint/prng.h"

namespace dsv4::gen {
namespace {

using testing_config::HashFolder;
using testing_config::ReadFileOrDie;
using testing_config::ReadSourceFile;
using testing_config::TempDir;
using ::testing::HasSubstr;

GenerateSummary MustGenerate(const std::string& config_json, GeneratorOptions o) {
  absl::StatusOr<GenerateSummary> s = GenerateCheckpoint(config_json, o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : GenerateSummary{};
}

GeneratorOptions Options(const std::string& out, uint64_t seed, ExpertFormat experts = ExpertFormat::kNvfp4) {
  GeneratorOptions o;
  o.out_dir = out;
  o.seed = seed;
  o.experts = experts;
  return o;
}

std::vector<uint8_t> Bytes(const ckpt::Checkpoint& ck, const std::string& name) {
  absl::StatusOr<ckpt::TensorView> v = ck.Get(name);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? std::vector<uint8_t>(v->data, v->data + v->nbytes) : std::vector<uint8_t>{};
}

// Every tensor of the inventory is in the checkpoint with its dtype and shape, and nothing else is.
void ExpectMatchesInventory(const std::string& dir, ExpertFormat experts) {
  absl::StatusOr<Config> config = LoadConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<ExpertFormat> detected = DetectExpertFormat(*config);
  ASSERT_TRUE(detected.ok()) << detected.status();
  EXPECT_EQ(*detected, experts);
  absl::StatusOr<std::unique_ptr<ckpt::Checkpoint>> ck = ckpt::Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  ASSERT_TRUE((*ck)->ValidateAll().ok());
  const std::vector<TensorSpec> inventory = TensorInventory(*config, experts);
  EXPECT_EQ((*ck)->Names().size(), inventory.size());
  for (const TensorSpec& t : inventory) {
    absl::StatusOr<ckpt::TensorView> v = (*ck)->Expect(t.name, t.dtype, t.shape);
    EXPECT_TRUE(v.ok()) << v.status();
  }
}

TEST(PrngTest, Mix64IsSplitMix64) {
  // SplitMix64 seeded with 0 first outputs 0xe220a8397b1dcdaf (Vigna's reference splitmix64.c).
  EXPECT_EQ(Mix64(0x9e3779b97f4a7c15ULL), 0xe220a8397b1dcdafULL);
  const TensorRng a(1, "x"), b(1, "y"), c(2, "x");
  EXPECT_NE(a.Bits(0), b.Bits(0));
  EXPECT_NE(a.Bits(0), c.Bits(0));
  EXPECT_EQ(a.Bits(7), TensorRng(1, "x").Bits(7));
}

TEST(PrngTest, UniformIsSymmetricWithStdOneOverSqrt3) {
  const TensorRng rng(42, "layers.0.attn.wq_a");
  constexpr int kN = 200000;
  double sum = 0, sq = 0;
  for (int i = 0; i < kN; ++i) {
    const float u = rng.Uniform(i);
    ASSERT_GT(u, -1.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    sq += static_cast<double>(u) * u;
  }
  EXPECT_NEAR(sum / kN, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sq / kN), 1.0 / std::sqrt(3.0), 0.01);
}

TEST(ParamInitTest, Tid2EidRowsAreDistinctValidExperts) {
  const std::vector<int64_t> ids = Tid2Eid(/*vocab=*/3000, /*experts=*/8, /*per_token=*/3, 5, "t");
  std::vector<int> uses(8, 0);
  for (int64_t t = 0; t < 3000; ++t) {
    std::set<int64_t> row(ids.begin() + t * 3, ids.begin() + t * 3 + 3);
    ASSERT_EQ(row.size(), 3u) << "token " << t;
    for (int64_t e : row) {
      ASSERT_GE(e, 0);
      ASSERT_LT(e, 8);
      ++uses[e];
    }
  }
  for (int e = 0; e < 8; ++e) EXPECT_NEAR(uses[e], 3000 * 3 / 8, 150) << "expert " << e;
}

TEST(GeneratorTest, SameSeedSameBytesDifferentSeedDifferentBytes) {
  const std::string tiny = ReadSourceFile("configs/tiny.json");
  TempDir a, b, c;
  GeneratorOptions oa = Options(a.path(), 7);
  oa.threads = 1;
  GeneratorOptions ob = Options(b.path(), 7);
  ob.threads = 2;  // a different generation order must not change a byte
  MustGenerate(tiny, oa);
  MustGenerate(tiny, ob);
  const uint64_t hash_a = HashFolder(a.path());
  EXPECT_EQ(hash_a, HashFolder(b.path()));
  MustGenerate(tiny, Options(c.path(), 8));
  EXPECT_NE(hash_a, HashFolder(c.path()));
  EXPECT_EQ(ReadFileOrDie(a.Sub("config.json")), ReadFileOrDie(c.Sub("config.json")));
}

TEST(GeneratorTest, Nvfp4CheckpointLoadsBackAsTheInventorySays) {
  TempDir dir;
  const GenerateSummary s = MustGenerate(ReadSourceFile("configs/tiny.json"), Options(dir.path(), 1));
  EXPECT_EQ(s.tensors, static_cast<int64_t>(TensorInventory(s.config, ExpertFormat::kNvfp4).size()));
  EXPECT_EQ(s.tensors_by_dtype.at("U8"), 4 * 8 * 3);  // main-layer experts only
  EXPECT_EQ(s.tensors_by_dtype.at("I8"), 1 * 8 * 3);  // the MTP block's experts stay MXFP4
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("hf_quant_config.json")));
  ExpectMatchesInventory(dir.path(), ExpertFormat::kNvfp4);
  EXPECT_THAT(s.ToString(), HasSubstr("tensors"));
}

TEST(GeneratorTest, Mxfp4ShardedCheckpointLoadsBack) {
  TempDir dir;
  GeneratorOptions o = Options(dir.path(), 1, ExpertFormat::kMxfp4);
  o.shards = 3;
  MustGenerate(ReadSourceFile("configs/tiny.json"), o);
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("hf_quant_config.json")));
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("model.safetensors.index.json")));
  ExpectMatchesInventory(dir.path(), ExpertFormat::kMxfp4);
}

TEST(GeneratorTest, LayersCutKeepsThePrefixAndTheMtpBlock) {
  const std::string tiny = ReadSourceFile("configs/tiny.json");
  TempDir full, cut;
  MustGenerate(tiny, Options(full.path(), 3, ExpertFormat::kMxfp4));
  GeneratorOptions o = Options(cut.path(), 3, ExpertFormat::kMxfp4);
  o.layers = 2;
  const GenerateSummary s = MustGenerate(tiny, o);
  EXPECT_EQ(s.config.num_hidden_layers, 2);
  EXPECT_EQ(s.config.compress_ratios, (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(s.config.num_hash_layers, 2);
  ExpectMatchesInventory(cut.path(), ExpertFormat::kMxfp4);
  auto a = ckpt::Checkpoint::Open(full.path());
  auto b = ckpt::Checkpoint::Open(cut.path());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE((*b)->Has("layers.2.attn.wq_a.weight"));
  EXPECT_TRUE((*b)->Has("mtp.0.e_proj.weight"));
  // Values are keyed by tensor name, so kept tensors are unchanged, except the residual projections,
  // whose 1/sqrt(2L) scale follows the depth.
  EXPECT_EQ(Bytes(**a, "layers.1.attn.wq_a.weight"), Bytes(**b, "layers.1.attn.wq_a.weight"));
  EXPECT_EQ(Bytes(**a, "embed.weight"), Bytes(**b, "embed.weight"));
  EXPECT_NE(Bytes(**a, "layers.1.attn.wo_b.weight"), Bytes(**b, "layers.1.attn.wo_b.weight"));
}

TEST(GeneratorTest, RefusesBadOptionsWithTheirNames) {
  const std::string tiny = ReadSourceFile("configs/tiny.json");
  TempDir dir;
  GeneratorOptions o = Options(dir.path(), 1);
  o.layers = 5;
  EXPECT_THAT(GenerateCheckpoint(tiny, o).status().message(), HasSubstr("--layers 5"));
  o.layers = 0;
  o.shards = 0;
  EXPECT_THAT(GenerateCheckpoint(tiny, o).status().message(), HasSubstr("--shards"));
  EXPECT_THAT(GenerateCheckpoint(tiny, Options("", 1)).status().message(), HasSubstr("--out"));
  nlohmann::json bad = nlohmann::json::parse(tiny);
  bad["head_dim"] = 64;
  EXPECT_THAT(GenerateCheckpoint(bad.dump(), Options(dir.path(), 1)).status().message(), HasSubstr("\"head_dim\""));
  MustGenerate(tiny, Options(dir.path(), 1));
  EXPECT_FALSE(GenerateCheckpoint(tiny, Options(dir.path(), 1)).ok()) << "overwrote without overwrite";
  GeneratorOptions again = Options(dir.path(), 2, ExpertFormat::kMxfp4);
  again.overwrite = true;
  MustGenerate(tiny, again);
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("hf_quant_config.json"))) << "stale NVFP4 metadata left behind";
  ExpectMatchesInventory(dir.path(), ExpertFormat::kMxfp4);
}

// RMS of a dequantised linear over its rows.
double LinearRms(const ckpt::Checkpoint& ck, const std::string& base) {
  absl::StatusOr<ckpt::LinearWeight> w = ckpt::LoadLinearWeight(ck, base);
  EXPECT_TRUE(w.ok()) << w.status();
  absl::StatusOr<std::vector<float>> v = ckpt::Dequantize(*w);
  EXPECT_TRUE(v.ok()) << v.status();
  double sq = 0;
  for (float x : *v) sq += static_cast<double>(x) * x;
  return std::sqrt(sq / static_cast<double>(v->size()));
}

std::vector<float> F32Values(const ckpt::Checkpoint& ck, const std::string& name) {
  const std::vector<uint8_t> bytes = Bytes(ck, name);
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

// The magnitudes param_init.cc promises, after quantisation, read back through the loader's dequant.
TEST(GeneratorTest, ValuesHaveTheDocumentedMagnitudes) {
  TempDir dir;
  const GenerateSummary s = MustGenerate(ReadSourceFile("configs/tiny.json"), Options(dir.path(), 11));
  auto ck = ckpt::Checkpoint::Open(dir.path());
  ASSERT_TRUE(ck.ok());
  const double L = static_cast<double>(s.config.num_hidden_layers);
  EXPECT_NEAR(LinearRms(**ck, "layers.0.attn.wq_a"), 1 / std::sqrt(512.0), 0.1 / std::sqrt(512.0));  // FP8
  EXPECT_NEAR(LinearRms(**ck, "layers.0.ffn.experts.1.w1"), 1 / std::sqrt(512.0), 0.15 / std::sqrt(512.0));  // NVFP4
  EXPECT_NEAR(LinearRms(**ck, "mtp.0.ffn.experts.1.w3"), 1 / std::sqrt(512.0), 0.15 / std::sqrt(512.0));  // MXFP4
  const double residual = 1 / std::sqrt(256.0 * 2 * L);
  EXPECT_NEAR(LinearRms(**ck, "layers.3.ffn.experts.0.w2"), residual, 0.15 * residual);
  EXPECT_NEAR(LinearRms(**ck, "layers.3.ffn.gate"), 2 / std::sqrt(512.0), 0.1 / std::sqrt(512.0));
  for (float x : F32Values(**ck, "layers.3.ffn.gate.bias")) ASSERT_LE(std::fabs(x), 0.1f);
  for (float x : F32Values(**ck, "layers.1.hc_ffn_scale")) ASSERT_TRUE(x > 0.25f && x < 0.75f);
  for (float x : F32Values(**ck, "layers.0.attn.attn_sink")) ASSERT_LE(std::fabs(x), 0.5f);
  const std::vector<uint8_t> norm = Bytes(**ck, "layers.2.attn.kv_norm.weight");
  ASSERT_EQ(norm.size(), 512u * 2);
  for (size_t i = 0; i < norm.size(); i += 2) {
    uint16_t h;
    std::memcpy(&h, &norm[i], 2);
    const float x = Bf16ToF32(h);
    ASSERT_TRUE(x >= 0.89f && x <= 1.11f) << x;
  }
  const std::vector<uint8_t> tid = Bytes(**ck, "layers.0.ffn.gate.tid2eid");
  for (size_t row = 0; row < tid.size() / 16; ++row) {
    int64_t e0, e1;
    std::memcpy(&e0, &tid[row * 16], 8);
    std::memcpy(&e1, &tid[row * 16 + 8], 8);
    ASSERT_NE(e0, e1) << "token " << row;
    ASSERT_TRUE(e0 >= 0 && e0 < 8 && e1 >= 0 && e1 < 8);
  }
}

TEST(GeneratorTest, OutputConfigNormalisesQuantizationAndCutsTransformersLists) {
  nlohmann::json j = nlohmann::json::parse(ReadSourceFile("configs/tiny.json"));
  j.erase("num_hash_layers");
  j["mlp_layer_types"] = {"hash_moe", "hash_moe", "hash_moe", "moe"};
  j["quantization_config"]["quant_algo"] = "NVFP4";
  absl::StatusOr<std::string> out = OutputConfigJson(j.dump(), 1);
  ASSERT_TRUE(out.ok()) << out.status();
  const nlohmann::json o = nlohmann::json::parse(*out);
  EXPECT_EQ(o["num_hidden_layers"], 1);
  EXPECT_EQ(o["mlp_layer_types"], nlohmann::json({"hash_moe"}));
  EXPECT_EQ(o["compress_ratios"], nlohmann::json({0, 0}));
  EXPECT_FALSE(o["quantization_config"].contains("quant_algo"));
  absl::StatusOr<Config> c = ParseConfig(*out);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_hash_layers, 1);
}

}  // namespace
}  // namespace dsv4::gen
