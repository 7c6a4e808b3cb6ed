// Golden data and comparison: see golden_util.h.
#include "tests/model/golden_util.h"

#include <cmath>
#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/model/model_fixture.h"
#include "tools/generate/npy.h"

namespace dsv4::model::testing {

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

double RowErrors::median() const {
  if (rel.empty()) return 0;
  std::vector<double> r = rel;
  std::nth_element(r.begin(), r.begin() + r.size() / 2, r.end());
  return r[r.size() / 2];
}

RowErrors Compare(const std::vector<float>& ours, const GoldenSeq& g, int64_t V) {
  RowErrors e;
  for (size_t r = 0; r < g.tokens.size(); ++r) {
    float gmax = 0, diff = 0;
    int32_t best = 0;
    for (int64_t v = 0; v < V; ++v) {
      const float a = ours[r * V + v], b = g.logits[r * V + v];
      gmax = std::max(gmax, std::fabs(b));
      diff = std::isnan(a) ? INFINITY : std::max(diff, std::fabs(a - b));
      if (a > ours[r * V + best]) best = static_cast<int32_t>(v);
    }
    e.rel.push_back(diff / gmax);
    if (g.margin[r] > 1e-3f) {
      ++e.argmax_checked;
      e.argmax_bad += best != g.argmax[r];
    }
  }
  return e;
}

}  // namespace dsv4::model::testing
