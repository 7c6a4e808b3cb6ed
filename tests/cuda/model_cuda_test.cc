// The whole DeepSeek-V4 forward on the CUDA backend, teacher-forced on transformers' golden sequences
// (GPU-ENGINE.md §3): the GPU production mode is no worse than the CPU production mode against the goldens
// (argmax agreement within 1 point of the CPU's, median per-position error within 2x of the CPU's) and agrees with
// the CPU production mode on >= 97% of argmaxes; the GPU exact mode (fp32 KV rows, no indexer simulation; bf16
// GEMM inputs) matches the CPU exact mode within 1e-2 of max|logit|; the same production checks hold on a
// checkpoint written with MXFP4 experts (against the CPU, there are no goldens for it); fused projections
// (ModelOptions::fuse_projections) agree with the unfused forward. Label gpu: skips without a usable GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <cuda_runtime_api.h>

#include "gtest/gtest.h"
#include "tests/gpu_check/gpu_check.h"
#include "kernels/backend_factory.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/model/golden_util.h"
#include "tests/model/model_fixture.h"
#include "tools/generate/runner.h"
#include "tools/make_checkpoint/generator.h"

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

std::unique_ptr<Dsv4Model> Load(const std::string& dir, NumericMode mode, kernels::Backend& backend) {
  auto m = Dsv4Model::Load(dir, {.mode = mode, .backend = &backend, .max_step_tokens = 512, .max_context = 1024});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

std::vector<float> Force(Dsv4Model& m, const std::vector<int32_t>& tokens, int chunk) {
  auto plan = generate::AllocateSequences(m, 1, 1024);
  EXPECT_TRUE(plan.ok()) << plan.status();
  auto out = generate::TeacherForce(m, plan->tables[0], tokens, chunk);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? std::move(*out) : std::vector<float>{};
}

// Fraction of rows whose argmax is the same, and max |a - b| / max |b| over the block.
std::pair<double, double> AgreeAndRel(const std::vector<float>& a, const std::vector<float>& b, int64_t V) {
  int64_t agree = 0, rows = static_cast<int64_t>(b.size()) / V;
  double diff = 0, mx = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = &a[r * V];
    const float* y = &b[r * V];
    agree += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
    for (int64_t v = 0; v < V; ++v) {
      diff = std::isnan(x[v]) ? INFINITY : std::max<double>(diff, std::fabs(x[v] - y[v]));
      mx = std::max<double>(mx, std::fabs(y[v]));
    }
  }
  return {static_cast<double>(agree) / static_cast<double>(rows), diff / mx};
}

TEST(CudaModelGpuTest, ProductionMatchesGoldensAsWellAsTheCpu) {
  DSV4_SKIP_WITHOUT_GPU();
  auto gpu = Load(TinyCheckpoint(), NumericMode::kProduction, Cuda());
  Dsv4Model& cpu = TinyModel(NumericMode::kProduction);
  ASSERT_NE(gpu, nullptr);
  const int64_t V = cpu.config().vocab_size;
  for (const GoldenSeq& g : LoadGoldens(V)) {
    const std::vector<float> lg = Force(*gpu, g.tokens, 64), lc = Force(cpu, g.tokens, 64);
    const RowErrors eg = Compare(lg, g, V), ec = Compare(lc, g, V);
    const auto [agree, rel] = AgreeAndRel(lg, lc, V);
    std::printf("production, %zu rows: GPU vs golden argmax %.2f%% median %.3e | CPU vs golden %.2f%% median %.3e | "
                "GPU vs CPU argmax %.2f%%, max rel %.3e\n", g.tokens.size(), 100 * eg.agreement(), eg.median(),
                100 * ec.agreement(), ec.median(), 100 * agree, rel);
    EXPECT_GE(eg.agreement(), ec.agreement() - 0.01);
    EXPECT_LE(eg.median(), 2 * ec.median());
    EXPECT_GE(agree, 0.97);
  }
}

// Exact mode (fp32 KV rows, no indexer simulation) differs from the CPU only by the bf16 rounding of GEMM inputs.
// Sharp while no top-k choice is involved: up to position 4 * Ksel - 1 the indexer selects every compressed row, so
// those rows must match to 1e-2 of max|logit| (H200, 2026-12-01: 3.7e-3). Later, a near tie in the indexer's
// scores may pick another row (that position's logits then move by up to ~0.1), so there the test bounds the
// median (measured 2.6e-3), the 99th percentile (5.7-6.0e-3) and the argmax agreement (99.1-99.7%).
TEST(CudaModelGpuTest, ExactModeMatchesCpuExact) {
  DSV4_SKIP_WITHOUT_GPU();
  auto gpu = Load(TinyCheckpoint(), NumericMode::kExact, Cuda());
  Dsv4Model& cpu = TinyModel(NumericMode::kExact);
  ASSERT_NE(gpu, nullptr);
  const int64_t V = cpu.config().vocab_size;
  const int64_t sharp_rows = 4 * cpu.config().index_topk - 1;
  const std::vector<int32_t> tokens = RandomTokens(330, 11, static_cast<int>(V));
  for (int chunk : {1, 64}) {
    const std::vector<float> lg = Force(*gpu, tokens, chunk), lc = Force(cpu, tokens, chunk);
    std::vector<double> rel(tokens.size());
    int64_t agree = 0, worst = 0;
    for (size_t r = 0; r < tokens.size(); ++r) {
      const std::vector<float> a(lg.begin() + r * V, lg.begin() + (r + 1) * V), b(lc.begin() + r * V, lc.begin() + (r + 1) * V);
      const auto [same, e] = AgreeAndRel(a, b, V);
      rel[r] = e;
      agree += same == 1.0;
      if (rel[r] > rel[worst]) worst = static_cast<int64_t>(r);
    }
    const double sharp = *std::max_element(rel.begin(), rel.begin() + sharp_rows);
    std::vector<double> sorted = rel;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2], p99 = sorted[sorted.size() * 99 / 100];
    const double agreement = static_cast<double>(agree) / static_cast<double>(tokens.size());
    std::printf("exact, chunk %d: rows < %lld max rel %.3e | all rows: median %.3e, p99 %.3e, worst %.3e at row %lld, "
                "argmax %.2f%%\n", chunk, static_cast<long long>(sharp_rows), sharp, median, p99, rel[worst],
                static_cast<long long>(worst), 100 * agreement);
    EXPECT_LE(sharp, 1e-2) << "chunk " << chunk;
    EXPECT_LE(median, 5e-3) << "chunk " << chunk;
    EXPECT_LE(p99, 1e-2) << "chunk " << chunk;
    EXPECT_GE(agreement, 0.98) << "chunk " << chunk;
  }
}

// ModelOptions::fuse_projections on the CUDA backend (the multi-weight linear, kernels/cuda/linear_fused.cu): the
// same forward with the projections of one input in one launch differs from the unfused one only in the order of
// the linears' fp32 sums (bit for bit where both plan the same split, as production chunks of 64 do). A changed
// sum order flips a bf16 rounding of some activation now and then, and that carries through the layers: on the
// H200 the logits differed by median 1.3-1.4e-3, max 2.8e-3 before the indexer's top-k engages (fused groups on the
// default build, branch fp8-fuse) - half the GPU-vs-CPU difference of the exact test above. The bounds are that test's, halved: fusing may not take the GPU
// further from the reference than the GPU already is.
TEST(CudaModelGpuTest, FusedProjectionsMatchUnfused) {
  DSV4_SKIP_WITHOUT_GPU();
  for (const NumericMode mode : {NumericMode::kExact, NumericMode::kProduction}) {
    // Both options explicit: the default is fused, so the plain model must ask for one Linear per projection.
    auto unfused = Dsv4Model::Load(TinyCheckpoint(), {.mode = mode, .backend = &Cuda(), .max_step_tokens = 512,
                                                      .max_context = 1024, .fuse_projections = false});
    auto m = Dsv4Model::Load(TinyCheckpoint(), {.mode = mode, .backend = &Cuda(), .max_step_tokens = 512,
                                                .max_context = 1024, .fuse_projections = true});
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(unfused.ok()) << unfused.status();
    Dsv4Model* plain = unfused->get();
    const int64_t V = plain->config().vocab_size;
    const int64_t sharp_rows = 4 * plain->config().index_topk - 1;
    const std::vector<int32_t> tokens = RandomTokens(200, 13, static_cast<int>(V));
    for (int chunk : {1, 64}) {
      const std::vector<float> lf = Force(**m, tokens, chunk), lp = Force(*plain, tokens, chunk);
      ASSERT_EQ(lf.size(), lp.size());
      std::vector<double> rel(tokens.size());
      int64_t agree = 0;
      for (size_t r = 0; r < tokens.size(); ++r) {
        const std::vector<float> a(lf.begin() + r * V, lf.begin() + (r + 1) * V);
        const std::vector<float> b(lp.begin() + r * V, lp.begin() + (r + 1) * V);
        const auto [same, e] = AgreeAndRel(a, b, V);
        rel[r] = e;
        agree += same == 1.0;
      }
      const double sharp = *std::max_element(rel.begin(), rel.begin() + std::min<int64_t>(sharp_rows, 200));
      std::vector<double> sorted = rel;
      std::sort(sorted.begin(), sorted.end());
      const double median = sorted[sorted.size() / 2];
      const double agreement = static_cast<double>(agree) / static_cast<double>(tokens.size());
      std::printf("fused vs unfused projections, mode %d, chunk %d: rows < %lld max rel %.3e, median %.3e, argmax "
                  "%.2f%%\n", static_cast<int>(mode), chunk, static_cast<long long>(sharp_rows), sharp, median,
                  100 * agreement);
      EXPECT_LE(sharp, 5e-3) << "chunk " << chunk;
      EXPECT_LE(median, 2.5e-3) << "chunk " << chunk;
      EXPECT_GE(agreement, 0.98) << "chunk " << chunk;
    }
  }
}

TEST(CudaModelGpuTest, Mxfp4ExpertsMatchTheCpu) {
  DSV4_SKIP_WITHOUT_GPU();
  const std::string dir = (std::filesystem::temp_directory_path() / "dsv4_cuda_model_mxfp4").string();
  std::ifstream in(SourceDir() + "/configs/tiny.json");
  std::stringstream json;
  json << in.rdbuf();
  auto summary = gen::GenerateCheckpoint(
      json.str(), {.seed = 1, .out_dir = dir, .experts = ExpertFormat::kMxfp4, .overwrite = true});
  ASSERT_TRUE(summary.ok()) << summary.status();
  auto gpu = Load(dir, NumericMode::kProduction, Cuda());
  auto cpu = Load(dir, NumericMode::kProduction, TestBackend());
  ASSERT_TRUE(gpu && cpu);
  const int64_t V = cpu->config().vocab_size;
  const std::vector<int32_t> tokens = RandomTokens(330, 12, static_cast<int>(V));
  const auto [agree, rel] = AgreeAndRel(Force(*gpu, tokens, 64), Force(*cpu, tokens, 64), V);
  std::printf("MXFP4 production: GPU vs CPU argmax %.2f%%, max rel %.3e\n", 100 * agree, rel);
  EXPECT_GE(agree, 0.97);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dsv4::model::testing
