// TokenLogprobOf (worker/logprobs.h): log-softmax in double against a direct computation at the flash vocabulary
// size, the top list's order and ties, and rows a broken step could produce (NaN, +inf, -inf), which must give
// no NaN and keep the order a strict one.
#include "worker/logprobs.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dsv4::worker {
namespace {

TEST(TokenLogprob, MatchesADirectLogSoftmaxAtFlashVocabulary) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> d(0.f, 4.f);
  std::vector<float> logits(129280);
  for (float& v : logits) v = d(rng);
  long double z = 0;
  for (float v : logits) z += std::exp(static_cast<long double>(v));
  const int32_t token = 4242;
  const auto lp = TokenLogprobOf(logits, token, 20);
  EXPECT_NEAR(lp.logprob(), static_cast<double>(logits[token] - std::log(z)), 1e-5);
  ASSERT_EQ(lp.top_size(), 20);
  const int32_t argmax = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  EXPECT_EQ(lp.top(0).token_id(), argmax);
  for (int k = 1; k < 20; ++k) EXPECT_GE(lp.top(k - 1).logprob(), lp.top(k).logprob());
}

TEST(TokenLogprob, TiesGoToTheSmallerIdAndTopIsCapped) {
  const std::vector<float> logits = {1.f, 3.f, 3.f, 0.f};
  const auto lp = TokenLogprobOf(logits, 2, 10);
  ASSERT_EQ(lp.top_size(), 4);
  EXPECT_EQ(lp.top(0).token_id(), 1);
  EXPECT_EQ(lp.top(1).token_id(), 2);
  EXPECT_EQ(lp.top(0).logprob(), lp.logprob());
}

TEST(TokenLogprob, BrokenRowsGiveNoNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  {
    const std::vector<float> logits = {0.f, nan, 1.f, -inf};
    const auto lp = TokenLogprobOf(logits, 2, 4);
    EXPECT_FALSE(std::isnan(lp.logprob()));
    EXPECT_NEAR(lp.logprob(), 1.0 - std::log(1.0 + std::exp(1.0)), 1e-6);
    EXPECT_EQ(lp.top(0).token_id(), 2);
    // NaN ranks with -inf at the bottom (ties: smaller id first): 2, 0, then 1 (NaN) and 3 (-inf).
    EXPECT_EQ(lp.top(2).token_id(), 1);
    EXPECT_EQ(lp.top(3).token_id(), 3);
    for (const auto& t : lp.top()) EXPECT_FALSE(std::isnan(t.logprob()));
  }
  {
    const std::vector<float> logits = {0.f, inf, 1.f, inf};
    const auto lp = TokenLogprobOf(logits, 1, 2);
    EXPECT_NEAR(lp.logprob(), -std::log(2.0), 1e-6);
    EXPECT_EQ(TokenLogprobOf(logits, 0, 0).logprob(), -inf);
  }
  EXPECT_EQ(TokenLogprobOf({}, 0, 3).logprob(), -inf);
}

}  // namespace
}  // namespace dsv4::worker
