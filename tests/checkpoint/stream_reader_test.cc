// StreamReader (model/checkpoint/stream_reader.h) on a file of known bytes: bytes exact through a ring that wraps
// while the consumer holds two items at a time, with 4 threads and 4 KiB reads; a short file fails naming the item
// and the file; a missing file and an item larger than the ring are refused at Start; a consumer holding more than
// the ring gets an error instead of a hang; a request the plan did not make is refused. Also run under TSan
// (scripts/sanitize.sh).
#include "model/checkpoint/stream_reader.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dsv4::ckpt {
namespace {

using ::testing::HasSubstr;

struct TempDir {
  std::string path;
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "dsv4-reader-XXXXXX").string();
    path = mkdtemp(templ.data()) != nullptr ? templ : std::string();
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

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
  StreamItem Item(int i, std::vector<ByteRange> ranges) {
    return {.name = absl::StrCat("t", i), .path = path_, .ranges = std::move(ranges)};
  }
  std::string Expected(const StreamItem& it) {
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
  std::vector<StreamItem> items;
  for (int i = 0; i < 300; ++i) {
    std::vector<ByteRange> ranges;
    for (int r = 0, n = 1 + rng() % 3; r < n; ++r) {
      const uint64_t len = rng() % 3000, off = rng() % (bytes_.size() - len);
      ranges.push_back({off, len});
    }
    items.push_back(Item(i, ranges));
  }
  std::vector<uint8_t> arena(30000);  // two held items of <= 9000 bytes, plus wrap-around
  auto copy = items;
  auto reader = StreamReader::Start(std::move(copy), arena.data(), arena.size(), {.threads = 4, .chunk_bytes = 4096});
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
  auto reader = StreamReader::Start({Item(0, {{0, 100}}), Item(1, {{bytes_.size() - 10, 50}})}, arena.data(),
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
  auto missing = StreamReader::Start({{.name = "t", .path = dir_.path + "/nope", .ranges = {{0, 10}}}},
                                           arena.data(), arena.size());
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("nope"));
  auto big = StreamReader::Start({Item(0, {{0, 1001}})}, arena.data(), arena.size());
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StreamReaderTest, HoldingMoreThanTheRingIsRefusedNotAHang) {
  std::vector<uint8_t> arena(1000);
  auto reader = StreamReader::Start({Item(0, {{0, 600}}), Item(1, {{0, 600}})}, arena.data(), arena.size());
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE((*reader)->Take("t0").ok());
  auto b = (*reader)->Take("t1");  // t0 not released: t1 has no room
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(b.status().message(), HasSubstr("staging arena"));
}

TEST_F(StreamReaderTest, UnplannedRequestRefused) {
  std::vector<uint8_t> arena(1000);
  auto reader = StreamReader::Start({Item(0, {{0, 10}})}, arena.data(), arena.size());
  ASSERT_TRUE(reader.ok());
  auto x = (*reader)->Take("other");
  ASSERT_FALSE(x.ok());
  EXPECT_THAT(x.status().message(), HasSubstr("planned t0"));
  ASSERT_TRUE((*reader)->Take("t0").ok());
  EXPECT_FALSE((*reader)->Take("t0").ok()) << "past the plan";
}

}  // namespace
}  // namespace dsv4::ckpt
