// The step API CUDA graphs are built on (model.h: PrepareStep / EnqueueStep / FinishStep): a step padded to a
// larger shape (padding tokens pos -1, padding sequences seq_len 0) gives the same logits for the real rows as the
// unpadded Forward, bit for bit on the CPU backend; an all-padding step (the graph runner's warm-up) changes no
// state; the Sample op at the end of a step draws the reference sampler's tokens; shapes that do not fit are
// refused naming the limit.
#include <cstring>
#include <functional>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_sample.h"
#include "tests/model/model_fixture.h"
#include "tools/generate/runner.h"

namespace dsv4::model::testing {
namespace {

// Index of the first differing float (-1 when equal), for a message that says where.
int64_t FirstDifference(const std::vector<float>& a, const std::vector<float>& b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  }
  return -1;
}

// Runs sequences [0, k) with Forward and the same tokens in sequences [k, 2k) through the padded step API, step
// by step, and compares the logits. `shape_of(chunks)` picks the padded shape of each step.
void ExpectPaddedEqualsForward(NumericMode mode, int k, const std::vector<int>& prefill,
                               const std::function<StepShape(int64_t seqs, int max_len, int64_t tokens)>& shape_of,
                               int decode_steps, bool warm_up_between) {
  Dsv4Model& m = TinyModel(mode);
  const int64_t V = m.config().vocab_size;
  auto plan = generate::AllocateSequences(m, 2 * k, 400);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::vector<int32_t>> toks;
  for (int s = 0; s < k; ++s) toks.push_back(RandomTokens(400, 900 + s, static_cast<int>(V)));
  std::vector<int32_t> pos(k, 0);
  std::vector<float> want(k * V), got(k * V);
  std::vector<SeqChunk> a(k), b(k);
  for (int step = 0; step < 1 + decode_steps; ++step) {
    int max_len = 1;
    int64_t tokens = 0;
    for (int s = 0; s < k; ++s) {
      const int n = step == 0 ? prefill[s] : 1;
      a[s] = {.tables = &plan->tables[s], .tokens = std::span(toks[s]).subspan(pos[s], n), .start_pos = pos[s]};
      b[s] = {.tables = &plan->tables[k + s], .tokens = a[s].tokens, .start_pos = pos[s]};
      pos[s] += n;
      max_len = std::max(max_len, n);
      tokens += n;
    }
    ASSERT_TRUE(m.Forward(a, want.data()).ok());
    const StepShape shape = shape_of(k, max_len, tokens);
    if (warm_up_between) {  // an all-padding step of the same shape must leave every sequence as it was
      ASSERT_TRUE(m.PrepareStep({}, shape).ok());
      ASSERT_TRUE(m.EnqueueStep(shape).ok());
      ASSERT_TRUE(m.FinishStep(nullptr, 0).ok());
    }
    const absl::Status prepared = m.PrepareStep(b, shape);
    ASSERT_TRUE(prepared.ok()) << prepared;
    ASSERT_TRUE(m.EnqueueStep(shape).ok());
    ASSERT_TRUE(m.FinishStep(got.data(), k).ok());
    const int64_t at = FirstDifference(got, want, k * V);
    ASSERT_EQ(at, -1) << "step " << step << " (shape " << shape.tokens << " tokens, " << shape.seqs
                      << " sequences): row " << at / V << " col " << at % V << ": padded " << got[at]
                      << " vs Forward " << want[at];
  }
}

TEST(StepApiTest, PaddedDecodeBucketEqualsForwardBitForBit) {
  for (NumericMode mode : {NumericMode::kExact, NumericMode::kProduction}) {
    // 5 sequences at different positions (past the window and a ratio-128 row) decoded in a bucket of 8.
    ExpectPaddedEqualsForward(
        mode, 5, {131, 140, 9, 260, 1},
        [](int64_t seqs, int max_len, int64_t tokens) {
          return max_len == 1 ? StepShape::Decode(8) : StepShape{.tokens = tokens, .seqs = seqs, .max_seq_len = max_len};
        },
        12, /*warm_up_between=*/false);
  }
}

TEST(StepApiTest, AllPaddingWarmUpStepChangesNothing) {
  ExpectPaddedEqualsForward(
      NumericMode::kProduction, 4, {70, 129, 3, 200},
      [](int64_t seqs, int max_len, int64_t tokens) {
        return max_len == 1 ? StepShape::Decode(8) : StepShape{.tokens = tokens, .seqs = seqs, .max_seq_len = max_len};
      },
      6, /*warm_up_between=*/true);
}

TEST(StepApiTest, PaddedPrefillShapeEqualsForward) {
  // Prefill chunks padded with both padding tokens and padding sequences, then decode steps padded likewise.
  ExpectPaddedEqualsForward(
      NumericMode::kExact, 3, {37, 5, 130},
      [](int64_t, int max_len, int64_t tokens) {
        return StepShape{.tokens = tokens + 11, .seqs = 6, .max_seq_len = max_len + 3};
      },
      4, /*warm_up_between=*/false);
}

TEST(StepApiTest, SamplingInTheStepDrawsTheHostSamplersTokens) {
  // The Sample op at the end of a padded step draws, for each chunk, the token the reference sampler draws from
  // Forward's logits; chunks without parameters and padding rows draw nothing (-1).
  Dsv4Model& m = TinyModel(NumericMode::kProduction);
  const int64_t V = m.config().vocab_size;
  const int k = 4;
  auto plan = generate::AllocateSequences(m, 2 * k, 300);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::vector<int32_t>> toks;
  for (int s = 0; s < k; ++s) toks.push_back(RandomTokens(300, 60 + s, static_cast<int>(V)));
  std::vector<int32_t> pos(k, 0);
  std::vector<SeqChunk> a(k), b(k);
  std::vector<float> logits(k * V);
  std::vector<int32_t> got(k);
  std::vector<uint64_t> scratch(V);
  for (int step = 0; step < 8; ++step) {
    for (int s = 0; s < k; ++s) {
      const int n = step == 0 ? 20 + 37 * s : 1;
      a[s] = {.tables = &plan->tables[s], .tokens = std::span(toks[s]).subspan(pos[s], n), .start_pos = pos[s]};
      b[s] = {.tables = &plan->tables[k + s], .tokens = a[s].tokens, .start_pos = pos[s]};
      pos[s] += n;
    }
    // Row 0 greedy, row 1 temperature + top-k, row 2 top-p + min-p, row 3 draws nothing.
    const std::vector<kernels::SampleParams> params = {
        {.temperature = 0.f, .seed = 1, .index = static_cast<uint64_t>(step)},
        {.temperature = 0.8f, .top_k = 40, .seed = 7, .index = static_cast<uint64_t>(step)},
        {.temperature = 1.2f, .top_p = 0.9f, .min_p = 0.05f, .seed = 9, .index = static_cast<uint64_t>(step)},
        {.temperature = -1.f}};
    ASSERT_TRUE(m.Forward(a, logits.data()).ok());
    const StepShape shape = step == 0 ? Dsv4Model::ShapeOf(b) : StepShape::Decode(8);
    ASSERT_TRUE(m.PrepareStep(b, shape, params).ok());
    ASSERT_TRUE(m.EnqueueStep(shape, /*sample=*/true).ok());
    const absl::Status finished = m.FinishStepTokens(got.data(), k);
    ASSERT_TRUE(finished.ok()) << finished;
    for (int s = 0; s < k; ++s) {
      const int32_t want = params[s].temperature < 0
                               ? -1
                               : kernels::cpu::SampleRow(std::span(logits).subspan(s * V, V), params[s], scratch);
      EXPECT_EQ(got[s], want) << "step " << step << " row " << s;
    }
  }
}

TEST(StepApiTest, ShapesThatDoNotFitAreRefused) {
  Dsv4Model& m = TinyModel(NumericMode::kExact);
  auto plan = generate::AllocateSequences(m, 4, 64);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<int32_t> toks = {5, 6, 7};
  const SeqChunk c{.tables = &plan->tables[0], .tokens = toks, .start_pos = 0};
  auto refused = [&](const StepShape& shape, const std::string& says) {
    const absl::Status s = m.PrepareStep({&c, 1}, shape);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(says), std::string::npos) << s;
  };
  refused(StepShape::Decode(2), "more than the step shape's 1 per chunk");
  refused({.tokens = 2, .seqs = 1, .max_seq_len = 3}, "more than its shape's 2");
  refused({.tokens = 8, .seqs = 5, .max_seq_len = 3}, "more than the 4 state slots");
  refused({.tokens = 1 << 20, .seqs = 1, .max_seq_len = 3}, "max_step_tokens");
  EXPECT_EQ(m.EnqueueStep(StepShape::Decode(5)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.FinishStep(nullptr, 3).code(), absl::StatusCode::kInvalidArgument);
  // Nothing was consumed by the refusals: the chunk still starts at 0.
  std::vector<float> logits(m.config().vocab_size);
  EXPECT_TRUE(m.Forward({&c, 1}, logits.data()).ok());
}

}  // namespace
}  // namespace dsv4::model::testing
