// CUDA graphs of whole decode steps on the tiny model (issue 15; worker/graph_runner.h, kernels/cuda/cuda_graphs.h):
// the backend's DeviceControl (memory, stream, a capture that synchronises fails and leaves the stream usable);
// a decode step padded to its bucket matches the unpadded Forward; a replayed graph gives the eager step's logits
// bit for bit; a replayed graph's Sample op draws the host sampler's token from the eager logits; every bucket up
// to 32 captures (time, nodes, memory printed); the executor's CUDA-event phase timer
// measures attention, MoE and dense time on timed steps while the other steps replay graphs; the host time of a
// replayed step (plan packing + copy + launch) against the whole step, printed per bucket. Label gpu: skips with a
// message without a usable GPU.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "gtest/gtest.h"
#include "tests/gpu_check/gpu_check.h"
#include "kernels/backend_factory.h"
#include "kernels/cpu/cpu_sample.h"
#include "kernels/cuda/pdl.h"
#include "kernels/device_control.h"
#include "metrics/phase_timer.h"
#include "tests/model/model_fixture.h"
#include "tools/generate/runner.h"
#include "worker/dsv4_executor.h"
#include "worker/graph_runner.h"

namespace dsv4::model::testing {
namespace {

kernels::Backend& Cuda() {
  static std::unique_ptr<kernels::Backend> b = [] {
    auto made = kernels::MakeBackend({.name = "cuda"});
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? std::move(*made) : nullptr;
  }();
  return *b;
}

std::unique_ptr<Dsv4Model> Load(NumericMode mode) {
  auto m = Dsv4Model::Load(TinyCheckpoint(), {.mode = mode, .backend = &Cuda(), .max_step_tokens = 512,
                                              .max_context = 1024});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

struct Diff {
  double max_abs = 0, max_ref = 0;
  int64_t first_diff = -1;  // first index not bit-identical
  int argmax_mismatch = 0;  // rows whose argmax differs
  int argmax_not_tie = 0;   // of those, rows where want's logits of the two tokens differ by > 2e-3 of max|logit|
};

Diff Compare(const std::vector<float>& got, const std::vector<float>& want, int64_t rows, int64_t V) {
  Diff d;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = &got[r * V];
    const float* w = &want[r * V];
    const int64_t ag = std::max_element(g, g + V) - g, aw = std::max_element(w, w + V) - w;
    double row_max = 0;
    for (int64_t v = 0; v < V; ++v) row_max = std::max<double>(row_max, std::fabs(w[v]));
    if (ag != aw) {
      ++d.argmax_mismatch;
      d.argmax_not_tie += std::fabs(static_cast<double>(w[ag]) - w[aw]) > 2e-3 * row_max;
    }
    for (int64_t v = 0; v < V; ++v) {
      if (d.first_diff < 0 && std::memcmp(&g[v], &w[v], 4) != 0) d.first_diff = r * V + v;
      d.max_abs = std::isnan(g[v]) ? INFINITY : std::max<double>(d.max_abs, std::fabs(g[v] - w[v]));
      d.max_ref = std::max<double>(d.max_ref, std::fabs(w[v]));
    }
  }
  return d;
}

// k sequences of random tokens at different positions: set A in slots [0, k), the same tokens in slots [k, 2k).
struct TwoSets {
  generate::TablePlan plan;
  std::vector<std::vector<int32_t>> toks;
  std::vector<int32_t> pos;
  std::vector<SeqChunk> a, b;
  int k = 0;

  // Chunks of this step (prefill[s] tokens on step 0, then one each).
  void Next(int step, const std::vector<int>& prefill) {
    for (int s = 0; s < k; ++s) {
      const int n = step == 0 ? prefill[s] : 1;
      a[s] = {.tables = &plan.tables[s], .tokens = std::span(toks[s]).subspan(pos[s], n), .start_pos = pos[s]};
      b[s] = {.tables = &plan.tables[k + s], .tokens = a[s].tokens, .start_pos = pos[s]};
      pos[s] += n;
    }
  }
};

TwoSets MakeSets(Dsv4Model& m, int k, int max_len) {
  TwoSets t;
  t.k = k;
  auto plan = generate::AllocateSequences(m, 2 * k, max_len);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (plan.ok()) t.plan = std::move(*plan);
  for (int s = 0; s < k; ++s) t.toks.push_back(RandomTokens(max_len, 700 + s, static_cast<int>(m.config().vocab_size)));
  t.pos.assign(k, 0);
  t.a.resize(k);
  t.b.resize(k);
  return t;
}

TEST(CudaGraphStep, DeviceControlMemoryStreamAndAFailedCapture) {
  DSV4_SKIP_WITHOUT_GPU();
  kernels::DeviceControl* device = Cuda().device_control();
  ASSERT_NE(device, nullptr) << "the CUDA backend offers no DeviceControl";
  auto mem = device->Memory();
  ASSERT_TRUE(mem.ok()) << mem.status();
  std::printf("device memory: total %.1f MiB, free %.1f MiB\n", mem->total / 1048576.0, mem->free / 1048576.0);
  EXPECT_GT(mem->total, 0);
  EXPECT_GT(mem->free, 0);
  EXPECT_LE(mem->free, mem->total);
  EXPECT_NE(device->stream(), nullptr);
  // Synchronising inside a capture is not allowed: the capture fails with a message, the stream stays usable.
  auto bad = device->Capture([] { return Cuda().Synchronize(); });
  ASSERT_FALSE(bad.ok());
  std::printf("a synchronising capture fails with: %s\n", bad.status().ToString().c_str());
  EXPECT_TRUE(Cuda().Synchronize().ok());
  auto m = Load(NumericMode::kProduction);
  ASSERT_NE(m, nullptr);
  auto plan = generate::AllocateSequences(*m, 1, 64);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<int32_t> toks = {5, 6, 7};
  const SeqChunk c{.tables = &plan->tables[0], .tokens = toks, .start_pos = 0};
  std::vector<float> logits(m->config().vocab_size);
  const absl::Status s = m->Forward({&c, 1}, logits.data());
  EXPECT_TRUE(s.ok()) << "a step after the failed capture: " << s;
}

TEST(CudaGraphStep, PaddedDecodeMatchesForward) {
  DSV4_SKIP_WITHOUT_GPU();
  auto m = Load(NumericMode::kProduction);
  ASSERT_NE(m, nullptr);
  const int64_t V = m->config().vocab_size;
  const int k = 5;
  TwoSets t = MakeSets(*m, k, 300);
  std::vector<float> want(k * V), got(k * V);
  const std::vector<int> prefill = {129, 3, 140, 60, 1};
  for (int step = 0; step < 12; ++step) {
    t.Next(step, prefill);
    ASSERT_TRUE(m->Forward(t.a, want.data()).ok());
    if (step == 0) {
      ASSERT_TRUE(m->Forward(t.b, got.data()).ok());
      continue;
    }
    const StepShape shape = StepShape::Decode(8);
    ASSERT_TRUE(m->PrepareStep(t.b, shape).ok());
    ASSERT_TRUE(m->EnqueueStep(shape).ok());
    const absl::Status s = m->FinishStep(got.data(), k);
    ASSERT_TRUE(s.ok()) << s;
    const Diff d = Compare(got, want, k, V);
    std::printf("step %d: padded to 8 vs unpadded %d: max |diff| %.3e (max |logit| %.3e), argmax mismatches %d "
                "(%d not at a near tie)%s\n", step, k, d.max_abs, d.max_ref, d.argmax_mismatch, d.argmax_not_tie,
                d.first_diff < 0 ? ", bit-identical" : "");
    EXPECT_LE(d.max_abs, 1e-3 * d.max_ref) << "step " << step;
    EXPECT_EQ(d.argmax_not_tie, 0) << "step " << step << ": a token differs where the logits are not nearly tied";
  }
}

TEST(CudaGraphStep, ReplayEqualsEagerBitForBit) {
  DSV4_SKIP_WITHOUT_GPU();
  auto m = Load(NumericMode::kProduction);
  ASSERT_NE(m, nullptr);
  const int64_t V = m->config().vocab_size;
  const int k = 6;
  TwoSets t = MakeSets(*m, k, 300);
  worker::GraphRunner runner(*m, Cuda().device_control(), {1, 2, 4, 8});
  auto report = runner.CaptureAll();
  ASSERT_TRUE(report.ok()) << report.status();
  std::vector<float> eager(k * V), replayed(k * V);
  const std::vector<int> prefill = {100, 3, 140, 60, 1, 129};
  for (int step = 0; step < 20; ++step) {
    t.Next(step, prefill);
    if (step == 0) {
      ASSERT_TRUE(m->Forward(t.a, eager.data()).ok());
      ASSERT_TRUE(m->Forward(t.b, replayed.data()).ok());
      continue;
    }
    // The same padded plan (bucket 8) enqueued eagerly for set A, the bucket's graph replayed for set B.
    absl::Status s = runner.RunDecode(t.a, eager.data(), /*eager=*/true);
    ASSERT_TRUE(s.ok()) << s;
    s = runner.RunDecode(t.b, replayed.data(), /*eager=*/false);
    ASSERT_TRUE(s.ok()) << s;
    const Diff d = Compare(replayed, eager, k, V);
    ASSERT_EQ(d.argmax_mismatch, 0) << "step " << step << ": graph and eager disagree on a token";
    EXPECT_EQ(d.first_diff, -1) << "step " << step << ": graph vs eager not bit-identical (row "
                                << d.first_diff / V << " col " << d.first_diff % V << ", max |diff| " << d.max_abs
                                << "): a kernel that is not deterministic, or a value baked in at capture";
  }
  EXPECT_EQ(runner.replays(8), 19);
  EXPECT_EQ(runner.eager_steps(8), 19);
}

// Programmatic dependent launch (kernels/cuda/pdl.h) changes when a kernel's blocks become resident, never what
// they compute: the same steps with PDL off (set A, eager) and on (set B, eager and replayed graphs captured with
// it on) must give the same bits. A kernel that touched memory before its PdlEnter() would race its predecessor
// and may show up here (or in the graph-vs-eager test above, which runs with PDL on) - only where the race corrupts
// data, and only on the kernel paths the tiny model takes.
TEST(CudaGraphStep, PdlOnAndOffGiveTheSameBits) {
  DSV4_SKIP_WITHOUT_GPU();
  struct ResetPdl {  // the override must not outlive this test, also when an ASSERT returns early
    ~ResetPdl() { kernels::cuda::SetPdlForTesting(-1); }
  } reset_pdl;
  auto m = Load(NumericMode::kProduction);
  ASSERT_NE(m, nullptr);
  const int64_t V = m->config().vocab_size;
  const int k = 5;
  TwoSets t = MakeSets(*m, k, 300);
  kernels::cuda::SetPdlForTesting(1);
  worker::GraphRunner runner(*m, Cuda().device_control(), {1, 2, 4, 8});
  auto report = runner.CaptureAll();
  ASSERT_TRUE(report.ok()) << report.status();
  std::vector<float> off(k * V), on(k * V);
  const std::vector<int> prefill = {90, 2, 130, 1, 64};
  for (int step = 0; step < 24; ++step) {
    t.Next(step, prefill);
    kernels::cuda::SetPdlForTesting(0);
    absl::Status s = step == 0 ? m->Forward(t.a, off.data()) : runner.RunDecode(t.a, off.data(), /*eager=*/true);
    ASSERT_TRUE(s.ok()) << s;
    kernels::cuda::SetPdlForTesting(1);
    // Odd steps replay the graphs (captured with PDL on), even ones launch eagerly with it on.
    s = step == 0 ? m->Forward(t.b, on.data()) : runner.RunDecode(t.b, on.data(), /*eager=*/step % 2 == 0);
    ASSERT_TRUE(s.ok()) << s;
    const Diff d = Compare(on, off, k, V);
    EXPECT_EQ(d.first_diff, -1) << "step " << step << ": PDL on vs off not bit-identical (row " << d.first_diff / V
                                << ", max |diff| " << d.max_abs << ")";
  }
  EXPECT_EQ(runner.replays(8), 12);      // odd steps 1..23
  EXPECT_EQ(runner.eager_steps(8), 34);  // set A on steps 1..23, set B on even steps 2..22
}

TEST(CudaGraphStep, ReplayedSamplingDrawsTheHostSamplersTokensFromEagerLogits) {
  DSV4_SKIP_WITHOUT_GPU();
  auto m = Load(NumericMode::kProduction);
  ASSERT_NE(m, nullptr);
  const int64_t V = m->config().vocab_size;
  const int k = 5;
  TwoSets t = MakeSets(*m, k, 300);
  worker::GraphRunner runner(*m, Cuda().device_control(), {1, 2, 4, 8});
  ASSERT_TRUE(runner.CaptureAll().ok());
  std::vector<float> logits(k * V);
  std::vector<int32_t> got(k);
  std::vector<uint64_t> scratch(V);
  const std::vector<int> prefill = {64, 3, 140, 20, 129};
  int mismatches = 0;
  for (int step = 0; step < 16; ++step) {
    t.Next(step, prefill);
    if (step == 0) {
      ASSERT_TRUE(m->Forward(t.a, logits.data()).ok());
      ASSERT_TRUE(m->Forward(t.b, logits.data()).ok());
      continue;
    }
    std::vector<kernels::SampleParams> params(k);
    for (int s = 0; s < k; ++s) {
      params[s] = {.temperature = 0.25f * s, .top_k = s == 3 ? 20 : 0, .top_p = s == 4 ? 0.8f : 1.f,
                   .seed = 1000u + s, .index = static_cast<uint64_t>(step)};
    }
    ASSERT_TRUE(runner.RunDecode(t.a, logits.data(), /*eager=*/true).ok());
    const absl::Status s = runner.RunDecodeSample(t.b, params, got.data(), /*eager=*/false);
    ASSERT_TRUE(s.ok()) << s;
    for (int r = 0; r < k; ++r) {
      const int32_t want = kernels::cpu::SampleRow(std::span(logits).subspan(r * V, V), params[r], scratch);
      if (got[r] != want) {
        ++mismatches;
        ADD_FAILURE() << "step " << step << " row " << r << " (temperature " << params[r].temperature
                      << "): the replayed graph's Sample op drew " << got[r] << ", the host sampler " << want
                      << " from the eager step's logits";
      }
    }
  }
  std::printf("replayed Sample op vs host sampler of eager logits: %d mismatches over 15 steps x %d rows\n",
              mismatches, k);
}

TEST(CudaGraphStep, EveryBucketUpTo32Captures) {
  DSV4_SKIP_WITHOUT_GPU();
  auto m = Load(NumericMode::kProduction);
  ASSERT_NE(m, nullptr);
  auto plan = generate::AllocateSequences(*m, 32, 1024);
  ASSERT_TRUE(plan.ok()) << plan.status();
  worker::GraphRunner runner(*m, Cuda().device_control(), {1, 2, 4, 8, 16, 24, 32});
  auto report = runner.CaptureAll();
  ASSERT_TRUE(report.ok()) << report.status();
  std::printf("capture: %s\n", report->ToString().c_str());
  ASSERT_EQ(report->buckets.size(), 7u);
  for (const auto& b : report->buckets) EXPECT_GT(b.nodes, 0) << "bucket " << b.bucket;
}

TEST(CudaGraphStep, ExecutorTimesPhasesOnTheGpuBetweenReplays) {
  DSV4_SKIP_WITHOUT_GPU();
  std::map<metrics::Phase, double> seconds;
  auto ex = worker::LoadDsv4Executor({.checkpoint = TinyCheckpoint(), .mode = "production", .backend = "cuda",
                                      .max_step_tokens = 512, .max_context = 1024,
                                      .phase_sink = [&](metrics::Phase p, double s) { seconds[p] += s; },
                                      .phase_timing_every = 2});
  ASSERT_TRUE(ex.ok()) << ex.status();
  worker::ModelExecutor& e = **ex;
  ASSERT_NE(e.phase_timer(), nullptr);
  const int k = 4;
  ASSERT_TRUE(e.AllocateCache({4 * k, 8 * k, 2 * k, 8 * k}, 64, k).ok());
  auto graphs = e.CaptureGraphs({1, 2, 4});
  ASSERT_TRUE(graphs.ok()) << graphs.status();
  std::vector<SeqBlockTables> tables(k);
  for (int s = 0; s < k; ++s) {
    tables[s].state_slot = s;
    tables[s].pages[0] = {4 * s, 4 * s + 1};
    for (int i = 0; i < 8; ++i) tables[s].pages[1].push_back(8 * s + i);
    tables[s].pages[2] = {2 * s};
    for (int i = 0; i < 8; ++i) tables[s].pages[3].push_back(8 * s + i);
    ASSERT_TRUE(e.ResetState(s).ok());
  }
  std::vector<std::vector<int32_t>> toks;
  for (int s = 0; s < k; ++s) toks.push_back(RandomTokens(200, 90 + s, 4096));
  std::vector<SeqChunk> chunks(k);
  std::vector<float> logits(k * 4096);
  for (int step = 0; step < 40; ++step) {
    for (int s = 0; s < k; ++s) {
      const int start = step == 0 ? 0 : 100 + step - 1, n = step == 0 ? 100 : 1;
      chunks[s] = {.tables = &tables[s], .tokens = std::span(toks[s]).subspan(start, n), .start_pos = start};
    }
    e.phase_timer()->BeginStep();
    const absl::Status st = e.Forward(chunks, logits.data());
    e.phase_timer()->EndStep();
    ASSERT_TRUE(st.ok()) << "step " << step << ": " << st;
  }
  auto* cuda_timer = dynamic_cast<metrics::CudaPhaseTimer*>(e.phase_timer());
  ASSERT_NE(cuda_timer, nullptr) << "the CUDA executor's timer is not the CUDA-event one";
  ASSERT_TRUE(cuda_timer->Flush().ok());
  std::printf("phase seconds over %lld timed steps: attention %.6f, moe %.6f, dense %.6f, comm %.6f, other %.6f\n",
              static_cast<long long>(cuda_timer->steps_reported()), seconds[metrics::Phase::kAttention],
              seconds[metrics::Phase::kMoe], seconds[metrics::Phase::kDense], seconds[metrics::Phase::kComm],
              seconds[metrics::Phase::kOther]);
  EXPECT_GE(cuda_timer->steps_reported(), 15) << "1 step in 2 of 40 should be measured";
  EXPECT_GT(seconds[metrics::Phase::kAttention], 0);
  EXPECT_GT(seconds[metrics::Phase::kMoe], 0);
  EXPECT_GT(seconds[metrics::Phase::kDense], 0);
}

TEST(CudaGraphStep, HostTimePerReplayedStep) {
  DSV4_SKIP_WITHOUT_GPU();
  auto m = Load(NumericMode::kProduction);
  ASSERT_NE(m, nullptr);
  const int kMax = 64;
  auto plan = generate::AllocateSequences(*m, kMax, 1024);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<int> buckets = {1, 8, 32, 64};
  worker::GraphRunner runner(*m, Cuda().device_control(), buckets);
  ASSERT_TRUE(runner.CaptureAll().ok());
  std::vector<float> logits(kMax * m->config().vocab_size);
  std::vector<int32_t> tok(kMax, 5);
  std::printf("bucket  prepare_us  launch_us  finish_us  step_us  host share (prepare + launch) / step\n");
  std::vector<int32_t> pos(kMax, 0);  // each sequence's next position, kept across the buckets
  for (int b : buckets) {
    std::vector<SeqChunk> chunks(b);
    worker::GraphRunner::StepTimes sum;
    const int warm = 5, steps = 50;
    for (int step = 0; step < warm + steps; ++step) {
      for (int s = 0; s < b; ++s) {
        chunks[s] = {.tables = &plan->tables[s], .tokens = std::span(tok).subspan(s, 1), .start_pos = pos[s]++};
      }
      const absl::Status st = runner.RunDecode(chunks, logits.data(), false);
      ASSERT_TRUE(st.ok()) << st;
      if (step < warm) continue;
      const worker::GraphRunner::StepTimes& t = runner.last_step_times();
      sum.prepare_s += t.prepare_s;
      sum.launch_s += t.launch_s;
      sum.finish_s += t.finish_s;
    }
    const double step = (sum.prepare_s + sum.launch_s + sum.finish_s) / steps;
    std::printf("%6d  %10.1f  %9.1f  %9.1f  %7.1f  %.2f%%\n", b, 1e6 * sum.prepare_s / steps,
                1e6 * sum.launch_s / steps, 1e6 * sum.finish_s / steps, 1e6 * step,
                100 * (sum.prepare_s + sum.launch_s) / steps / step);
    EXPECT_EQ(runner.replays(b), warm + steps);
  }
}

}  // namespace
}  // namespace dsv4::model::testing
