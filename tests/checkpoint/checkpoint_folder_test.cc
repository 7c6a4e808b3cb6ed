// Checkpoint folders: index handling, refusals naming the tensor and shard, Expect messages,
// config file access.
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/safetensors_writer.h"
#include "tests/checkpoint/test_util.h"

namespace dsv4::ckpt {
namespace {

using ::testing::HasSubstr;
using testing::PadHeader;
using testing::RawSafetensors;
using testing::TempDir;
using testing::WriteFile;

// A shard with one U8 [4] tensor per name.
void WriteShard(const std::string& path, const std::vector<std::string>& names) {
  std::string header = "{", data;
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppend(&header, i ? "," : "", "\"", names[i], "\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[",
                    4 * i, ",", 4 * i + 4, "]}");
    data += "wxyz";
  }
  WriteFile(path, RawSafetensors(PadHeader(absl::StrCat(header, "}")), data));
}

absl::Status OpenStatus(const std::string& dir) { return Checkpoint::Open(dir).status(); }

TEST(CheckpointFolder, ExpectNamesTensorExpectedAndFound) {
  TempDir dir;
  auto w = CheckpointWriter::Create(dir.path(), 1);
  ASSERT_TRUE(w.ok());
  const std::vector<uint8_t> bytes(512 * 4096 * 2, 0);
  ASSERT_TRUE((*w)->Add("layers.2.attn.wkv.weight", DType::kBF16, {512, 4096}, bytes).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  auto v = (*ckpt)->Expect("layers.2.attn.wkv.weight", DType::kF8E4M3, {512, 4096});
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(),
              HasSubstr("layers.2.attn.wkv.weight: expected F8_E4M3 [512,4096], found BF16 [512,4096]"));
  EXPECT_THAT(v.status().message(), HasSubstr(dir.File(kSingleFileName)));
  auto shape = (*ckpt)->Expect("layers.2.attn.wkv.weight", DType::kBF16, {4096, 512});
  EXPECT_THAT(shape.status().message(), HasSubstr("expected BF16 [4096,512], found BF16 [512,4096]"));
  EXPECT_TRUE((*ckpt)->Expect("layers.2.attn.wkv.weight", DType::kBF16, {512, 4096}).ok());
  auto missing = (*ckpt)->Get("layers.2.attn.wq_a.weight");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("layers.2.attn.wq_a.weight"));
}

TEST(CheckpointFolder, LocateGivesTheShardAndTheOffsetOfTheBytes) {
  // The streamed loader (stream_reader.h) preads what Locate says: it must be the bytes Get maps, in every shard.
  TempDir dir;
  auto w = CheckpointWriter::Create(dir.path(), 2);
  ASSERT_TRUE(w.ok());
  std::vector<uint8_t> a(3000), b(5000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7 + 1);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 13 + 5);
  ASSERT_TRUE((*w)->Add("x.weight", DType::kU8, {3000}, a).ok());
  ASSERT_TRUE((*w)->Add("y.weight", DType::kU8, {5000}, b).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  for (const char* name : {"x.weight", "y.weight"}) {
    auto at = (*ckpt)->Locate(name);
    ASSERT_TRUE(at.ok()) << at.status();
    auto shard = (*ckpt)->ShardOf(name);
    ASSERT_TRUE(shard.ok());
    EXPECT_EQ(at->path, dir.File(*shard));
    EXPECT_EQ(at->view.name, name);
    std::ifstream f(at->path, std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at->offset));
    std::string bytes(at->view.nbytes, '\0');
    f.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    EXPECT_EQ(bytes, std::string(reinterpret_cast<const char*>(at->view.data), at->view.nbytes)) << name;
  }
  auto missing = (*ckpt)->Locate("z.weight");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("z.weight"));
}

TEST(CheckpointInMemory, ServesItsViewsAndRefusesWhatHasNoFile) {
  // The decode bench's synthetic weights: views into memory the checkpoint keeps alive, two sharing bytes.
  auto bytes = std::make_shared<std::vector<uint8_t>>(64, 7);
  std::vector<TensorView> views = {
      {.name = "a.weight", .dtype = DType::kU8, .shape = {8, 8}, .data = bytes->data(), .nbytes = 64},
      {.name = "b.weight", .dtype = DType::kU8, .shape = {4}, .data = bytes->data(), .nbytes = 4}};
  auto ck = Checkpoint::InMemory("(synthetic)", views, bytes);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_TRUE((*ck)->in_memory());
  EXPECT_TRUE((*ck)->Has("b.weight"));
  EXPECT_EQ((*ck)->Names(), (std::vector<std::string>{"a.weight", "b.weight"}));
  auto a = (*ck)->Get("a.weight");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->data, bytes->data());
  EXPECT_EQ(a->shape, (std::vector<int64_t>{8, 8}));
  auto missing = (*ck)->Get("c.weight");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("c.weight"));
  // No file to read the bytes from directly (the GPU weight stream): a clear refusal, not "no such tensor".
  auto at = (*ck)->Locate("a.weight");
  EXPECT_EQ(at.status().code(), absl::StatusCode::kFailedPrecondition) << at.status();
  EXPECT_THAT(at.status().message(), HasSubstr("held in memory"));

  EXPECT_FALSE(Checkpoint::InMemory("(empty)", {}, nullptr).ok());
  views.push_back(views[0]);
  auto twice = Checkpoint::InMemory("(twice)", views, bytes);
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(twice.status().message(), HasSubstr("a.weight given twice"));
}

TEST(CheckpointFolder, RefusesBadFolders) {
  TempDir empty;
  EXPECT_EQ(OpenStatus(empty.path()).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(OpenStatus(empty.path()).message(), HasSubstr("neither"));

  TempDir both;
  WriteShard(both.File(kSingleFileName), {"a"});
  WriteFile(both.File(kIndexFileName), R"({"weight_map":{"a":"model.safetensors"}})");
  EXPECT_THAT(OpenStatus(both.path()).message(), HasSubstr("both"));

  TempDir bad_json;
  WriteFile(bad_json.File(kIndexFileName), R"({"weight_map":)");
  EXPECT_EQ(OpenStatus(bad_json.path()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(OpenStatus(bad_json.path()).message(), HasSubstr(kIndexFileName));

  TempDir no_map;
  WriteFile(no_map.File(kIndexFileName), R"({"metadata":{"total_size":4}})");
  EXPECT_THAT(OpenStatus(no_map.path()).message(), HasSubstr("weight_map"));

  TempDir escape;
  WriteFile(escape.File(kIndexFileName), R"({"weight_map":{"layers.0.w":"../elsewhere.safetensors"}})");
  EXPECT_EQ(OpenStatus(escape.path()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(OpenStatus(escape.path()).message(), HasSubstr("layers.0.w"));

  TempDir missing_shard;
  WriteFile(missing_shard.File(kIndexFileName), R"({"weight_map":{"a":"model-00001-of-00002.safetensors"}})");
  EXPECT_EQ(OpenStatus(missing_shard.path()).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(OpenStatus(missing_shard.path()).message(), HasSubstr("model-00001-of-00002.safetensors"));
}

// The index parser alone (what Checkpoint::Open uses, and what fuzz/checkpoint_index_fuzzer drives).
TEST(CheckpointFolder, IndexParserMapsTensorsToPlainShardNames) {
  auto map = ParseCheckpointIndex("i.json", R"({"metadata":{"total_size":8},"weight_map":{"a":"s1.safetensors",)"
                                            R"("b":"s2.safetensors"}})");
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->size(), 2u);
  EXPECT_EQ(map->at("b"), "s2.safetensors");
  for (const char* shard : {R"("")", R"(".")", R"("..")", R"("a/b")", R"("/abs")", "\"x\\u0000y\"", "7", "null"}) {
    const auto bad = ParseCheckpointIndex("i.json", absl::StrCat(R"({"weight_map":{"t":)", shard, "}}"));
    ASSERT_FALSE(bad.ok()) << shard;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << shard;
    EXPECT_THAT(bad.status().message(), HasSubstr("i.json: tensor \"t\"")) << shard;
  }
  EXPECT_FALSE(ParseCheckpointIndex("i.json", R"({"weight_map":{}})").ok());
  EXPECT_FALSE(ParseCheckpointIndex("i.json", "[1]").ok());
}

TEST(CheckpointFolder, IndexAndShardsMustAgree) {
  TempDir dir;
  WriteShard(dir.File("s1.safetensors"), {"a", "b"});
  WriteShard(dir.File("s2.safetensors"), {"c", "stray"});
  WriteFile(dir.File(kIndexFileName),
            R"({"metadata":{"total_size":16},"weight_map":{"a":"s1.safetensors","b":"s1.safetensors",)"
            R"("c":"s2.safetensors","ghost":"s2.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Names(), (std::vector<std::string>{"a", "b", "c", "ghost"}));
  EXPECT_TRUE((*ckpt)->Get("a").ok());
  auto ghost = (*ckpt)->Get("ghost");
  EXPECT_EQ(ghost.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(ghost.status().message(), HasSubstr("ghost"));
  EXPECT_THAT(ghost.status().message(), HasSubstr("s2.safetensors"));
  const absl::Status all = (*ckpt)->ValidateAll();
  EXPECT_EQ(all.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(all.message(), HasSubstr("stray"));
}

TEST(CheckpointFolder, ShardErrorsSurfaceOnFirstUseNamingTheShard) {
  TempDir dir;
  WriteShard(dir.File("good.safetensors"), {"a"});
  WriteFile(dir.File("bad.safetensors"), std::string("\x10\x00", 2));
  WriteFile(dir.File(kIndexFileName), R"({"weight_map":{"a":"good.safetensors","b":"bad.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();  // shards are opened lazily
  EXPECT_TRUE((*ckpt)->Get("a").ok());
  auto b = (*ckpt)->Get("b");
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(b.status().message(), HasSubstr("bad.safetensors"));
}

TEST(CheckpointFolder, ReadsConfigFiles) {
  TempDir dir;
  WriteShard(dir.File(kSingleFileName), {"a"});
  WriteFile(dir.File(kConfigFileName), R"({"hidden_size": 512})");
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  auto config = (*ckpt)->ReadConfigJson();
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(*config, R"({"hidden_size": 512})");
  EXPECT_EQ((*ckpt)->ReadQuantConfigJson().status().code(), absl::StatusCode::kNotFound);
  WriteFile(dir.File(kQuantConfigFileName), R"({"quant_algo": "MIXED_PRECISION"})");
  EXPECT_EQ(*(*ckpt)->ReadQuantConfigJson(), R"({"quant_algo": "MIXED_PRECISION"})");
  EXPECT_EQ((*ckpt)->PathOf(kConfigFileName), dir.File(kConfigFileName));
}

}  // namespace
}  // namespace dsv4::ckpt
