// The streamed weight loader (model/dsv4/weights.h, model/checkpoint/stream_reader.h): the backend receives
// exactly the bytes the mapped loader hands it - every PrepareLinear / PrepareExperts view and every upload, in
// order, byte for byte - for the whole model and for every rank of worlds 2 and 4, from one file or several, with
// a staging ring small enough to wrap and tiny reads; reads that fail name the tensor and the file; the reader's
// ring keeps its contract (bytes exact under wrap-around, a consumer holding more than the ring is refused
// instead of hanging, a loader asking for something it did not plan is refused).
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/checkpoint/stream_reader.h"
#include "model/config/config.h"
#include "model/dsv4/weights.h"
#include "tests/model/model_fixture.h"
#include "tools/make_checkpoint/generator.h"

namespace dsv4::model {
namespace {

using ::testing::HasSubstr;

// Bytes of a view in its format (kernels/weights.h).
std::pair<int64_t, int64_t> ViewBytes(const kernels::WeightView& v) {
  switch (v.format) {
    case kernels::WeightFormat::kF32: return {v.n * v.k * 4, 0};
    case kernels::WeightFormat::kBF16: return {v.n * v.k * 2, 0};
    case kernels::WeightFormat::kFp8Block128: return {v.n * v.k, (v.n + 127) / 128 * ((v.k + 127) / 128)};
    case kernels::WeightFormat::kNvfp4: return {v.n * v.k / 2, v.n * v.k / 16};
    case kernels::WeightFormat::kMxfp4: return {v.n * v.k / 2, v.n * v.k / 32};
  }
  return {0, 0};
}

// A CPU backend that logs everything the loader hands it: each view's name, format, shape, global scale and
// bytes, and every upload's bytes.
class RecordingBackend final : public kernels::Backend {
 public:
  RecordingBackend() : cpu_(kernels::cpu::MakeCpuBackend(1)) {}
  std::string name() const override { return "recording"; }
  kernels::Ops& ops() override { return cpu_->ops(); }
  absl::Status Reserve(const kernels::StepLimits& l) override { return cpu_->Reserve(l); }
  absl::StatusOr<kernels::Buffer> Allocate(int64_t bytes, kernels::MemoryKind kind) override {
    void* p = bytes > 0 ? std::calloc(1, bytes) : nullptr;
    Count(kind, bytes);
    return kernels::Buffer(this, p, bytes, kind);
  }
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    log_.push_back(absl::StrCat("copy ", bytes, " ", std::string(static_cast<const char*>(src), bytes)));
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::StatusOr<kernels::LinearHandle> PrepareLinear(const kernels::WeightView& w) override {
    Record("linear", w);
    return cpu_->PrepareLinear(w);
  }
  absl::StatusOr<kernels::ExpertsHandle> PrepareExperts(std::span<const kernels::WeightView> w1,
                                                        std::span<const kernels::WeightView> w3,
                                                        std::span<const kernels::WeightView> w2) override {
    for (size_t e = 0; e < w1.size(); ++e) {
      for (const kernels::WeightView* v : {&w1[e], &w3[e], &w2[e]}) {
        if (v->data == nullptr) {
          log_.push_back(absl::StrCat("expert ", e, " not held"));
        } else {
          Record("expert", *v);
        }
      }
    }
    return cpu_->PrepareExperts(w1, w3, w2);
  }
  const std::vector<std::string>& log() const { return log_; }

 protected:
  void Free(void* data, int64_t bytes, kernels::MemoryKind kind) override {
    std::free(data);
    Count(kind, -bytes);
  }

 private:
  void Record(const char* what, const kernels::WeightView& v) {
    const auto [data, scale] = ViewBytes(v);
    log_.push_back(absl::StrCat(what, " ", v.name, " ", kernels::WeightFormatName(v.format), " ", v.n, "x", v.k,
                                " gs ", v.global_scale, " f32 ", v.scale_f32, " data ",
                                std::string(reinterpret_cast<const char*>(v.data), data), " scale ",
                                v.scale ? std::string(reinterpret_cast<const char*>(v.scale), scale) : "-"));
  }
  std::unique_ptr<kernels::Backend> cpu_;
  std::vector<std::string> log_;
};

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct TempDir {
  std::string path;
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "dsv4-stream-XXXXXX").string();
    path = mkdtemp(templ.data()) != nullptr ? templ : std::string();
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// Loads `dir` once mapped and once streamed (with `options`) and expects the two logs to match entry for entry.
void ExpectSameBytes(const std::string& dir, ShardSpec spec, WeightLoadOptions options) {
  auto ck = ckpt::Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  auto config = LoadConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  std::unique_ptr<ShardLayout> shard;
  if (spec.world > 1) {
    auto layout = PlanShardLayout(*config, spec);
    ASSERT_TRUE(layout.ok()) << layout.status();
    shard = std::make_unique<ShardLayout>(*layout);
  }
  RecordingBackend mapped, streamed;
  WeightLoadStats mapped_stats, streamed_stats;
  int layers_seen = 0;
  auto a = LoadWeights(**ck, *config, mapped, shard.get(), {}, {.mode = WeightLoadOptions::Mode::kMapped},
                       &mapped_stats);
  ASSERT_TRUE(a.ok()) << a.status();
  options.mode = WeightLoadOptions::Mode::kStreamed;
  auto b = LoadWeights(**ck, *config, streamed, shard.get(), [&](int, int) { ++layers_seen; }, options,
                       &streamed_stats);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(layers_seen, config->num_hidden_layers) << "progress once per layer, not for the plan walk";
  EXPECT_FALSE(mapped_stats.streamed);
  EXPECT_TRUE(streamed_stats.streamed);
  EXPECT_EQ(mapped_stats.bytes, streamed_stats.bytes);
  EXPECT_GT(streamed_stats.staging_bytes, 0);
  EXPECT_EQ(streamed.allocated()[static_cast<int>(kernels::MemoryKind::kHostStaging)], 0) << "staging freed";
  ASSERT_EQ(mapped.log().size(), streamed.log().size());
  for (size_t i = 0; i < mapped.log().size(); ++i) {
    ASSERT_TRUE(mapped.log()[i] == streamed.log()[i])
        << "rank " << spec.rank << " of " << spec.world << ": entry " << i << " differs: mapped "
        << mapped.log()[i].substr(0, 80) << " vs streamed " << streamed.log()[i].substr(0, 80);
  }
}

TEST(WeightStream, WholeModelSameBytesAsMapped) {
  ExpectSameBytes(testing::TinyCheckpoint(), {}, {});
}

TEST(WeightStream, SmallRingAndTinyReadsSameBytes) {
  // No read-ahead (the ring is just what the loader holds plus one item: it wraps constantly) and 4 KiB reads
  // shared by 5 threads.
  ExpectSameBytes(testing::TinyCheckpoint(), {}, {.reader_threads = 5, .chunk_bytes = 4096, .read_ahead_bytes = 0});
}

TEST(WeightStream, EveryRankOfWorlds2And4SameBytes) {
  for (int world : {2, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " of ", world));
      ExpectSameBytes(testing::TinyCheckpoint(), {.rank = rank, .world = world}, {.reader_threads = 3});
    }
  }
}

TEST(WeightStream, ShardedMxfp4CheckpointSameBytes) {
  TempDir dir;
  const std::string json = ReadText(testing::SourceDir() + "/configs/tiny.json");
  auto s = gen::GenerateCheckpoint(json, {.seed = 3, .out_dir = dir.path, .shards = 3,
                                          .experts = ExpertFormat::kMxfp4, .overwrite = true});
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectSameBytes(dir.path, {}, {.reader_threads = 2});
  ExpectSameBytes(dir.path, {.rank = 1, .world = 2}, {.reader_threads = 2});
}

TEST(WeightStream, FileTruncatedAfterOpenNamesTensorAndFile) {
  // MXFP4 experts: the plan walk reads no tensor bytes through the mapping (no NVFP4 scalar), so cutting the file
  // after Open is seen only by the readers.
  TempDir dir;
  const std::string json = ReadText(testing::SourceDir() + "/configs/tiny.json");
  auto s = gen::GenerateCheckpoint(json, {.seed = 3, .out_dir = dir.path, .experts = ExpertFormat::kMxfp4,
                                          .overwrite = true});
  ASSERT_TRUE(s.ok()) << s.status();
  auto ck = ckpt::Checkpoint::Open(dir.path);
  ASSERT_TRUE(ck.ok()) << ck.status();
  ASSERT_TRUE((*ck)->ValidateAll().ok());
  auto config = LoadConfig(dir.path);
  ASSERT_TRUE(config.ok());
  const std::string file = dir.path + "/model.safetensors";
  const auto size = std::filesystem::file_size(file);
  std::filesystem::resize_file(file, size / 2);
  RecordingBackend backend;
  auto w = LoadWeights(**ck, *config, backend, nullptr, {}, {.mode = WeightLoadOptions::Mode::kStreamed});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kDataLoss) << w.status();
  EXPECT_THAT(w.status().message(), HasSubstr(file));
  EXPECT_THAT(w.status().message(), HasSubstr("truncated"));
  EXPECT_THAT(std::string(w.status().message()), ::testing::MatchesRegex("^[A-Za-z_0-9.]+: .*"))
      << "starts with the tensor's name";
}

// The reader alone, on a file of known bytes.
class StreamReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.path + "/data.bin";
    bytes_.resize(1 << 20);
    std::mt19937 rng(7);
    for (auto& b : bytes_) b = static_cast<uint8_t>(rng());
    std::ofstream(path_, std::ios::binary).write(reinterpret_cast<const char*>(bytes_.data()), bytes_.size());
  }
  ckpt::StreamItem Item(int i, std::vector<ckpt::ByteRange> ranges) {
    return {.name = absl::StrCat("t", i), .path = path_, .ranges = std::move(ranges)};
  }
  std::string Expected(const ckpt::StreamItem& it) {
    std::string s;
    for (const auto& r : it.ranges) s.append(reinterpret_cast<const char*>(bytes_.data()) + r.offset, r.bytes);
    return s;
  }
  TempDir dir_;
  std::string path_;
  std::vector<uint8_t> bytes_;
};

TEST_F(StreamReaderTest, BytesExactThroughAWrappingRing) {
  std::mt19937 rng(11);
  std::vector<ckpt::StreamItem> items;
  for (int i = 0; i < 300; ++i) {
    std::vector<ckpt::ByteRange> ranges;
    for (int r = 0, n = 1 + rng() % 3; r < n; ++r) {
      const uint64_t len = rng() % 3000, off = rng() % (bytes_.size() - len);
      ranges.push_back({off, len});
    }
    items.push_back(Item(i, ranges));
  }
  std::vector<uint8_t> arena(30000);  // two held items of <= 9000 bytes, plus wrap-around
  auto copy = items;
  auto reader = ckpt::StreamReader::Start(std::move(copy), arena.data(), arena.size(), {.threads = 4, .chunk_bytes = 4096});
  ASSERT_TRUE(reader.ok()) << reader.status();
  // Hold two items at a time, as the loader holds a weight and its scale.
  for (size_t i = 0; i < items.size(); i += 2) {
    auto a = (*reader)->Take(items[i].name);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(*a), items[i].bytes()), Expected(items[i])) << i;
    if (i + 1 < items.size()) {
      auto b = (*reader)->Take(items[i + 1].name);
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(*b), items[i + 1].bytes()), Expected(items[i + 1]));
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(*a), items[i].bytes()), Expected(items[i]))
          << "an item still held was overwritten";
    }
    (*reader)->ReleaseTaken();
  }
  EXPECT_EQ((*reader)->remaining(), 0u);
}

TEST_F(StreamReaderTest, ShortFileNamesItemAndFile) {
  std::vector<uint8_t> arena(1 << 16);
  auto reader = ckpt::StreamReader::Start({Item(0, {{0, 100}}), Item(1, {{bytes_.size() - 10, 50}})}, arena.data(),
                                          arena.size());
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE((*reader)->Take("t0").ok());
  auto b = (*reader)->Take("t1");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(b.status().message(), HasSubstr("t1"));
  EXPECT_THAT(b.status().message(), HasSubstr(path_));
}

TEST_F(StreamReaderTest, MissingFileAndOversizedItemRefusedAtStart) {
  std::vector<uint8_t> arena(1000);
  auto missing = ckpt::StreamReader::Start({{.name = "t", .path = dir_.path + "/nope", .ranges = {{0, 10}}}},
                                           arena.data(), arena.size());
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("nope"));
  auto big = ckpt::StreamReader::Start({Item(0, {{0, 1001}})}, arena.data(), arena.size());
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StreamReaderTest, HoldingMoreThanTheRingIsRefusedNotAHang) {
  std::vector<uint8_t> arena(1000);
  auto reader = ckpt::StreamReader::Start({Item(0, {{0, 600}}), Item(1, {{0, 600}})}, arena.data(), arena.size());
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE((*reader)->Take("t0").ok());
  auto b = (*reader)->Take("t1");  // t0 not released: t1 has no room
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(b.status().message(), HasSubstr("staging arena"));
}

TEST_F(StreamReaderTest, UnplannedRequestRefused) {
  std::vector<uint8_t> arena(1000);
  auto reader = ckpt::StreamReader::Start({Item(0, {{0, 10}})}, arena.data(), arena.size());
  ASSERT_TRUE(reader.ok());
  auto x = (*reader)->Take("other");
  ASSERT_FALSE(x.ok());
  EXPECT_THAT(x.status().message(), HasSubstr("planned t0"));
  ASSERT_TRUE((*reader)->Take("t0").ok());
  EXPECT_FALSE((*reader)->Take("t0").ok()) << "past the plan";
}

}  // namespace
}  // namespace dsv4::model
