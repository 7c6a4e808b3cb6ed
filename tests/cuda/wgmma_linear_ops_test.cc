// The sm_90a wgmma FP8 linear (kernels/cuda/linear_wgmma.cu, LinearKernel::kWgmma) against the CPU reference
// (cuda_ops_test, label gpu; the GPU cases skip unless the build has 90a and the device is compute capability 9.0).
// Every K split the plan allows (clusters 1-8, slices with no K left), at the flash shapes (wq_b, wo_b, wo_a's
// groups, shared w2 TP 4, wkv, the c_q group) and at ragged edges (rows past N, 64-row groups, one token, 300
// tokens, bf16 and strided x, strided y), raw and bf16-grid x; repeats and a CUDA graph replay bit for bit; the
// automatic choice (LaunchLinear / FusedLinear take the kernel from kWgmmaMinTokens, not below, not with
// DSV4_LINEAR_WGMMA off, not for unsuitable weights) and refusals of plans and weights it cannot run.
// WgmmaLinearPlan: the planner alone (host arithmetic, runs in CI).
// Outputs start as a sentinel, so an element not written (or written outside its row) fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/float_formats.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/linear_params.h"
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
constexpr double kTightRel = 2e-5;  // x on the bf16 grid: summation order only
constexpr double kBf16Rel = 5e-3;   // raw x: the kernel rounds it to bf16
const WeightFormat kFp8 = WeightFormat::kFp8Block128;

#define DSV4_REQUIRE_WGMMA()                                                                   \
  DSV4_REQUIRE_GPU();                                                                          \
  if (!LinearWgmmaEnabled()) {                                                                 \
    GTEST_SKIP() << "the wgmma linear needs a 90a build on a compute capability 9.0 GPU (and " \
                    "DSV4_LINEAR_WGMMA not 0)";                                                \
  }

// The plans the kernel can run for these sizes: DeviceWgmmaPlan's, and for both token tiles (16 and 64 tokens a
// block) every cluster whose slice fits with one, two and three row tiles a block (three leaves a short last block
// where the tiles do not divide) and the largest slice.
std::vector<LinearPlan> AllWgmmaPlans(int64_t t, std::span<const int64_t> rows, int64_t k) {
  std::vector<LinearPlan> plans;
  if (std::optional<LinearPlan> p = DeviceWgmmaPlan(t, rows, k)) plans.push_back(*p);
  for (const int n_tiles : {2, 8}) {
    for (int cluster = 1; cluster <= 8; cluster *= 2) {
      for (const int64_t k_slice : {((k / 128 + cluster - 1) / cluster) * 128, kWgmmaMaxKSlice}) {
        for (const int row_tiles : {1, 2, 3}) {
          LinearPlan pl{.kernel = LinearKernel::kWgmma, .n_tiles = n_tiles, .cluster = cluster, .k_slice = k_slice};
          pl.row_tiles = row_tiles;
          if (!CheckWgmmaPlan(pl, t, k, rows).ok()) continue;
          bool seen = false;
          for (const LinearPlan& q : plans) seen = seen || LinearPlanName(q) == LinearPlanName(pl);
          if (!seen) plans.push_back(pl);
        }
      }
    }
  }
  return plans;
}

// One weight (optionally grouped), random FP8 data and scales, x [T, x_stride] f32 or bf16.
struct Case {
  std::string what;
  int64_t n = 0, k = 0, t = 0;
  int groups = 1;
  bool round_x = true;
  bool x_bf16 = false;
  int64_t x_pad = 0, y_pad = 0;
};

struct Prepared {
  HostWeight host;
  LinearHandle cpu, gpu;
  Buffer xc, xg;
  int64_t xs = 0, ys = 0;
  std::vector<float> want;
};

Prepared Prepare(const Case& c) {
  auto b = GetBackends();
  Prepared s;
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>()(c.what)));
  s.host = RandomWeight(rng, kFp8, c.n, c.k);
  auto wc = b.cpu.PrepareLinear(s.host.view);
  auto wg = b.cuda.PrepareLinear(s.host.view);
  EXPECT_TRUE(wc.ok() && wg.ok()) << wc.status() << wg.status();
  s.cpu = std::move(*wc);
  s.gpu = std::move(*wg);
  s.xs = c.groups * c.k + c.x_pad;
  s.ys = c.n + c.y_pad;
  std::vector<float> x = RandomNormal(rng, c.t * s.xs);
  if (c.round_x || c.x_bf16) RoundToBf16(x);
  if (c.x_bf16) {
    std::vector<uint16_t> bits(x.size());
    for (size_t i = 0; i < x.size(); ++i) bits[i] = F32ToBf16(x[i]);
    s.xc = UploadBytes(b.cpu, bits.data(), static_cast<int64_t>(bits.size() * 2));
    s.xg = UploadBytes(b.cuda, bits.data(), static_cast<int64_t>(bits.size() * 2));
  } else {
    s.xc = Upload(b.cpu, x);
    s.xg = Upload(b.cuda, x);
  }
  Buffer y = Upload(b.cpu, std::vector<float>(static_cast<size_t>(c.t * s.ys), kSentinel));
  b.cpu.ops().Linear({.w = s.cpu.get(), .x = {.data = s.xc.data(), .dtype = c.x_bf16 ? DType::kBF16 : DType::kF32},
                      .y = y.as<float>(), .t = c.t, .groups = c.groups, .x_stride = s.xs, .y_stride = s.ys});
  EXPECT_TRUE(b.cpu.Synchronize().ok());
  s.want = Download(b.cpu, y, c.t * s.ys);
  return s;
}

// The linear on the GPU with `plan` (null: the automatic choice); y as downloaded.
std::vector<float> RunGpu(const Case& c, const Prepared& s, const LinearPlan* plan, absl::Status* status = nullptr) {
  auto b = GetBackends();
  auto& gpu = static_cast<CudaBackend&>(b.cuda);
  Buffer y = Upload(b.cuda, std::vector<float>(static_cast<size_t>(c.t * s.ys), kSentinel));
  const absl::Status st = LaunchLinearWithPlan(
      {.w = s.gpu.get(), .x = {.data = s.xg.data(), .dtype = c.x_bf16 ? DType::kBF16 : DType::kF32},
       .y = y.as<float>(), .t = c.t, .groups = c.groups, .x_stride = s.xs, .y_stride = s.ys},
      plan, gpu.stream());
  if (status != nullptr) *status = st;
  EXPECT_TRUE(st.ok() || status != nullptr) << c.what << ": " << st;
  EXPECT_TRUE(gpu.Synchronize().ok()) << c.what;
  return Download(b.cuda, y, c.t * s.ys);
}

void CheckEveryPlan(const Case& c) {
  const Prepared s = Prepare(c);
  const std::vector<int64_t> rows(static_cast<size_t>(c.groups), c.n / c.groups);
  const std::vector<LinearPlan> plans = AllWgmmaPlans(c.t, rows, c.k);
  ASSERT_FALSE(plans.empty()) << c.what;
  for (const LinearPlan& pl : plans) {
    ExpectClose(absl::StrCat(c.what, " [", c.n, "x", c.k, "] x", c.groups, " T=", c.t, " ", LinearPlanName(pl)),
                RunGpu(c, s, &pl), s.want, (c.round_x || c.x_bf16) ? kTightRel : kBf16Rel);
  }
}

TEST(WgmmaLinear, FlashShapesEverySplit) {
  DSV4_REQUIRE_WGMMA();
  for (const int64_t t : {1, 8, 16, 33, 64, 128}) CheckEveryPlan({.what = "wq_b", .n = 32768, .k = 1024, .t = t});
  CheckEveryPlan({.what = "wo_b 4 tokens", .n = 4096, .k = 8192, .t = 4});
  CheckEveryPlan({.what = "wo_b", .n = 4096, .k = 8192, .t = 64});
  CheckEveryPlan({.what = "wo_a groups 8", .n = 8192, .k = 4096, .t = 40, .groups = 8});
  CheckEveryPlan({.what = "wo_a tp4 groups 2", .n = 2048, .k = 4096, .t = 128, .groups = 2});
  CheckEveryPlan({.what = "shared w2 tp4", .n = 4096, .k = 512, .t = 100});
  CheckEveryPlan({.what = "wkv 200 tokens", .n = 512, .k = 4096, .t = 200});
  CheckEveryPlan({.what = "wq_b raw x", .n = 8192, .k = 1024, .t = 77, .round_x = false});
}

TEST(WgmmaLinear, RaggedEdges) {
  DSV4_REQUIRE_WGMMA();
  CheckEveryPlan({.what = "rows past N", .n = 520, .k = 1024, .t = 64});
  CheckEveryPlan({.what = "one row", .n = 1, .k = 256, .t = 35});
  CheckEveryPlan({.what = "groups of 192 rows", .n = 576, .k = 768, .t = 70, .groups = 3});
  CheckEveryPlan({.what = "one token", .n = 256, .k = 512, .t = 1});
  CheckEveryPlan({.what = "slices past K", .n = 384, .k = 640, .t = 65});  // cluster 8: 3 blocks without K
  CheckEveryPlan({.what = "300 tokens", .n = 1024, .k = 4096, .t = 300});
  CheckEveryPlan({.what = "bf16 x strided", .n = 1024, .k = 2048, .t = 65, .x_bf16 = true, .x_pad = 16, .y_pad = 3});
  CheckEveryPlan({.what = "f32 x strided", .n = 640, .k = 1024, .t = 50, .x_pad = 4, .y_pad = 1});
}

// Several FP8 weights in one launch: the fused c_q group (wq_b + the indexer's wq_b) through FusedLinear's automatic
// choice (the same bits as DeviceWgmmaPlan's plan forced: the wgmma kernel ran), and ragged weights (520, 192 and 64
// rows) under forced plans whose blocks walk tiles across weights (row_tiles 2-3: a block switches weight, scale
// row and output between tiles), each equal to the CPU's separate linears.
struct Group {
  std::string what;
  std::vector<int64_t> rows;
  int64_t k = 0, t = 0;
};

void CheckGroup(const Group& grp, const std::vector<LinearPlan>& forced) {
  auto b = GetBackends();
  auto& gpu = static_cast<CudaBackend&>(b.cuda);
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>()(grp.what)));
  std::vector<HostWeight> host;
  std::vector<LinearHandle> wc, wg;
  for (const int64_t r : grp.rows) {
    host.push_back(RandomWeight(rng, kFp8, r, grp.k));
    wc.push_back(std::move(*b.cpu.PrepareLinear(host.back().view)));
    wg.push_back(std::move(*b.cuda.PrepareLinear(host.back().view)));
  }
  std::vector<float> x = RandomNormal(rng, grp.t * grp.k);
  RoundToBf16(x);
  Buffer xc = Upload(b.cpu, x), xg = Upload(b.cuda, x);
  std::vector<std::vector<float>> want;
  for (size_t i = 0; i < grp.rows.size(); ++i) {
    Buffer yc = Upload(b.cpu, std::vector<float>(static_cast<size_t>(grp.t * grp.rows[i]), kSentinel));
    b.cpu.ops().Linear({.w = wc[i].get(), .x = {.data = xc.data()}, .y = yc.as<float>(), .t = grp.t});
    ASSERT_TRUE(b.cpu.Synchronize().ok());
    want.push_back(Download(b.cpu, yc, grp.t * grp.rows[i]));
  }
  // plan null: FusedLinear's own choice.
  auto run = [&](const LinearPlan* plan) {
    std::vector<Buffer> y;
    FusedLinearArgs a{.x = {.data = xg.data()}, .t = grp.t, .count = static_cast<int>(grp.rows.size())};
    for (size_t i = 0; i < grp.rows.size(); ++i) {
      y.push_back(Upload(b.cuda, std::vector<float>(static_cast<size_t>(grp.t * grp.rows[i]), kSentinel)));
      a.out[i] = {.w = wg[i].get(), .y = y.back().as<float>()};
    }
    if (plan == nullptr) {
      b.cuda.ops().FusedLinear(a);
    } else {
      const absl::Status st = LaunchFusedLinearWithPlan(a, plan, gpu.stream());
      EXPECT_TRUE(st.ok()) << grp.what << " " << LinearPlanName(*plan) << ": " << st;
    }
    EXPECT_TRUE(b.cuda.Synchronize().ok());
    std::vector<std::vector<float>> out;
    for (size_t i = 0; i < grp.rows.size(); ++i) out.push_back(Download(b.cuda, y[i], grp.t * grp.rows[i]));
    return out;
  };
  const std::vector<std::vector<float>> automatic = run(nullptr);
  const std::optional<LinearPlan> device_plan = DeviceWgmmaPlan(grp.t, grp.rows, grp.k);
  ASSERT_TRUE(device_plan.has_value()) << grp.what;
  const std::vector<std::vector<float>> planned = run(&*device_plan);
  for (size_t i = 0; i < grp.rows.size(); ++i) {
    const std::string what = absl::StrCat(grp.what, " weight ", i, " T=", grp.t);
    ExpectClose(what + " automatic", automatic[i], want[i], kTightRel);
    ExpectBitEqual(what + " automatic = " + LinearPlanName(*device_plan), automatic[i], planned[i]);
  }
  for (const LinearPlan& pl : forced) {
    ASSERT_TRUE(CheckWgmmaPlan(pl, grp.t, grp.k, grp.rows).ok()) << LinearPlanName(pl);
    const std::vector<std::vector<float>> got = run(&pl);
    for (size_t i = 0; i < grp.rows.size(); ++i) {
      ExpectClose(absl::StrCat(grp.what, " weight ", i, " T=", grp.t, " ", LinearPlanName(pl)), got[i], want[i],
                  kTightRel);
    }
  }
}

LinearPlan Wgmma(int cluster, int64_t k_slice, int row_tiles, int tokens = 64) {
  LinearPlan pl{.kernel = LinearKernel::kWgmma, .n_tiles = tokens / 8, .cluster = cluster, .k_slice = k_slice};
  pl.row_tiles = row_tiles;
  return pl;
}

TEST(WgmmaLinear, SeveralWeightsInOneLaunch) {
  DSV4_REQUIRE_WGMMA();
  CheckGroup({.what = "c_q group", .rows = {8192, 8192}, .k = 1024, .t = 96}, {});
  CheckGroup({.what = "ragged weights", .rows = {520, 192, 64}, .k = 1024, .t = 70},
             {Wgmma(2, 512, 3), Wgmma(1, 1024, 2), Wgmma(4, 256, 1), Wgmma(8, 128, 5), Wgmma(2, 512, 3, 16)});
  CheckGroup({.what = "shared w1+w3 prefill", .rows = {2048, 2048}, .k = 4096, .t = 300}, {Wgmma(4, 1024, 3)});
}

// LaunchLinear's own choice: from kWgmmaMinTokens exactly PlanWgmmaLinear's plan (same bits), the mma.sync plan
// below it and with the kernel switched off (same bits as AutoLinearPlan's plan).
TEST(WgmmaLinear, AutomaticChoiceAndSwitch) {
  DSV4_REQUIRE_WGMMA();
  const int sms = CurrentDeviceSms();
  for (const int64_t t : {kWgmmaMinTokens - 1, kWgmmaMinTokens, int64_t{128}}) {
    const Case c{.what = absl::StrCat("wq_b tp4 auto ", t), .n = 8192, .k = 1024, .t = t};
    const Prepared s = Prepare(c);
    const std::vector<int64_t> rows = {c.n};
    const std::vector<float> automatic = RunGpu(c, s, nullptr);
    ExpectClose(c.what, automatic, s.want, kTightRel);
    const LinearPlan mma = AutoLinearPlan(t, c.n, c.k, 1, sms, LinearKernelFormat::kFp8);
    if (t >= kWgmmaMinTokens) {
      const LinearPlan wgmma = *DeviceWgmmaPlan(t, rows, c.k);
      ExpectBitEqual(c.what + " = DeviceWgmmaPlan's plan", automatic, RunGpu(c, s, &wgmma));
    } else {
      ExpectBitEqual(c.what + " = AutoLinearPlan's plan", automatic, RunGpu(c, s, &mma));
    }
    SetLinearWgmmaForTesting(0);
    ExpectBitEqual(c.what + " switched off = AutoLinearPlan's plan", RunGpu(c, s, nullptr), RunGpu(c, s, &mma));
    SetLinearWgmmaForTesting(-1);
  }
}

TEST(WgmmaLinear, DeterministicAndGraphReplayBitForBit) {
  DSV4_REQUIRE_WGMMA();
  auto& gpu = static_cast<CudaBackend&>(GetBackends().cuda);
  const Case c{.what = "repeat wo_a tp4", .n = 2048, .k = 4096, .t = 64, .groups = 2};
  const Prepared s = Prepare(c);
  const std::vector<float> first = RunGpu(c, s, nullptr);
  ExpectClose(c.what, first, s.want, kTightRel);
  ExpectBitEqual("same call twice", RunGpu(c, s, nullptr), first);
  Buffer y = testing::Poisoned(gpu, c.t * s.ys);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(gpu.stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  gpu.ops().Linear({.w = s.gpu.get(), .x = {.data = s.xg.data()}, .y = y.as<float>(), .t = c.t, .groups = c.groups,
                    .x_stride = s.xs, .y_stride = s.ys});
  ASSERT_EQ(cudaStreamEndCapture(gpu.stream(), &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_TRUE(gpu.Synchronize().ok()) << "no op failed while capturing";
  for (int i = 0; i < 2; ++i) ASSERT_EQ(cudaGraphLaunch(exec, gpu.stream()), cudaSuccess);
  ASSERT_TRUE(gpu.Synchronize().ok());
  ExpectBitEqual("graph replay vs eager", Download(gpu, y, c.t * s.ys), first);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Weights and x the kernel cannot take: the automatic choice passes them to the mma.sync kernels (still correct);
// a forced wgmma plan is refused with InvalidArgument naming the problem.
TEST(WgmmaLinear, UnsuitableInputsFallBackOrAreRefused) {
  DSV4_REQUIRE_WGMMA();
  auto b = GetBackends();
  auto& gpu = static_cast<CudaBackend&>(b.cuda);
  const LinearPlan forced{.kernel = LinearKernel::kWgmma, .n_tiles = 8, .cluster = 1, .k_slice = 1024};
  {  // groups of 40 rows: a group's rows do not start on a 64-row boundary
    const Case c{.what = "groups of 40 rows", .n = 80, .k = 256, .t = 64, .groups = 2};
    const Prepared s = Prepare(c);
    ExpectClose(c.what + " automatic", RunGpu(c, s, nullptr), s.want, kTightRel);
    absl::Status st;
    RunGpu(c, s, &forced, &st);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("64-row"), std::string::npos) << st;
  }
  {  // Kin not a multiple of 128
    const Case c{.what = "Kin 1000", .n = 256, .k = 1000, .t = 64};
    const Prepared s = Prepare(c);
    ExpectClose(c.what + " automatic", RunGpu(c, s, nullptr), s.want, kTightRel);
    absl::Status st;
    RunGpu(c, s, &forced, &st);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  }
  {  // a BF16 weight
    std::mt19937 rng(3);
    HostWeight h = RandomWeight(rng, WeightFormat::kBF16, 256, 512);
    auto w = b.cuda.PrepareLinear(h.view);
    ASSERT_TRUE(w.ok());
    Buffer x = Upload(b.cuda, RandomNormal(rng, 64 * 512)), y = testing::Poisoned(gpu, 64 * 256);
    const LinearPlan bf16_plan{.kernel = LinearKernel::kWgmma, .n_tiles = 8, .cluster = 1, .k_slice = 512};
    const absl::Status st =
        LaunchLinearWithPlan({.w = w->get(), .x = {.data = x.data()}, .y = y.as<float>(), .t = 64}, &bf16_plan,
                             gpu.stream());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  }
  ASSERT_TRUE(gpu.Synchronize().ok());
}

// The planner alone (host arithmetic, no GPU: CI). Flash shapes at TP 1 and the TP 4 shard, single and fused, at
// 33..1000 tokens: a plan that passes its own check, covers K with slices of <= kWgmmaMaxKSlice, and gives the GPU at
// least one block per SM where the weight has that many 128-row x 128-K tiles; none where the kernel cannot run.
TEST(WgmmaLinearPlan, FlashShapes) {
  if (!internal::LinearWgmmaBuilt()) GTEST_SKIP() << "this build has no sm_90a kernels";
  struct Shape {
    std::vector<int64_t> rows;
    int64_t k;
  };
  const std::vector<Shape> shapes = {{{32768}, 1024},         {{4096}, 8192},       {std::vector<int64_t>(8, 1024), 4096},
                                     {{1024, 1024}, 4096},    {{8192, 8192}, 1024}, {{2048, 2048}, 4096},
                                     {{4096}, 2048},          {{4096}, 512},        {{512}, 4096},
                                     {{8192}, 1024},          {{1024, 512}, 4096}};
  for (const Shape& sh : shapes) {
    int64_t tiles = 0;
    for (const int64_t r : sh.rows) tiles += (r + 127) / 128 * (sh.k / 128);
    for (const int64_t t : {33, 64, 100, 128, 256, 1000}) {
      const std::optional<LinearPlan> p = PlanWgmmaLinear(t, sh.rows, sh.k, 132);
      ASSERT_TRUE(p.has_value()) << sh.rows[0] << "x" << sh.k << " T=" << t;
      EXPECT_LT((p->cluster / 2) * p->k_slice, sh.k) << "a cluster with whole slices past K";
      int64_t row_blocks = 0;
      for (const int64_t r : sh.rows) row_blocks += (r + 127) / 128;
      const int64_t token_blocks = (t + WgmmaPlanTokens(*p) - 1) / WgmmaPlanTokens(*p);
      const int64_t blocks = (row_blocks + p->row_tiles - 1) / p->row_tiles * token_blocks * p->cluster;
      EXPECT_LE(blocks, std::max<int64_t>(132, token_blocks * p->cluster)) << "more than one wave";
      if (tiles >= 132) {
        EXPECT_GE(blocks, 66) << sh.rows[0] << "x" << sh.k << " T=" << t << " " << LinearPlanName(*p);
      }
    }
  }
  {  // plans over the kernel's limits: cluster 3, a slice above 1024, slices that do not cover K, no row tile, a
     // token tile it has no build for (32); the good plan they vary passes
    const std::vector<int64_t> rows = {256};
    const LinearPlan good{.kernel = LinearKernel::kWgmma, .n_tiles = 8, .cluster = 2, .k_slice = 512};
    EXPECT_TRUE(CheckWgmmaPlan(good, 64, 1024, rows).ok());
    LinearPlan c3 = good, big_slice = good, short_k = good, no_tiles = good, tok32 = good;
    c3.cluster = 3;
    big_slice.cluster = 1, big_slice.k_slice = 2048;
    short_k.k_slice = 256;
    no_tiles.row_tiles = 0;
    tok32.n_tiles = 4;
    for (const LinearPlan& bad : {c3, big_slice, short_k, no_tiles, tok32}) {
      EXPECT_EQ(CheckWgmmaPlan(bad, 64, 1024, rows).code(), absl::StatusCode::kInvalidArgument)
          << LinearPlanName(bad);
    }
    EXPECT_NE(CheckWgmmaPlan(tok32, 64, 1024, rows).message().find("has no kernel"), std::string::npos);
    EXPECT_NE(CheckWgmmaPlan(no_tiles, 64, 1024, rows).message().find("over its limits"), std::string::npos);
  }
  // The token tile: 16 tokens a block up to 16 tokens, 64 above.
  for (const int64_t t : {1, 8, 16, 17, 64}) {
    const std::optional<LinearPlan> p = PlanWgmmaLinear(t, std::vector<int64_t>{4096}, 4096, 132);
    ASSERT_TRUE(p.has_value()) << t;
    EXPECT_EQ(WgmmaPlanTokens(*p), t <= 16 ? 16 : 64) << t;
  }
  {  // the device's cluster capacity: wo_b at 64 tokens needs clusters of 8; with 14 of them resident (not 132 / 8)
     // the plan still fits one wave
    const std::vector<int64_t> rows = {4096};
    const std::vector<int> max_clusters = {132, 66, 32, 14};
    const std::optional<LinearPlan> p = PlanWgmmaLinear(64, rows, 8192, 132, max_clusters);
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->cluster, 8);
    EXPECT_LE((32 + p->row_tiles - 1) / p->row_tiles, 14) << LinearPlanName(*p);
  }
  EXPECT_FALSE(PlanWgmmaLinear(64, std::vector<int64_t>{256}, 1000, 132).has_value());   // Kin % 128
  EXPECT_FALSE(PlanWgmmaLinear(64, std::vector<int64_t>{256}, 16384, 132).has_value());  // > 8 slices of 1024
  EXPECT_FALSE(PlanWgmmaLinear(64, std::vector<int64_t>(9, 256), 1024, 132).has_value());
  EXPECT_FALSE(PlanWgmmaLinear(0, std::vector<int64_t>{256}, 1024, 132).has_value());
}

}  // namespace
}  // namespace dsv4::kernels::cuda
