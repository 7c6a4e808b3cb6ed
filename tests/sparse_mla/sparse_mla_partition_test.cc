// The 8-warp MMA kernel's work partition (kernels/sparse_mla/sparse_mla_partition.h): every tile in exactly
// one part, part lookup, merge slots unique and consecutive per sequence, and the choices the H200 plan makes
// (132 SMs, 640 selected rows = 20 tiles of 32).
#include "kernels/sparse_mla/sparse_mla_partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>

namespace dsv4::kernels::sparse_mla {
namespace {

void CheckPartition(const MmaPartition& m) {
  SCOPED_TRACE(::testing::Message() << "B=" << m.batch << " T=" << m.tiles_per_seq << " N=" << m.parts);
  ASSERT_EQ(m.Begin(0), 0);
  ASSERT_EQ(m.Begin(m.parts), m.Units());
  for (int i = 0; i < m.parts; ++i) ASSERT_LT(m.Begin(i), m.Begin(i + 1)) << "empty part " << i;
  for (int64_t u = 0; u < m.Units(); ++u) {
    const int i = m.PartOf(u);
    ASSERT_GE(i, 0);
    ASSERT_LT(i, m.parts);
    ASSERT_LE(m.Begin(i), u);
    ASSERT_LT(u, m.Begin(i + 1)) << "unit " << u;
  }
  std::set<int> slots;
  for (int b = 0; b < m.batch; ++b) {
    const int first = m.FirstPart(b), last = m.LastPart(b);
    ASSERT_LE(first, last);
    ASSERT_LE(last - first + 1, m.tiles_per_seq);
    for (int i = first; i <= last; ++i) {
      // The kernel's walk: part i meets sequence b exactly when their unit ranges overlap.
      ASSERT_LT(m.Begin(i), int64_t{b + 1} * m.tiles_per_seq);
      ASSERT_GT(m.Begin(i + 1), int64_t{b} * m.tiles_per_seq);
      const int slot = MmaPartition::Slot(i, b);
      ASSERT_LT(slot, m.Slots());
      ASSERT_TRUE(slots.insert(slot).second) << "slot " << slot << " used twice";
    }
  }
}

TEST(SparseMlaPartition, CoversEveryTileOnceWithUniqueSlots) {
  for (const int B : {1, 2, 3, 5, 7, 16, 33, 48, 96, 128, 200}) {
    for (const int T : {1, 2, 7, 20, 32, 40}) {
      for (const int N : {1, 2, 3, 13, 64, 66, 128, 132, 260}) {
        const MmaPartition m = MmaPartition::Of(B, T, N);
        EXPECT_EQ(m.parts, std::min<int64_t>(N, int64_t{B} * T));
        CheckPartition(m);
      }
    }
  }
}

TEST(SparseMlaPartition, ChoosesPartsThatFillTheSms) {
  // H = 64 on 132 SMs, 20 tiles per sequence.
  auto parts = [](int batch, int cap) { return ChooseMmaPartition(batch, 20, cap).parts; };
  EXPECT_EQ(parts(32, 132), 128);   // 4 equal pieces per sequence
  EXPECT_EQ(parts(48, 132), 132);   // 7.3 tiles per block instead of 10 (2 pieces) or 14 (3 pieces, 2 waves)
  EXPECT_EQ(parts(64, 132), 128);
  EXPECT_EQ(parts(96, 132), 132);   // 15 tiles per block instead of 20
  EXPECT_EQ(parts(128, 132), 128);  // whole sequences: nothing to merge
  EXPECT_EQ(parts(128, 66), 64);    // H = 128 (two head groups): two whole sequences per part
  EXPECT_EQ(parts(300, 132), 132);
  for (int B = 1; B <= 256; ++B) {
    const MmaPartition m = ChooseMmaPartition(B, 20, 132);
    EXPECT_LE(m.parts, 132);
    EXPECT_GE(m.parts, 1);
    // The longest part is within one tile of an even spread over the SMs (or over B x 20 units).
    const int64_t longest = (m.Units() + m.parts - 1) / m.parts;
    EXPECT_LE(longest, (m.Units() + 131) / 132 + 1) << "B=" << B;
  }
}

TEST(SparseMlaPartition, EstimatedCostGrowsWithBatch) {
  // Within half a segment's cost: no batch is planned much slower than a larger one.
  double prev = 0.0;
  for (int B = 1; B <= 256; ++B) {
    const double cost = MmaPartitionCost(ChooseMmaPartition(B, 20, 132));
    EXPECT_GE(cost, prev - kSegmentCost - 1e-9) << "B=" << B;
    prev = cost;
  }
}

}  // namespace
}  // namespace dsv4::kernels::sparse_mla
