// The CUDA backend itself (cuda_ops_test, label gpu): memory counted by kind and zero-filled, copies, the first
// op error surfacing at Synchronize / CopyToHost, weights it refuses, Reserve, and a CUDA graph of dense ops
// captured on the backend's stream replaying to the eager results bit for bit.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "tests/cuda/test_util.h"

namespace dsv4::kernels::cuda {
namespace {

using testing::Download;
using testing::ExpectBitEqual;
using testing::GetBackends;
using testing::HostWeight;
using testing::Poisoned;
using testing::RandomNormal;
using testing::RandomWeight;
using testing::Upload;

TEST(DenseBackend, NameAndMemoryByKind) {
  DSV4_REQUIRE_GPU();
  Backend& gpu = GetBackends().cuda;
  EXPECT_EQ(gpu.name().rfind("cuda:0 (", 0), 0u) << gpu.name();
  for (const MemoryKind kind : {MemoryKind::kWeights, MemoryKind::kKvCache, MemoryKind::kState,
                                MemoryKind::kWorkspace, MemoryKind::kHostStaging}) {
    const int64_t before = gpu.allocated()[static_cast<int>(kind)];
    {
      absl::StatusOr<Buffer> buf = gpu.Allocate(4096, kind);
      ASSERT_TRUE(buf.ok()) << buf.status();
      EXPECT_EQ(gpu.allocated()[static_cast<int>(kind)], before + 4096) << MemoryKindName(kind);
      std::vector<float> host(1024, 1.f);
      if (kind == MemoryKind::kHostStaging) {
        std::memcpy(host.data(), buf->data(), 4096);  // pinned host memory, readable directly
      } else {
        host = Download(gpu, *buf, 1024);
      }
      EXPECT_EQ(host, std::vector<float>(1024, 0.f)) << MemoryKindName(kind) << " is not zero-filled";
    }
    EXPECT_EQ(gpu.allocated()[static_cast<int>(kind)], before) << MemoryKindName(kind);
  }
  absl::StatusOr<Buffer> empty = gpu.Allocate(0, MemoryKind::kWorkspace);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  EXPECT_EQ(gpu.Allocate(-1, MemoryKind::kWorkspace).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DenseBackend, CopiesThroughPinnedStaging) {
  DSV4_REQUIRE_GPU();
  Backend& gpu = GetBackends().cuda;
  std::mt19937 rng(5);
  const std::vector<float> data = RandomNormal(rng, 1 << 20);
  absl::StatusOr<Buffer> staging = gpu.Allocate(4 << 20, MemoryKind::kHostStaging);
  absl::StatusOr<Buffer> dev = gpu.Allocate(4 << 20, MemoryKind::kState);
  ASSERT_TRUE(staging.ok() && dev.ok());
  std::memcpy(staging->data(), data.data(), 4 << 20);
  ASSERT_TRUE(gpu.CopyToDevice(dev->data(), staging->data(), 4 << 20).ok());
  ExpectBitEqual("staging -> device -> host", Download(gpu, *dev, 1 << 20), data);
}

TEST(DenseBackend, FirstOpErrorSurfacesOnceAtSynchronize) {
  DSV4_REQUIRE_GPU();
  Backend& gpu = GetBackends().cuda;
  ASSERT_TRUE(gpu.Synchronize().ok());
  std::mt19937 rng(6);
  HostWeight hw = RandomWeight(rng, WeightFormat::kFp8Block128, 1024, 256);
  auto w = gpu.PrepareLinear(hw.view);
  ASSERT_TRUE(w.ok()) << w.status();
  Buffer x = Upload(gpu, RandomNormal(rng, 3 * 256)), y = Poisoned(gpu, 3 * 1024);
  gpu.ops().Linear({.w = w->get(), .x = {.data = x.data()}, .y = y.as<float>(), .t = 1, .groups = 3});
  gpu.ops().HadamardFp4({.x = x.as<float>(), .rows = 1, .dim = 100});  // a second, later error
  const absl::Status first = gpu.Synchronize();
  EXPECT_EQ(first.code(), absl::StatusCode::kInvalidArgument) << first;
  EXPECT_NE(first.message().find("groups"), std::string::npos) << first;
  EXPECT_TRUE(gpu.Synchronize().ok()) << "the error is reported once";

  gpu.ops().Fill({.x = y.as<float>(), .n = -1});
  std::vector<float> host(4);
  EXPECT_EQ(gpu.CopyToHost(host.data(), y.data(), 16).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(gpu.Synchronize().ok());
}

TEST(DenseBackend, RefusesFourBitLinearsAndForeignWeights) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  std::mt19937 rng(8);
  for (const WeightFormat f : {WeightFormat::kNvfp4, WeightFormat::kMxfp4}) {
    HostWeight hw = RandomWeight(rng, f, 128, 256);
    auto w = b.cuda.PrepareLinear(hw.view);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kUnimplemented) << w.status();
    EXPECT_NE(w.status().message().find("PrepareExperts"), std::string::npos) << w.status();
  }
  HostWeight fp8 = RandomWeight(rng, WeightFormat::kFp8Block128, 128, 256);
  fp8.view.scale = nullptr;
  EXPECT_EQ(b.cuda.PrepareLinear(fp8.view).status().code(), absl::StatusCode::kInvalidArgument);

  HostWeight bf16 = RandomWeight(rng, WeightFormat::kBF16, 128, 256);
  auto cpu_w = b.cpu.PrepareLinear(bf16.view);
  ASSERT_TRUE(cpu_w.ok());
  Buffer x = Upload(b.cuda, RandomNormal(rng, 256)), y = Poisoned(b.cuda, 128);
  b.cuda.ops().Linear({.w = cpu_w->get(), .x = {.data = x.data()}, .y = y.as<float>(), .t = 1});
  const absl::Status s = b.cuda.Synchronize();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(DenseBackend, ReserveForFlashLimits) {
  DSV4_REQUIRE_GPU();
  Backend& gpu = GetBackends().cuda;
  const StepLimits limits{.max_tokens = 512, .max_seqs = 64, .max_context = 8192, .hidden = 4096, .hc_mult = 4,
                          .heads = 64, .head_dim = 512, .window = 128, .index_heads = 64, .index_dim = 128,
                          .index_topk = 512, .experts = 256, .experts_per_token = 6, .moe_inter = 2048,
                          .shared_inter = 2048, .vocab = 129280};
  const absl::Status s = gpu.Reserve(limits);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(gpu.Reserve(limits).ok()) << "a second Reserve with the same limits";
}

// Linear -> RMSNorm -> HcPre -> HcPost captured once on the backend's stream, replayed on new inputs: the
// launches allocate nothing and read nothing back, and replay gives the eager results bit for bit.
TEST(DenseGraph, CaptureReplayMatchesEager) {
  DSV4_REQUIRE_GPU();
  auto& gpu = static_cast<CudaBackend&>(GetBackends().cuda);
  std::mt19937 rng(9);
  const int64_t t = 4, d = 512, s = 4, k = 1024;
  HostWeight hw = RandomWeight(rng, WeightFormat::kFp8Block128, d, k);
  auto w = gpu.PrepareLinear(hw.view);
  ASSERT_TRUE(w.ok());
  Buffer x = Upload(gpu, RandomNormal(rng, t * k)), y = Poisoned(gpu, t * d), nw = Upload(gpu, RandomNormal(rng, d));
  Buffer streams = Upload(gpu, RandomNormal(rng, t * s * d)), fn = Upload(gpu, RandomNormal(rng, 24 * s * d, 0.02f));
  Buffer base = Upload(gpu, RandomNormal(rng, 24)), scale = Upload(gpu, RandomNormal(rng, 3));
  Buffer u = Poisoned(gpu, t * d), post = Poisoned(gpu, t * s), comb = Poisoned(gpu, t * s * s);
  Buffer out = Poisoned(gpu, t * s * d);
  auto step = [&] {
    Ops& ops = gpu.ops();
    ops.Linear({.w = w->get(), .x = {.data = x.data()}, .y = y.as<float>(), .t = t});
    ops.RmsNorm({.x = y.as<float>(), .w = nw.as<float>(), .out = y.as<float>(), .rows = t, .dim = d});
    ops.HcPre({.x = streams.as<float>(), .fn = fn.as<float>(), .base = base.as<float>(), .scale = scale.as<float>(),
               .u = u.as<float>(), .post = post.as<float>(), .comb = comb.as<float>(), .t = t, .s = s, .d = d});
    ops.HcPost({.x = streams.as<float>(), .y = y.as<float>(), .post = post.as<float>(), .comb = comb.as<float>(),
                .x_out = out.as<float>(), .t = t, .s = s, .d = d});
  };
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(gpu.stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  step();
  ASSERT_EQ(cudaStreamEndCapture(gpu.stream(), &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_TRUE(gpu.Synchronize().ok()) << "no op failed while capturing";

  // New inputs, replay, keep the results; then the same inputs eagerly.
  const std::vector<float> x2 = RandomNormal(rng, t * k), s2 = RandomNormal(rng, t * s * d);
  ASSERT_TRUE(gpu.CopyToDevice(x.data(), x2.data(), t * k * 4).ok());
  ASSERT_TRUE(gpu.CopyToDevice(streams.data(), s2.data(), t * s * d * 4).ok());
  ASSERT_EQ(cudaGraphLaunch(exec, gpu.stream()), cudaSuccess);
  const std::vector<float> replay_u = Download(gpu, u, t * d), replay_out = Download(gpu, out, t * s * d);
  step();
  ExpectBitEqual("graph replay vs eager: u", replay_u, Download(gpu, u, t * d));
  ExpectBitEqual("graph replay vs eager: hc_post out", replay_out, Download(gpu, out, t * s * d));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace
}  // namespace dsv4::kernels::cuda
