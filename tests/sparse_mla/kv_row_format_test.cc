// The 584-byte FP8 KV row: page layout arithmetic, known bytes, exact round trips and quantisation error.
#include "kernels/sparse_mla/kv_row_format.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/float_formats.h"

namespace dsv4::kernels::sparse_mla {
namespace {

TEST(KvRowFormat, PageStrideAndOffsets) {
  EXPECT_EQ(KvPageStrideBytes(64), 37440);    // dsv4-decode.md §3.1
  EXPECT_EQ(KvPageStrideBytes(256), 149760);
  EXPECT_EQ(KvPageStrideBytes(1), 1152);      // 584 rounded up to 2 x 576
  EXPECT_EQ(KvPageStrideBytes(2), 1728);      // C128 pages of 2 rows: 1168 -> 3 x 576
  // Row 70 with P = 64: page 1, row 6.
  EXPECT_EQ(KvRowDataOffset(70, 64), 37440 + 6 * 576);
  EXPECT_EQ(KvRowScaleOffset(70, 64), 37440 + 64 * 576 + 6 * 8);
  // Every byte of a page belongs to at most one row's data or scales, all inside the page stride.
  for (int P : {1, 2, 16, 64, 256}) {
    std::vector<int> owner(KvPageStrideBytes(P), -1);
    for (int r = 0; r < P; ++r) {
      for (int i = 0; i < kRowDataBytes; ++i) {
        ASSERT_EQ(owner[KvRowDataOffset(r, P) + i], -1);
        owner[KvRowDataOffset(r, P) + i] = r;
      }
      for (int i = 0; i < kRowScaleBytes; ++i) {
        ASSERT_EQ(owner[KvRowScaleOffset(r, P) + i], -1);
        owner[KvRowScaleOffset(r, P) + i] = r;
      }
    }
    EXPECT_EQ(KvPageStrideBytes(P) % kRowDataBytes, 0);
  }
}

TEST(KvRowFormat, KnownBytes) {
  std::array<float, kKvDim> k;
  k.fill(1.0f);
  k[kNopeDim] = -2.5f;
  std::array<uint8_t, kRowDataBytes> data;
  std::array<uint8_t, kRowScaleBytes> scales;
  EncodeKvRow(k, data.data(), scales.data());
  // amax 1 -> scale 2^ceil(log2(1/448)) = 2^-8 (byte 119); 1 / 2^-8 = 256 = e4m3 0x78.
  for (int t = 0; t < kNumTiles; ++t) EXPECT_EQ(scales[t], 119);
  EXPECT_EQ(scales[kNumTiles], 0);
  for (int d = 0; d < kNopeDim; ++d) ASSERT_EQ(data[d], 0x78);
  uint16_t h;
  std::memcpy(&h, data.data() + kNopeDim, 2);
  EXPECT_EQ(h, F32ToBf16(-2.5f));
  std::memcpy(&h, data.data() + kNopeDim + 2, 2);
  EXPECT_EQ(h, F32ToBf16(1.0f));
  // An all-zero tile uses the amax floor 1e-4: scale 2^ceil(log2(1e-4/448)) = 2^-22.
  k.fill(0.0f);
  EncodeKvRow(k, data.data(), scales.data());
  EXPECT_EQ(scales[0], 127 - 22);
  EXPECT_EQ(data[0], 0);
}

TEST(KvRowFormat, RepresentableRowsRoundTripBitExact) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> code(0, 0x7e), sign(0, 1), exp(110, 150);
  for (int trial = 0; trial < 50; ++trial) {
    std::array<float, kKvDim> k;
    std::array<uint8_t, kNumTiles> want_scales;
    for (int t = 0; t < kNumTiles; ++t) {
      want_scales[t] = static_cast<uint8_t>(exp(rng));
      for (int i = 0; i < kTileDim; ++i) {
        const uint8_t c = i == 5 ? 0x7e : static_cast<uint8_t>(code(rng) | (sign(rng) << 7));  // 0x7e = 448
        k[t * kTileDim + i] = E4m3ToF32(c) * Ue8m0ToF32(want_scales[t]);
      }
    }
    for (int i = 0; i < kRopeDim; ++i) k[kNopeDim + i] = Bf16ToF32(static_cast<uint16_t>(rng()));
    for (float& x : k) if (std::isnan(x)) x = 1.0f;
    std::array<uint8_t, kRowDataBytes> data;
    std::array<uint8_t, kRowScaleBytes> scales;
    EncodeKvRow(k, data.data(), scales.data());
    for (int t = 0; t < kNumTiles; ++t) ASSERT_EQ(scales[t], want_scales[t]) << "tile " << t;
    std::array<float, kKvDim> back;
    DecodeKvRow(data.data(), scales.data(), back);
    for (int d = 0; d < kKvDim; ++d) ASSERT_EQ(F32Bits(back[d]), F32Bits(k[d])) << "dim " << d;
  }
}

TEST(KvRowFormat, QuantisationErrorWithinE4m3HalfStep) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint8_t> pool_bytes(KvPageStrideBytes(16) * 3);
  const KvPoolView pool{pool_bytes.data(), 3, 16};
  for (int64_t row = 0; row < pool.num_rows(); ++row) {
    std::array<float, kKvDim> k, back;
    const float mag = std::ldexp(1.0f, static_cast<int>(row % 41) - 20);  // 2^-20 .. 2^20
    for (float& x : k) x = normal(rng) * mag;
    WriteKvRow(pool, row, k);
    ReadKvRow(pool, row, back);
    for (int t = 0; t < kNumTiles; ++t) {
      const float scale = Ue8m0ToF32(pool_bytes[KvRowScaleOffset(row, 16) + t]);
      for (int i = 0; i < kTileDim; ++i) {
        const int d = t * kTileDim + i;
        // Normal e4m3: half a step is 2^-4 relative; subnormal: half of 2^-9 absolute (times the scale).
        const float tol = std::max(std::fabs(k[d]) * 0.0625f, scale * 0.0009765625f);
        ASSERT_LE(std::fabs(back[d] - k[d]), tol) << "row " << row << " dim " << d;
      }
    }
    for (int d = kNopeDim; d < kKvDim; ++d) ASSERT_LE(std::fabs(back[d] - k[d]), std::fabs(k[d]) * 0.00390625f);
  }
}

}  // namespace
}  // namespace dsv4::kernels::sparse_mla
