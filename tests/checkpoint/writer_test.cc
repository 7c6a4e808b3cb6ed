// CheckpointWriter: round trips through the reader (1 and 3 shards, every dtype), the exact header
// bytes, order-independent deterministic output, refusals, and lazy paging of shards on read.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/safetensors_writer.h"
#include "nlohmann/json.hpp"
#include "tests/checkpoint/test_util.h"

namespace dsv4::ckpt {
namespace {

using ::testing::HasSubstr;
using testing::FreshRng;
using testing::RandomBytes;
using testing::ReadFile;
using testing::TempDir;

struct Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Every dtype, random shapes (including a scalar and an empty tensor), random bytes.
std::vector<Tensor> RandomTensors(std::mt19937_64& rng) {
  std::vector<Tensor> out;
  int i = 0;
  for (DType dt : kAllDTypes) {
    for (int rep = 0; rep < 2; ++rep) {
      std::vector<int64_t> shape = {static_cast<int64_t>(1 + rng() % 40), static_cast<int64_t>(1 + rng() % 70)};
      Tensor t{.name = absl::StrCat("layers.", i++, ".", DTypeName(dt)),
               .dtype = dt, .shape = shape, .bytes = {}};
      t.bytes = RandomBytes(rng, static_cast<size_t>(shape[0] * shape[1]) * DTypeSize(dt));
      out.push_back(std::move(t));
    }
  }
  out.push_back({"scalar", DType::kF32, {}, RandomBytes(rng, 4)});
  out.push_back({"empty", DType::kI64, {0, 5}, {}});
  return out;
}

void WriteAll(const std::string& dir, const std::vector<Tensor>& tensors, int shards) {
  auto w = CheckpointWriter::Create(dir, shards);
  ASSERT_TRUE(w.ok()) << w.status();
  for (const Tensor& t : tensors) ASSERT_TRUE((*w)->Add(t.name, t.dtype, t.shape, t.bytes).ok()) << t.name;
  ASSERT_TRUE((*w)->Finish().ok());
}

class WriterRoundTrip : public ::testing::TestWithParam<int> {};

TEST_P(WriterRoundTrip, EveryDTypeReadsBackBitExact) {
  const int shards = GetParam();
  auto rng = FreshRng();
  const std::vector<Tensor> tensors = RandomTensors(rng);
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(WriteAll(dir.path(), tensors, shards));

  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(static_cast<int>((*ckpt)->shard_files().size()), shards);
  ASSERT_TRUE((*ckpt)->ValidateAll().ok()) << (*ckpt)->ValidateAll();
  EXPECT_EQ((*ckpt)->Names().size(), tensors.size());
  for (const Tensor& t : tensors) {
    auto v = (*ckpt)->Expect(t.name, t.dtype, t.shape);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_EQ(v->nbytes, t.bytes.size()) << t.name;
    EXPECT_TRUE(t.bytes.empty() || std::memcmp(v->data, t.bytes.data(), t.bytes.size()) == 0) << t.name;
    // The reference layout aligns every tensor to its element size.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v->data) % DTypeSize(t.dtype), 0u) << t.name;
  }
  if (shards > 1) {
    const auto index = nlohmann::json::parse(ReadFile(dir.File(kIndexFileName)));
    uint64_t total = 0;
    for (const Tensor& t : tensors) total += t.bytes.size();
    EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
    EXPECT_EQ(index["weight_map"].size(), tensors.size());
    EXPECT_FALSE(std::filesystem::exists(dir.File(kSingleFileName)));
  } else {
    EXPECT_FALSE(std::filesystem::exists(dir.File(kIndexFileName)));
  }
  // Every shard is non-empty and carries the metadata transformers needs.
  for (const std::string& f : (*ckpt)->shard_files()) {
    auto file = SafetensorsFile::Open(dir.File(f));
    ASSERT_TRUE(file.ok());
    EXPECT_FALSE((*file)->entries().empty()) << f;
    EXPECT_EQ((*file)->metadata().at("format"), "pt");
  }
  // Nothing but the outputs is left behind (the spool is unlinked, partial files renamed).
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_THAT(e.path().filename().string(), ::testing::StartsWith("model"));
    ++files;
  }
  EXPECT_EQ(files, shards == 1 ? 1 : shards + 1);
}

INSTANTIATE_TEST_SUITE_P(Shards, WriterRoundTrip, ::testing::Values(1, 3));

TEST(Writer, HeaderBytesMatchTheReferenceLayout) {
  TempDir dir;
  auto w = CheckpointWriter::Create(dir.path(), 1);
  ASSERT_TRUE(w.ok());
  const std::vector<uint8_t> a = {1, 2, 3}, b = {0, 0, 0x80, 0x3f};
  ASSERT_TRUE((*w)->Add("b", DType::kF32, {1}, b).ok());
  ASSERT_TRUE((*w)->Add("a", DType::kU8, {3}, a).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  // Keys sorted, compact; data: F32 (4-byte elements) first, then U8; padded with spaces to 8.
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"a":{"data_offsets":[4,7],"dtype":"U8","shape":[3]},)"
      R"("b":{"data_offsets":[0,4],"dtype":"F32","shape":[1]}})";
  const std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  std::string want(8, '\0');
  for (int i = 0; i < 8; ++i) want[i] = static_cast<char>((padded.size() >> (8 * i)) & 0xff);
  want += padded + std::string("\x00\x00\x80\x3f\x01\x02\x03", 7);
  EXPECT_EQ(ReadFile(dir.File(kSingleFileName)), want);
}

TEST(Writer, OutputDependsOnlyOnTheSetOfTensors) {
  auto rng = FreshRng();
  std::vector<Tensor> tensors = RandomTensors(rng);
  TempDir one, two;
  ASSERT_NO_FATAL_FAILURE(WriteAll(one.path(), tensors, 3));
  std::shuffle(tensors.begin(), tensors.end(), rng);
  ASSERT_NO_FATAL_FAILURE(WriteAll(two.path(), tensors, 3));
  for (const std::string& f : {ShardFileName(0, 3), ShardFileName(1, 3), ShardFileName(2, 3),
                              std::string(kIndexFileName)}) {
    EXPECT_EQ(ReadFile(one.File(f)), ReadFile(two.File(f))) << f;
  }
}

TEST(Writer, ShardsAreContiguousNameRunsOfSimilarSize) {
  TempDir dir;
  auto w = CheckpointWriter::Create(dir.path(), 4);
  ASSERT_TRUE(w.ok());
  const std::vector<uint8_t> kb(1024, 7);
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE((*w)->Add(absl::StrCat("t", std::string(1, static_cast<char>('a' + i))), DType::kU8, {1024}, kb).ok());
  }
  ASSERT_TRUE((*w)->Finish().ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(*(*ckpt)->ShardOf(absl::StrCat("t", std::string(1, static_cast<char>('a' + i)))), ShardFileName(i / 4, 4));
  }
}

TEST(Writer, RefusesBadTensorsNamingThem) {
  TempDir dir;
  auto w = CheckpointWriter::Create(dir.path(), 2);
  ASSERT_TRUE(w.ok());
  const std::vector<uint8_t> four(4, 0);
  auto expect = [](const absl::Status& s, absl::StatusCode code, const std::string& word) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(s.message(), HasSubstr(word));
  };
  expect((*w)->Add("x.weight", DType::kBF16, {3}, four), absl::StatusCode::kInvalidArgument, "x.weight");
  expect((*w)->Add("neg", DType::kU8, {-4}, four), absl::StatusCode::kInvalidArgument, "neg");
  expect((*w)->Add("", DType::kU8, {4}, four), absl::StatusCode::kInvalidArgument, "invalid tensor name");
  expect((*w)->Add("__metadata__", DType::kU8, {4}, four), absl::StatusCode::kInvalidArgument, "__metadata__");
  ASSERT_TRUE((*w)->Add("ok", DType::kU8, {4}, four).ok());
  expect((*w)->Add("ok", DType::kU8, {4}, four), absl::StatusCode::kInvalidArgument, "ok: added twice");
  expect((*w)->Finish(), absl::StatusCode::kFailedPrecondition, "2 shard(s) requested but 1 tensor(s)");
  expect((*w)->Add("late", DType::kU8, {4}, four), absl::StatusCode::kFailedPrecondition, "late");
}

TEST(Writer, RefusesToOverwriteUnlessAsked) {
  TempDir dir;
  const std::vector<uint8_t> four(4, 1);
  ASSERT_NO_FATAL_FAILURE(WriteAll(dir.path(), {{"a", DType::kU8, {4}, four}, {"b", DType::kU8, {4}, four}}, 2));
  auto again = CheckpointWriter::Create(dir.path(), 1);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("already exists"));
  // With overwrite, a 1-shard rewrite removes the old shards and index.
  auto w = CheckpointWriter::Create(dir.path(), CheckpointWriterOptions{.num_shards = 1, .overwrite = true});
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Add("c", DType::kU8, {4}, four).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Names(), std::vector<std::string>{"c"});
  EXPECT_FALSE(std::filesystem::exists(dir.File(ShardFileName(0, 2))));
}

// Resident pages of `path` in the page cache (mincore on a fresh mapping, which touches nothing).
size_t ResidentPages(const std::string& path, size_t* total_pages) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  const size_t size = static_cast<size_t>(::lseek(fd, 0, SEEK_END));
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  std::vector<unsigned char> vec((size + page - 1) / page);
  ::mincore(map, size, vec.data());
  ::munmap(map, size);
  ::close(fd);
  *total_pages = vec.size();
  return static_cast<size_t>(std::count_if(vec.begin(), vec.end(), [](unsigned char c) { return c & 1; }));
}

// The kernel's readahead window for the block device holding `path` (bytes); 8 MiB if unknown.
size_t ReadaheadBytes(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 8u << 20;
  const std::string dev = absl::StrCat("/sys/dev/block/", major(st.st_dev), ":", minor(st.st_dev));
  for (const std::string& f : {absl::StrCat(dev, "/queue/read_ahead_kb"), absl::StrCat(dev, "/../queue/read_ahead_kb")}) {
    std::ifstream in(f);
    size_t kb = 0;
    if (in >> kb) return kb << 10;
  }
  return 8u << 20;
}

TEST(Checkpoint, ReadsOnlyTheShardAndPagesItTouches) {
  TempDir dir;
  const size_t big_bytes = 64u << 20;
  {
    auto w = CheckpointWriter::Create(dir.path(), 3);
    ASSERT_TRUE(w.ok());
    std::vector<uint8_t> big(big_bytes);
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i >> 12);  // page number
    const std::vector<uint8_t> small(4096, 0x11);
    ASSERT_TRUE((*w)->Add("a.small", DType::kU8, {4096}, small).ok());
    ASSERT_TRUE((*w)->Add("b.big", DType::kU8, {static_cast<int64_t>(big_bytes)}, big).ok());
    ASSERT_TRUE((*w)->Add("c.small", DType::kU8, {4096}, small).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }
  const std::string shard1 = dir.File(ShardFileName(1, 3));
  const size_t readahead = ReadaheadBytes(shard1);
  if (2 * readahead + (1u << 20) > big_bytes / 2) GTEST_SKIP() << "readahead window too large: " << readahead;
  // Drop the files from the page cache; skip where the filesystem keeps them (tmpfs).
  for (int s = 0; s < 3; ++s) {
    const std::string path = dir.File(ShardFileName(s, 3));
    const int fd = ::open(path.c_str(), O_RDONLY);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    size_t total;
    if (ResidentPages(path, &total) > total / 10) GTEST_SKIP() << "page cache cannot be dropped on this filesystem";
  }
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  ASSERT_EQ(*(*ckpt)->ShardOf("b.big"), ShardFileName(1, 3));
  auto v = (*ckpt)->Get("b.big");
  ASSERT_TRUE(v.ok());
  const size_t page = 8192;  // read one page from the middle of the 64 MiB tensor
  EXPECT_EQ(v->data[page << 12], static_cast<uint8_t>(page));
  size_t total = 0;
  EXPECT_EQ(ResidentPages(dir.File(ShardFileName(0, 3)), &total), 0u) << "shard 0 was read";
  EXPECT_EQ(ResidentPages(dir.File(ShardFileName(2, 3)), &total), 0u) << "shard 2 was read";
  const size_t resident = ResidentPages(shard1, &total);
  std::cout << "    shard 1: " << resident << " of " << total << " pages resident after touching one (readahead "
            << (readahead >> 10) << " KiB)\n";
  EXPECT_LE(resident * 4096, 2 * readahead + (1u << 20)) << "more than the touched page and readahead was read";
}

}  // namespace
}  // namespace dsv4::ckpt
