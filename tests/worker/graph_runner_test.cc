// GraphRunner (worker/graph_runner.h) on the CPU backend with a fake DeviceControl whose "graph" is the recorded
// enqueue function, re-run at each launch. That is what a CUDA graph is to the model - EnqueueStep(shape) with
// everything else read from the plan - so the runner's bucketing, padding, bucket lifecycle and error paths are
// checked here bit for bit against Forward; tests/cuda/graph_step_test.cc checks real graphs on a GPU.
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_sample.h"
#include "tests/model/model_fixture.h"
#include "tools/generate/runner.h"
#include "worker/graph_runner.h"

namespace dsv4::worker {
namespace {

using ::testing::HasSubstr;
using model::testing::RandomTokens;
using model::testing::TinyModel;

class FakeGraphs final : public kernels::DeviceControl {
 public:
  int captures = 0, launches = 0;
  int fail_capture_of = -1;  // the n-th capture (0-based) fails

  absl::StatusOr<kernels::DeviceMemory> Memory() override {
    return kernels::DeviceMemory{.total = 1 << 30, .free = (1 << 30) - captures * 4096};
  }
  void* stream() override { return nullptr; }
  absl::StatusOr<std::unique_ptr<kernels::StepGraph>> Capture(const std::function<absl::Status()>& enqueue) override {
    if (captures++ == fail_capture_of) return absl::InternalError("operation not permitted when stream is capturing");
    return std::unique_ptr<kernels::StepGraph>(new Graph(enqueue));
  }
  absl::Status Launch(kernels::StepGraph& graph) override {
    ++launches;
    return static_cast<Graph&>(graph).enqueue();
  }

 private:
  struct Graph final : public kernels::StepGraph {
    explicit Graph(std::function<absl::Status()> e) : enqueue(std::move(e)) {}
    int64_t nodes() const override { return 1; }
    std::function<absl::Status()> enqueue;
  };
};

// Counts phase marks, to see the runner detaches the hook while capturing and restores it.
struct CountingHook final : public model::PhaseHook {
  int marks = 0;
  void Begin(model::Phase) override { ++marks; }
  void End() override { ++marks; }
};

TEST(GraphRunner, ReplaysEqualForwardBitForBitThroughTheBucketLifecycle) {
  model::Dsv4Model& m = TinyModel(model::NumericMode::kProduction);
  const int64_t V = m.config().vocab_size;
  const int k = 5;
  auto plan = generate::AllocateSequences(m, 2 * k, 300);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CountingHook hook;
  m.SetPhaseHook(&hook);
  FakeGraphs graphs;
  GraphRunner runner(m, &graphs, {1, 2, 4, 8});
  absl::StatusOr<GraphCaptureReport> report = runner.CaptureAll();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->buckets.size(), 4u);
  EXPECT_EQ(graphs.captures, 4);
  EXPECT_EQ(hook.marks, 0) << "phase marks during warm-up or capture";
  EXPECT_EQ(runner.state(8), GraphRunner::BucketState::kCaptured);
  EXPECT_EQ(runner.BucketFor(5), 8);
  EXPECT_EQ(runner.BucketFor(9), 0);

  std::vector<std::vector<int32_t>> toks;
  for (int s = 0; s < k; ++s) toks.push_back(RandomTokens(300, 40 + s, static_cast<int>(V)));
  std::vector<int32_t> pos(k, 0);
  std::vector<model::SeqChunk> a(k), b(k);
  std::vector<float> want(k * V), got(k * V);
  const std::vector<int> prefill = {129, 3, 140, 60, 1};
  for (int step = 0; step < 16; ++step) {
    for (int s = 0; s < k; ++s) {
      const int n = step == 0 ? prefill[s] : 1;
      a[s] = {.tables = &plan->tables[s], .tokens = std::span(toks[s]).subspan(pos[s], n), .start_pos = pos[s]};
      b[s] = {.tables = &plan->tables[k + s], .tokens = a[s].tokens, .start_pos = pos[s]};
      pos[s] += n;
    }
    ASSERT_TRUE(m.Forward(a, want.data()).ok());
    if (step == 0) {  // prefill: eager, as the executor does
      ASSERT_TRUE(m.Forward(b, got.data()).ok());
      continue;
    }
    if (step == 6) runner.InvalidateAll();  // the graphs go; the bucket's steps run their padded plan eagerly
    if (step == 10) {
      ASSERT_TRUE(runner.CaptureAll().ok());
    }
    const bool timed = step == 3;  // a step the phase timer measures runs eagerly
    const absl::Status s = runner.RunDecode(b, got.data(), timed);
    ASSERT_TRUE(s.ok()) << s;
    for (int64_t i = 0; i < k * V; ++i) {
      ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0)
          << "step " << step << " row " << i / V << " col " << i % V << ": runner " << got[i] << " vs Forward "
          << want[i] << " (bucket 8 state " << static_cast<int>(runner.state(8)) << ")";
    }
    if (step == 6) {
      EXPECT_EQ(runner.state(8), GraphRunner::BucketState::kInvalid);
    }
  }
  // Steps 1..15: 3 (timed) and 6..9 (invalid) eager, the other 10 replayed.
  EXPECT_EQ(runner.replays(8), 10);
  EXPECT_EQ(runner.eager_steps(8), 5);
  EXPECT_EQ(runner.state(8), GraphRunner::BucketState::kCaptured);
  EXPECT_GT(hook.marks, 0) << "the hook is back after capturing (eager steps mark phases)";
  m.SetPhaseHook(nullptr);
}

TEST(GraphRunner, ReplaysWithSamplingDrawTheReferenceSamplersTokens) {
  model::Dsv4Model& m = TinyModel(model::NumericMode::kExact);
  const int64_t V = m.config().vocab_size;
  const int k = 3;
  auto plan = generate::AllocateSequences(m, 2 * k, 200);
  ASSERT_TRUE(plan.ok()) << plan.status();
  FakeGraphs graphs;
  GraphRunner runner(m, &graphs, {1, 4});
  ASSERT_TRUE(runner.CaptureAll().ok());
  std::vector<std::vector<int32_t>> toks;
  for (int s = 0; s < k; ++s) toks.push_back(RandomTokens(200, 80 + s, static_cast<int>(V)));
  std::vector<int32_t> pos(k, 0), got(k);
  std::vector<model::SeqChunk> a(k), b(k);
  std::vector<float> logits(k * V);
  std::vector<uint64_t> scratch(V);
  for (int step = 0; step < 10; ++step) {
    for (int s = 0; s < k; ++s) {
      const int n = step == 0 ? 30 + 50 * s : 1;
      a[s] = {.tables = &plan->tables[s], .tokens = std::span(toks[s]).subspan(pos[s], n), .start_pos = pos[s]};
      b[s] = {.tables = &plan->tables[k + s], .tokens = a[s].tokens, .start_pos = pos[s]};
      pos[s] += n;
    }
    ASSERT_TRUE(m.Forward(a, logits.data()).ok());
    if (step == 0) {
      ASSERT_TRUE(m.Forward(b, logits.data()).ok());
      continue;
    }
    std::vector<kernels::SampleParams> params(k);
    for (int s = 0; s < k; ++s) {
      params[s] = {.temperature = 0.3f * s, .top_p = 0.9f, .seed = 100u + s, .index = static_cast<uint64_t>(step)};
    }
    ASSERT_TRUE(runner.RunDecodeSample(b, params, got.data(), /*eager=*/step % 3 == 0).ok());
    for (int s = 0; s < k; ++s) {
      EXPECT_EQ(got[s], kernels::cpu::SampleRow(std::span(logits).subspan(s * V, V), params[s], scratch))
          << "step " << step << " row " << s;
    }
  }
  EXPECT_GT(runner.replays(4), 0);
  EXPECT_GT(runner.eager_steps(4), 0);
}

TEST(GraphRunner, AFailedCaptureNamesTheBucketAndRestoresTheHook) {
  model::Dsv4Model& m = TinyModel(model::NumericMode::kExact);
  auto plan = generate::AllocateSequences(m, 4, 64);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CountingHook hook;
  m.SetPhaseHook(&hook);
  FakeGraphs graphs;
  graphs.fail_capture_of = 2;
  GraphRunner runner(m, &graphs, {1, 2, 4});
  absl::StatusOr<GraphCaptureReport> report = runner.CaptureAll();
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("graph bucket 4"));
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("not permitted when stream is capturing"));
  EXPECT_EQ(m.options().phase_hook, &hook);
  EXPECT_EQ(runner.state(2), GraphRunner::BucketState::kCaptured);
  EXPECT_EQ(runner.state(4), GraphRunner::BucketState::kNone);
  m.SetPhaseHook(nullptr);
}

TEST(GraphRunner, RefusesBucketsThatDoNotFitAndStepsAboveTheLast) {
  model::Dsv4Model& m = TinyModel(model::NumericMode::kExact);
  auto plan = generate::AllocateSequences(m, 4, 64);
  ASSERT_TRUE(plan.ok()) << plan.status();
  FakeGraphs graphs;
  EXPECT_EQ(GraphRunner(m, &graphs, {4, 2}).CaptureAll().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GraphRunner(m, &graphs, {1, 8}).CaptureAll().status().code(), absl::StatusCode::kInvalidArgument)
      << "8 sequences do not fit 4 state slots";
  GraphRunner runner(m, nullptr, {1, 2});  // no device: eager padded steps only
  ASSERT_TRUE(runner.CaptureAll().ok());
  EXPECT_EQ(runner.state(2), GraphRunner::BucketState::kNone);
  const std::vector<int32_t> t = {5};
  std::vector<model::SeqChunk> three(3, model::SeqChunk{.tables = &plan->tables[0], .tokens = t, .start_pos = 0});
  for (int i = 0; i < 3; ++i) three[i].tables = &plan->tables[i];
  std::vector<float> logits(3 * m.config().vocab_size);
  const absl::Status s = runner.RunDecode(three, logits.data(), false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("largest graph bucket 2"));
  EXPECT_TRUE(runner.RunDecode(std::span(three).subspan(0, 2), logits.data(), false).ok());
  EXPECT_EQ(runner.eager_steps(2), 1);
}

}  // namespace
}  // namespace dsv4::worker
