// SafetensorsFile: a file in the published format, built byte by byte as another program would
// write it, loads; every malformed file is refused with a message naming the file and the tensor.
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/checkpoint/safetensors.h"
#include "tests/checkpoint/test_util.h"

namespace dsv4::ckpt {
namespace {

using ::testing::HasSubstr;
using testing::PadHeader;
using testing::RawSafetensors;
using testing::TempDir;
using testing::WriteFile;

TEST(SafetensorsReader, LoadsHandWrittenFileWithMetadataAndPadding) {
  TempDir dir;
  // Key order as Python's json.dumps leaves it (not sorted), spaces after separators, padded.
  const std::string header = PadHeader(
      R"({"__metadata__": {"format": "pt", "note": "hand"}, )"
      R"("w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [8, 16]}, )"
      R"("s": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, )"
      R"("e": {"dtype": "I64", "shape": [0, 3], "data_offsets": [16, 16]}, )"
      R"("one": {"dtype": "F8_E4M3", "shape": [], "data_offsets": [16, 17]}})");
  ASSERT_EQ(header.size() % 8, 0u);
  ASSERT_GT(header.size(), header.find_last_of('}') + 1) << "test header should carry padding";
  std::string data;
  const float s[2] = {1.5f, -2.0f};
  data.append(reinterpret_cast<const char*>(s), 8);
  const uint16_t w[4] = {0x3f80, 0x4000, 0xbf80, 0x0000};  // bf16 1, 2, -1, 0
  data.append(reinterpret_cast<const char*>(w), 8);
  data.push_back(static_cast<char>(0x38));  // e4m3 1.0
  const std::string path = dir.File("hand.safetensors");
  WriteFile(path, RawSafetensors(header, data));

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_EQ((*file)->metadata().at("note"), "hand");
  ASSERT_EQ((*file)->entries().size(), 4u);
  EXPECT_EQ((*file)->entries()[0].name, "e");  // sorted by name
  EXPECT_EQ((*file)->data_start(), 8 + header.size());

  auto sv = (*file)->Get("s");
  ASSERT_TRUE(sv.ok()) << sv.status();
  EXPECT_EQ(sv->dtype, DType::kF32);
  EXPECT_EQ(sv->shape, (std::vector<int64_t>{2}));
  float got[2];
  std::memcpy(got, sv->data, 8);
  EXPECT_EQ(got[0], 1.5f);
  EXPECT_EQ(got[1], -2.0f);
  auto wv = (*file)->Get("w");
  ASSERT_TRUE(wv.ok());
  EXPECT_EQ(wv->nbytes, 8u);
  EXPECT_EQ(std::memcmp(wv->data, w, 8), 0);
  auto ev = (*file)->Get("e");
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->nbytes, 0u);
  EXPECT_EQ(ev->numel(), 0);
  auto one = (*file)->Get("one");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->numel(), 1);
  EXPECT_EQ(one->data[0], 0x38);

  auto missing = (*file)->Get("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope"));
  EXPECT_THAT(missing.status().message(), HasSubstr(path));
}

TEST(SafetensorsReader, AllowsGapsBetweenTensors) {
  TempDir dir;
  const std::string header =
      PadHeader(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})");
  WriteFile(dir.File("g.safetensors"), RawSafetensors(header, "ab....cd"));
  auto file = SafetensorsFile::Open(dir.File("g.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*file)->Get("b")->data), 2), "cd");
}

struct BadCase {
  std::string label;
  std::string bytes;            // whole file
  absl::StatusCode code;
  std::vector<std::string> must_mention;  // besides the file path
};

std::string U8Entry(const std::string& name, const std::string& extra) {
  return absl::StrCat("\"", name, "\":{", extra, "}");
}

std::vector<BadCase> BadCases() {
  const std::string ok_a = U8Entry("a", R"("dtype":"U8","shape":[4],"data_offsets":[0,4])");
  std::string huge_len(8, '\0');
  const uint64_t big = 100'000'001;
  for (int i = 0; i < 8; ++i) huge_len[i] = static_cast<char>((big >> (8 * i)) & 0xff);
  std::string short_header = RawSafetensors(PadHeader(absl::StrCat("{", ok_a, "}")), "abcd");
  short_header.resize(8 + 10);  // length says more than is there
  return {
      {"file shorter than the length field", std::string("\x05\x00\x00", 3), absl::StatusCode::kDataLoss, {"truncated"}},
      {"header length over the limit", absl::StrCat(huge_len, "{}"), absl::StatusCode::kInvalidArgument, {"100000000"}},
      {"truncated header", short_header, absl::StatusCode::kDataLoss, {"truncated header"}},
      {"invalid JSON", RawSafetensors("{\"a\":{\"dtype\":", ""), absl::StatusCode::kInvalidArgument, {"JSON"}},
      {"header not an object", RawSafetensors("[1,2]   ", ""), absl::StatusCode::kInvalidArgument, {"not an object"}},
      {"unknown dtype",
       RawSafetensors(PadHeader(absl::StrCat("{", ok_a, ",", U8Entry("layers.0.w", R"("dtype":"F4","shape":[1],"data_offsets":[4,5])"), "}")), "abcde"),
       absl::StatusCode::kInvalidArgument, {"layers.0.w", "F4"}},
      {"shape does not match the byte count",
       RawSafetensors(PadHeader(absl::StrCat("{", U8Entry("layers.1.w", R"("dtype":"BF16","shape":[2,3],"data_offsets":[0,10])"), "}")), std::string(10, 'x')),
       absl::StatusCode::kInvalidArgument, {"layers.1.w", "BF16 [2,3]", "12"}},
      {"offsets past the end (truncated data)",
       RawSafetensors(PadHeader(absl::StrCat("{", ok_a, ",", U8Entry("tail", R"("dtype":"F32","shape":[4],"data_offsets":[4,20])"), "}")), "abcd1234"),
       absl::StatusCode::kDataLoss, {"tail", "truncated"}},
      {"overlapping tensors",
       RawSafetensors(PadHeader(absl::StrCat("{", ok_a, ",", U8Entry("b", R"("dtype":"U8","shape":[4],"data_offsets":[2,6])"), "}")), "abcdef"),
       absl::StatusCode::kInvalidArgument, {"\"b\"", "overlap", "\"a\""}},
      {"begin after end",
       RawSafetensors(PadHeader(absl::StrCat("{", U8Entry("rev", R"("dtype":"U8","shape":[0],"data_offsets":[4,2])"), "}")), "abcd"),
       absl::StatusCode::kInvalidArgument, {"rev", "data_offsets"}},
      {"negative dimension",
       RawSafetensors(PadHeader(absl::StrCat("{", U8Entry("neg", R"("dtype":"U8","shape":[-1],"data_offsets":[0,0])"), "}")), ""),
       absl::StatusCode::kInvalidArgument, {"neg", "shape"}},
      {"missing dtype",
       RawSafetensors(PadHeader(absl::StrCat("{", U8Entry("nodt", R"("shape":[1],"data_offsets":[0,1])"), "}")), "a"),
       absl::StatusCode::kInvalidArgument, {"nodt", "dtype"}},
      {"duplicate tensor name",
       RawSafetensors(PadHeader(absl::StrCat("{", ok_a, ",", ok_a, "}")), "abcd"), absl::StatusCode::kInvalidArgument,
       {"\"a\"", "twice"}},
      {"metadata value not a string",
       RawSafetensors(PadHeader(R"({"__metadata__":{"format":1}})"), ""), absl::StatusCode::kInvalidArgument,
       {"__metadata__", "format"}},
  };
}

TEST(SafetensorsReader, RefusesEveryMalformedFileNamingFileAndTensor) {
  TempDir dir;
  int i = 0;
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.label);
    const std::string path = dir.File(absl::StrCat("bad", i++, ".safetensors"));
    WriteFile(path, c.bytes);
    auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), c.code) << file.status();
    EXPECT_THAT(file.status().message(), HasSubstr(path));
    for (const std::string& word : c.must_mention) EXPECT_THAT(file.status().message(), HasSubstr(word));
  }
}

TEST(SafetensorsReader, MissingFileIsNotFound) {
  TempDir dir;
  auto file = SafetensorsFile::Open(dir.File("absent.safetensors"));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr("absent.safetensors"));
}

TEST(DType, NamesSizesAndParseRoundTrip) {
  const std::vector<std::pair<std::string, size_t>> want = {{"BF16", 2}, {"F32", 4}, {"F8_E4M3", 1},
                                                            {"F8_E8M0", 1}, {"U8", 1}, {"I8", 1},
                                                            {"I64", 8}, {"I32", 4}, {"F16", 2}};
  ASSERT_EQ(kAllDTypes.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(DTypeName(kAllDTypes[i]), want[i].first);
    EXPECT_EQ(DTypeSize(kAllDTypes[i]), want[i].second);
    auto parsed = ParseDType(want[i].first);
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kAllDTypes[i]);
  }
  auto bad = ParseDType("bf16");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("bf16"));
}

}  // namespace
}  // namespace dsv4::ckpt
