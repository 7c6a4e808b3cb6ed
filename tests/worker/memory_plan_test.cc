// The start-up memory plan (worker/memory_plan.h) against a fake device executor that accounts device memory like
// the CUDA backend does (weights at load, workspace + pools at AllocateCache, graphs at capture, a CUDA context
// nobody allocated): the pools get --gpu-memory-fraction of the device minus everything else, a fraction too small
// for one request is refused naming the flags, --kv-pages overrides the budget, the table says it all.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/memory_plan.h"

namespace dsv4::worker {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;

// Window rows 1 KiB, compressed-4 rows 512 B (a quarter of the positions), the other pools unused.
class FakeDeviceExecutor final : public ModelExecutor {
 public:
  int64_t total = 10240 * kMiB;
  int64_t context = 500 * kMiB;         // CUDA context + NCCL: used, but held by no backend allocation
  int64_t weights = 2048 * kMiB;
  int64_t workspace = 1024 * kMiB;      // allocated with the cache
  int64_t graph_bytes_each = 3 * kMiB;  // per captured bucket
  std::vector<std::vector<int>> captures;
  std::vector<std::array<int64_t, kNumPools>> allocations;

  const ModelInfo& info() const override { return info_; }
  int64_t PageBytes(Pool pool, int page_rows) const override {
    if (pool == Pool::kWindow) return 1024 * page_rows;
    if (pool == Pool::kCompressed4) return 512 * page_rows;
    return 0;
  }
  int64_t RowsNeeded(Pool pool, int64_t n) const override {
    if (pool == Pool::kWindow) return n > 0 ? 128 : 0;
    if (pool == Pool::kCompressed4) return n / 4;
    return 0;
  }
  absl::Status AllocateCache(const std::array<int64_t, kNumPools>& pages, int page_rows, int slots) override {
    allocations.push_back(pages);
    kv_ = 0;
    for (int p = 0; p < kNumPools; ++p) kv_ += pages[p] * PageBytes(static_cast<Pool>(p), page_rows);
    if (Used() > total) return absl::ResourceExhaustedError("fake device: out of memory");
    cached_ = true;
    graphs_ = 0;  // re-allocation invalidates the graphs
    return absl::OkStatus();
  }
  absl::Status ResetState(int32_t) override { return absl::OkStatus(); }
  absl::Status Forward(std::span<const SeqChunk>, float*) override { return absl::OkStatus(); }
  ExecutorMemory Memory() override {
    return {.backend = "fake-gpu", .device = true, .device_total = total, .device_free = total - Used(),
            .weights = weights, .kv_cache = kv_, .state = 0, .workspace = cached_ ? workspace : 0};
  }
  absl::StatusOr<GraphCaptureReport> CaptureGraphs(const std::vector<int>& buckets, bool capture) override {
    captures.push_back(buckets);
    GraphCaptureReport r;
    if (!capture) return r;  // padded steps, no graphs
    for (int b : buckets) r.buckets.push_back({.bucket = b, .capture_seconds = 0.001, .nodes = 10});
    graphs_ = graph_bytes_each * static_cast<int64_t>(buckets.size());
    r.device_bytes = graphs_;
    return r;
  }

 private:
  int64_t Used() const { return context + weights + (cached_ ? workspace : 0) + kv_ + graphs_; }
  ModelInfo info_;
  int64_t kv_ = 0, graphs_ = 0;
  bool cached_ = false;
};

MemoryPlanRequest Request(double fraction) {
  return {.kv = {.page_rows = 64, .max_batch = 8, .max_context = 4096, .kv_pages = 0},
          .gpu_memory_fraction = fraction,
          .graph_buckets = {1, 2, 4, 8},
          .graph_reserve_per_bucket = 16 * kMiB};
}

TEST(MemoryPlan, PoolsTakeTheFractionsRestThenGraphsAreCaptured) {
  FakeDeviceExecutor ex;
  ex.workspace = 1024 * kMiB;
  // 8 requests of 4096 positions need 8 x 16 compressed-4 pages of 32 KiB = 4 MiB: cap them so the budget binds.
  MemoryPlanRequest r = Request(0.5);
  r.kv.max_batch = 4096;
  absl::StatusOr<MemoryPlan> plan = PlanMemory(ex, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(ex.allocations.size(), 2u) << "a minimal cache first, then the sized one";
  ASSERT_EQ(ex.captures.size(), 1u);
  EXPECT_EQ(ex.captures[0], (std::vector<int>{1, 2, 4, 8})) << "graphs are captured after the final allocation";
  const int64_t budget = ex.total / 2;
  const int64_t others = ex.context + ex.weights + ex.workspace + 4 * 16 * kMiB;
  const int64_t pools = plan->sizing.total_bytes();
  EXPECT_LE(pools, budget - others);
  EXPECT_GE(pools, (budget - others) * 95 / 100) << "the pools should fill most of what is left";
  EXPECT_EQ(plan->budget_bytes, budget);
  EXPECT_EQ(plan->graphs.device_bytes, 4 * 3 * kMiB);
  EXPECT_THAT(plan->table, HasSubstr("--gpu-memory-fraction 0.5"));
  EXPECT_THAT(plan->table, HasSubstr("CUDA graphs"));
  EXPECT_THAT(plan->table, HasSubstr("other on the device"));
  EXPECT_THAT(plan->table, HasSubstr("max concurrent sequences at --max-context 4096"));
  EXPECT_GT(plan->max_context_seqs, 8);
  std::printf("%s\n", plan->table.c_str());
}

TEST(MemoryPlan, WithoutGraphsNothingIsReservedForThem) {
  FakeDeviceExecutor with, without;
  MemoryPlanRequest r = Request(0.5);
  r.kv.max_batch = 4096;
  absl::StatusOr<MemoryPlan> a = PlanMemory(with, r);
  r.capture_graphs = false;
  absl::StatusOr<MemoryPlan> b = PlanMemory(without, r);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " / " << b.status();
  EXPECT_EQ(b->graphs.device_bytes, 0);
  EXPECT_GT(b->sizing.total_bytes(), a->sizing.total_bytes() + 60 * kMiB) << "the 64 MiB reserve went to the pools";
}

TEST(MemoryPlan, TooSmallAFractionIsRefusedNamingTheFlags) {
  FakeDeviceExecutor ex;
  absl::StatusOr<MemoryPlan> plan = PlanMemory(ex, Request(0.3));  // 3 GiB < weights + workspace + context
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("--gpu-memory-fraction 0.3"));
  EXPECT_TRUE(ex.captures.empty()) << "nothing is captured when the pools do not fit";
}

TEST(MemoryPlan, KvPagesOverridesTheBudget) {
  FakeDeviceExecutor ex;
  MemoryPlanRequest r = Request(0.9);
  r.kv.kv_pages = 20;
  absl::StatusOr<MemoryPlan> plan = PlanMemory(ex, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->sizing.pages[static_cast<int>(Pool::kCompressed4)], 20);
  EXPECT_EQ(plan->max_context_seqs, 1) << "20 pages hold one request of 16 pages";
}

TEST(MemoryPlan, AHostBackendUsesTheMemFraction) {
  FakeDeviceExecutor ex;
  MemoryPlanRequest r = Request(0.9);
  r.graph_buckets.clear();
  r.kv.mem_fraction = 0.5;
  r.kv.available_bytes = 64 * kMiB;
  struct Host final : public ModelExecutor {
    FakeDeviceExecutor* inner;
    const ModelInfo& info() const override { return inner->info(); }
    int64_t PageBytes(Pool p, int rows) const override { return inner->PageBytes(p, rows); }
    int64_t RowsNeeded(Pool p, int64_t n) const override { return inner->RowsNeeded(p, n); }
    absl::Status AllocateCache(const std::array<int64_t, kNumPools>& pages, int rows, int slots) override {
      return absl::OkStatus();
    }
    absl::Status ResetState(int32_t) override { return absl::OkStatus(); }
    absl::Status Forward(std::span<const SeqChunk>, float*) override { return absl::OkStatus(); }
  } host;
  host.inner = &ex;
  absl::StatusOr<MemoryPlan> plan = PlanMemory(host, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_LE(plan->sizing.total_bytes(), 32 * kMiB);
  EXPECT_THAT(plan->table, HasSubstr("--mem-fraction 0.5"));
}

}  // namespace
}  // namespace dsv4::worker
