// Quantizers: the scale rules on hand-picked blocks, and quantize -> dequantize round trips on
// fresh random matrices within each format's error (per element and relative by norm).
#include <cmath>
#include <cstdio>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/float_formats.h"
#include "model/checkpoint/quantize.h"
#include "tests/checkpoint/test_util.h"

namespace dsv4::ckpt {
namespace {

using ::testing::HasSubstr;

// Rows of very different magnitude (2^-4 .. 2^4) with rare 20x outliers: exercises every block scale.
std::vector<float> RandomMatrix(std::mt19937_64& rng, int64_t n, int64_t k) {
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uni(-4.0f, 4.0f);
  std::vector<float> w(n * k);
  for (int64_t r = 0; r < n; ++r) {
    const float row_scale = std::exp2(uni(rng));
    for (int64_t c = 0; c < k; ++c) {
      w[r * k + c] = normal(rng) * row_scale * ((rng() % 1000) == 0 ? 20.0f : 1.0f);
    }
  }
  return w;
}

// |deq - w| <= bound(r, c) everywhere; prints the worst element relative to its bound.
template <typename Bound>
void ExpectWithinBound(const std::vector<float>& w, const std::vector<float>& deq, int64_t k, Bound bound) {
  ASSERT_EQ(w.size(), deq.size());
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_TRUE(std::isfinite(deq[i])) << "element " << i;
    const double ratio = std::fabs(static_cast<double>(deq[i]) - w[i]) / bound(i / k, i % k);
    if (ratio > worst) worst = ratio, worst_i = i;
  }
  std::printf("    worst error / bound = %.3f at [%zu,%zu] (w=%g, deq=%g)\n", worst, worst_i / k, worst_i % k,
              w[worst_i], deq[worst_i]);
  EXPECT_LE(worst, 1.0);
}

TEST(Quantize, Fp8Block128RoundTrip) {
  auto rng = testing::FreshRng();
  const int64_t n = 200, k = 300;  // partial blocks on both axes
  const std::vector<float> w = RandomMatrix(rng, n, k);
  auto q = QuantizeLinear(WeightFormat::kFp8Block128, w, n, k);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->scale_shape, (std::vector<int64_t>{2, 3}));
  auto deq = Dequantize(q->View("x"));
  ASSERT_TRUE(deq.ok());
  const double rel = testing::RelErrorByNorm(*deq, w);
  std::printf("    FP8 block-128 relative error by norm: %.5f\n", rel);
  EXPECT_LT(rel, 0.04);
  // Half an e4m3 ulp: 2^-4 relative for normals, 2^-10 * scale in the subnormal range.
  ExpectWithinBound(w, *deq, k, [&](int64_t r, int64_t c) {
    const float s = Ue8m0ToF32(q->scale[(r / 128) * 3 + c / 128]);
    return std::max(std::fabs(w[r * k + c]) * 0.0625, s * std::ldexp(1.0, -10)) * (1 + 1e-6);
  });
  // Values already on the grid come back unchanged.
  auto q2 = QuantizeLinear(WeightFormat::kFp8Block128, *deq, n, k);
  ASSERT_TRUE(q2.ok());
  EXPECT_EQ(*Dequantize(q2->View("x")), *deq);
}

TEST(Quantize, Nvfp4RoundTrip) {
  auto rng = testing::FreshRng();
  const int64_t n = 96, k = 256;
  const std::vector<float> w = RandomMatrix(rng, n, k);
  auto q = QuantizeLinear(WeightFormat::kNvfp4, w, n, k);
  ASSERT_TRUE(q.ok()) << q.status();
  float amax = 0;
  for (float x : w) amax = std::max(amax, std::fabs(x));
  EXPECT_EQ(q->scale_2, amax / (6.0f * 448.0f));
  auto deq = Dequantize(q->View("x"));
  ASSERT_TRUE(deq.ok());
  const double rel = testing::RelErrorByNorm(*deq, w);
  std::printf("    NVFP4 relative error by norm: %.5f\n", rel);
  EXPECT_LT(rel, 0.15);
  // Half the widest e2m1 gap (4 -> 6) in units of the element's full scale.
  ExpectWithinBound(w, *deq, k, [&](int64_t r, int64_t c) {
    return E4m3ToF32(q->scale[r * (k / 16) + c / 16]) * q->scale_2 * (1 + 1e-6);
  });
}

TEST(Quantize, Mxfp4RoundTrip) {
  auto rng = testing::FreshRng();
  const int64_t n = 96, k = 256;
  const std::vector<float> w = RandomMatrix(rng, n, k);
  auto q = QuantizeLinear(WeightFormat::kMxfp4, w, n, k);
  ASSERT_TRUE(q.ok()) << q.status();
  auto deq = Dequantize(q->View("x"));
  ASSERT_TRUE(deq.ok());
  const double rel = testing::RelErrorByNorm(*deq, w);
  std::printf("    MXFP4 relative error by norm: %.5f\n", rel);
  EXPECT_LT(rel, 0.2);
  ExpectWithinBound(w, *deq, k, [&](int64_t r, int64_t c) {
    return Ue8m0ToF32(q->scale[r * (k / 32) + c / 32]) * (1 + 1e-6);
  });
  auto q2 = QuantizeLinear(WeightFormat::kMxfp4, *deq, n, k);
  ASSERT_TRUE(q2.ok());
  EXPECT_EQ(*Dequantize(q2->View("x")), *deq);
}

TEST(Quantize, PlainFormatsRoundTrip) {
  auto rng = testing::FreshRng();
  const std::vector<float> w = RandomMatrix(rng, 33, 65);
  auto f32 = QuantizeLinear(WeightFormat::kF32, w, 33, 65);
  ASSERT_TRUE(f32.ok());
  EXPECT_EQ(*Dequantize(f32->View("x")), w);
  auto bf16 = QuantizeLinear(WeightFormat::kBF16, w, 33, 65);
  ASSERT_TRUE(bf16.ok());
  auto deq = Dequantize(bf16->View("x"));
  ASSERT_TRUE(deq.ok());
  ExpectWithinBound(w, *deq, 65, [&](int64_t r, int64_t c) { return std::fabs(w[r * 65 + c]) * std::ldexp(1.0, -8); });  // 8-bit significand
}

TEST(Quantize, ScaleRulesOnHandPickedBlocks) {
  // FP8: amax 300 -> 300/448 < 1 -> 2^0 (127); amax 1000 -> 2.23 -> 2^2 (129); amax 448 -> exactly 1.
  std::vector<float> w(2 * 256, 0.0f);
  w[5] = -300.0f;
  w[128 + 7] = 1000.0f;
  w[256 + 3] = 448.0f;
  auto q = QuantizeLinear(WeightFormat::kFp8Block128, w, 2, 256);
  ASSERT_TRUE(q.ok());
  // Blocks: [rows 0-1] x [cols 0-127 | 128-255]; row 1 col 3 falls in block (0,0) too.
  EXPECT_EQ(q->scale, (std::vector<uint8_t>{127, 129}));
  EXPECT_EQ(q->weight[5], F32ToE4m3(-300.0f));
  EXPECT_EQ(q->weight[128 + 7], F32ToE4m3(250.0f));
  // MXFP4: amax 6 -> 2^0; amax 7 -> 2^1; all-zero block -> code 0.
  std::vector<float> m(96, 0.0f);
  m[0] = 6.0f;
  m[1] = -1.0f;
  m[32] = 7.0f;
  auto mx = QuantizeLinear(WeightFormat::kMxfp4, m, 1, 96);
  ASSERT_TRUE(mx.ok());
  EXPECT_EQ(mx->scale, (std::vector<uint8_t>{127, 128, 0}));
  EXPECT_EQ(mx->weight[0], 0xA7);  // low nibble code 7 (6), high nibble code 0xA (-1)
  EXPECT_EQ(mx->weight[16], 0x06);  // 7/2 = 3.5 rounds (tie) to the even code 6 (4)
  // NVFP4: scale_2 = amax / 2688; block scale = e4m3(block amax / 6 / scale_2).
  std::vector<float> v(32, 0.0f);
  v[0] = 2688.0f;  // amax -> scale_2 = 1
  v[16] = 3.0f;    // block 1: 3/6 = 0.5
  auto nv = QuantizeLinear(WeightFormat::kNvfp4, v, 1, 32);
  ASSERT_TRUE(nv.ok());
  EXPECT_EQ(nv->scale_2, 1.0f);
  EXPECT_EQ(nv->scale, (std::vector<uint8_t>{F32ToE4m3(448.0f), F32ToE4m3(0.5f)}));
  EXPECT_EQ(nv->weight[8] & 0xf, 7);  // 3 / 0.5 = 6
  // All-zero NVFP4: scale_2 1 and block scales 1, as ModelOpt does, and a zero matrix back.
  auto zero = QuantizeLinear(WeightFormat::kNvfp4, std::vector<float>(32, 0.0f), 1, 32);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->scale_2, 1.0f);
  EXPECT_EQ(zero->scale, (std::vector<uint8_t>{0x38, 0x38}));
  EXPECT_EQ(*Dequantize(zero->View("z")), std::vector<float>(32, 0.0f));
}

TEST(Quantize, RefusesBadInput) {
  std::vector<float> w(64, 1.0f);
  w[37] = NAN;
  auto nan = QuantizeLinear(WeightFormat::kFp8Block128, w, 2, 32);
  EXPECT_EQ(nan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(nan.status().message(), HasSubstr("[1,5]"));
  auto odd = QuantizeLinear(WeightFormat::kNvfp4, std::vector<float>(24, 1.0f), 1, 24);
  EXPECT_THAT(odd.status().message(), HasSubstr("multiple of 16"));
  auto mx = QuantizeLinear(WeightFormat::kMxfp4, std::vector<float>(48, 1.0f), 1, 48);
  EXPECT_THAT(mx.status().message(), HasSubstr("multiple of 32"));
  auto size = QuantizeLinear(WeightFormat::kBF16, std::vector<float>(5, 1.0f), 2, 3);
  EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsv4::ckpt
