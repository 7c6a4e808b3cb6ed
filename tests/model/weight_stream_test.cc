// The streamed weight loader (model/dsv4/weights.h, model/checkpoint/stream_reader.h): the backend receives
// exactly the bytes the mapped loader hands it - every PrepareLinear / PrepareExperts view and every upload, in
// order, byte for byte - for the whole model and for every rank of worlds 2 and 4, from one file or several, with
// a staging ring small enough to wrap and tiny reads; a file cut short after Open fails the load naming the tensor
// and the file. The reader's own contract is tested in tests/checkpoint/stream_reader_test.cc.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/device_control.h"
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

// Stands in for a GPU's controls so a CPU backend counts as one with a device for the loader's choice (kAuto); the
// loader never calls them.
class NoDeviceControl final : public kernels::DeviceControl {
 public:
  absl::StatusOr<kernels::DeviceMemory> Memory() override { return absl::UnimplementedError("no device"); }
  void* stream() override { return nullptr; }
  absl::StatusOr<std::unique_ptr<kernels::StepGraph>> Capture(const std::function<absl::Status()>&) override {
    return absl::UnimplementedError("no device");
  }
  absl::Status Launch(kernels::StepGraph&) override { return absl::UnimplementedError("no device"); }
};

// A CPU backend that logs everything the loader hands it: each view's name, format, shape, global scale and
// bytes, and every upload's bytes. With claims_device it answers device_control() like a GPU backend.
class RecordingBackend final : public kernels::Backend {
 public:
  explicit RecordingBackend(bool claims_device = false) : cpu_(kernels::cpu::MakeCpuBackend(1)) {
    if (claims_device) device_ = std::make_unique<NoDeviceControl>();
  }
  kernels::DeviceControl* device_control() override { return device_.get(); }
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
  std::unique_ptr<NoDeviceControl> device_;
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

TEST(WeightStream, InMemoryCheckpointLoadsMappedAndRefusesStreaming) {
  // The decode bench hands the loader an in-memory checkpoint: kAuto must map it (streaming reads files), an
  // explicit kStreamed must say why not.
  TempDir dir;
  const std::string json = ReadText(testing::SourceDir() + "/configs/tiny.json");
  auto s = gen::GenerateCheckpoint(json, {.seed = 5, .out_dir = dir.path, .overwrite = true});
  ASSERT_TRUE(s.ok()) << s.status();
  auto disk = ckpt::Checkpoint::Open(dir.path);
  ASSERT_TRUE(disk.ok()) << disk.status();
  auto config = LoadConfig(dir.path);
  ASSERT_TRUE(config.ok()) << config.status();
  std::vector<ckpt::TensorView> views;
  for (const std::string& name : (*disk)->Names()) {
    auto v = (*disk)->Get(name);
    ASSERT_TRUE(v.ok()) << v.status();
    views.push_back(*v);
  }
  auto mem = ckpt::Checkpoint::InMemory("(copy of tiny)", std::move(views), nullptr);  // *disk outlives it
  ASSERT_TRUE(mem.ok()) << mem.status();
  RecordingBackend from_disk, from_memory;
  WeightLoadStats stats;
  auto a = LoadWeights(**disk, *config, from_disk, nullptr, {}, {.mode = WeightLoadOptions::Mode::kMapped});
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = LoadWeights(**mem, *config, from_memory, nullptr, {}, {.mode = WeightLoadOptions::Mode::kAuto}, &stats);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(stats.streamed);
  EXPECT_EQ(from_disk.log(), from_memory.log());
  auto c = LoadWeights(**mem, *config, from_memory, nullptr, {}, {.mode = WeightLoadOptions::Mode::kStreamed});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_THAT(c.status().message(), HasSubstr("held in memory"));
}

TEST(WeightLoadChoice, ParsesTheThreeModesAndRefusesOthers) {
  EXPECT_EQ(*ParseWeightLoadMode("auto"), WeightLoadOptions::Mode::kAuto);
  EXPECT_EQ(*ParseWeightLoadMode("mapped"), WeightLoadOptions::Mode::kMapped);
  EXPECT_EQ(*ParseWeightLoadMode("streamed"), WeightLoadOptions::Mode::kStreamed);
  for (const char* bad : {"", "Auto", "stream", "mmap"}) {
    auto m = ParseWeightLoadMode(bad);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr("auto, mapped, streamed"));
  }
}

TEST(WeightLoadChoice, AutoStreamsOnlyLargeRanksFromDiskToADevice) {
  const WeightLoadOptions automatic{.auto_stream_min_bytes = 3'000'000'000};
  const int64_t big = 40'000'000'000, small = 2'000'000'000;
  EXPECT_TRUE(ShouldStream(automatic, true, false, big).streamed);
  EXPECT_TRUE(ShouldStream(automatic, true, false, 3'000'000'000).streamed) << "the threshold itself streams";
  const LoadChoice below = ShouldStream(automatic, true, false, small);
  EXPECT_FALSE(below.streamed);
  EXPECT_THAT(below.why, HasSubstr("2.00 GB for this rank is below the 3.00 GB"));
  EXPECT_FALSE(ShouldStream(automatic, false, false, big).streamed) << "no device: mapped";
  EXPECT_FALSE(ShouldStream(automatic, true, true, big).streamed) << "in memory: mapped";
  // Asked for explicitly, size does not matter.
  EXPECT_TRUE(ShouldStream({.mode = WeightLoadOptions::Mode::kStreamed}, false, false, 1).streamed);
  EXPECT_FALSE(ShouldStream({.mode = WeightLoadOptions::Mode::kMapped}, true, false, big).streamed);
}

TEST(WeightLoadChoice, AutoOnADeviceBackendChoosesByThePlannedBytes) {
  // The tiny checkpoint is far below the default threshold: mapped, saying why; with the threshold at 1 byte the
  // same kAuto load streams and hands the backend the same bytes.
  const std::string dir = testing::TinyCheckpoint();
  auto ck = ckpt::Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  auto config = LoadConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  RecordingBackend small_load(/*claims_device=*/true), large_load(/*claims_device=*/true);
  WeightLoadStats small_stats, large_stats;
  auto a = LoadWeights(**ck, *config, small_load, nullptr, {}, {}, &small_stats);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(small_stats.streamed);
  EXPECT_THAT(small_stats.choice, HasSubstr("below the 3.00 GB streaming threshold"));
  EXPECT_THAT(small_stats.ToString(), HasSubstr("[auto: mapped"));
  auto b = LoadWeights(**ck, *config, large_load, nullptr, {}, {.auto_stream_min_bytes = 1}, &large_stats);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(large_stats.streamed) << large_stats.choice;
  EXPECT_THAT(large_stats.ToString(), HasSubstr("[auto: streamed"));
  EXPECT_EQ(small_stats.bytes, large_stats.bytes);
  EXPECT_EQ(small_load.log(), large_load.log());
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

}  // namespace
}  // namespace dsv4::model
