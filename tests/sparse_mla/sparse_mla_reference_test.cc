// The float64 reference against an independent brute-force attention (sink as an extra softmax column),
// its edge cases (no valid key, lengths, holes, ids past the pool), its bf16 writer, and the validation.
#include "kernels/sparse_mla/sparse_mla_reference.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "common/float_formats.h"
#include "kernels/sparse_mla/sparse_mla_validate.h"
#include "tests/sparse_mla/sparse_mla_test_util.h"

namespace dsv4::kernels::sparse_mla {
namespace {

using testing::HostProblem;
using testing::MakeProblem;
using testing::ProblemSpec;

// Written from the formula, not from the reference: walk the index rows by hand, decode every key, put the
// sink in the softmax as one more logit and drop its column.
void BruteForce(const HostProblem& pr, std::vector<double>& out, std::vector<double>& lse) {
  const ProblemSpec& s = pr.spec;
  out.assign(static_cast<size_t>(s.batch) * s.heads * kKvDim, 0.0);
  lse.assign(static_cast<size_t>(s.batch) * s.heads, std::numeric_limits<double>::infinity());
  for (int b = 0; b < s.batch; ++b) {
    std::vector<std::array<float, kKvDim>> keys;
    auto gather = [&](const std::vector<uint8_t>& cache, int64_t pages, int P, const std::vector<int32_t>& idx,
                      const std::vector<int32_t>& len, int topk) {
      for (int j = 0; j < topk; ++j) {
        if (!len.empty() && j >= len[b]) break;
        const int32_t id = idx[static_cast<size_t>(b) * topk + j];
        if (id < 0 || id >= pages * P) continue;
        std::array<float, kKvDim> k;
        const uint8_t* page = cache.data() + (id / P) * KvPageStrideBytes(P);
        DecodeKvRow(page + (id % P) * 576, page + P * 576 + (id % P) * 8, k);
        keys.push_back(k);
      }
    };
    if (s.topk_window) gather(pr.cache_window, pr.pages_window, s.page_rows_window, pr.idx_window, pr.len_window, s.topk_window);
    if (s.topk_extra) gather(pr.cache_extra, pr.pages_extra, s.page_rows_extra, pr.idx_extra, pr.len_extra, s.topk_extra);
    if (keys.empty()) continue;
    for (int h = 0; h < s.heads; ++h) {
      std::vector<double> logit;
      for (const auto& k : keys) {
        double dot = 0;
        for (int d = 0; d < kKvDim; ++d) {
          dot += Bf16ToF32(pr.q[(static_cast<size_t>(b) * s.heads + h) * kKvDim + d]) * static_cast<double>(k[d]);
        }
        logit.push_back(dot * static_cast<double>(1.0f / std::sqrt(512.0f)));  // the params' float scale
      }
      const double sink = s.sink ? pr.sink[h] : -std::numeric_limits<double>::infinity();
      double m = sink;
      for (double x : logit) m = std::max(m, x);
      double denom = std::exp(sink - m), real = 0;
      for (double x : logit) {
        denom += std::exp(x - m);
        real += std::exp(x - m);
      }
      double* o = &out[(static_cast<size_t>(b) * s.heads + h) * kKvDim];
      for (size_t j = 0; j < keys.size(); ++j) {
        for (int d = 0; d < kKvDim; ++d) o[d] += std::exp(logit[j] - m) / denom * keys[j][d];
      }
      lse[static_cast<size_t>(b) * s.heads + h] = m + std::log(real);
    }
  }
}

class ReferenceVsBruteForce : public ::testing::TestWithParam<ProblemSpec> {};

TEST_P(ReferenceVsBruteForce, Matches) {
  const HostProblem pr = MakeProblem(GetParam());
  std::vector<uint16_t> out_bf16(pr.q.size());
  std::vector<float> lse_f32(static_cast<size_t>(GetParam().batch) * GetParam().heads);
  auto ref = SparseMlaDecodeReferenceF64(pr.Params(out_bf16.data(), lse_f32.data()));
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::vector<double> out, lse;
  BruteForce(pr, out, lse);
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_FALSE(std::isnan(ref->out[i])) << i;
    num += (ref->out[i] - out[i]) * (ref->out[i] - out[i]);
    den += out[i] * out[i];
  }
  EXPECT_LE(std::sqrt(num / std::max(den, 1e-300)), 1e-10);
  int empty = 0;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(lse[i])) {
      ++empty;
      EXPECT_TRUE(std::isinf(ref->lse[i]) && ref->lse[i] > 0) << i;
      for (int d = 0; d < kKvDim; ++d) ASSERT_EQ(ref->out[i * kKvDim + d], 0.0);
    } else {
      EXPECT_NEAR(ref->lse[i], lse[i], 1e-9 * std::max(1.0, std::fabs(lse[i]))) << i;
    }
  }
  if (GetParam().lengths || GetParam().empty_every > 0) {
    EXPECT_GT(empty, 0) << "the spec promises rows with no valid key";
  }
  // The bf16 / f32 writer rounds the same numbers.
  ASSERT_TRUE(SparseMlaDecodeReference(pr.Params(out_bf16.data(), lse_f32.data())).ok());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out_bf16[i], F32ToBf16(static_cast<float>(ref->out[i])));
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_EQ(lse_f32[i], static_cast<float>(ref->lse[i]));
}

INSTANTIATE_TEST_SUITE_P(
    Specs, ReferenceVsBruteForce,
    ::testing::Values(ProblemSpec{.batch = 2, .heads = 3, .topk_window = 20, .topk_extra = 0, .seed = 1},
                      ProblemSpec{.batch = 3, .heads = 2, .topk_window = 16, .topk_extra = 40, .page_rows_window = 8,
                                  .page_rows_extra = 2, .lengths = true, .holes = 0.2, .seed = 2},
                      ProblemSpec{.batch = 4, .heads = 2, .topk_window = 8, .topk_extra = 24, .holes = 0.1,
                                  .empty_every = 2, .extreme = true, .sink = false, .seed = 3}),
    [](const ::testing::TestParamInfo<ProblemSpec>& info) { return info.param.Name(); });

TEST(SparseMlaReference, SinkScalesOutputAndNotLse) {
  ProblemSpec spec{.batch = 1, .heads = 2, .topk_window = 8, .topk_extra = 0, .sink = true, .seed = 5};
  HostProblem pr = MakeProblem(spec);
  std::vector<uint16_t> out(pr.q.size());
  std::vector<float> lse(2);
  pr.sink = {-std::numeric_limits<float>::infinity(), 0.0f};
  auto with = SparseMlaDecodeReferenceF64(pr.Params(out.data(), lse.data()));
  pr.sink = {-std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  auto without = SparseMlaDecodeReferenceF64(pr.Params(out.data(), lse.data()));
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_EQ(with->lse, without->lse);
  const double factor = 1.0 / (1.0 + std::exp(0.0 - without->lse[1]));
  for (int d = 0; d < kKvDim; ++d) {
    EXPECT_EQ(with->out[d], without->out[d]);
    EXPECT_NEAR(with->out[kKvDim + d], without->out[kKvDim + d] * factor, 1e-12 * std::fabs(without->out[kKvDim + d]) + 1e-300);
  }
}

TEST(SparseMlaValidation, RejectsBadParams) {
  const HostProblem pr = MakeProblem({.batch = 2, .heads = 16, .topk_window = 8, .topk_extra = 8, .seed = 9});
  std::vector<uint16_t> out(pr.q.size());
  std::vector<float> lse(32);
  const SparseMlaParams good = pr.Params(out.data(), lse.data());
  ASSERT_TRUE(ValidateSparseMlaParams(good, true).ok());
  struct Case {
    const char* what;
    void (*edit)(SparseMlaParams&);
    bool cuda_only;
  };
  const Case cases[] = {
      {"batch", [](SparseMlaParams& p) { p.batch = 0; }, false},
      {"num_heads", [](SparseMlaParams& p) { p.num_heads = 48; }, true},
      {"num_heads", [](SparseMlaParams& p) { p.num_heads = 0; }, false},
      {"q is null", [](SparseMlaParams& p) { p.q = nullptr; }, false},
      {"out is null", [](SparseMlaParams& p) { p.out = nullptr; }, false},
      {"lse is null", [](SparseMlaParams& p) { p.lse = nullptr; }, false},
      {"softmax_scale", [](SparseMlaParams& p) { p.softmax_scale = std::numeric_limits<float>::quiet_NaN(); }, false},
      {"window.topk", [](SparseMlaParams& p) { p.window.topk = -1; }, false},
      {"extra.cache", [](SparseMlaParams& p) { p.extra.cache = nullptr; }, false},
      {"window.indices", [](SparseMlaParams& p) { p.window.indices = nullptr; }, false},
      {"extra.page_rows", [](SparseMlaParams& p) { p.extra.page_rows = 0; }, false},
      {"window.num_pages", [](SparseMlaParams& p) { p.window.num_pages = 0; }, false},
      {"window.index_stride", [](SparseMlaParams& p) { p.window.index_stride = 3; }, false},
  };
  for (const Case& c : cases) {
    SparseMlaParams p = good;
    c.edit(p);
    const absl::Status st = ValidateSparseMlaParams(p, /*cuda_head_counts=*/true);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(st.message().find(c.what), std::string::npos) << st.message();
    EXPECT_EQ(ValidateSparseMlaParams(p, false).ok(), c.cuda_only) << c.what;
  }
  // A cache that is not used may be absent.
  SparseMlaParams p = good;
  p.extra = {};
  EXPECT_TRUE(ValidateSparseMlaParams(p, true).ok());
  EXPECT_EQ(SparseMlaDecodeReference(SparseMlaParams{}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsv4::kernels::sparse_mla
