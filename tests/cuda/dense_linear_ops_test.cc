// The CUDA Linear against the CPU reference Linear (cuda_ops_test, label gpu): FP8 block-128 (ue8m0 and f32
// scales), BF16 and F32 weights at the projections of configs/flash.json (TP 1 and the TP-4 shard) and
// tiny.json, every decode token count (the split-K kernel) and prefill chunks (the tiled kernel), grouped
// (wo_a), strided, bf16 activations, odd sizes that take the unaligned paths, T = 0; forced plans of both
// kernels (m-tiles, K splits up to 64, clusters with blocks past the end of K, the split-K kernel's register and
// shared-memory weight rings) must agree with the CPU too.
// Outputs start as a sentinel, so an element not written (or written outside its row) fails.
//
// Two tolerances: with x already on the bf16 grid the CUDA kernel's only difference is the order of the fp32
// sums (rel <= 2e-5); with raw fp32 x its bf16 rounding of x adds ~1e-3 (rel <= 5e-3).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/float_formats.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_info.h"
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
constexpr double kTightRel = 2e-5;  // x on the bf16 grid: summation order only
constexpr double kBf16Rel = 5e-3;   // raw x: the kernel rounds it to bf16

struct LinearCase {
  std::string what;
  WeightFormat format = WeightFormat::kFp8Block128;
  int64_t n = 0, k = 0;  // the whole weight: [groups * N, Kin]
  int64_t t = 1;
  int groups = 1;
  bool round_x = true;   // x on the bf16 grid
  bool x_bf16 = false;   // x handed over as bf16
  bool scale_f32 = false;
  int64_t x_pad = 0, y_pad = 0;  // extra elements per row (strides)
  std::optional<LinearPlan> plan = std::nullopt;  // forced through LaunchLinearWithPlan (default: LaunchLinear's own)
};

// Runs one case on both backends and compares the whole y (the padding columns must keep the sentinel).
void CheckLinear(const LinearCase& c) {
  auto b = GetBackends();
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>()(c.what)));
  HostWeight hw = RandomWeight(rng, c.format, c.n, c.k, c.scale_f32);
  auto wc = b.cpu.PrepareLinear(hw.view);
  auto wg = b.cuda.PrepareLinear(hw.view);
  ASSERT_TRUE(wc.ok()) << wc.status();
  ASSERT_TRUE(wg.ok()) << wg.status();
  const int64_t n = c.n / c.groups;
  const int64_t xs = c.groups * c.k + c.x_pad, ys = c.groups * n + c.y_pad;
  std::vector<float> x = RandomNormal(rng, c.t * xs);
  if (c.round_x || c.x_bf16) RoundToBf16(x);
  const std::vector<float> y0(static_cast<size_t>(c.t * ys), kSentinel);
  Buffer xc, xg;
  if (c.x_bf16) {
    std::vector<uint16_t> bits(x.size());
    for (size_t i = 0; i < x.size(); ++i) bits[i] = F32ToBf16(x[i]);
    xc = UploadBytes(b.cpu, bits.data(), static_cast<int64_t>(bits.size() * 2));
    xg = UploadBytes(b.cuda, bits.data(), static_cast<int64_t>(bits.size() * 2));
  } else {
    xc = Upload(b.cpu, x);
    xg = Upload(b.cuda, x);
  }
  Buffer yc = Upload(b.cpu, y0), yg = Upload(b.cuda, y0);
  const DType dt = c.x_bf16 ? DType::kBF16 : DType::kF32;
  auto args = [&](const LinearHandle& w, const Buffer& xb, const Buffer& yb) {
    return LinearArgs{.w = w.get(), .x = {.data = xb.data(), .dtype = dt}, .y = yb.as<float>(), .t = c.t,
                      .groups = c.groups, .x_stride = c.x_pad ? xs : 0, .y_stride = c.y_pad ? ys : 0};
  };
  b.cpu.ops().Linear(args(*wc, xc, yc));
  if (c.plan) {
    const absl::Status launched =
        LaunchLinearWithPlan(args(*wg, xg, yg), &*c.plan, static_cast<CudaBackend&>(b.cuda).stream());
    ASSERT_TRUE(launched.ok()) << launched;
  } else {
    b.cuda.ops().Linear(args(*wg, xg, yg));
  }
  ASSERT_TRUE(b.cpu.Synchronize().ok());
  const absl::Status s = b.cuda.Synchronize();
  ASSERT_TRUE(s.ok()) << s;
  const std::vector<float> want = Download(b.cpu, yc, c.t * ys), got = Download(b.cuda, yg, c.t * ys);
  const bool tight = c.round_x || c.x_bf16 || c.format == WeightFormat::kF32;
  std::string what = absl::StrCat(c.what, " [", c.n, "x", c.k, "] T=", c.t);
  if (c.plan) absl::StrAppend(&what, " ", LinearPlanName(*c.plan));
  ExpectClose(what, got, want, tight ? kTightRel : kBf16Rel);
}

// The split-K plan with forced m-tiles / splits for case `c` (fails the test when there is none).
LinearPlan SplitPlan(const LinearCase& c, int m_tiles, int splits) {
  std::optional<LinearPlan> plan =
      PlanSplitKLinear(c.t, c.n / c.groups, c.k, c.groups, CurrentDeviceSms(), m_tiles, splits);
  EXPECT_TRUE(plan.has_value()) << c.what << " m_tiles " << m_tiles << " splits " << splits;
  return plan.value_or(LinearPlan{});
}

TEST(DenseLinear, Fp8FlashDecode) {
  DSV4_REQUIRE_GPU();
  CheckLinear({.what = "wq_a", .n = 1024, .k = 4096, .t = 1});
  CheckLinear({.what = "wq_a", .n = 1024, .k = 4096, .t = 8});
  CheckLinear({.what = "wkv", .n = 512, .k = 4096, .t = 2});
  CheckLinear({.what = "wq_b", .n = 32768, .k = 1024, .t = 1});
  CheckLinear({.what = "wo_b", .n = 4096, .k = 8192, .t = 16});
  CheckLinear({.what = "shared w1", .n = 2048, .k = 4096, .t = 12});
  CheckLinear({.what = "shared w2", .n = 4096, .k = 2048, .t = 33});
  CheckLinear({.what = "indexer wq_b", .n = 8192, .k = 1024, .t = 64});
}

TEST(DenseLinear, Fp8EveryDecodeTokenCount) {
  DSV4_REQUIRE_GPU();
  for (const int64_t t : {1, 2, 4, 8, 16, 32, 64, 128}) {
    CheckLinear({.what = "wq_a", .n = 1024, .k = 4096, .t = t});
  }
  CheckLinear({.what = "wkv", .n = 512, .k = 4096, .t = 32});
  CheckLinear({.what = "wkv", .n = 512, .k = 4096, .t = 128});
  CheckLinear({.what = "wo_b (lean multi-weight build)", .n = 4096, .k = 8192, .t = 1});
  CheckLinear({.what = "wo_b", .n = 4096, .k = 8192, .t = 4});
  // The automatic plan's hand-off to the multi-weight kernel (lean build, T <= 8, >= 16 MiB, K >= 4096) with the
  // inputs the single linear accepts: bf16 x, row strides on x and y, grouped (wo_a's 8 groups).
  CheckLinear({.what = "wo_b lean, bf16 x, strided", .n = 4096, .k = 8192, .t = 8, .x_bf16 = true, .x_pad = 24,
               .y_pad = 8});
  CheckLinear({.what = "wo_a lean, 8 groups, raw x, strided", .n = 8192, .k = 4096, .t = 3, .groups = 8,
               .round_x = false, .x_pad = 8, .y_pad = 16});
  CheckLinear({.what = "indexer wq_b, 4 token tiles", .n = 8192, .k = 1024, .t = 128});
  CheckLinear({.what = "indexer wq_b, a partial token tile", .n = 8192, .k = 1024, .t = 100});
}

TEST(DenseLinear, Fp8Tp4ShardDecode) {
  DSV4_REQUIRE_GPU();
  CheckLinear({.what = "wq_b tp4", .n = 8192, .k = 1024, .t = 2});
  CheckLinear({.what = "wo_a tp4 groups 2", .n = 2048, .k = 4096, .t = 3, .groups = 2});
  CheckLinear({.what = "wo_a tp4 groups 2", .n = 2048, .k = 4096, .t = 32, .groups = 2});
  CheckLinear({.what = "wo_b tp4", .n = 4096, .k = 2048, .t = 16});
  CheckLinear({.what = "shared w1 tp4", .n = 512, .k = 4096, .t = 8});
  CheckLinear({.what = "shared w2 tp4", .n = 4096, .k = 512, .t = 8});
}

TEST(DenseLinear, Bf16DecodeSplitK) {
  DSV4_REQUIRE_GPU();
  const WeightFormat bf16 = WeightFormat::kBF16;
  CheckLinear({.what = "weights_proj, 64 splits", .format = bf16, .n = 64, .k = 4096, .t = 1});
  CheckLinear({.what = "weights_proj", .format = bf16, .n = 64, .k = 4096, .t = 32});
  CheckLinear({.what = "indexer compressor", .format = bf16, .n = 256, .k = 4096, .t = 16, .x_bf16 = true});
  CheckLinear({.what = "compressor r128", .format = bf16, .n = 512, .k = 4096, .t = 128});
}

// Forced plans: every m-tile / split combination the split-K kernel has, on shapes with K tails (blocks of a
// cluster past the end of K), N not a multiple of the block's rows, groups, strides and unaligned rows.
TEST(DenseLinear, SplitKForcedPlans) {
  DSV4_REQUIRE_GPU();
  std::vector<LinearCase> cases = {
      {.what = "wq_a", .n = 1024, .k = 4096, .t = 3},
      {.what = "wq_a 16 tokens", .n = 1024, .k = 4096, .t = 16},
      {.what = "K tail", .n = 130, .k = 4096 + 48, .t = 2},
      {.what = "odd N and K (unaligned)", .n = 200, .k = 328, .t = 9},
      {.what = "groups of 40 rows", .n = 80, .k = 256, .t = 3, .groups = 2},
      {.what = "strided x and y", .n = 512, .k = 1024, .t = 5, .x_pad = 64, .y_pad = 8},
      {.what = "strided, grouped, 40 tokens", .n = 1024, .k = 512, .t = 40, .groups = 4, .x_pad = 16, .y_pad = 3},
      {.what = "bf16 x, bf16 W", .format = WeightFormat::kBF16, .n = 96, .k = 640, .t = 7, .x_bf16 = true},
      {.what = "raw x, f32 scales", .n = 256, .k = 1024, .t = 12, .round_x = false, .scale_f32 = true},
  };
  for (LinearCase c : cases) {
    for (const int m_tiles : {1, 2}) {
      if (m_tiles == 2 && c.t > 16) continue;  // no 2 x 4 tile
      for (const int splits : {1, 2, 8, 16, 64}) {
        const LinearPlan plan = SplitPlan(c, m_tiles, splits);
        c.plan = plan;
        CheckLinear(c);
        // The FP8 weight-ring plan with the same number of splits and 2..4 slots per warp (BF16, unaligned rows
        // and grouped N % 16 != 0 run it with the register ring inside LaunchLinearWithPlan).
        if (m_tiles == 1 && splits <= 32) {
          for (const int stages : {2, 3, kMaxStages}) {
            const std::optional<LinearPlan> ring =
                PlanRingLinear(c.t, c.n / c.groups, c.k, c.groups, CurrentDeviceSms(), splits, stages);
            EXPECT_TRUE(ring.has_value()) << c.what << " splits " << splits << " stages " << stages;
            if (ring) {
              c.plan = *ring;
              CheckLinear(c);
            }
          }
        }
      }
    }
    c.plan = PlanTiledLinear(c.t, c.n / c.groups, c.k, c.groups, CurrentDeviceSms());
    CheckLinear(c);
  }
}

// The FP8 weight ring at its edges (small enough for compute-sanitizer): K tails inside a step, rows past N in a
// tile, grouped N % 16 == 0, strided and bf16 x, clusters and warp splits, every ring depth.
TEST(DenseLinear, RingPlansAtEdges) {
  DSV4_REQUIRE_GPU();
  const std::vector<LinearCase> cases = {
      {.what = "ring K tail", .n = 130, .k = 1024 + 48, .t = 2},
      {.what = "ring groups of 48 rows", .n = 96, .k = 512, .t = 3, .groups = 2},
      {.what = "ring strided", .n = 512, .k = 1024, .t = 5, .x_pad = 64, .y_pad = 8},
      {.what = "ring grouped strided 40 tokens", .n = 1024, .k = 512, .t = 40, .groups = 4, .x_pad = 16,
       .y_pad = 3},
      {.what = "ring bf16 x", .n = 256, .k = 1024, .t = 9, .x_bf16 = true},
  };
  for (LinearCase c : cases) {
    for (const int splits : {1, 4, 16}) {
      for (const int stages : {2, 3, kMaxStages}) {
        const std::optional<LinearPlan> ring =
            PlanRingLinear(c.t, c.n / c.groups, c.k, c.groups, CurrentDeviceSms(), splits, stages);
        if (!ring) continue;  // more splits than 128-wide steps
        c.plan = *ring;
        CheckLinear(c);
      }
    }
  }
}

TEST(DenseLinear, BadPlansAreRefused) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  std::mt19937 rng(5);
  HostWeight hw = RandomWeight(rng, WeightFormat::kFp8Block128, 256, 1024);
  auto w = b.cuda.PrepareLinear(hw.view);
  ASSERT_TRUE(w.ok()) << w.status();
  Buffer x = Upload(b.cuda, RandomNormal(rng, 4 * 1024)), y = testing::Poisoned(b.cuda, 4 * 256);
  const LinearArgs args{.w = w->get(), .x = {.data = x.data()}, .y = y.as<float>(), .t = 4};
  const LinearPlan good = *PlanSplitKLinear(4, 256, 1024, 1, CurrentDeviceSms(), 1, 8);
  const cudaStream_t stream = static_cast<CudaBackend&>(b.cuda).stream();
  LinearPlan bad = good;
  bad.k_slice = 64;  // cluster * k_slice < Kin
  EXPECT_EQ(LaunchLinearWithPlan(args, &bad, stream).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.cluster = 3;
  EXPECT_EQ(LaunchLinearWithPlan(args, &bad, stream).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.warps_m = 8, bad.warps_k = 2;  // 16 warps
  EXPECT_EQ(LaunchLinearWithPlan(args, &bad, stream).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.stages = 1;  // a ring needs two slots
  EXPECT_EQ(LaunchLinearWithPlan(args, &bad, stream).code(), absl::StatusCode::kInvalidArgument);
  bad.stages = kMaxStages + 1;
  EXPECT_EQ(LaunchLinearWithPlan(args, &bad, stream).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(PlanRingLinear(4, 256, 1024, 1, 132, 0, 1).has_value());
  EXPECT_FALSE(PlanRingLinear(4, 256, 1024, 1, 132, 3).has_value());
  EXPECT_FALSE(PlanRingLinear(129, 256, 1024, 1, 132).has_value());
  bad = *PlanRingLinear(4, 256, 1024, 1, 132);
  bad.m_tiles = 2;  // the ring takes one row tile per warp
  EXPECT_EQ(LaunchLinearWithPlan(args, &bad, stream).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.m_tiles = 2, bad.n_tiles = 4;
  EXPECT_EQ(LaunchLinearWithPlan(args, &bad, stream).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(PlanSplitKLinear(129, 256, 1024, 1, 132).has_value());
  EXPECT_FALSE(PlanSplitKLinear(32, 256, 1024, 1, 132, 2).has_value());
  EXPECT_TRUE(LaunchLinearWithPlan(args, &good, stream).ok());
  ASSERT_TRUE(b.cuda.Synchronize().ok());
}

TEST(DenseLinear, Fp8FlashGroupedWoA) {
  DSV4_REQUIRE_GPU();
  CheckLinear({.what = "wo_a groups 8", .n = 8192, .k = 4096, .t = 1, .groups = 8});
  CheckLinear({.what = "wo_a groups 8", .n = 8192, .k = 4096, .t = 17, .groups = 8});
}

TEST(DenseLinear, Fp8Prefill) {
  DSV4_REQUIRE_GPU();
  CheckLinear({.what = "wq_a prefill", .n = 1024, .k = 4096, .t = 600});
  CheckLinear({.what = "wq_b prefill", .n = 32768, .k = 1024, .t = 129});
  CheckLinear({.what = "wo_a prefill", .n = 8192, .k = 4096, .t = 256, .groups = 8});
}

TEST(DenseLinear, Fp8RawActivationsAndF32Scales) {
  DSV4_REQUIRE_GPU();
  CheckLinear({.what = "wq_a raw x", .n = 1024, .k = 4096, .t = 3, .round_x = false});
  CheckLinear({.what = "wq_a raw x prefill", .n = 1024, .k = 4096, .t = 100, .round_x = false});
  CheckLinear({.what = "f32 scales", .n = 1024, .k = 4096, .t = 5, .scale_f32 = true});
  CheckLinear({.what = "bf16 x", .n = 1024, .k = 4096, .t = 9, .x_bf16 = true});
  CheckLinear({.what = "bf16 x prefill", .n = 2048, .k = 1024, .t = 70, .x_bf16 = true});
}

TEST(DenseLinear, Fp8OddShapesAndStrides) {
  DSV4_REQUIRE_GPU();
  // K not a multiple of 16 (no 16-byte rows: the element-wise path), N not a multiple of 16 or 128.
  CheckLinear({.what = "odd N and K", .n = 200, .k = 328, .t = 9});
  CheckLinear({.what = "K tail within a step", .n = 130, .k = 4096 + 48, .t = 2});
  CheckLinear({.what = "groups of 40 rows", .n = 80, .k = 256, .t = 3, .groups = 2});
  CheckLinear({.what = "strided x and y", .n = 512, .k = 1024, .t = 5, .x_pad = 64, .y_pad = 8});
  CheckLinear({.what = "strided, grouped, prefill", .n = 1024, .k = 512, .t = 40, .groups = 4, .x_pad = 16,
               .y_pad = 3});
}

TEST(DenseLinear, Bf16Weights) {
  DSV4_REQUIRE_GPU();
  const WeightFormat bf16 = WeightFormat::kBF16;
  CheckLinear({.what = "compressor wkv", .format = bf16, .n = 1024, .k = 4096, .t = 1});
  CheckLinear({.what = "compressor wgate prefill", .format = bf16, .n = 1024, .k = 4096, .t = 40, .x_bf16 = true});
  CheckLinear({.what = "indexer weights_proj", .format = bf16, .n = 64, .k = 4096, .t = 7});
  CheckLinear({.what = "head slice", .format = bf16, .n = 16384, .k = 4096, .t = 2});
  CheckLinear({.what = "tiny head", .format = bf16, .n = 4096, .k = 512, .t = 3});
  CheckLinear({.what = "tiny weights_proj", .format = bf16, .n = 8, .k = 512, .t = 1});
  CheckLinear({.what = "bf16 odd", .format = bf16, .n = 77, .k = 100, .t = 4, .round_x = false});
}

TEST(DenseLinear, F32Weights) {
  DSV4_REQUIRE_GPU();
  const WeightFormat f32 = WeightFormat::kF32;
  CheckLinear({.what = "f32", .format = f32, .n = 300, .k = 200, .t = 6, .round_x = false});
  CheckLinear({.what = "f32 grouped strided", .format = f32, .n = 64, .k = 96, .t = 5, .groups = 2,
               .round_x = false, .x_pad = 7, .y_pad = 1});
  CheckLinear({.what = "f32 bf16 x", .format = f32, .n = 128, .k = 256, .t = 3, .x_bf16 = true});
}

TEST(DenseLinear, ZeroTokensWritesNothing) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  std::mt19937 rng(7);
  HostWeight hw = RandomWeight(rng, WeightFormat::kFp8Block128, 256, 256);
  auto w = b.cuda.PrepareLinear(hw.view);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::vector<float> y0(256, kSentinel);
  Buffer x = Upload(b.cuda, RandomNormal(rng, 256)), y = Upload(b.cuda, y0);
  b.cuda.ops().Linear({.w = w->get(), .x = {.data = x.data()}, .y = y.as<float>(), .t = 0});
  ASSERT_TRUE(b.cuda.Synchronize().ok());
  ExpectBitEqual("T=0 leaves y", Download(b.cuda, y, 256), y0);
}

TEST(DenseLinear, Deterministic) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  std::mt19937 rng(11);
  HostWeight hw = RandomWeight(rng, WeightFormat::kFp8Block128, 1024, 4096);
  auto w = b.cuda.PrepareLinear(hw.view);
  ASSERT_TRUE(w.ok()) << w.status();
  for (const int64_t t : {1, 24, 128, 200}) {
    Buffer x = Upload(b.cuda, RandomNormal(rng, t * 4096));
    Buffer y1 = testing::Poisoned(b.cuda, t * 1024), y2 = testing::Poisoned(b.cuda, t * 1024);
    b.cuda.ops().Linear({.w = w->get(), .x = {.data = x.data()}, .y = y1.as<float>(), .t = t});
    b.cuda.ops().Linear({.w = w->get(), .x = {.data = x.data()}, .y = y2.as<float>(), .t = t});
    ASSERT_TRUE(b.cuda.Synchronize().ok());
    ExpectBitEqual(absl::StrCat("same call twice, T=", t), Download(b.cuda, y1, t * 1024),
                   Download(b.cuda, y2, t * 1024));
  }
}

// Not a check: times the linear at flash decode shapes (CUDA events, 50 calls after a warm-up) and prints
// microseconds and weight GB/s, for the report and as issue 14's baseline. Run with
// --gtest_also_run_disabled_tests --gtest_filter='*LinearTiming*'.
TEST(DenseLinearTiming, DISABLED_FlashDecodeShapes) {
  DSV4_REQUIRE_GPU();
  auto& gpu = static_cast<CudaBackend&>(GetBackends().cuda);
  struct Shape {
    const char* what;
    WeightFormat format;
    int64_t n, k;
    int groups;
  };
  const Shape shapes[] = {{"wq_a", WeightFormat::kFp8Block128, 1024, 4096, 1},
                          {"wkv", WeightFormat::kFp8Block128, 512, 4096, 1},
                          {"wq_b", WeightFormat::kFp8Block128, 32768, 1024, 1},
                          {"wo_a (8 groups)", WeightFormat::kFp8Block128, 8192, 4096, 8},
                          {"wo_b", WeightFormat::kFp8Block128, 4096, 8192, 1},
                          {"shared w1", WeightFormat::kFp8Block128, 2048, 4096, 1},
                          {"compressor wkv (bf16)", WeightFormat::kBF16, 1024, 4096, 1},
                          {"head (bf16)", WeightFormat::kBF16, 129280, 4096, 1}};
  cudaEvent_t start, stop;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  std::mt19937 rng(1);
  for (const Shape& sh : shapes) {
    // Zero weights (ue8m0 scales 2^0): the time does not depend on the values, and a 1 GB random head would
    // take the host longer to make than the GPU to run.
    const bool fp8 = sh.format == WeightFormat::kFp8Block128;
    const std::vector<uint8_t> data(static_cast<size_t>(sh.n * sh.k * (fp8 ? 1 : 2)), 0);
    const std::vector<uint8_t> scale(static_cast<size_t>(((sh.n + 127) / 128) * ((sh.k + 127) / 128)), 127);
    auto w = gpu.PrepareLinear({.name = sh.what, .format = sh.format, .n = sh.n, .k = sh.k, .data = data.data(),
                                .scale = fp8 ? scale.data() : nullptr});
    ASSERT_TRUE(w.ok()) << w.status();
    for (const int64_t t : {1, 8, 32, 128, 1024}) {
      Buffer x = Upload(gpu, RandomNormal(rng, t * sh.k * sh.groups));
      Buffer y = testing::Poisoned(gpu, t * sh.n);
      const LinearArgs args{.w = w->get(), .x = {.data = x.data()}, .y = y.as<float>(), .t = t, .groups = sh.groups};
      gpu.ops().Linear(args);
      cudaEventRecord(start, gpu.stream());
      constexpr int kReps = 50;
      for (int i = 0; i < kReps; ++i) gpu.ops().Linear(args);
      cudaEventRecord(stop, gpu.stream());
      ASSERT_TRUE(gpu.Synchronize().ok());
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      const double us = 1e3 * ms / kReps;
      const double gbs = static_cast<double>((*w)->device_bytes()) / (us * 1e3);
      const double tflops = 2.0 * t * sh.n * sh.k / (us * 1e6);
      std::printf("  linear %-22s [%6lld x %5lld] T=%-5lld %9.2f us  %7.1f GB/s of weights  %6.1f TFLOP/s\n", sh.what,
                  static_cast<long long>(sh.n), static_cast<long long>(sh.k), static_cast<long long>(t), us, gbs,
                  tflops);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace
}  // namespace dsv4::kernels::cuda
