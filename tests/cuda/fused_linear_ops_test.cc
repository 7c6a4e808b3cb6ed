// The CUDA FusedLinear (several weights, one x, one launch: kernels/cuda/linear_fused.cu) against the CPU reference
// (cuda_ops_test, label gpu). The groups model/dsv4 fuses at the shapes of configs/flash.json - the projections of
// the normed hidden state (wq_a, wkv FP8; the compressor's wkv / wgate, the indexer's weights_proj and its
// compressor's wkv / wgate BF16) for ratio-4, ratio-128 and ratio-0 layers, and of c_q (wq_b with the indexer's
// wq_b, TP 1 and the TP-4 shard) - at every decode token count 1..128, through the default plan and every build
// (default / lean, hardware / bit-move FP8 dequantisation); forced plans at ragged edges (K tails, rows past N,
// unaligned rows, strides, bf16 x, K splits up to 64) including a single grouped linear run by this kernel; a single
// linear bit for bit against LinearSplitKernel at the same plan (the same computation by construction); the
// bit-move dequantisation bit for bit against the hardware one (all 254 finite codes); repeats bit for bit; a CUDA
// graph replay bit for bit; refusals; prefill and F32 falling back to one launch per weight. FusedLinearPlan: the
// planner alone (host arithmetic: runs without a GPU, in CI).
// Outputs start as a sentinel, so an element not written (or written outside its row) fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/float_formats.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/linear.h"
#include "tests/cuda/test_util.h"

namespace dsv4::kernels::cuda {
namespace {

using testing::Download;
using testing::ExpectBitEqual;
using testing::ExpectClose;
using testing::GetBackends;
using testing::HostWeight;
using testing::RandomNormal;
using testing::RandomWeight;
using testing::RoundToBf16;
using testing::Upload;
using testing::UploadBytes;

constexpr float kSentinel = 12345.f;
constexpr double kTightRel = 2e-5;  // x on the bf16 grid: summation order only (as dense_linear_ops_test)
constexpr double kBf16Rel = 5e-3;   // raw x: the kernel rounds it to bf16

struct W {
  std::string name;
  WeightFormat format = WeightFormat::kFp8Block128;
  int64_t n = 0;
};

struct FusedCase {
  std::string what;
  std::vector<W> weights;
  int64_t k = 4096;
  int64_t t = 1;
  bool round_x = true;
  bool x_bf16 = false;
  int64_t x_pad = 0, y_pad = 0;
};

// A plan choice: the ops' own (nullopt) or PlanFusedLinear's with these arguments.
struct PlanChoice {
  int min_blocks = kFusedMinBlocks;
  int splits = 0;
  bool bits = false;
};

// Prepared weights on both backends, x on both, and a fresh sentinel y per weight per run.
struct Inputs {
  std::vector<HostWeight> host;
  std::vector<LinearHandle> cpu, gpu;
  std::vector<float> x;
  Buffer xc, xg;
  int64_t xs = 0;
  std::vector<int64_t> ys;
};

Inputs MakeInputs(const FusedCase& c) {
  auto b = GetBackends();
  Inputs s;
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>()(c.what)));
  for (const W& w : c.weights) {
    s.host.push_back(RandomWeight(rng, w.format, w.n, c.k));
    auto wc = b.cpu.PrepareLinear(s.host.back().view);
    auto wg = b.cuda.PrepareLinear(s.host.back().view);
    EXPECT_TRUE(wc.ok() && wg.ok()) << wc.status() << wg.status();
    s.cpu.push_back(std::move(*wc));
    s.gpu.push_back(std::move(*wg));
    s.ys.push_back(w.n + c.y_pad);
  }
  s.xs = c.k + c.x_pad;
  s.x = RandomNormal(rng, c.t * s.xs);
  if (c.round_x || c.x_bf16) RoundToBf16(s.x);
  if (c.x_bf16) {
    std::vector<uint16_t> bits(s.x.size());
    for (size_t i = 0; i < s.x.size(); ++i) bits[i] = F32ToBf16(s.x[i]);
    s.xc = UploadBytes(b.cpu, bits.data(), static_cast<int64_t>(bits.size() * 2));
    s.xg = UploadBytes(b.cuda, bits.data(), static_cast<int64_t>(bits.size() * 2));
  } else {
    s.xc = Upload(b.cpu, s.x);
    s.xg = Upload(b.cuda, s.x);
  }
  return s;
}

// Runs the fused op on the GPU (the ops' default, or a forced plan) and returns every output.
std::vector<std::vector<float>> RunGpu(const FusedCase& c, Inputs& s, const std::optional<PlanChoice>& choice,
                                       std::string* plan_name = nullptr) {
  auto b = GetBackends();
  std::vector<Buffer> y;
  FusedLinearArgs a{.x = {.data = s.xg.data(), .dtype = c.x_bf16 ? DType::kBF16 : DType::kF32}, .t = c.t,
                    .x_stride = c.x_pad ? s.xs : 0, .count = static_cast<int>(c.weights.size())};
  std::vector<int64_t> rows;
  for (size_t i = 0; i < c.weights.size(); ++i) {
    y.push_back(Upload(b.cuda, std::vector<float>(static_cast<size_t>(c.t * s.ys[i]), kSentinel)));
    a.out[i] = {.w = s.gpu[i].get(), .y = y.back().as<float>(), .y_stride = c.y_pad ? s.ys[i] : 0};
    rows.push_back(c.weights[i].n);
  }
  if (choice) {
    const std::optional<LinearPlan> plan =
        PlanFusedLinear(c.t, rows, c.k, CurrentDeviceSms(), choice->min_blocks, choice->splits, choice->bits);
    EXPECT_TRUE(plan.has_value()) << c.what << " T=" << c.t << " min_blocks " << choice->min_blocks << " splits "
                                  << choice->splits;
    if (!plan) return {};
    if (plan_name) *plan_name = LinearPlanName(*plan);
    const absl::Status st = LaunchFusedLinearWithPlan(a, &*plan, static_cast<CudaBackend&>(b.cuda).stream());
    EXPECT_TRUE(st.ok()) << st;
  } else {
    b.cuda.ops().FusedLinear(a);
  }
  const absl::Status st = b.cuda.Synchronize();
  EXPECT_TRUE(st.ok()) << st;
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < c.weights.size(); ++i) out.push_back(Download(b.cuda, y[i], c.t * s.ys[i]));
  return out;
}

// The CPU reference: one Linear per weight.
std::vector<std::vector<float>> RunCpu(const FusedCase& c, Inputs& s) {
  auto b = GetBackends();
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < c.weights.size(); ++i) {
    Buffer y = Upload(b.cpu, std::vector<float>(static_cast<size_t>(c.t * s.ys[i]), kSentinel));
    b.cpu.ops().Linear({.w = s.cpu[i].get(), .x = {.data = s.xc.data(), .dtype = c.x_bf16 ? DType::kBF16 : DType::kF32},
                        .y = y.as<float>(), .t = c.t, .x_stride = c.x_pad ? s.xs : 0,
                        .y_stride = c.y_pad ? s.ys[i] : 0});
    EXPECT_TRUE(b.cpu.Synchronize().ok());
    out.push_back(Download(b.cpu, y, c.t * s.ys[i]));
  }
  return out;
}

void CompareAll(const FusedCase& c, const std::string& how, const std::vector<std::vector<float>>& got,
                const std::vector<std::vector<float>>& want) {
  ASSERT_EQ(got.size(), want.size()) << c.what << " " << how;
  const double tol = (c.round_x || c.x_bf16) ? kTightRel : kBf16Rel;
  for (size_t i = 0; i < got.size(); ++i) {
    ExpectClose(absl::StrCat(c.what, " / ", c.weights[i].name, " [", c.weights[i].n, "x", c.k, "] T=", c.t, " ", how),
                got[i], want[i], tol);
  }
}

// Checks a case through the ops' default and every given plan choice against the CPU.
void CheckFused(const FusedCase& c, const std::vector<PlanChoice>& choices) {
  Inputs s = MakeInputs(c);
  const auto want = RunCpu(c, s);
  CompareAll(c, "default", RunGpu(c, s, std::nullopt), want);
  for (const PlanChoice& pc : choices) {
    if (pc.min_blocks == kFusedLeanBlocks && c.t > 8) continue;  // the lean build: one token tile
    std::string name;
    const auto got = RunGpu(c, s, pc, &name);
    if (got.empty()) continue;
    CompareAll(c, name, got, want);
  }
}

const WeightFormat kFp8 = WeightFormat::kFp8Block128;
const WeightFormat kBf16 = WeightFormat::kBF16;

// The normed-hidden-state group of a ratio-4 layer (configs/flash.json; the same at the TP-4 shard).
std::vector<W> FlashRatio4() {
  return {{"wq_a", kFp8, 1024},          {"wkv", kFp8, 512},
          {"compressor.wkv", kBf16, 1024}, {"compressor.wgate", kBf16, 1024},
          {"indexer.weights_proj", kBf16, 64}, {"indexer.compressor.wkv", kBf16, 256},
          {"indexer.compressor.wgate", kBf16, 256}};
}

const std::vector<PlanChoice> kAllBuilds = {{kFusedMinBlocks, 0, false}, {kFusedMinBlocks, 0, true},
                                            {kFusedLeanBlocks, 0, false}, {kFusedLeanBlocks, 0, true}};

// The plans alone (host arithmetic, no GPU needed: runs in CI): for the flash groups at every decode T and both
// builds, a plan exists where the build does (the lean one up to 8 tokens), passes its own check, covers K, keeps
// the x slice within the SM share of its build, puts more than one warp's work on every SM, and honours forced
// splits; refused where there is no build.
TEST(FusedLinearPlan, FlashGroupsEveryTokenCount) {
  const std::vector<std::pair<std::vector<int64_t>, int64_t>> groups = {
      {{1024, 512, 1024, 1024, 64, 256, 256}, 4096}, {{1024, 512, 512, 512}, 4096}, {{1024, 512}, 4096},
      {{32768, 8192}, 1024}, {{8192, 8192}, 1024}, {{2048, 2048}, 4096}, {{8, 16, 1}, 128}};
  for (const auto& [rows, k] : groups) {
    for (const int64_t t : {1, 2, 3, 4, 8, 9, 16, 17, 32, 64, 100, 128}) {
      for (const int min_blocks : {kFusedMinBlocks, kFusedLeanBlocks}) {
        for (const bool bits : {false, true}) {
          const std::optional<LinearPlan> plan = PlanFusedLinear(t, rows, k, 132, min_blocks, 0, bits);
          const std::string what = absl::StrCat("rows[0] ", rows[0], " K ", k, " T ", t, " min_blocks ", min_blocks);
          if (min_blocks == kFusedLeanBlocks && t > 8) {
            EXPECT_FALSE(plan.has_value()) << what;
            continue;
          }
          ASSERT_TRUE(plan.has_value()) << what;
          EXPECT_TRUE(CheckFusedPlan(*plan, t, k, rows).ok()) << what;
          EXPECT_EQ(plan->min_blocks, min_blocks) << what;
          EXPECT_EQ(plan->bit_dequant, bits) << what;
          EXPECT_EQ(plan->m_tiles, 1) << what;
          // 64-token warp tiles above 32 tokens at K >= 4096 (these groups' K = 4096 slices fit).
          EXPECT_EQ(plan->n_tiles, t <= 8 ? 1 : t <= 16 ? 2 : (t <= 32 || k < 4096) ? 4 : 8) << what;
          EXPECT_GE(plan->cluster * plan->k_slice, k) << what;
          const int64_t smem = internal::FusedSharedBytes(*plan, std::min<int64_t>(t, 8 * plan->n_tiles));
          EXPECT_LE(smem, (int64_t{228} * 1024) / min_blocks - 1024) << what << " " << LinearPlanName(*plan);
        }
      }
    }
  }
  // Forced splits are honoured (cluster * warps_k).
  const std::vector<int64_t> rows = {1024, 512};
  for (const int splits : {1, 2, 4, 8, 16, 32, 64}) {
    const std::optional<LinearPlan> plan = PlanFusedLinear(1, rows, 4096, 132, kFusedMinBlocks, splits);
    ASSERT_TRUE(plan.has_value()) << splits;
    EXPECT_EQ(plan->cluster * plan->warps_k, splits);
  }
  // The ratio-4 group at T = 1 splits K enough to give every SM work (>= 2 warps per SM on 132 SMs).
  const std::vector<int64_t> r4 = {1024, 512, 1024, 1024, 64, 256, 256};
  const LinearPlan p = *PlanFusedLinear(1, r4, 4096, 132);
  int64_t tiles = 0;
  for (const int64_t r : r4) tiles += (r + 15) / 16;
  EXPECT_GE(tiles * p.cluster * p.warps_k, 2 * 132) << LinearPlanName(p);
  // The automatic choice: the lean build up to 8 tokens, the default one above, for every flash group.
  for (const auto& [g, gk] : groups) {
    for (const int64_t t : {1, 4, 8, 9, 16, 64, 128}) {
      const std::optional<LinearPlan> a = AutoFusedLinearPlan(t, g, gk, 132);
      ASSERT_TRUE(a.has_value()) << "rows[0] " << g[0] << " T " << t;
      EXPECT_EQ(a->min_blocks, t <= 8 ? kFusedLeanBlocks : kFusedMinBlocks) << "rows[0] " << g[0] << " T " << t;
      EXPECT_FALSE(a->bit_dequant);
    }
  }
  EXPECT_FALSE(AutoFusedLinearPlan(1, std::vector<int64_t>(9, 16), 128, 132).has_value());
  EXPECT_FALSE(PlanFusedLinear(1, std::vector<int64_t>(9, 16), 128, 132).has_value());  // more than 8 weights
  EXPECT_FALSE(PlanFusedLinear(1, std::vector<int64_t>{16, 0}, 128, 132).has_value());  // an empty weight
  EXPECT_FALSE(PlanFusedLinear(1, rows, 4096, 132, 3).has_value());                      // no such build
}

// The single linear's automatic plan (host arithmetic, CI): the multi-weight kernel's lean build for FP8 weights of
// >= 16 MB with K >= 4096 at T <= 8 (flash wo_a, 8 groups of 1024 x 4096, and wo_b, 4096 x 8192), the other
// kernels for short rows (wq_b, K = 1024), small weights (the TP 4 shards), BF16 and more tokens.
TEST(FusedLinearPlan, AutoLinearPlanTakesTheLeanBuildOnLargeLongRowWeights) {
  for (const int64_t t : {1, 2, 4, 8}) {
    const LinearPlan wo_a = AutoLinearPlan(t, 1024, 4096, 8, 132, LinearKernelFormat::kFp8);
    const LinearPlan wo_b = AutoLinearPlan(t, 4096, 8192, 1, 132, LinearKernelFormat::kFp8);
    EXPECT_EQ(wo_a.min_blocks, kFusedLeanBlocks) << t << " " << LinearPlanName(wo_a);
    EXPECT_EQ(wo_b.min_blocks, kFusedLeanBlocks) << t << " " << LinearPlanName(wo_b);
    EXPECT_TRUE(CheckFusedPlan(wo_a, t, 4096, std::vector<int64_t>(8, 1024)).ok());
    EXPECT_TRUE(CheckFusedPlan(wo_b, t, 8192, std::vector<int64_t>{4096}).ok());
    EXPECT_EQ(AutoLinearPlan(t, 32768, 1024, 1, 132, LinearKernelFormat::kFp8).min_blocks, 0) << t;  // wq_b
    EXPECT_EQ(AutoLinearPlan(t, 1024, 4096, 2, 132, LinearKernelFormat::kFp8).min_blocks, 0) << t;   // wo_a TP 4
    EXPECT_EQ(AutoLinearPlan(t, 4096, 2048, 1, 132, LinearKernelFormat::kFp8).min_blocks, 0) << t;   // wo_b TP 4
    EXPECT_EQ(AutoLinearPlan(t, 4096, 8192, 1, 132, LinearKernelFormat::kBf16).min_blocks, 0) << t;
  }
  EXPECT_EQ(AutoLinearPlan(9, 4096, 8192, 1, 132, LinearKernelFormat::kFp8).min_blocks, 0);
  EXPECT_EQ(AutoLinearPlan(1, 1024, 4096, 9, 132, LinearKernelFormat::kFp8).min_blocks, 0);  // > 8 groups
}

// From 9 to 32 tokens the automatic plan is the split-K kernel with its register ring on every flash shape (never
// the FP8 weight ring, slower everywhere since the fifth session's staging and epilogue rewrite), except the tiled
// kernel for the short-row 4096-row FP8 weight; from 33 to 128 the multi-weight kernel's 64-token warp tile where
// K >= 4096 and its x slice fits (K = 4096), else the split-K kernel; prefill is tiled.
TEST(LinearPlan, AutoPlanFromNineTokens) {
  struct Shape {
    int64_t n, k;
    int groups;
    LinearKernelFormat f;
  };
  const Shape shapes[] = {{32768, 1024, 1, LinearKernelFormat::kFp8}, {1024, 4096, 8, LinearKernelFormat::kFp8},
                          {4096, 8192, 1, LinearKernelFormat::kFp8},  {1024, 4096, 1, LinearKernelFormat::kFp8},
                          {4096, 2048, 1, LinearKernelFormat::kFp8},  {1024, 4096, 1, LinearKernelFormat::kBf16}};
  for (const int64_t t : {9, 16, 32, 33, 64, 100, 128}) {
    for (const Shape& s : shapes) {
      const LinearPlan p = AutoLinearPlan(t, s.n, s.k, s.groups, 132, s.f);
      const std::string what = absl::StrCat(t, " tokens, ", s.n, " x ", s.k, " x ", s.groups, ": ", LinearPlanName(p));
      EXPECT_EQ(p.kernel, LinearKernel::kSplitK) << what;
      EXPECT_EQ(p.stages, 0) << what;
      // K = 4096: always the 64-token tile; K = 8192: only at T = 33, where its 33-row x slice fits (100,624 of
      // 101,376 bytes; 34 rows need 102,672); K < 4096: never.
      if (t > 32 && (s.k == 4096 || (s.k == 8192 && t == 33))) {
        EXPECT_EQ(p.min_blocks, kFusedMinBlocks) << what;
        EXPECT_EQ(p.n_tiles, 8) << what;
        EXPECT_TRUE(CheckFusedPlan(p, t, s.k, std::vector<int64_t>(static_cast<size_t>(s.groups), s.n)).ok()) << what;
      } else {
        EXPECT_EQ(p.min_blocks, 0) << what;
        EXPECT_LE(p.n_tiles, 4) << what;
      }
    }
    const LinearPlan w2 = AutoLinearPlan(t, 4096, 512, 1, 132, LinearKernelFormat::kFp8);
    EXPECT_EQ(w2.kernel, t <= 32 ? LinearKernel::kTiled : LinearKernel::kSplitK) << t << " " << LinearPlanName(w2);
  }
  EXPECT_EQ(AutoLinearPlan(129, 1024, 4096, 1, 132, LinearKernelFormat::kFp8).kernel, LinearKernel::kTiled);
  // The multi-weight kernel's own plans: 64-token tiles above 32 tokens at K = 4096, 32 where the slice does not fit
  // (K = 8192) or K is short (1024: the c_q group).
  EXPECT_EQ(AutoFusedLinearPlan(64, std::vector<int64_t>{1024, 512}, 4096, 132)->n_tiles, 8);
  EXPECT_EQ(AutoFusedLinearPlan(32, std::vector<int64_t>{1024, 512}, 4096, 132)->n_tiles, 4);
  EXPECT_EQ(AutoFusedLinearPlan(64, std::vector<int64_t>{4096, 4096}, 8192, 132)->n_tiles, 4);
  EXPECT_EQ(AutoFusedLinearPlan(64, std::vector<int64_t>{8192, 8192}, 1024, 132)->n_tiles, 4);
}

TEST(FusedLinear, FlashRatio4GroupEveryTokenCount) {
  DSV4_REQUIRE_GPU();
  for (const int64_t t : {1, 2, 3, 4, 8, 16, 32, 64, 100, 128}) {
    CheckFused({.what = "ratio-4 group", .weights = FlashRatio4(), .t = t}, kAllBuilds);
  }
}

TEST(FusedLinear, FlashOtherGroups) {
  DSV4_REQUIRE_GPU();
  const std::vector<W> r128 = {{"wq_a", kFp8, 1024}, {"wkv", kFp8, 512}, {"compressor.wkv", kBf16, 512},
                               {"compressor.wgate", kBf16, 512}};
  const std::vector<W> r0 = {{"wq_a", kFp8, 1024}, {"wkv", kFp8, 512}};
  const std::vector<W> cq_tp1 = {{"wq_b", kFp8, 32768}, {"indexer.wq_b", kFp8, 8192}};
  const std::vector<W> cq_tp4 = {{"wq_b tp4", kFp8, 8192}, {"indexer.wq_b", kFp8, 8192}};
  const std::vector<W> shared = {{"shared.w1", kFp8, 2048}, {"shared.w3", kFp8, 2048}};
  for (const int64_t t : {1, 4, 8, 32, 128}) {
    CheckFused({.what = "ratio-128 group", .weights = r128, .t = t}, kAllBuilds);
    CheckFused({.what = "ratio-0 group", .weights = r0, .t = t}, kAllBuilds);
    CheckFused({.what = "c_q group tp1", .weights = cq_tp1, .k = 1024, .t = t}, kAllBuilds);
    CheckFused({.what = "c_q group tp4", .weights = cq_tp4, .k = 1024, .t = t}, kAllBuilds);
    CheckFused({.what = "shared w1+w3", .weights = shared, .t = t}, kAllBuilds);
  }
  CheckFused({.what = "ratio-4 group raw x", .weights = FlashRatio4(), .t = 5, .round_x = false}, kAllBuilds);
  CheckFused({.what = "ratio-4 group bf16 x", .weights = FlashRatio4(), .t = 9, .x_bf16 = true}, kAllBuilds);
}

// Ragged edges under forced splits (1 .. 64, clusters with blocks past the end of K) of every build.
TEST(FusedLinear, ForcedPlansAtEdges) {
  DSV4_REQUIRE_GPU();
  const std::vector<FusedCase> cases = {
      {.what = "K tail, rows past N", .weights = {{"a", kFp8, 130}, {"b", kBf16, 200}, {"c", kFp8, 1}}, .k = 1072,
       .t = 3},
      {.what = "unaligned K", .weights = {{"a", kFp8, 40}, {"b", kBf16, 17}}, .k = 328, .t = 9},
      {.what = "strided x and y", .weights = {{"a", kFp8, 512}, {"b", kBf16, 96}}, .k = 1024, .t = 5, .x_pad = 64,
       .y_pad = 8},
      {.what = "bf16 x strided 40 tokens", .weights = {{"a", kFp8, 256}, {"b", kFp8, 48}}, .k = 512, .t = 40,
       .x_bf16 = true, .x_pad = 16, .y_pad = 3},
      {.what = "eight weights", .weights = {{"a", kFp8, 16}, {"b", kBf16, 32}, {"c", kFp8, 48}, {"d", kBf16, 64},
                                            {"e", kFp8, 80}, {"f", kBf16, 96}, {"g", kFp8, 112}, {"h", kBf16, 128}},
       .k = 768, .t = 2},
  };
  for (const FusedCase& c : cases) {
    std::vector<PlanChoice> choices;
    for (const int splits : {1, 2, 8, 16, 64}) {
      for (const PlanChoice& b : kAllBuilds) choices.push_back({b.min_blocks, splits, b.bits});
    }
    CheckFused(c, choices);
  }
}

// A single (grouped) linear through this kernel: LaunchLinearWithPlan with min_blocks > 0 (one entry per group).
TEST(FusedLinear, SingleGroupedLinearThroughTheKernel) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  const cudaStream_t stream = static_cast<CudaBackend&>(b.cuda).stream();
  struct One {
    std::string what;
    int64_t n, k, t;
    int groups;
  };
  for (const One& o : std::vector<One>{{"wo_a groups 8", 8192, 4096, 1, 8},
                                       {"wo_a tp4 groups 2", 2048, 4096, 4, 2},
                                       {"wq_b", 32768, 1024, 2, 1},
                                       {"groups of 40 rows", 80, 256, 3, 2}}) {
    std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>()(o.what)));
    HostWeight hw = RandomWeight(rng, kFp8, o.n, o.k);
    auto wc = b.cpu.PrepareLinear(hw.view);
    auto wg = b.cuda.PrepareLinear(hw.view);
    ASSERT_TRUE(wc.ok() && wg.ok());
    std::vector<float> x = RandomNormal(rng, o.t * o.k * o.groups);
    RoundToBf16(x);
    Buffer xc = Upload(b.cpu, x), xg = Upload(b.cuda, x);
    Buffer yc = Upload(b.cpu, std::vector<float>(static_cast<size_t>(o.t * o.n), kSentinel));
    b.cpu.ops().Linear({.w = wc->get(), .x = {.data = xc.data()}, .y = yc.as<float>(), .t = o.t, .groups = o.groups});
    ASSERT_TRUE(b.cpu.Synchronize().ok());
    const std::vector<float> want = Download(b.cpu, yc, o.t * o.n);
    std::vector<int64_t> rows(static_cast<size_t>(o.groups), o.n / o.groups);
    for (const PlanChoice& pc : kAllBuilds) {
      const std::optional<LinearPlan> plan =
          PlanFusedLinear(o.t, rows, o.k, CurrentDeviceSms(), pc.min_blocks, pc.splits, pc.bits);
      ASSERT_TRUE(plan.has_value()) << o.what;
      Buffer yg = Upload(b.cuda, std::vector<float>(static_cast<size_t>(o.t * o.n), kSentinel));
      const absl::Status st = LaunchLinearWithPlan(
          {.w = wg->get(), .x = {.data = xg.data()}, .y = yg.as<float>(), .t = o.t, .groups = o.groups}, &*plan,
          stream);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_TRUE(b.cuda.Synchronize().ok());
      ExpectClose(absl::StrCat(o.what, " T=", o.t, " ", LinearPlanName(*plan)), Download(b.cuda, yg, o.t * o.n), want,
                  kTightRel);
    }
  }
}

// At the same work split the multi-weight kernel IS the split-K kernel's computation (same steps per warp in the
// same order, same MMA mapping, x rounding and fixed-order reduction; its padding token columns are never stored),
// so a single (grouped) linear through LinearSplitKernel (plan with min_blocks 0, stages 0) and through the
// multi-weight kernel (the same plan with min_blocks set, hardware dequantisation) must give the same bits, at
// ragged N and K, several token tiles, K split over warps and clusters, and raw (unrounded) x. A mismatch here
// points at the new kernel's indexing, not at summation order.
TEST(FusedLinear, SameBitsAsTheSplitKKernelAtTheSamePlan) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  const cudaStream_t stream = static_cast<CudaBackend&>(b.cuda).stream();
  struct One {
    std::string what;
    WeightFormat format;
    int64_t n, k;
    int groups;
  };
  for (const One& o : std::vector<One>{{"fp8 wq_a", kFp8, 1024, 4096, 1},
                                       {"bf16 compressor", kBf16, 512, 4096, 1},
                                       {"fp8 ragged", kFp8, 130, 1072, 1},
                                       {"bf16 ragged", kBf16, 200, 1072, 1},
                                       {"fp8 groups of 40 rows", kFp8, 80, 256, 2}}) {
    std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>()(o.what)));
    HostWeight hw = RandomWeight(rng, o.format, o.n, o.k);
    auto wg = b.cuda.PrepareLinear(hw.view);
    ASSERT_TRUE(wg.ok()) << wg.status();
    for (const int64_t t : {1, 5, 13, 40}) {
      for (const bool raw_x : {false, true}) {
        std::vector<float> x = RandomNormal(rng, t * o.k * o.groups);
        if (!raw_x) RoundToBf16(x);
        Buffer xg = Upload(b.cuda, x);
        for (const int splits : {1, 4, 16}) {
          const std::optional<LinearPlan> split =
              PlanSplitKLinear(t, o.n / o.groups, o.k, o.groups, CurrentDeviceSms(), 1, splits);
          ASSERT_TRUE(split.has_value()) << o.what << " T=" << t << " splits " << splits;
          ASSERT_EQ(split->stages, 0);
          ASSERT_EQ(split->min_blocks, 0);
          std::vector<LinearPlan> fused_plans = {*split};
          fused_plans.back().min_blocks = kFusedMinBlocks;
          if (t <= 8) {
            fused_plans.push_back(*split);
            fused_plans.back().min_blocks = kFusedLeanBlocks;
          }
          auto run = [&](const LinearPlan& plan) {
            Buffer y = Upload(b.cuda, std::vector<float>(static_cast<size_t>(t * o.n), kSentinel));
            const absl::Status st = LaunchLinearWithPlan(
                {.w = wg->get(), .x = {.data = xg.data()}, .y = y.as<float>(), .t = t, .groups = o.groups}, &plan,
                stream);
            EXPECT_TRUE(st.ok()) << LinearPlanName(plan) << ": " << st;
            EXPECT_TRUE(b.cuda.Synchronize().ok());
            return Download(b.cuda, y, t * o.n);
          };
          const std::vector<float> want = run(*split);
          for (const LinearPlan& fp : fused_plans) {
            ExpectBitEqual(absl::StrCat(o.what, " T=", t, raw_x ? " raw x " : " ", LinearPlanName(fp), " vs ",
                                        LinearPlanName(*split)),
                           run(fp), want);
          }
        }
      }
    }
  }
}

// The bit-move dequantisation equals the hardware one bit for bit (same plan otherwise): every finite e4m3 code
// (RandomWeight draws one code in ten uniformly, subnormals included) times 2^-120 through the tensor cores, x
// times 2^64, partial sums times 2^56. A mismatch here means the tensor cores do not take bf16 subnormals exactly
// (e4m3_bits.h).
TEST(FusedLinear, BitDequantEqualsHardwareDequant) {
  DSV4_REQUIRE_GPU();
  for (const int64_t t : {1, 8, 13}) {
    for (const bool raw_x : {false, true}) {
      const FusedCase c{.what = "bits vs hardware", .weights = {{"a", kFp8, 1024}, {"b", kFp8, 512}},
                        .t = t, .round_x = !raw_x};
      Inputs s = MakeInputs(c);
      for (const int min_blocks : {kFusedMinBlocks, kFusedLeanBlocks}) {
        if (min_blocks == kFusedLeanBlocks && t > 8) continue;
        const auto hw = RunGpu(c, s, PlanChoice{min_blocks, 16, false});
        const auto bits = RunGpu(c, s, PlanChoice{min_blocks, 16, true});
        ASSERT_EQ(hw.size(), bits.size());
        for (size_t i = 0; i < hw.size(); ++i) {
          ExpectBitEqual(absl::StrCat("bits vs hardware, weight ", i, " T=", t, raw_x ? " raw x" : "", " min_blocks ",
                                      min_blocks),
                         bits[i], hw[i]);
        }
      }
    }
  }
}

// Fused vs the separate CUDA linears the model runs without the option: the same sums up to their order.
TEST(FusedLinear, CloseToTheSeparateLinears) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  for (const int64_t t : {1, 8, 64}) {
    const FusedCase c{.what = "fused vs separate", .weights = FlashRatio4(), .t = t};
    Inputs s = MakeInputs(c);
    const auto fused = RunGpu(c, s, std::nullopt);
    for (size_t i = 0; i < c.weights.size(); ++i) {
      Buffer y = Upload(b.cuda, std::vector<float>(static_cast<size_t>(t * s.ys[i]), kSentinel));
      b.cuda.ops().Linear({.w = s.gpu[i].get(), .x = {.data = s.xg.data()}, .y = y.as<float>(), .t = t});
      ASSERT_TRUE(b.cuda.Synchronize().ok());
      ExpectClose(absl::StrCat("fused vs separate ", c.weights[i].name, " T=", t), fused[i],
                  Download(b.cuda, y, t * s.ys[i]), kTightRel);
    }
  }
}

TEST(FusedLinear, DeterministicAndGraphReplayBitForBit) {
  DSV4_REQUIRE_GPU();
  auto& gpu = static_cast<CudaBackend&>(GetBackends().cuda);
  for (const int64_t t : {1, 24, 128}) {
    const FusedCase c{.what = "repeat", .weights = FlashRatio4(), .t = t};
    Inputs s = MakeInputs(c);
    const auto first = RunGpu(c, s, std::nullopt);
    const auto second = RunGpu(c, s, std::nullopt);
    for (size_t i = 0; i < first.size(); ++i) {
      ExpectBitEqual(absl::StrCat("same call twice, weight ", i, " T=", t), second[i], first[i]);
    }
    // Captured once, replayed: the launch allocates nothing and reads nothing back.
    std::vector<Buffer> y;
    FusedLinearArgs a{.x = {.data = s.xg.data()}, .t = t, .count = static_cast<int>(c.weights.size())};
    for (size_t i = 0; i < c.weights.size(); ++i) {
      y.push_back(testing::Poisoned(gpu, t * s.ys[i]));
      a.out[i] = {.w = s.gpu[i].get(), .y = y.back().as<float>()};
    }
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(gpu.stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
    gpu.ops().FusedLinear(a);
    ASSERT_EQ(cudaStreamEndCapture(gpu.stream(), &graph), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_TRUE(gpu.Synchronize().ok()) << "no op failed while capturing";
    ASSERT_EQ(cudaGraphLaunch(exec, gpu.stream()), cudaSuccess);
    ASSERT_TRUE(gpu.Synchronize().ok());
    for (size_t i = 0; i < c.weights.size(); ++i) {
      ExpectBitEqual(absl::StrCat("graph replay vs eager, weight ", i, " T=", t), Download(gpu, y[i], t * s.ys[i]),
                     first[i]);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

// Prefill (T > 128) and F32 weights: one single linear each, as the ops contract promises; T = 0 writes nothing.
TEST(FusedLinear, FallbacksAndZeroTokens) {
  DSV4_REQUIRE_GPU();
  CheckFused({.what = "prefill", .weights = {{"wq_a", kFp8, 1024}, {"cw", kBf16, 512}}, .t = 300}, {});
  CheckFused({.what = "with an F32 weight", .weights = {{"a", kFp8, 256}, {"f32", WeightFormat::kF32, 40}}, .k = 512,
              .t = 3, .round_x = false},
             {});
  CheckFused({.what = "one weight", .weights = {{"wkv", kFp8, 512}}, .t = 2}, {{kFusedLeanBlocks, 0, true}});
  const FusedCase c{.what = "zero tokens", .weights = {{"a", kFp8, 256}, {"b", kBf16, 64}}, .k = 256, .t = 1};
  Inputs s = MakeInputs(c);
  auto b = GetBackends();
  Buffer y = Upload(b.cuda, std::vector<float>(256, kSentinel));
  FusedLinearArgs a{.x = {.data = s.xg.data()}, .t = 0, .count = 2};
  a.out[0] = {.w = s.gpu[0].get(), .y = y.as<float>()};
  a.out[1] = {.w = s.gpu[1].get(), .y = y.as<float>()};
  b.cuda.ops().FusedLinear(a);
  ASSERT_TRUE(b.cuda.Synchronize().ok());
  ExpectBitEqual("T=0 leaves y", Download(b.cuda, y, 256), std::vector<float>(256, kSentinel));
}

TEST(FusedLinear, BadArgumentsAndPlansAreRefused) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  const cudaStream_t stream = static_cast<CudaBackend&>(b.cuda).stream();
  std::mt19937 rng(5);
  HostWeight h1 = RandomWeight(rng, kFp8, 256, 1024), h2 = RandomWeight(rng, kFp8, 128, 512);
  auto w1 = b.cuda.PrepareLinear(h1.view);
  auto w2 = b.cuda.PrepareLinear(h2.view);
  ASSERT_TRUE(w1.ok() && w2.ok());
  Buffer x = Upload(b.cuda, RandomNormal(rng, 16 * 1024)), y = testing::Poisoned(b.cuda, 16 * 512);
  FusedLinearArgs a{.x = {.data = x.data()}, .t = 4, .count = 2};
  a.out[0] = {.w = w1->get(), .y = y.as<float>()};
  a.out[1] = {.w = w2->get(), .y = y.as<float>() + 4 * 256};  // Kin 512 against 1024
  EXPECT_EQ(LaunchFusedLinear(a, stream).code(), absl::StatusCode::kInvalidArgument);
  a.out[1] = {.w = w1->get(), .y = nullptr};
  EXPECT_EQ(LaunchFusedLinear(a, stream).code(), absl::StatusCode::kInvalidArgument);
  a.out[1] = {.w = w1->get(), .y = y.as<float>() + 4 * 256};
  a.count = kMaxFusedLinears + 1;
  EXPECT_EQ(LaunchFusedLinear(a, stream).code(), absl::StatusCode::kInvalidArgument);
  a.count = 2;
  const std::vector<int64_t> rows = {256, 256};
  const LinearPlan good = *PlanFusedLinear(4, rows, 1024, CurrentDeviceSms());
  LinearPlan bad = good;
  bad.min_blocks = 3;  // no such build
  EXPECT_EQ(LaunchFusedLinearWithPlan(a, &bad, stream).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.k_slice = 128, bad.cluster = 2;  // cluster * k_slice < Kin
  EXPECT_EQ(LaunchFusedLinearWithPlan(a, &bad, stream).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.m_tiles = 2;
  EXPECT_EQ(LaunchFusedLinearWithPlan(a, &bad, stream).code(), absl::StatusCode::kInvalidArgument);
  bad = *PlanFusedLinear(4, rows, 1024, CurrentDeviceSms(), kFusedLeanBlocks);
  bad.n_tiles = 2;  // the lean build has one 8-token tile per warp
  EXPECT_EQ(LaunchFusedLinearWithPlan(a, &bad, stream).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(PlanFusedLinear(16, rows, 1024, 132, kFusedLeanBlocks).has_value());
  EXPECT_FALSE(PlanFusedLinear(129, rows, 1024, 132).has_value());
  EXPECT_FALSE(PlanFusedLinear(4, rows, 1024, 132, kFusedMinBlocks, 3).has_value());
  // A grouped linear of more groups than the kernel takes weights.
  HostWeight h3 = RandomWeight(rng, kFp8, 16 * 9, 128);
  auto w3 = b.cuda.PrepareLinear(h3.view);
  ASSERT_TRUE(w3.ok());
  const LinearPlan nine = *PlanFusedLinear(1, std::vector<int64_t>(8, 16), 128, CurrentDeviceSms());
  EXPECT_EQ(LaunchLinearWithPlan({.w = w3->get(), .x = {.data = x.data()}, .y = y.as<float>(), .t = 1, .groups = 9},
                                 &nine, stream)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(LaunchFusedLinearWithPlan(a, &good, stream).ok());
  ASSERT_TRUE(b.cuda.Synchronize().ok());
}

}  // namespace
}  // namespace dsv4::kernels::cuda
