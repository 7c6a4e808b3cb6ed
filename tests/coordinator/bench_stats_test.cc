// dsv4-bench's statistics and workloads: percentiles against hand-computed values, summaries, random
// lengths within their range, and token-file errors that name the line.
#include <cstdio>
#include <fstream>
#include <random>

#include "bench/serving/stats.h"
#include "bench/serving/workload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dsv4::bench {
namespace {

using ::testing::HasSubstr;

TEST(BenchStatsTest, PercentileInterpolatesLikeNumpy) {
  // numpy.percentile([1, 2, 3, 4], [50, 90, 99]) = [2.5, 3.7, 3.97]
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_NEAR(Percentile({4, 1, 3, 2}, 90), 3.7, 1e-12);
  EXPECT_NEAR(Percentile({4, 1, 3, 2}, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
}

TEST(BenchStatsTest, PercentileMatchesSortedRankOnRandomData) {
  std::mt19937 rng(3);
  std::vector<double> v(101);
  for (double& x : v) x = std::uniform_real_distribution<double>(0, 10)(rng);
  std::vector<double> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_DOUBLE_EQ(Percentile(v, 50), sorted[50]);  // 101 values: p50 is exactly the middle one
  EXPECT_DOUBLE_EQ(Percentile(v, 90), sorted[90]);
  EXPECT_DOUBLE_EQ(Percentile(v, 0), sorted[0]);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), sorted[100]);
}

TEST(BenchStatsTest, SummaryComputesThroughputAndTpot) {
  std::vector<RequestRecord> r(3);
  r[0] = {.ok = true, .prompt_len = 10, .output_len = 5, .ttft_s = 0.1, .e2e_s = 0.5, .itl_s = {0.1, 0.1, 0.1, 0.1}};
  r[1] = {.ok = true, .prompt_len = 20, .output_len = 3, .ttft_s = 0.3, .e2e_s = 0.7, .itl_s = {0.2, 0.2}};
  r[2] = {.ok = false, .error = "boom"};
  Summary s = Summarize(r, 2.0);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.first_error, "boom");
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(s.input_tok_s, 15.0);
  EXPECT_DOUBLE_EQ(s.output_tok_s, 4.0);
  EXPECT_NEAR(s.ttft_ms.mean, 200.0, 1e-9);
  EXPECT_NEAR(s.tpot_ms.mean, 150.0, 1e-9);  // (0.4/4 + 0.4/2) / 2
  EXPECT_NEAR(s.itl_ms.mean, 1000.0 * 0.8 / 6, 1e-9);
  EXPECT_NEAR(s.e2e_ms.p50, 600.0, 1e-9);
  const std::string table = FormatTable({s});
  EXPECT_THAT(table, HasSubstr("TTFT"));
  EXPECT_EQ(ToJson(s)["completed"], 2);
  EXPECT_NEAR(ToJson(s)["tpot_ms"]["mean"].get<double>(), 150.0, 1e-9);
}

TEST(BenchWorkloadTest, RandomLengthsStayInRange) {
  auto w = MakeRandomWorkload({.num_prompts = 200, .input_len = 100, .output_len = 20, .range_ratio = 0.5,
                               .vocab_size = 50, .seed = 9});
  ASSERT_TRUE(w.ok()) << w.status();
  int min_in = 1 << 30, max_in = 0;
  for (const BenchRequest& r : *w) {
    min_in = std::min<int>(min_in, r.prompt.size());
    max_in = std::max<int>(max_in, r.prompt.size());
    EXPECT_GE(r.output_len, 10);
    EXPECT_LE(r.output_len, 20);
    for (int32_t t : r.prompt) ASSERT_TRUE(t >= 0 && t < 50);
  }
  EXPECT_GE(min_in, 50);
  EXPECT_LE(max_in, 100);
  EXPECT_LT(min_in, max_in);  // 200 draws from [50, 100] are not all equal
  auto fixed = MakeRandomWorkload({.num_prompts = 3, .input_len = 7, .output_len = 4, .vocab_size = 50});
  ASSERT_TRUE(fixed.ok());
  for (const BenchRequest& r : *fixed) EXPECT_EQ(r.prompt.size(), 7u);
  EXPECT_THAT(std::string(MakeRandomWorkload({.range_ratio = 1.5, .vocab_size = 50}).status().message()),
              HasSubstr("--random-range-ratio"));
}

TEST(BenchWorkloadTest, TokenFileParsesAndNamesBadLines) {
  const std::string path = ::testing::TempDir() + "/prompts.jsonl";
  std::ofstream(path) << "{\"prompt_token_ids\": [1, 2, 3], \"output_len\": 4}\n\n{\"prompt_token_ids\": [5]}\n";
  auto ok = LoadTokenFile(path, 9, 10);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[0].prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ((*ok)[0].output_len, 4);
  EXPECT_EQ((*ok)[1].output_len, 9);
  std::ofstream(path) << "{\"prompt_token_ids\": [1]}\n{\"prompt_token_ids\": [1, 10]}\n";
  EXPECT_THAT(std::string(LoadTokenFile(path, 9, 10).status().message()), HasSubstr("prompts.jsonl:2: token 10"));
  std::ofstream(path) << "not json\n";
  EXPECT_THAT(std::string(LoadTokenFile(path, 9, 10).status().message()), HasSubstr(":1: not a JSON object"));
}

}  // namespace
}  // namespace dsv4::bench
