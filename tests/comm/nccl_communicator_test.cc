// NcclCommunicator on real GPUs: every collective against exact host results, world 1 (one GPU) and world 2
// (two GPUs, one thread per rank). Skips with a message when built without CUDA or run without a GPU.
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

#if defined(DSV4_HAVE_NCCL)
#include <cuda_runtime.h>

#include "comm/nccl_communicator.h"
#include "common/float_formats.h"
#endif

namespace dsv4::comm {
namespace {

#if defined(DSV4_HAVE_NCCL)

// Runs every collective on this rank and checks it; returns the first failure as text (empty when all good).
std::string RunRank(int rank, int world, const std::string& id, uint32_t seed) {
  NcclOptions options;
  options.device = rank;
  options.comm.startup_timeout = std::chrono::milliseconds(60'000);
  auto comm_or = NcclCommunicator::Create(rank, world, id, options);
  if (!comm_or.ok()) return comm_or.status().ToString();
  NcclCommunicator& comm = **comm_or;
  const size_t n = 100'003;
  auto input = [&](int r) {
    std::mt19937 rng(seed + r);
    std::vector<float> v(n);
    for (auto& x : v) x = std::uniform_real_distribution<float>(-1, 1)(rng);
    return v;
  };
  std::vector<double> want(n, 0.0), want16(n, 0.0);
  for (int r = 0; r < world; ++r) {
    const auto v = input(r);
    for (size_t i = 0; i < n; ++i) {
      want[i] += v[i];
      want16[i] += Bf16ToF32(F32ToBf16(v[i]));
    }
  }
  const auto mine = input(rank);
  float* d = nullptr;
  cudaMalloc(&d, n * sizeof(float));
  cudaMemcpy(d, mine.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  if (auto s = comm.AllReduceSum(d, n); !s.ok()) return s.ToString();
  std::vector<float> got(n);
  cudaMemcpy(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(got[i])) return "NaN in fp32 all-reduce";
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  std::printf("rank %d nccl fp32 all-reduce rel err %.3g\n", rank, std::sqrt(num / den));
  if (std::sqrt(num / den) > 1e-6) return "fp32 all-reduce rel err too large";

  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = F32ToBf16(mine[i]);
  uint16_t* d16 = reinterpret_cast<uint16_t*>(d);
  cudaMemcpy(d16, h.data(), n * 2, cudaMemcpyHostToDevice);
  if (auto s = comm.AllReduceSumBf16(d16, n); !s.ok()) return s.ToString();
  cudaMemcpy(h.data(), d16, n * 2, cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < n; ++i) {
    const float g = Bf16ToF32(h[i]);
    if (!(std::fabs(g - want16[i]) <= std::ldexp(std::fabs(want16[i]), -8) + 1e-6)) {
      return "bf16 all-reduce off by more than one rounding at " + std::to_string(i);
    }
  }

  const size_t bytes = 1000;
  uint8_t* dg = nullptr;
  cudaMalloc(&dg, bytes * (world + 1));
  std::vector<uint8_t> send(bytes, static_cast<uint8_t>(rank + 1));
  cudaMemcpy(dg, send.data(), bytes, cudaMemcpyHostToDevice);
  if (auto s = comm.AllGather(dg, dg + bytes, bytes); !s.ok()) return s.ToString();
  std::vector<uint8_t> all(bytes * world);
  cudaMemcpy(all.data(), dg + bytes, all.size(), cudaMemcpyDeviceToHost);
  for (int r = 0; r < world; ++r) {
    if (all[r * bytes] != r + 1 || all[r * bytes + bytes - 1] != r + 1) return "all-gather chunk wrong";
  }
  std::vector<uint8_t> b(bytes, rank == 0 ? 42 : 0);
  cudaMemcpy(dg, b.data(), bytes, cudaMemcpyHostToDevice);
  if (auto s = comm.Broadcast(dg, bytes, 0); !s.ok()) return s.ToString();
  cudaMemcpy(b.data(), dg, bytes, cudaMemcpyDeviceToHost);
  if (b[0] != 42 || b[bytes - 1] != 42) return "broadcast wrong";
  if (auto s = comm.Barrier(); !s.ok()) return s.ToString();
  cudaFree(dg);
  cudaFree(d);
  return "";
}

void RunWorld(int world) {
  if (NcclCommunicator::DeviceCount() < world) {
    GTEST_SKIP() << "needs " << world << " CUDA GPU(s); " << NcclCommunicator::DeviceCount() << " visible";
  }
  auto id = NcclCommunicator::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  const uint32_t seed = std::random_device{}();
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { errors[r] = RunRank(r, world, *id, seed); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r << " (seed " << seed << ")";
}

TEST(NcclCommunicatorTest, World1) { RunWorld(1); }
TEST(NcclCommunicatorTest, World2) { RunWorld(2); }

TEST(NcclCommunicatorTest, RefusesABadUniqueId) {
  if (NcclCommunicator::DeviceCount() < 1) GTEST_SKIP() << "needs a CUDA GPU; none visible";
  EXPECT_EQ(NcclCommunicator::Create(0, 1, "short", NcclOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

#else

TEST(NcclCommunicatorTest, World1) { GTEST_SKIP() << "built without CUDA (DSV4_HAVE_NCCL unset): no NCCL backend"; }

#endif

}  // namespace
}  // namespace dsv4::comm
