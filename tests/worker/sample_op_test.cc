// The CPU Sample op (kernels/cpu/cpu_sample.h via CpuOps) against the worker's Sampler: the same tokens for the
// same rows, parameters, seeds and token indices (padding rows give -1, bad sizes an error); and the shared
// arithmetic of kernels/sample_math.h (exp, the 128-bit draw, the rank keys) against plain references.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_sample.h"
#include "kernels/ops.h"
#include "kernels/sample_math.h"
#include "worker/sampler.h"

namespace dsv4::worker {
namespace {

namespace s = kernels::sample;

// Rows of a few kinds: spread, peaked, many exact ties, all equal, some -inf.
std::vector<float> Row(std::mt19937& rng, int kind, int v) {
  std::normal_distribution<float> n(0.0f, kind == 1 ? 8.0f : 2.0f);
  std::vector<float> row(v);
  for (float& x : row) x = n(rng);
  if (kind == 2) {
    for (float& x : row) x = std::round(x * 2.0f) / 2.0f;
  } else if (kind == 3) {
    std::fill(row.begin(), row.end(), row[0]);
  } else if (kind == 4) {
    for (int i = 0; i < v; i += 3) row[i] = -INFINITY;
  }
  return row;
}

TEST(SampleOp, CpuOpMatchesWorkerSampler) {
  std::mt19937 rng(20261201);
  std::unique_ptr<kernels::Backend> be = kernels::cpu::MakeCpuBackend(2);
  const float temps[] = {0.0f, 0.3f, 1.0f, 2.5f};
  const int topks[] = {0, 1, 3, 40};
  const float topps[] = {1.0f, 0.2f, 0.9f};
  const float minps[] = {0.0f, 0.05f};
  const int v = 1000, rows = 4 * 4 * 3 * 2;
  std::vector<float> logits;
  std::vector<kernels::SampleParams> params;
  std::vector<SamplingConfig> configs;
  std::vector<uint64_t> indices;
  for (float t : temps) {
    for (int k : topks) {
      for (float p : topps) {
        for (float m : minps) {
          const std::vector<float> row = Row(rng, static_cast<int>(params.size()) % 5, v);
          logits.insert(logits.end(), row.begin(), row.end());
          const uint64_t seed = (static_cast<uint64_t>(rng()) << 32) | rng(), index = rng() % 5000;
          params.push_back({.temperature = t, .top_k = k, .top_p = p, .min_p = m, .seed = seed, .index = index});
          configs.push_back({.temperature = t, .top_k = k, .top_p = p, .min_p = m, .seed = seed});
          indices.push_back(index);
        }
      }
    }
  }
  // Two padding rows at the end.
  for (const float t : {-1.0f, std::numeric_limits<float>::quiet_NaN()}) {
    logits.insert(logits.end(), v, 0.0f);
    params.push_back({.temperature = t});
  }
  const int64_t r = static_cast<int64_t>(params.size());
  auto l = be->UploadF32(logits);
  auto pb = be->Allocate(r * static_cast<int64_t>(sizeof(kernels::SampleParams)), kernels::MemoryKind::kWorkspace);
  auto tb = be->Allocate(r * 4, kernels::MemoryKind::kWorkspace);
  ASSERT_TRUE(l.ok() && pb.ok() && tb.ok());
  ASSERT_TRUE(be->CopyToDevice(pb->data(), params.data(), pb->bytes()).ok());
  be->ops().Sample({.logits = l->as<float>(), .params = pb->as<kernels::SampleParams>(),
                    .tokens = tb->as<int32_t>(), .r = r, .v = v});
  std::vector<int32_t> got(r);
  ASSERT_TRUE(be->CopyToHost(got.data(), tb->data(), r * 4).ok());
  Sampler sampler;
  int sampled = 0;
  for (int i = 0; i < rows; ++i) {
    const std::span<const float> row(logits.data() + static_cast<size_t>(i) * v, v);
    const int32_t want = sampler.Sample(row, configs[i], indices[i]);
    EXPECT_EQ(got[i], want) << "row " << i;
    sampled += want != ArgMax(row);
  }
  EXPECT_EQ(got[rows], -1);
  EXPECT_EQ(got[rows + 1], -1);
  EXPECT_GT(sampled, rows / 8) << "too few rows drew anything but the argmax: the test would not see a bad draw";
}

TEST(SampleOp, BadSizesAreAnError) {
  std::unique_ptr<kernels::Backend> be = kernels::cpu::MakeCpuBackend(1);
  std::vector<float> logits(8, 0.0f);
  kernels::SampleParams p{.temperature = 1.0f};
  int32_t token = 7;
  be->ops().Sample({.logits = logits.data(), .params = &p, .tokens = &token, .r = 1, .v = 0});
  EXPECT_EQ(be->Synchronize().code(), absl::StatusCode::kInvalidArgument);
  be->ops().Sample({.logits = logits.data(), .params = &p, .tokens = &token, .r = 1, .v = 8, .logits_stride = 4});
  EXPECT_EQ(be->Synchronize().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(token, 7);  // nothing written
  be->ops().Sample({.logits = logits.data(), .params = &p, .tokens = &token, .r = 1, .v = 8});
  EXPECT_TRUE(be->Synchronize().ok());
  EXPECT_GE(token, 0);
  EXPECT_LT(token, 8);
}

// Degenerate rows are sampled greedily; the top token survives every filter.
TEST(SampleOp, DegenerateRowsAndExtremeParameters) {
  std::vector<uint64_t> scratch(6);
  const kernels::SampleParams hot{.temperature = 1.0f, .seed = 3, .index = 9};
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = INFINITY;
  auto sample = [&](std::vector<float> row, kernels::SampleParams p) {
    return kernels::cpu::SampleRow(row, p, scratch);
  };
  EXPECT_EQ(sample({1, 5, nan, 5, 2, 0}, hot), 1);         // a NaN anywhere: the argmax
  EXPECT_EQ(sample({nan, 5, 1, 5, 2, 0}, hot), 0);         // ... which is 0 when the NaN is first
  EXPECT_EQ(sample({1, inf, 3, inf, 2, 0}, hot), 1);       // +inf: the first +inf
  EXPECT_EQ(sample({-inf, -inf, -inf, -inf, -inf, -inf}, hot), 0);
  // +0 and -0 tie at the top: a tiny temperature draws among ids 0, 1 and 2 alike.
  int zeros[6] = {};
  for (uint64_t i = 0; i < 300; ++i) {
    ++zeros[sample({0, -0.0f, 0, -3, -4, -5}, {.temperature = 1e-30f, .seed = 1, .index = i})];
  }
  EXPECT_GT(zeros[0], 50);
  EXPECT_GT(zeros[1], 50);
  EXPECT_GT(zeros[2], 50);
  // Tiny temperature: only the tied top tokens (ids 1 and 3) carry weight; both are drawn.
  int drawn[6] = {};
  for (uint64_t i = 0; i < 200; ++i) {
    ++drawn[sample({1, 5, 2, 5, 4.9999f, 0}, {.temperature = 1e-6f, .seed = 5, .index = i})];
  }
  EXPECT_EQ(drawn[0] + drawn[2] + drawn[4] + drawn[5], 0);
  EXPECT_GT(drawn[1], 50);
  EXPECT_GT(drawn[3], 50);
  // min_p above 1 drops everything: the argmax. top_p 0 keeps the top token only.
  EXPECT_EQ(sample({1, 5, 2, 5, 4, 0}, {.temperature = 1.0f, .min_p = 1.5f, .seed = 5}), 1);
  for (uint64_t i = 0; i < 50; ++i) {
    EXPECT_EQ(sample({1, 4, 2, 5, 4, 0}, {.temperature = 1.0f, .top_p = 0.0f, .seed = 5, .index = i}), 3);
  }
}

TEST(SampleMath, ExpNegIsCloseToExp) {
  EXPECT_EQ(s::ExpNeg(0.0f), 1.0f);
  EXPECT_EQ(s::ExpNeg(-0.0f), 1.0f);
  EXPECT_EQ(s::ExpNeg(std::nextafter(s::kMinX, -100.0f)), 0.0f);
  EXPECT_EQ(s::ExpNeg(-INFINITY), 0.0f);
  EXPECT_EQ(s::ExpNeg(std::numeric_limits<float>::quiet_NaN()), 0.0f);
  EXPECT_GT(s::Weight(s::ExpNeg(s::kMinX)), 0u);
  double worst = 0;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(s::kMinX, 0.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = i < 1000 ? -static_cast<float>(i) * 0.03f : u(rng);
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(s::ExpNeg(x) - want) / want);
  }
  std::printf("ExpNeg on [-30, 0]: max relative error %.3g\n", worst);
  EXPECT_LT(worst, 1e-6);
}

TEST(SampleMath, DrawTargetIsTheExactProduct) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t bits = rng() >> 11, total = i % 3 == 0 ? rng() >> 1 : rng() >> (rng() % 60);
    const unsigned __int128 want = (static_cast<unsigned __int128>(bits) * total) >> 53;
    ASSERT_EQ(s::DrawTarget(bits, total), static_cast<uint64_t>(want)) << bits << " " << total;
    ASSERT_LT(s::DrawTarget(bits, total), std::max<uint64_t>(total, 1));
  }
  EXPECT_EQ(s::DrawTarget((uint64_t{1} << 53) - 1, uint64_t{1} << 63), (uint64_t{1} << 63) - (uint64_t{1} << 10));
}

TEST(SampleMath, RankKeysOrderLikeLogitsThenIds) {
  std::mt19937 rng(13);
  std::normal_distribution<float> n(0.0f, 10.0f);
  std::vector<float> vals = {0.0f, -0.0f, 1e-40f, -1e-40f, INFINITY, -INFINITY, 3.0f, -3.0f};
  for (int i = 0; i < 2000; ++i) vals.push_back(n(rng));
  for (float a : vals) {
    EXPECT_EQ(s::OrderKey(s::LogitOfKey(s::OrderKey(a))), s::OrderKey(a));
    for (int j = 0; j < 8; ++j) {
      const float b = vals[rng() % vals.size()];
      const int ia = static_cast<int>(rng() % 1000), ib = static_cast<int>(rng() % 1000);
      const bool a_first = a > b || (a == b && ia < ib);
      if (a == b && ia == ib) continue;
      EXPECT_EQ(s::RankKey(s::OrderKey(a), ia) > s::RankKey(s::OrderKey(b), ib), a_first) << a << " " << b;
    }
  }
  EXPECT_EQ(s::IdOfRankKey(s::RankKey(s::OrderKey(2.0f), 129279)), 129279);
}

}  // namespace
}  // namespace dsv4::worker
