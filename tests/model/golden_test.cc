// Exact mode against transformers: token-by-token decode of the golden sequences (tests/data/golden, made by
// tools/golden/make_golden.py from DeepseekV4ForCausalLM in fp32 on a GPU) must match every position's logits
// within 1e-3 of the row's largest |logit|, with the same argmax wherever the golden top-2 margin > 1e-3.
#include <cmath>
#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/model/model_fixture.h"
#include "tools/generate/npy.h"
#include "tools/generate/runner.h"

namespace dsv4::model::testing {
namespace {

struct GoldenSeq {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [rows, V]
  std::vector<float> margin;  // [rows]
  std::vector<int32_t> argmax;
};

std::vector<GoldenSeq> LoadGoldens(int64_t vocab) {
  const std::string dir = SourceDir() + "/tests/data/golden/";
  std::ifstream in(dir + "golden.json");
  EXPECT_TRUE(in.good()) << "missing " << dir << "golden.json";
  const nlohmann::json meta = nlohmann::json::parse(in);
  auto tokens = npy::Read(dir + "tokens.npy");
  auto q = npy::Read(dir + "logits_q.npy");
  auto stats = npy::Read(dir + "row_stats.npy");
  EXPECT_TRUE(tokens.ok() && q.ok() && stats.ok()) << tokens.status() << q.status() << stats.status();
  EXPECT_EQ(q->shape.at(1), vocab);
  std::vector<GoldenSeq> out;
  int64_t row = 0;
  for (const auto& s : meta["sequences"]) {
    GoldenSeq g;
    const int64_t rows = s["rows"].get<int64_t>();
    for (int64_t r = row; r < row + rows; ++r) {
      g.tokens.push_back(tokens->as<int32_t>()[r]);
      const float scale = stats->as<float>()[3 * r];
      for (int64_t v = 0; v < vocab; ++v) g.logits.push_back(q->as<int16_t>()[r * vocab + v] * scale);
      g.margin.push_back(stats->as<float>()[3 * r + 1]);
      g.argmax.push_back(static_cast<int32_t>(stats->as<float>()[3 * r + 2]));
    }
    row += rows;
    out.push_back(std::move(g));
  }
  return out;
}

TEST(GoldenTest, ExactDecodeMatchesTransformers) {
  Dsv4Model& m = TinyModel(NumericMode::kExact);
  const int64_t V = m.config().vocab_size;
  const std::vector<GoldenSeq> goldens = LoadGoldens(V);
  ASSERT_GE(goldens.size(), 3u);
  auto plan = generate::AllocateSequences(m, 1, 1024);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (size_t i = 0; i < goldens.size(); ++i) {
    const GoldenSeq& g = goldens[i];
    ASSERT_GE(g.tokens.size(), 320u);
    auto ours = generate::TeacherForce(m, plan->tables[0], g.tokens, 1);
    ASSERT_TRUE(ours.ok()) << ours.status();
    double worst = 0;
    int64_t worst_row = -1, argmax_checked = 0, argmax_bad = 0;
    for (size_t r = 0; r < g.tokens.size(); ++r) {
      float gmax = 0, diff = 0;
      int32_t best = 0;
      for (int64_t v = 0; v < V; ++v) {
        const float a = (*ours)[r * V + v], b = g.logits[r * V + v];
        gmax = std::max(gmax, std::fabs(b));
        diff = std::isnan(a) ? INFINITY : std::max(diff, std::fabs(a - b));
        if (a > (*ours)[r * V + best]) best = static_cast<int32_t>(v);
      }
      const double rel = diff / gmax;
      if (!(rel <= worst)) worst = rel, worst_row = static_cast<int64_t>(r);
      if (g.margin[r] > 1e-3f) {
        ++argmax_checked;
        argmax_bad += best != g.argmax[r];
      }
    }
    std::printf("golden seq %zu: %zu rows, max |err| / max|logit| %.3e at row %lld, argmax %lld/%lld differ\n", i,
                g.tokens.size(), worst, static_cast<long long>(worst_row), static_cast<long long>(argmax_bad),
                static_cast<long long>(argmax_checked));
    EXPECT_LE(worst, 1e-3) << "sequence " << i << " row " << worst_row;
    EXPECT_EQ(argmax_bad, 0) << "sequence " << i;
  }
}

}  // namespace
}  // namespace dsv4::model::testing
