// Page allocator, KV sizing and the sampler: unit tests on fresh random inputs.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/fake_executor.h"
#include "worker/kv_manager.h"
#include "worker/sampler.h"

namespace dsv4::worker {
namespace {

TEST(PageAllocator, AllOrNothingAndReuse) {
  PageAllocator a(4);
  std::vector<int32_t> pages;
  EXPECT_TRUE(a.Allocate(3, &pages));
  EXPECT_FALSE(a.Allocate(2, &pages));  // only 1 left: nothing taken
  EXPECT_EQ(pages.size(), 3u);
  EXPECT_EQ(a.free_pages(), 1);
  a.Free(pages);
  EXPECT_EQ(a.used(), 0);
  std::vector<int32_t> all;
  EXPECT_TRUE(a.Allocate(4, &all));
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(PageAllocatorDeathTest, DoubleFreeAborts) {
  PageAllocator a(2);
  std::vector<int32_t> pages;
  ASSERT_TRUE(a.Allocate(1, &pages));
  a.Free(pages);
  EXPECT_DEATH(a.Free(pages), "not in use");
}

TEST(KvManager, ReserveGrowsAndReleaseReturnsEverything) {
  testing::FakeExecutor ex;  // window 8 rows, compressed-4 rows, other pools unused
  auto sizing = PlanKvSizing(ex, {.page_rows = 4, .max_batch = 2, .max_context = 64, .kv_pages = 6});
  ASSERT_TRUE(sizing.ok()) << sizing.status();
  EXPECT_EQ(sizing->pages[0], 4);  // capped: 2 requests x 2 window pages
  EXPECT_EQ(sizing->pages[1], 6);
  EXPECT_EQ(sizing->pages[2], 0);
  KvManager kv(ex, *sizing);
  BlockTables t;
  ASSERT_TRUE(kv.AcquireSlot(&t));
  ASSERT_TRUE(kv.Reserve(&t, 1));
  EXPECT_EQ(t.pages[0].size(), 2u);  // the whole window from the first token
  EXPECT_EQ(t.pages[1].size(), 0u);
  ASSERT_TRUE(kv.Reserve(&t, 33));   // 8 compressed rows = 2 pages
  EXPECT_EQ(t.pages[1].size(), 2u);
  EXPECT_FALSE(kv.Reserve(&t, 200));  // 50 rows = 13 pages > 6: nothing changes
  EXPECT_EQ(t.pages[1].size(), 2u);
  kv.Release(&t);
  for (const auto& u : kv.Usage()) EXPECT_EQ(u.used, 0);
  EXPECT_EQ(kv.free_slots(), 2);
}

TEST(KvManager, SizingRefusesPoolsTooSmallForOneRequest) {
  testing::FakeExecutor ex;
  auto s = PlanKvSizing(ex, {.page_rows = 4, .max_batch = 2, .max_context = 64, .kv_pages = 3});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("--kv-pages 3"), std::string::npos) << s.status();
  auto m = PlanKvSizing(ex, {.page_rows = 4, .max_batch = 2, .max_context = 64, .mem_fraction = 0.5,
                             .available_bytes = 64});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("--mem-fraction"), std::string::npos) << m.status();
  auto ok = PlanKvSizing(ex, {.page_rows = 4, .max_batch = 2, .max_context = 64, .mem_fraction = 0.5,
                              .available_bytes = 1 << 20});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->pages[1], 8);  // enough for every slot at full context: 2 x 16 rows / 4
}

TEST(Sampler, CounterUniformIsDeterministicAndUniform) {
  double sum = 0;
  for (uint64_t i = 0; i < 20000; ++i) {
    const double u = CounterUniform(42, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    EXPECT_EQ(u, CounterUniform(42, i));
    sum += u;
  }
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);
  EXPECT_NE(CounterUniform(42, 7), CounterUniform(43, 7));
}

std::vector<float> RandomLogits(std::mt19937& rng, int n) {
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  std::mt19937 rng(std::random_device{}());
  Sampler s;
  for (int trial = 0; trial < 20; ++trial) {
    auto logits = RandomLogits(rng, 50);
    const int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(s.Sample(logits, {}, trial), best);
  }
  std::vector<float> tie = {1.0f, 3.0f, 3.0f};
  EXPECT_EQ(s.Sample(tie, {}, 0), 1);
}

// Empirical frequencies of many draws match the filtered, renormalised softmax.
void CheckDistribution(const std::vector<float>& logits, const SamplingConfig& c,
                       const std::vector<double>& expected) {
  Sampler s;
  std::vector<double> counts(logits.size(), 0);
  const int draws = 40000;
  for (int i = 0; i < draws; ++i) counts[s.Sample(logits, c, i)] += 1;
  for (size_t v = 0; v < logits.size(); ++v) {
    EXPECT_NEAR(counts[v] / draws, expected[v], 0.012) << "token " << v;
    if (expected[v] == 0) {
      EXPECT_EQ(counts[v], 0) << "token " << v << " should be filtered";
    }
  }
}

std::vector<double> Softmax(const std::vector<float>& l, float t, const std::vector<bool>& keep) {
  std::vector<double> p(l.size(), 0);
  double sum = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    if (keep[i]) sum += p[i] = std::exp(l[i] / t);
  }
  for (double& x : p) x /= sum;
  return p;
}

TEST(Sampler, TemperatureTopKTopPMinP) {
  const std::vector<float> l = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f};
  CheckDistribution(l, {.temperature = 0.7f, .seed = 1}, Softmax(l, 0.7f, {true, true, true, true, true}));
  CheckDistribution(l, {.temperature = 1.0f, .top_k = 2, .seed = 2}, Softmax(l, 1, {true, true, false, false, false}));
  // Probabilities at T=1: .55 .20 .12 .07 .03 -> top_p 0.7 keeps the first two (0.55 < 0.7 <= 0.75).
  CheckDistribution(l, {.temperature = 1.0f, .top_p = 0.7f, .seed = 3}, Softmax(l, 1, {true, true, false, false, false}));
  // min_p 0.2 of 0.55 = 0.11: keeps tokens 0..2.
  CheckDistribution(l, {.temperature = 1.0f, .min_p = 0.2f, .seed = 4}, Softmax(l, 1, {true, true, true, false, false}));
}

TEST(Sampler, SameSeedSameIndexSameToken) {
  std::mt19937 rng(std::random_device{}());
  auto logits = RandomLogits(rng, 1000);
  Sampler a, b;
  const SamplingConfig c{.temperature = 1.0f, .top_k = 50, .top_p = 0.9f, .seed = rng()};
  for (uint64_t i = 0; i < 50; ++i) EXPECT_EQ(a.Sample(logits, c, i), b.Sample(logits, c, i));
}

}  // namespace
}  // namespace dsv4::worker
