// Self-consistency of the forward: prefill then decode equals decode alone; a batch of sequences at different
// positions equals each run alone; production mode stays close to exact; fused projections give the same bits
// (ModelOptions::fuse_projections); the tiny model decodes a few
// hundred tokens quickly; bad inputs are refused with errors that name the problem.
#include <chrono>
#include <cmath>
#include <cstring>

#include "gtest/gtest.h"
#include "tests/model/model_fixture.h"
#include "tools/generate/npy.h"
#include "tools/generate/runner.h"

namespace dsv4::model::testing {
namespace {

// max |a - b| / max |b| over a [rows, V] block, NaN-poisoned.
double RelMaxErr(const float* a, const float* b, int64_t n) {
  double diff = 0, mx = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::isnan(a[i]) ? INFINITY : std::max<double>(diff, std::fabs(a[i] - b[i]));
    mx = std::max<double>(mx, std::fabs(b[i]));
  }
  return diff / mx;
}

TEST(ConsistencyTest, PrefillThenDecodeEqualsDecode) {
  Dsv4Model& m = TinyModel(NumericMode::kExact);
  const int64_t V = m.config().vocab_size;
  const auto tokens = RandomTokens(300, 7, static_cast<int>(V));
  auto plan = generate::AllocateSequences(m, 1, 300);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto decode = generate::TeacherForce(m, plan->tables[0], tokens, 1);
  ASSERT_TRUE(decode.ok()) << decode.status();
  // Prefill 261 tokens in uneven chunks, then decode the rest one by one.
  ASSERT_TRUE(m.ResetState(0).ok());
  std::vector<float> all, part;
  int32_t pos = 0;
  for (int n : {100, 29, 132, 1, 1, 1, 36}) {
    const SeqChunk c{.tables = &plan->tables[0], .tokens = std::span(tokens).subspan(pos, n), .start_pos = pos};
    ASSERT_TRUE(m.ForwardAllLogits({&c, 1}, &part).ok());
    all.insert(all.end(), part.begin(), part.end());
    pos += n;
  }
  ASSERT_EQ(all.size(), decode->size());
  const double err = RelMaxErr(all.data(), decode->data(), static_cast<int64_t>(all.size()));
  std::printf("prefill+decode vs decode: max rel err %.3e\n", err);
  EXPECT_LE(err, 1e-5);
}

TEST(ConsistencyTest, BatchAtDifferentPositionsEqualsEachAlone) {
  Dsv4Model& m = TinyModel(NumericMode::kExact);
  const int64_t V = m.config().vocab_size;
  const int kSeqs = 3;
  const std::vector<int> lens = {290, 160, 140};
  const std::vector<int> start_step = {0, 40, 75};  // sequence s joins at this step
  std::vector<std::vector<int32_t>> toks;
  for (int s = 0; s < kSeqs; ++s) toks.push_back(RandomTokens(lens[s], 100 + s, static_cast<int>(V)));
  auto plan = generate::AllocateSequences(m, kSeqs, 300);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::vector<float>> alone;
  for (int s = 0; s < kSeqs; ++s) {
    auto r = generate::TeacherForce(m, plan->tables[s], toks[s], 1);
    ASSERT_TRUE(r.ok()) << r.status();
    alone.push_back(std::move(*r));
  }
  for (int s = 0; s < kSeqs; ++s) ASSERT_TRUE(m.ResetState(s).ok());
  // Each step: every active sequence contributes one chunk; sequence 2 prefills 50 tokens when it joins.
  std::vector<int> pos(kSeqs, 0);
  double worst = 0;
  for (int step = 0; step < 400; ++step) {
    std::vector<SeqChunk> chunks;
    std::vector<int> who;
    for (int s = 0; s < kSeqs; ++s) {
      if (step < start_step[s] || pos[s] >= lens[s]) continue;
      const int n = (s == 2 && pos[s] == 0) ? 50 : 1;
      chunks.push_back({.tables = &plan->tables[s], .tokens = std::span(toks[s]).subspan(pos[s], n), .start_pos = pos[s]});
      who.push_back(s);
      pos[s] += n;
    }
    if (chunks.empty()) break;
    std::vector<float> logits(chunks.size() * V);
    ASSERT_TRUE(m.Forward(chunks, logits.data()).ok());
    for (size_t i = 0; i < chunks.size(); ++i) {
      const int s = who[i];
      worst = std::max(worst, RelMaxErr(&logits[i * V], &alone[s][(pos[s] - 1) * V], V));
    }
  }
  for (int s = 0; s < kSeqs; ++s) EXPECT_EQ(pos[s], lens[s]);
  std::printf("batched vs alone: max rel err %.3e\n", worst);
  EXPECT_LE(worst, 1e-5);
}

TEST(ConsistencyTest, ProductionCloseToExact) {
  Dsv4Model& exact = TinyModel(NumericMode::kExact);
  Dsv4Model& prod = TinyModel(NumericMode::kProduction);
  const int64_t V = exact.config().vocab_size;
  // The first golden sequence (328 tokens): crosses the window, the indexer's top-k and two ratio-128 rows.
  auto golden = npy::Read(SourceDir() + "/tests/data/golden/tokens.npy");
  ASSERT_TRUE(golden.ok()) << golden.status();
  const std::vector<int32_t> tokens(golden->as<int32_t>(), golden->as<int32_t>() + 328);
  auto pe = generate::AllocateSequences(exact, 1, 328);
  auto pp = generate::AllocateSequences(prod, 1, 328);
  ASSERT_TRUE(pe.ok() && pp.ok());
  auto a = generate::TeacherForce(exact, pe->tables[0], tokens, 64);
  auto b = generate::TeacherForce(prod, pp->tables[0], tokens, 64);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  double num = 0, den = 0;
  int agree = 0;
  for (size_t r = 0; r < tokens.size(); ++r) {
    const float* x = &(*a)[r * V];
    const float* y = &(*b)[r * V];
    for (int64_t v = 0; v < V; ++v) {
      num += (double(y[v]) - x[v]) * (double(y[v]) - x[v]);
      den += double(x[v]) * x[v];
    }
    agree += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
  }
  const double rel = std::sqrt(num / den), frac = double(agree) / tokens.size();
  std::printf("production vs exact: rel err by norm %.3e, argmax agreement %.4f\n", rel, frac);
  EXPECT_LE(rel, 2e-2);
  EXPECT_GE(frac, 0.98);
}

// ModelOptions::fuse_projections runs the projections of one input as one FusedLinear op; on the CPU backend that
// op is the loop of the same Linear calls, so the logits must be the same bits (exact and production mode; a
// prefill chunk and single-token steps; ratio-4 and ratio-128 layers).
TEST(ConsistencyTest, FusedProjectionsGiveTheSameBits) {
  for (const NumericMode mode : {NumericMode::kExact, NumericMode::kProduction}) {
    // Both options explicit: the default is fused, so the plain model must ask for one Linear per projection.
    auto unfused =
        Dsv4Model::Load(TinyCheckpoint(), {.mode = mode, .backend = &TestBackend(), .fuse_projections = false});
    auto fused = Dsv4Model::Load(TinyCheckpoint(), {.mode = mode, .backend = &TestBackend(), .fuse_projections = true});
    ASSERT_TRUE(unfused.ok()) << unfused.status();
    ASSERT_TRUE(fused.ok()) << fused.status();
    Dsv4Model& plain = **unfused;
    const auto tokens = RandomTokens(160, 11, static_cast<int>(plain.config().vocab_size));
    auto pa = generate::AllocateSequences(plain, 1, 160);
    auto pb = generate::AllocateSequences(**fused, 1, 160);
    ASSERT_TRUE(pa.ok() && pb.ok());
    for (const int chunk : {1, 64}) {
      ASSERT_TRUE(plain.ResetState(0).ok());
      ASSERT_TRUE((*fused)->ResetState(0).ok());
      auto a = generate::TeacherForce(plain, pa->tables[0], tokens, chunk);
      auto b = generate::TeacherForce(**fused, pb->tables[0], tokens, chunk);
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
      ASSERT_EQ(a->size(), b->size());
      size_t first_diff = a->size();
      for (size_t i = 0; i < a->size() && first_diff == a->size(); ++i) {
        if (std::memcmp(&(*a)[i], &(*b)[i], 4) != 0) first_diff = i;
      }
      EXPECT_EQ(first_diff, a->size()) << "mode " << static_cast<int>(mode) << " chunk " << chunk
                                       << ": fused and plain logits differ";
    }
  }
}

TEST(ConsistencyTest, DecodesAFewHundredTokens) {
  Dsv4Model& m = TinyModel(NumericMode::kExact);
  const std::vector<int32_t> prompt = {0, 17, 42, 99};
  auto plan = generate::AllocateSequences(m, 1, 300);
  ASSERT_TRUE(plan.ok());
  auto g = generate::Greedy(m, plan->tables[0], prompt, 290, 0, false);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->tokens.size(), 290u);
  for (int32_t t : g->tokens) ASSERT_TRUE(t >= 0 && t < m.config().vocab_size);
  std::printf("tiny exact decode: %.1f tokens/s (2 threads)\n", 290 / g->decode_seconds);
  EXPECT_LT(g->decode_seconds, 60.0);
}

TEST(ConsistencyTest, BadInputsAreRefused) {
  Dsv4Model& m = TinyModel(NumericMode::kExact);
  auto plan = generate::AllocateSequences(m, 2, 200);
  ASSERT_TRUE(plan.ok());
  std::vector<float> logits(2 * m.config().vocab_size);
  const std::vector<int32_t> ok_tok = {5}, bad_tok = {static_cast<int32_t>(m.config().vocab_size)};
  auto expect_error = [&](SeqChunk c, const std::string& needle) {
    const absl::Status st = m.Forward({&c, 1}, logits.data());
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(needle), std::string::npos) << st;
  };
  expect_error({.tables = &plan->tables[0], .tokens = bad_tok, .start_pos = 0}, "out of [0, 4096)");
  expect_error({.tables = &plan->tables[0], .tokens = ok_tok, .start_pos = 3}, "start_pos 3");
  expect_error({.tables = nullptr, .tokens = ok_tok, .start_pos = 0}, "tables is null");
  SeqBlockTables no_pages = plan->tables[0];
  no_pages.pages[0].clear();
  expect_error({.tables = &no_pages, .tokens = ok_tok, .start_pos = 0}, "pool 0 has 0 pages");
  SeqBlockTables bad_slot = plan->tables[0];
  bad_slot.state_slot = 9;
  expect_error({.tables = &bad_slot, .tokens = ok_tok, .start_pos = 0}, "state_slot 9");
  const SeqChunk twice[2] = {{.tables = &plan->tables[0], .tokens = ok_tok, .start_pos = 0},
                             {.tables = &plan->tables[0], .tokens = ok_tok, .start_pos = 0}};
  EXPECT_FALSE(m.Forward(twice, logits.data()).ok());
  EXPECT_FALSE(Dsv4Model::Load("/nonexistent/dsv4", {}).ok());
}

}  // namespace
}  // namespace dsv4::model::testing
