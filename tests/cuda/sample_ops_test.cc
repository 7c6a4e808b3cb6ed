// The CUDA Sample op against the CPU reference op (kernels/cpu/cpu_sample.cc): the tokens must be identical
// (0 mismatches) for every combination of temperature / top-k / top-p / min-p, on rows of many kinds (spread,
// peaked, exact ties, all equal, -inf entries, a spike, near-flat, +-0 and denormals, huge magnitudes, NaN, +inf,
// all -inf), at V = 4096, 129280 (flash's vocabulary), small and shard-sized vocabularies, R = 1..64, strided
// rows and padding rows. Token buffers start at a sentinel, and the stride's extra columns hold a huge logit, so
// an unwritten row or a read past V shows as a mismatch. Label gpu; skipped without a GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/ops.h"
#include "tests/cuda/test_util.h"

namespace dsv4::kernels::cuda {
namespace {

using testing::GetBackends;

enum Family {
  kSpread, kPeaked, kTies, kAllEqual, kSomeNegInf, kSpike, kNearFlat, kZerosAndDenormals, kHuge, kNan, kPosInf,
  kAllNegInf, kFamilies
};
const char* const kFamilyNames[] = {"spread",  "peaked", "ties",    "all-equal", "some--inf", "spike",
                                    "near-flat", "+-0/denormal", "huge", "nan", "+inf", "all--inf"};

// N(0, 1) values that rows are cut from at random offsets (drawing 2268 x 129280 fresh normals would take the
// host longer than the whole comparison).
const std::vector<float>& NormalPool() {
  static const std::vector<float> pool = [] {
    std::mt19937 rng(2026);
    return testing::RandomNormal(rng, int64_t{1} << 22);
  }();
  return pool;
}

void FillRow(std::mt19937& rng, Family f, float* row, int64_t v) {
  const std::vector<float>& pool = NormalPool();
  const float scale = f == kPeaked ? 8.0f : (f == kNearFlat ? 1e-3f : 2.0f);
  const size_t offset = rng() % pool.size(), mask = pool.size() - 1;
  for (int64_t i = 0; i < v; ++i) row[i] = scale * pool[(offset + static_cast<size_t>(i)) & mask];
  switch (f) {
    case kTies:
      for (int64_t i = 0; i < v; ++i) row[i] = std::round(row[i] * 2.0f) / 2.0f;
      break;
    case kAllEqual:
      for (int64_t i = 0; i < v; ++i) row[i] = row[0];
      break;
    case kSomeNegInf:
      for (int64_t i = 0; i < v; ++i) {
        if (rng() % 3 == 0) row[i] = -INFINITY;
      }
      break;
    case kSpike:
      for (int64_t i = 0; i < v; ++i) row[i] = 0.0f;
      row[rng() % v] = 20.0f;
      break;
    case kZerosAndDenormals: {
      const float vals[] = {0.0f, -0.0f, 1e-40f, -1e-40f, 1e-45f, -3e-39f};
      for (int64_t i = 0; i < v; ++i) row[i] = vals[rng() % 6];
      break;
    }
    case kHuge:
      for (int64_t i = 0; i < v; ++i) row[i] = rng() % 2 ? 3e38f : -3e38f;
      break;
    case kNan:
      row[rng() % v] = std::numeric_limits<float>::quiet_NaN();
      break;
    case kPosInf:
      row[rng() % v] = INFINITY;
      break;
    case kAllNegInf:
      for (int64_t i = 0; i < v; ++i) row[i] = -INFINITY;
      break;
    default:
      break;
  }
}

// Every combination of these (vLLM-style values plus the extremes: a denormal temperature whose inverse is
// infinite, top_k of 1, V-1, V and more, top_p 0, min_p above 1).
std::vector<SampleParams> AllCombinations(int64_t v, std::mt19937& rng) {
  const float temps[] = {0.0f, 1e-39f, 1e-4f, 0.5f, 1.0f, 2.0f, 1e4f};
  const int64_t topks[] = {0, 1, 2, 7, 50, 1000, v - 1, v, v + 3};
  const float topps[] = {1.0f, 0.0f, 0.05f, 0.5f, 0.9f, 0.999f};
  const float minps[] = {0.0f, 0.001f, 0.1f, 0.9f, 1.0f, 1.5f};
  std::vector<SampleParams> out;
  for (float t : temps) {
    for (int64_t k : topks) {
      for (float p : topps) {
        for (float m : minps) {
          out.push_back({.temperature = t, .top_k = static_cast<int32_t>(k), .top_p = p, .min_p = m,
                         .seed = (static_cast<uint64_t>(rng()) << 32) | rng(), .index = rng() % 100000});
        }
      }
    }
  }
  return out;
}

struct Tally {
  int64_t rows = 0, padding = 0, not_argmax = 0, mismatches = 0;
};

// Samples one batch on both backends and compares the tokens.
void RunBatch(const std::vector<float>& logits, const std::vector<SampleParams>& params,
              const std::vector<Family>& families, int64_t v, int64_t stride, Tally& tally) {
  testing::Backends be = GetBackends();
  const int64_t r = static_cast<int64_t>(params.size());
  int32_t got[2][64];
  Backend* backends[2] = {&be.cpu, &be.cuda};
  for (int b = 0; b < 2; ++b) {
    Backend& k = *backends[b];
    Buffer l = testing::Upload(k, logits);
    Buffer p = testing::UploadBytes(k, params.data(), r * static_cast<int64_t>(sizeof(SampleParams)));
    Buffer t = testing::UploadI32(k, std::vector<int32_t>(static_cast<size_t>(r), -7));
    k.ops().Sample({.logits = l.as<float>(), .params = p.as<SampleParams>(), .tokens = t.as<int32_t>(), .r = r,
                    .v = v, .logits_stride = stride});
    const absl::Status s = k.CopyToHost(got[b], t.data(), r * 4);
    ASSERT_TRUE(s.ok()) << k.name() << ": " << s;
  }
  for (int64_t i = 0; i < r; ++i) {
    const SampleParams& q = params[i];
    const float* row = logits.data() + i * stride;
    int32_t argmax = 0;
    for (int64_t j = 1; j < v; ++j) argmax = row[j] > row[argmax] ? static_cast<int32_t>(j) : argmax;
    ++tally.rows;
    tally.padding += got[0][i] == -1;
    tally.not_argmax += got[0][i] >= 0 && got[0][i] != argmax;
    if (got[0][i] != got[1][i]) {
      if (++tally.mismatches <= 12) {
        ADD_FAILURE() << "V=" << v << " stride=" << stride << " row " << i << "/" << r << " ("
                      << kFamilyNames[families[i]] << ") T=" << q.temperature << " top_k=" << q.top_k
                      << " top_p=" << q.top_p << " min_p=" << q.min_p << " seed=" << q.seed << " index=" << q.index
                      << ": cpu " << got[0][i] << ", cuda " << got[1][i] << " (argmax " << argmax << ")";
      }
    }
  }
}

// Runs `params` in batches of R = 1, 2, 7, 33, then 64 rows; row kinds cycle through the families, odd batches
// are strided (extra columns hold 1e30, which would win if read), and about one row in 16 is padding.
Tally RunAll(int64_t v, std::vector<SampleParams> params, std::mt19937& rng) {
  const int64_t sizes[] = {1, 2, 7, 33};
  Tally tally;
  size_t next = 0;
  for (int batch = 0; next < params.size(); ++batch) {
    const int64_t r = std::min<int64_t>(batch < 4 ? sizes[batch] : 64, static_cast<int64_t>(params.size() - next));
    const int64_t stride = batch % 2 == 1 ? v + 3 : v;
    std::vector<float> logits(static_cast<size_t>(r * stride), 1e30f);
    std::vector<SampleParams> batch_params(params.begin() + next, params.begin() + next + r);
    std::vector<Family> families(static_cast<size_t>(r));
    for (int64_t i = 0; i < r; ++i) {
      families[i] = static_cast<Family>((next + i) % kFamilies);
      FillRow(rng, families[i], logits.data() + i * stride, v);
      if (rng() % 16 == 0) batch_params[i].temperature = rng() % 2 ? -1.0f : std::numeric_limits<float>::quiet_NaN();
    }
    RunBatch(logits, batch_params, families, v, stride, tally);
    next += r;
  }
  std::printf("  sample V=%lld: %lld rows (%lld padding), %lld drew a token other than the argmax, %lld mismatches\n",
              static_cast<long long>(v), static_cast<long long>(tally.rows), static_cast<long long>(tally.padding),
              static_cast<long long>(tally.not_argmax), static_cast<long long>(tally.mismatches));
  return tally;
}

TEST(SampleOps, MatchesCpuV4096) {
  DSV4_REQUIRE_GPU();
  std::mt19937 rng(4096);
  const Tally t = RunAll(4096, AllCombinations(4096, rng), rng);
  EXPECT_EQ(t.mismatches, 0);
  EXPECT_GT(t.not_argmax, t.rows / 20);  // enough real draws for a wrong one to show
}

TEST(SampleOps, MatchesCpuV129280) {
  DSV4_REQUIRE_GPU();
  std::mt19937 rng(129280);
  const Tally t = RunAll(129280, AllCombinations(129280, rng), rng);
  EXPECT_EQ(t.mismatches, 0);
  EXPECT_GT(t.not_argmax, t.rows / 20);
}

// Small vocabularies (1 token, fewer than a warp, one segment + 1) and a vocabulary shard (129280 / 8).
TEST(SampleOps, MatchesCpuOtherVocabularies) {
  DSV4_REQUIRE_GPU();
  std::mt19937 rng(33);
  for (const int64_t v : {1, 2, 5, 33, 513, 16160}) {
    std::vector<SampleParams> params = AllCombinations(v, rng);
    if (v == 16160) params.resize(640);  // a shard's worth of the sweep; the full one runs at 4096 and 129280
    EXPECT_EQ(RunAll(v, params, rng).mismatches, 0) << "V=" << v;
  }
}

// One batch of 64 assorted rows at the full vocabulary (small enough for compute-sanitizer).
TEST(SampleOps, OneFullBatch) {
  DSV4_REQUIRE_GPU();
  std::mt19937 rng(64);
  std::vector<SampleParams> params = AllCombinations(129280, rng);
  std::shuffle(params.begin(), params.end(), rng);
  params.resize(64 + 33);
  EXPECT_EQ(RunAll(129280, params, rng).mismatches, 0);
}

// A few rows that take both radix selects and the tie resolution (small enough for racecheck).
TEST(SampleOps, SanitizerBatch) {
  DSV4_REQUIRE_GPU();
  std::mt19937 rng(24);
  std::vector<SampleParams> params;
  for (const SampleParams& p : AllCombinations(4096, rng)) {
    if (p.temperature >= 0.5f && p.temperature <= 2.0f && p.top_k > 1 && p.top_k < 4096 && p.top_p > 0.0f &&
        p.top_p < 1.0f && p.min_p < 0.5f) {
      params.push_back(p);
    }
  }
  std::shuffle(params.begin(), params.end(), rng);
  params.resize(24);
  EXPECT_EQ(RunAll(4096, params, rng).mismatches, 0);
}

TEST(SampleOps, PaddingRowsAndErrors) {
  DSV4_REQUIRE_GPU();
  Backend& gpu = GetBackends().cuda;
  std::mt19937 rng(5);
  const std::vector<float> logits = testing::RandomNormal(rng, 3 * 100);
  const std::vector<SampleParams> params = {{.temperature = -1.0f},
                                            {.temperature = 1.0f, .seed = 9},
                                            {.temperature = std::numeric_limits<float>::quiet_NaN()}};
  Buffer l = testing::Upload(gpu, logits);
  Buffer p = testing::UploadBytes(gpu, params.data(), 3 * static_cast<int64_t>(sizeof(SampleParams)));
  Buffer t = testing::UploadI32(gpu, std::vector<int32_t>{-7, -7, -7});
  SampleArgs args{.logits = l.as<float>(), .params = p.as<SampleParams>(), .tokens = t.as<int32_t>(), .r = 3,
                  .v = 100};
  gpu.ops().Sample(args);
  int32_t got[3];
  ASSERT_TRUE(gpu.CopyToHost(got, t.data(), 12).ok());
  EXPECT_EQ(got[0], -1);
  EXPECT_GE(got[1], 0);
  EXPECT_LT(got[1], 100);
  EXPECT_EQ(got[2], -1);
  // Refused on the host, nothing launched; the error surfaces once at the next sync.
  for (const auto& [what, bad] : std::vector<std::pair<std::string, SampleArgs>>{
           {"v = 0", {.logits = args.logits, .params = args.params, .tokens = args.tokens, .r = 3, .v = 0}},
           {"v > 2^19", {.logits = args.logits, .params = args.params, .tokens = args.tokens, .r = 1,
                         .v = (int64_t{1} << 19) + 1}},
           {"stride < v", {.logits = args.logits, .params = args.params, .tokens = args.tokens, .r = 3, .v = 100,
                           .logits_stride = 50}},
           {"null tokens", {.logits = args.logits, .params = args.params, .r = 3, .v = 100}}}) {
    gpu.ops().Sample(bad);
    EXPECT_EQ(gpu.Synchronize().code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_TRUE(gpu.Synchronize().ok()) << what;
  }
  gpu.ops().Sample({.r = 0, .v = 100});  // nothing to do
  EXPECT_TRUE(gpu.Synchronize().ok());
}

// Not a check: times the op at R = 64 (and 1), V = 129280 for typical settings (CUDA events, 20 calls after a
// warm-up). Run with --gtest_also_run_disabled_tests --gtest_filter='*SampleTiming*'.
TEST(SampleTiming, DISABLED_Flash) {
  DSV4_REQUIRE_GPU();
  auto& gpu = static_cast<CudaBackend&>(GetBackends().cuda);
  constexpr int64_t kV = 129280;
  std::mt19937 rng(1);
  struct Config {
    const char* what;
    SampleParams p;
  };
  const Config configs[] = {
      {"greedy", {.temperature = 0.0f}},
      {"T=1", {.temperature = 1.0f}},
      {"T=0.7 top_p=0.9", {.temperature = 0.7f, .top_p = 0.9f}},
      {"T=1 top_k=50", {.temperature = 1.0f, .top_k = 50}},
      {"T=0.7 k=50 p=0.95 min_p=0.05", {.temperature = 0.7f, .top_k = 50, .top_p = 0.95f, .min_p = 0.05f}},
      {"T=1 top_k=1000 top_p=0.9", {.temperature = 1.0f, .top_k = 1000, .top_p = 0.9f}},
  };
  cudaEvent_t start, stop;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  for (const bool peaked : {false, true}) {
    // Spread: N(0, 2) over the vocabulary. Peaked: N(0, 3) plus a few tokens 10-15 above (a confident model).
    std::vector<float> logits = testing::RandomNormal(rng, 64 * kV, peaked ? 3.0f : 2.0f);
    if (peaked) {
      for (int64_t r = 0; r < 64; ++r) {
        for (int j = 0; j < 5; ++j) logits[r * kV + rng() % kV] += 10.0f + static_cast<float>(j);
      }
    }
    Buffer l = testing::Upload(gpu, logits);
    Buffer t = testing::UploadI32(gpu, std::vector<int32_t>(64, 0));
    for (const Config& c : configs) {
      for (const int64_t r : {int64_t{1}, int64_t{64}}) {
        std::vector<SampleParams> params(static_cast<size_t>(r), c.p);
        for (int64_t i = 0; i < r; ++i) params[i].seed = static_cast<uint64_t>(i) * 7919 + 1;
        Buffer p = testing::UploadBytes(gpu, params.data(), r * static_cast<int64_t>(sizeof(SampleParams)));
        const SampleArgs args{.logits = l.as<float>(), .params = p.as<SampleParams>(), .tokens = t.as<int32_t>(),
                              .r = r, .v = kV};
        gpu.ops().Sample(args);
        cudaEventRecord(start, gpu.stream());
        constexpr int kReps = 20;
        for (int i = 0; i < kReps; ++i) gpu.ops().Sample(args);
        cudaEventRecord(stop, gpu.stream());
        ASSERT_TRUE(gpu.Synchronize().ok());
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        std::printf("  sample %-7s R=%-3lld V=%lld %-30s %8.1f us\n", peaked ? "peaked" : "spread",
                    static_cast<long long>(r), static_cast<long long>(kV), c.what, 1e3 * ms / kReps);
      }
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace
}  // namespace dsv4::kernels::cuda
