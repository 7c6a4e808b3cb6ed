// The CUDA lightning indexer (kernels/cuda/indexer.cu) against the CPU reference op at the shapes of
// configs/flash.json (64 heads x 128 dims, top-512, contexts up to 128K = 32768 rows) and the tiny config (8 heads,
// top-16), with contexts below / at / above top-k, no rows yet, padding tokens and exact ties at the k-th place
// (zero rows score exactly 0: the lowest rows win). The kept set may differ from the CPU's only by rows whose
// scores tie the k-th score within rounding (the GPU sums in another order); every such swap is checked and
// counted; with FP4-simulated q and rows (production mode, the tensor-core path) the selections must be
// identical. Also times the indexer at B = 1 / 32 / 64 and 8K / 32K / 128K contexts (printed, not asserted).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cuda/launchers.h"
#include "tests/cuda/attention_test_util.h"
#include "tests/cuda/test_util.h"

namespace dsv4::kernels::cuda::testing {
namespace {

struct IndexerCase {
  const char* name;
  int heads, dim, k;
  std::vector<SeqSpec> seqs;
  int padding;
  double zero_rows;  // fraction of pool rows that are zero (their scores tie at exactly 0)
  // Production mode: q and the rows put through the Hadamard + FP4 simulation (the CPU op), so they are exactly
  // bf16 and the tensor-core scores must equal the CPU's bit for bit: every selection identical, no swap.
  bool fp4 = false;
};

// Score of row `row` for token t in double (to judge how close a swapped row is to the k-th score).
double Score(const IndexerArgs& a, int64_t t, const float* krow) {
  double s = 0;
  for (int64_t h = 0; h < a.heads; ++h) {
    double dot = 0;
    for (int64_t d = 0; d < a.dim; ++d) dot += double{a.q[(t * a.heads + h) * a.dim + d]} * krow[d];
    s += double{a.w[t * a.heads + h]} * a.weight_scale * std::max(0.0, dot);
  }
  return s;
}

void RunIndexer(const IndexerCase& c) {
  std::printf("Indexer %s (IH=%d, ID=%d, k=%d)\n", c.name, c.heads, c.dim, c.k);
  std::mt19937 rng(c.heads * 7 + c.k + static_cast<int>(100 * c.zero_rows));
  const int page_rows = 64;
  TestStep step(c.seqs, c.padding);
  int64_t max_rows = 1;
  for (int32_t p : step.pos) max_rows = std::max<int64_t>(max_rows, (p + 1) / 4);
  const int64_t per_seq = (max_rows + page_rows - 1) / page_rows;
  TestPool pool(KvFormat::kF32, c.dim, page_rows, step.b() * per_seq);
  {
    std::vector<float> rows = RandomNormal(rng, pool.rows() * c.dim);
    std::bernoulli_distribution zero(c.zero_rows);
    for (int64_t r = 0; r < pool.rows(); ++r) {
      if (zero(rng)) std::fill_n(&rows[r * c.dim], c.dim, 0.f);
    }
    if (c.fp4) GetBackends().cpu.ops().HadamardFp4({.x = rows.data(), .rows = pool.rows(), .dim = c.dim});
    std::memcpy(pool.host.data(), rows.data(), rows.size() * 4);
    pool.Upload();
  }
  // The compressed pool's ids come from other pages than the indexer pool's (same page size, as in the model).
  TestTables index_tables(step.b(), per_seq, 0, rng), target_tables(step.b(), per_seq, 100000, rng);
  std::vector<float> q = RandomNormal(rng, step.t() * c.heads * c.dim);
  const std::vector<float> w = RandomNormal(rng, step.t() * c.heads);
  if (c.fp4) GetBackends().cpu.ops().HadamardFp4({.x = q.data(), .rows = step.t() * c.heads, .dim = c.dim});
  const DeviceArray<float> d_q(q), d_w(w);
  std::vector<int32_t> want(step.t() * c.k, 7), want_count(step.t(), 7);
  DeviceArray<int32_t> d_selected(want), d_count(want_count);
  const IndexerArgs host{.q = q.data(), .w = w.data(),
                         .weight_scale = static_cast<float>(1.0 / std::sqrt(c.dim * c.heads)),
                         .cache = pool.HostView(), .index_tables = index_tables.Host(),
                         .target_tables = target_tables.Host(), .step = step.Host(), .selected = want.data(),
                         .selected_count = want_count.data(), .heads = c.heads, .dim = c.dim, .k = c.k,
                         .max_rows = max_rows};
  IndexerArgs dev = host;
  dev.q = d_q.get();
  dev.w = d_w.get();
  dev.cache = pool.DeviceView();
  dev.index_tables = index_tables.Device();
  dev.target_tables = target_tables.Device();
  dev.step = step.Device();
  dev.selected = d_selected.get();
  dev.selected_count = d_count.get();
  GetBackends().cpu.ops().Indexer(host);
  const absl::Status cpu = GetBackends().cpu.Synchronize();
  ASSERT_TRUE(cpu.ok()) << cpu;
  DeviceArray<uint8_t> scratch(IndexerScratchBytes({.max_tokens = step.t(), .max_context = 4 * max_rows}));
  const absl::Status st =
      LaunchIndexer(dev, {.data = scratch.get(), .bytes = static_cast<int64_t>(scratch.size())}, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<int32_t> got = d_selected.ToHost(), got_count = d_count.ToHost();

  int64_t identical = 0, swaps = 0, scored = 0;
  double worst_gap = 0;
  std::vector<float> krow(c.dim);
  for (int64_t t = 0; t < step.t(); ++t) {
    ASSERT_EQ(got_count[t], want_count[t]) << "token " << t;
    const int32_t n = got_count[t];
    const int32_t* g = &got[t * c.k];
    const int32_t* r = &want[t * c.k];
    for (int i = n; i < c.k; ++i) ASSERT_EQ(g[i], -1) << "token " << t << " entry " << i;
    scored += step.pos[t] < 0 ? 0 : (step.pos[t] + 1) / 4;
    if (std::equal(g, g + n, r)) {
      ++identical;
      continue;
    }
    // Back to logical rows: ascending, and differing from the CPU's only at the k-th score.
    const int64_t b = step.seq[t];
    std::map<int32_t, int64_t> logical;
    for (int64_t i = 0; i < per_seq * page_rows; ++i) logical[static_cast<int32_t>(target_tables.Row(b, i, page_rows))] = i;
    std::vector<int64_t> gl(n), rl(n);
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(logical.count(g[i])) << "token " << t << ": id " << g[i] << " is not one of its sequence's rows";
      gl[i] = logical[g[i]];
      rl[i] = logical[r[i]];
      if (i > 0) {
        ASSERT_LT(gl[i - 1], gl[i]) << "token " << t << ": ids not in ascending row order";
      }
    }
    auto score = [&](int64_t row) {
      HostReadRow(host.cache, index_tables.Row(b, row, page_rows), krow.data());
      return Score(host, t, krow.data());
    };
    double kth = INFINITY, top = 0;
    for (int64_t row : rl) {
      const double s = score(row);
      kth = std::min(kth, s);
      top = std::max(top, std::fabs(s));
    }
    std::vector<int64_t> diff;
    std::set_symmetric_difference(gl.begin(), gl.end(), rl.begin(), rl.end(), std::back_inserter(diff));
    for (int64_t row : diff) {
      const double gap = std::fabs(score(row) - kth) / std::max(1e-30, top);
      worst_gap = std::max(worst_gap, gap);
      EXPECT_LE(gap, 1e-5) << "token " << t << " row " << row << " is not a near-tie of the k-th score";
    }
    swaps += static_cast<int64_t>(diff.size()) / 2;
  }
  std::printf("  %lld tokens, %lld rows scored: %lld selections identical to the CPU's, %lld near-tie swaps "
              "(largest score gap %.2e of the top score)\n",
              static_cast<long long>(step.t()), static_cast<long long>(scored), static_cast<long long>(identical),
              static_cast<long long>(swaps), worst_gap);
  if (c.fp4) {
    EXPECT_EQ(identical, step.t()) << "FP4-simulated inputs: the scores must be the CPU's exactly";
  }
}

TEST(IndexerOps, MatchesCpu) {
  DSV4_REQUIRE_GPU();
  // Flash: 2048 rows, the 128K context (32768 rows), contexts of 511 / 512 / 513 rows around top-k, no rows
  // yet, a padding token; then mostly-zero rows so the k-th place falls in a tie at 0; then the tiny config.
  RunIndexer({"flash", 64, 128, 512, {{8191, 1, 0}, {131071, 1, 1}, {2044, 8, 2}, {0, 3, 3}}, 1, 0.0});
  RunIndexer({"flash, 85% zero rows", 64, 128, 512, {{8191, 2, 0}, {4000, 1, 1}}, 0, 0.85});
  RunIndexer({"tiny", 8, 128, 16, {{99, 1, 0}, {0, 70, 1}}, 2, 0.3});
  // Production mode at the flash shape: the tensor-core path, selections identical to the CPU's (ties at the
  // k-th place included: FP4 rows repeat scores often, and zero rows tie at 0).
  RunIndexer({"flash, FP4-simulated", 64, 128, 512, {{8191, 1, 0}, {131071, 1, 1}, {2044, 8, 2}, {0, 3, 3}}, 1, 0.0,
              true});
  RunIndexer({"flash, FP4-simulated, 85% zero rows", 64, 128, 512, {{8191, 2, 0}, {32767, 1, 1}}, 0, 0.85, true});
}

// Mean milliseconds of one LaunchIndexer for `seqs` decode tokens at `context`, with the planned row bound at
// the 128K context and a pool of pool_factor x the pages the sequences use.
double TimeIndexer(int64_t seqs, int64_t context, int64_t pool_factor, std::mt19937& rng) {
  const int heads = 64, dim = 128, k = 512, page_rows = 64;
  const int64_t max_rows = 131072 / 4, rows = context / 4;
  std::vector<SeqSpec> specs(seqs, SeqSpec{.p0 = static_cast<int32_t>(context - 1), .len = 1});
  TestStep step(specs, 0);
  const int64_t per_seq = (rows + page_rows - 1) / page_rows, pages = seqs * per_seq * pool_factor;
  DeviceArray<uint8_t> pool(static_cast<size_t>(pages * page_rows * dim * 4));
  {  // one 8 MB random block copied over the pool (generating 1 GB on the host would dominate the test), its rows
     // and q FP4-simulated as in production, so the tensor-core path is the one timed
    std::vector<float> block = RandomNormal(rng, 2 << 20);
    GetBackends().cpu.ops().HadamardFp4({.x = block.data(), .rows = (2 << 20) / dim, .dim = dim});
    for (size_t at = 0; at < pool.size(); at += block.size() * 4) {
      const size_t n = std::min(block.size() * 4, pool.size() - at);
      EXPECT_EQ(cudaMemcpy(pool.get() + at, block.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  std::vector<int32_t> table(seqs * per_seq);
  for (int64_t i = 0; i < seqs * per_seq; ++i) table[i] = static_cast<int32_t>(i * pool_factor % pages);
  const DeviceArray<int32_t> d_table(table);
  std::vector<float> host_q = RandomNormal(rng, seqs * heads * dim);
  GetBackends().cpu.ops().HadamardFp4({.x = host_q.data(), .rows = seqs * heads, .dim = dim});
  const DeviceArray<float> q(host_q), w(RandomNormal(rng, seqs * heads));
  DeviceArray<int32_t> selected(static_cast<size_t>(seqs * k)), count(static_cast<size_t>(seqs));
  DeviceArray<uint8_t> scratch(IndexerScratchBytes({.max_tokens = seqs, .max_context = 4 * max_rows}));
  const IndexerArgs a{.q = q.get(), .w = w.get(), .weight_scale = 1.f / 90.5f,
                      .cache = {.base = pool.get(), .format = KvFormat::kF32, .dim = dim, .page_rows = page_rows,
                                .page_bytes = int64_t{page_rows} * dim * 4},
                      .index_tables = {.pages = d_table.get(), .stride = per_seq},
                      .target_tables = {.pages = d_table.get(), .stride = per_seq}, .step = step.Device(),
                      .selected = selected.get(), .selected_count = count.get(), .heads = heads, .dim = dim, .k = k,
                      .max_rows = max_rows};
  const CudaScratch s{.data = scratch.get(), .bytes = static_cast<int64_t>(scratch.size())};
  EXPECT_TRUE(LaunchIndexer(a, s, nullptr).ok());  // warm-up
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const int reps = 20;
  cudaEventRecord(start);
  for (int i = 0; i < reps; ++i) EXPECT_TRUE(LaunchIndexer(a, s, nullptr).ok());
  cudaEventRecord(stop);
  EXPECT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  for (int32_t n : count.ToHost()) EXPECT_EQ(n, k);
  return ms / reps;
}

TEST(IndexerOps, TimeFollowsTheContext) {
  DSV4_REQUIRE_GPU();
  std::mt19937 rng(5);
  std::printf("indexer, 64 heads x 128 dims, top-512, FP4-simulated q and rows, row bound 32768 (128K context), "
              "mean of 20 launches:\n");
  for (int64_t seqs : {1, 32, 64}) {
    for (int64_t context : {8192, 32768, 131072}) {
      const double ms = TimeIndexer(seqs, context, 1, rng);
      const double gb = static_cast<double>(seqs) * context / 4 * 128 * 4 / 1e9;
      std::printf("  B=%-3lld context %6lld: %8.3f ms  (%5.0f GB/s of indexer rows)\n", static_cast<long long>(seqs),
                  static_cast<long long>(context), ms, gb / (ms / 1e3));
    }
  }
  std::printf("  B=1   context   8192, pool 8x the context: %8.3f ms\n", TimeIndexer(1, 8192, 8, rng));
}

}  // namespace
}  // namespace dsv4::kernels::cuda::testing
