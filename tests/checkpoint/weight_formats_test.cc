// Weight formats: dequantization against hand-computed values (the e2m1 table, nibble order,
// scale axis, negative zero, e8m0 bias, NVFP4 scale_2), NaN refusal, and format detection from a
// checkpoint with every shape validated.
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/checkpoint/quantize.h"
#include "model/checkpoint/weight_formats.h"
#include "tests/checkpoint/test_util.h"

namespace dsv4::ckpt {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

// A hand-filled linear: raw weight and scale bytes in checkpoint layout.
QuantizedLinear Raw(WeightFormat f, int64_t n, int64_t k, std::vector<uint8_t> weight, std::vector<uint8_t> scale,
                    float scale_2 = 1.0f) {
  QuantizedLinear q;
  q.format = f;
  q.n = n;
  q.k = k;
  q.weight = std::move(weight);
  q.scale = std::move(scale);
  q.scale_2 = scale_2;
  switch (f) {
    case WeightFormat::kFp8Block128:
      q.weight_dtype = DType::kF8E4M3;
      q.weight_shape = {n, k};
      q.scale_dtype = DType::kF8E8M0;
      q.scale_shape = {(n + 127) / 128, (k + 127) / 128};
      break;
    case WeightFormat::kNvfp4:
      q.weight_dtype = DType::kU8;
      q.weight_shape = {n, k / 2};
      q.scale_dtype = DType::kF8E4M3;
      q.scale_shape = {n, k / 16};
      break;
    case WeightFormat::kMxfp4:
      q.weight_dtype = DType::kI8;
      q.weight_shape = {n, k / 2};
      q.scale_dtype = DType::kF8E8M0;
      q.scale_shape = {n, k / 32};
      break;
    default:
      q.weight_dtype = f == WeightFormat::kBF16 ? DType::kBF16 : DType::kF32;
      q.weight_shape = {n, k};
  }
  return q;
}

std::vector<float> Deq(const QuantizedLinear& q) {
  auto out = Dequantize(q.View("x"));
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<float>();
}

const float kE2m1[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};

TEST(Dequantize, E2m1TableNibbleOrderAndNegativeZero) {
  std::vector<uint8_t> packed(16, 0);
  for (int j = 0; j < 8; ++j) packed[j] = static_cast<uint8_t>((2 * j) | ((2 * j + 1) << 4));  // codes 0..15
  for (const QuantizedLinear& q : {Raw(WeightFormat::kMxfp4, 1, 32, packed, {127}),
                                   Raw(WeightFormat::kNvfp4, 1, 32, packed, {0x38, 0x38}, 1.0f)}) {
    SCOPED_TRACE(WeightFormatName(q.format));
    const std::vector<float> w = Deq(q);
    ASSERT_EQ(w.size(), 32u);
    for (int k = 0; k < 16; ++k) EXPECT_EQ(w[k], kE2m1[k]) << "k=" << k;
    EXPECT_TRUE(std::signbit(w[8])) << "code 8 is -0";
    EXPECT_FALSE(std::signbit(w[0]));
    for (int k = 16; k < 32; ++k) EXPECT_EQ(w[k], 0.0f);
  }
  // One byte 0x71: element 0 is the low nibble (code 1 = 0.5), element 1 the high (code 7 = 6).
  std::vector<uint8_t> one(16, 0);
  one[0] = 0x71;
  const std::vector<float> w = Deq(Raw(WeightFormat::kMxfp4, 1, 32, one, {127}));
  EXPECT_EQ(w[0], 0.5f);
  EXPECT_EQ(w[1], 6.0f);
}

TEST(Dequantize, BlockScalesRunAlongK) {
  // MXFP4 N=2, K=64, every code 2 (1.0): W[n,k] = 2^(s[n, k/32]-127).
  const std::vector<float> mx = Deq(Raw(WeightFormat::kMxfp4, 2, 64, std::vector<uint8_t>(64, 0x22),
                                        {127, 128, 129, 126}));
  for (int k = 0; k < 64; ++k) {
    EXPECT_EQ(mx[k], k < 32 ? 1.0f : 2.0f) << k;
    EXPECT_EQ(mx[64 + k], k < 32 ? 4.0f : 0.5f) << k;
  }
  // NVFP4 N=2, K=32, code 2 (1.0) and one code 7 (6): W = e2m1 * e4m3(ws[n, k/16]) * scale_2.
  std::vector<uint8_t> nvw(32, 0x22);
  nvw[8] = 0x27;  // row 0, k=16 -> code 7 (low nibble), k=17 -> code 2
  const std::vector<float> nv =
      Deq(Raw(WeightFormat::kNvfp4, 2, 32, nvw, {0x38, 0x40, 0x48, 0x30}, 0.75f));  // ws 1, 2, 4, 0.5
  for (int k = 0; k < 32; ++k) {
    const float want0 = (k == 16 ? 6.0f : 1.0f) * (k < 16 ? 1.0f : 2.0f) * 0.75f;
    EXPECT_EQ(nv[k], want0) << k;
    EXPECT_EQ(nv[32 + k], (k < 16 ? 4.0f : 0.5f) * 0.75f) << k;
  }
  EXPECT_EQ(nv[16], 9.0f);
  // FP8 N=130, K=200 (partial blocks), every weight 1.0: W[n,k] = 2^(s[n/128, k/128]-127).
  const std::vector<uint8_t> scales = {127, 128, 130, 120};
  const std::vector<float> f8 = Deq(Raw(WeightFormat::kFp8Block128, 130, 200,
                                        std::vector<uint8_t>(130 * 200, 0x38), scales));
  for (int n = 0; n < 130; ++n) {
    for (int k = 0; k < 200; ++k) {
      ASSERT_EQ(f8[n * 200 + k], std::ldexp(1.0f, scales[(n / 128) * 2 + k / 128] - 127)) << n << "," << k;
    }
  }
}

TEST(Dequantize, E8m0BiasAndE4m3Codes) {
  const std::vector<float> mx = Deq(Raw(WeightFormat::kMxfp4, 1, 128, std::vector<uint8_t>(64, 0x22),
                                        {0, 127, 130, 254}));
  EXPECT_EQ(mx[0], std::ldexp(1.0f, -127));
  EXPECT_EQ(mx[32], 1.0f);
  EXPECT_EQ(mx[64], 8.0f);
  EXPECT_EQ(mx[96], std::ldexp(1.0f, 127));
  const std::vector<float> f8 = Deq(Raw(WeightFormat::kFp8Block128, 1, 8,
                                        {0x38, 0x40, 0xC0, 0x01, 0x7e, 0x80, 0x08, 0x30}, {126}));
  const std::vector<float> want = {1, 2, -2, std::ldexp(1.0f, -9), 448, -0.0f, std::ldexp(1.0f, -6), 0.5f};
  for (int k = 0; k < 8; ++k) EXPECT_EQ(f8[k], want[k] * 0.5f) << k;
  EXPECT_TRUE(std::signbit(f8[5]));
  const std::vector<uint8_t> bf = {0x80, 0x3f, 0x40, 0xc0};  // bf16 1.0, -3.0 (little-endian)
  const std::vector<float> b = Deq(Raw(WeightFormat::kBF16, 1, 2, bf, {}));
  EXPECT_EQ(b, (std::vector<float>{1.0f, -3.0f}));
}

TEST(Dequantize, RefusesNanCodesNamingTensorAndElement) {
  struct Case {
    QuantizedLinear q;
    std::string where;
  };
  std::vector<uint8_t> f8(4, 0x38);
  f8[3] = 0x7f;  // e4m3 NaN
  std::vector<Case> cases;
  cases.push_back({Raw(WeightFormat::kFp8Block128, 2, 2, std::vector<uint8_t>(4, 0x38), {0xff}), "[0,0]"});
  cases.push_back({Raw(WeightFormat::kFp8Block128, 2, 2, f8, {127}), "[1,1]"});
  cases.push_back({Raw(WeightFormat::kNvfp4, 1, 32, std::vector<uint8_t>(16, 0x11), {0x38, 0x7f}), "[0,16]"});
  cases.push_back({Raw(WeightFormat::kMxfp4, 1, 32, std::vector<uint8_t>(16, 0), {0xff}), "[0,0]"});
  cases.push_back({Raw(WeightFormat::kBF16, 1, 2, {0, 0, 0x80, 0x7f}, {}), "[0,1]"});  // bf16 +inf
  for (const Case& c : cases) {
    SCOPED_TRACE(WeightFormatName(c.q.format));
    auto out = Dequantize(c.q.View("layers.4.ffn.w2"));
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(out.status().message(), HasSubstr("layers.4.ffn.w2"));
    EXPECT_THAT(out.status().message(), HasSubstr(c.where));
  }
}

TEST(Dequantize, BlocksAndRowsMatchTheWholeMatrix) {
  auto rng = testing::FreshRng();
  std::normal_distribution<float> normal;
  const int64_t n = 150, k = 288;
  std::vector<float> w(n * k);
  for (float& x : w) x = normal(rng);
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kF32, WeightFormat::kFp8Block128, WeightFormat::kNvfp4,
                         WeightFormat::kMxfp4}) {
    SCOPED_TRACE(WeightFormatName(f));
    auto q = QuantizeLinear(f, w, n, k);
    ASSERT_TRUE(q.ok()) << q.status();
    const LinearWeight lw = q->View("x");
    auto full = Dequantize(lw);
    ASSERT_TRUE(full.ok());
    const int64_t r0 = 129, rows = 7, c0 = 17, cols = 131;  // odd column start: mid-byte for FP4
    std::vector<float> block(rows * cols);
    ASSERT_TRUE(DequantizeBlock(lw, r0, rows, c0, cols, block).ok());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(block[r * cols + c], (*full)[(r0 + r) * k + c0 + c]);
    }
    std::vector<float> row_out(2 * k);
    ASSERT_TRUE(DequantizeRows(lw, 5, 2, row_out.data()).ok());
    EXPECT_TRUE(std::equal(row_out.begin(), row_out.end(), full->begin() + 5 * k));
    EXPECT_EQ(DequantizeRows(lw, n - 1, 2, row_out.data()).code(), absl::StatusCode::kOutOfRange);
    EXPECT_EQ(DequantizeBlock(lw, 0, 2, 0, k, std::span<float>(row_out.data(), k)).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// Writes linears through AddLinear, loads them back by base name and checks detection.
TEST(LoadLinearWeight, DetectsEveryFormatFromACheckpoint) {
  auto rng = testing::FreshRng();
  std::normal_distribution<float> normal;
  const int64_t n = 40, k = 64;
  std::vector<float> w(n * k);
  for (float& x : w) x = normal(rng);
  const std::vector<WeightFormat> formats = {WeightFormat::kBF16, WeightFormat::kF32, WeightFormat::kFp8Block128,
                                             WeightFormat::kNvfp4, WeightFormat::kMxfp4};
  TempDir dir;
  std::vector<QuantizedLinear> qs;
  {
    auto writer = CheckpointWriter::Create(dir.path(), 2);
    ASSERT_TRUE(writer.ok());
    for (size_t i = 0; i < formats.size(); ++i) {
      auto q = QuantizeLinear(formats[i], w, n, k);
      ASSERT_TRUE(q.ok());
      q->input_scale = 0.5f;
      ASSERT_TRUE(AddLinear(**writer, absl::StrCat("layers.", i, ".w"), *q).ok());
      qs.push_back(std::move(*q));
    }
    ASSERT_TRUE((*writer)->Finish().ok());
  }
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  for (size_t i = 0; i < formats.size(); ++i) {
    SCOPED_TRACE(WeightFormatName(formats[i]));
    auto lw = LoadLinearWeight(**ckpt, absl::StrCat("layers.", i, ".w"));
    ASSERT_TRUE(lw.ok()) << lw.status();
    EXPECT_EQ(lw->format, formats[i]);
    EXPECT_EQ(lw->n, n);
    EXPECT_EQ(lw->k, k);
    if (formats[i] == WeightFormat::kNvfp4) {
      EXPECT_EQ(lw->scale_2, qs[i].scale_2);
      EXPECT_TRUE(lw->has_input_scale);
      EXPECT_EQ(lw->input_scale, 0.5f);
    }
    auto from_ckpt = Dequantize(*lw);
    ASSERT_TRUE(from_ckpt.ok());
    EXPECT_EQ(*from_ckpt, Deq(qs[i]));
  }
}

// A checkpoint holding the given raw tensors.
std::unique_ptr<Checkpoint> CkptWith(const TempDir& dir,
                                     const std::vector<std::tuple<std::string, DType, std::vector<int64_t>>>& ts) {
  auto writer = CheckpointWriter::Create(dir.path(), 1);
  EXPECT_TRUE(writer.ok());
  for (const auto& [name, dt, shape] : ts) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    std::vector<uint8_t> bytes(numel * DTypeSize(dt), 0x38);
    if (dt == DType::kF32) {
      const float zero = 0.0f;  // scalars: 0, which NVFP4 must refuse as weight_scale_2
      for (int64_t i = 0; i < numel; ++i) std::memcpy(&bytes[4 * i], &zero, 4);
    }
    EXPECT_TRUE((*writer)->Add(name, dt, shape, bytes).ok());
  }
  EXPECT_TRUE((*writer)->Finish().ok());
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_TRUE(ckpt.ok());
  return std::move(*ckpt);
}

TEST(LoadLinearWeight, RefusesInconsistentTensorsNamingThem) {
  struct Case {
    std::string label;
    std::vector<std::tuple<std::string, DType, std::vector<int64_t>>> tensors;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"fp8 without scale", {{"a.weight", DType::kF8E4M3, {4, 8}}}, "a.scale"},
      {"fp8 scale shape", {{"a.weight", DType::kF8E4M3, {130, 8}}, {"a.scale", DType::kF8E8M0, {1, 1}}},
       "a.scale: expected F8_E8M0 [2,1] for FP8_BLOCK128, found F8_E8M0 [1,1]"},
      {"fp8 scale dtype", {{"a.weight", DType::kF8E4M3, {4, 8}}, {"a.scale", DType::kF32, {1, 1}}},
       "a.scale: expected F8_E8M0 [1,1]"},
      {"mxfp4 scale along N", {{"a.weight", DType::kI8, {64, 16}}, {"a.scale", DType::kF8E8M0, {2, 32}}},
       "a.scale: expected F8_E8M0 [64,1] for MXFP4, found F8_E8M0 [2,32]"},
      {"nvfp4 scale_2 zero",
       {{"a.weight", DType::kU8, {4, 8}}, {"a.weight_scale", DType::kF8E4M3, {4, 1}},
        {"a.weight_scale_2", DType::kF32, {}}},
       "a.weight_scale_2: must be finite and > 0"},
      {"nvfp4 without scale_2", {{"a.weight", DType::kU8, {4, 8}}, {"a.weight_scale", DType::kF8E4M3, {4, 1}}},
       "a.weight_scale_2"},
      {"nvfp4 scale_2 not scalar",
       {{"a.weight", DType::kU8, {4, 8}}, {"a.weight_scale", DType::kF8E4M3, {4, 1}},
        {"a.weight_scale_2", DType::kF32, {2}}},
       "a.weight_scale_2: expected F32 []"},
      {"1-D weight", {{"a.weight", DType::kBF16, {8}}}, "a.weight: a linear weight is 2-D"},
      {"bf16 with scale", {{"a.weight", DType::kBF16, {2, 2}}, {"a.scale", DType::kF8E8M0, {1, 1}}},
       "a.weight is BF16"},
      {"two scale kinds",
       {{"a.weight", DType::kI8, {4, 16}}, {"a.scale", DType::kF8E8M0, {4, 1}},
        {"a.weight_scale", DType::kF8E4M3, {4, 2}}},
       "NVFP4 scale tensors exist"},
      {"unsupported dtype", {{"a.weight", DType::kI32, {2, 2}}}, "not a linear weight dtype"},
      {"missing weight", {{"b.weight", DType::kBF16, {2, 2}}}, "a.weight"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    TempDir dir;
    auto ckpt = CkptWith(dir, c.tensors);
    ASSERT_NE(ckpt, nullptr);
    auto lw = LoadLinearWeight(*ckpt, "a");
    ASSERT_FALSE(lw.ok());
    EXPECT_THAT(lw.status().message(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace dsv4::ckpt
