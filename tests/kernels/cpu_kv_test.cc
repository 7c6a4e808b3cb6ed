// CPU backend, cache writers: the window ring with staging rows and the commit phase (two sequences, a chunk
// longer than W that wraps the ring, padding), and the compressors (ratio 4 with its overlapping halves,
// ratio 128) stepped over batched steps against a whole-sequence double reference, with the same bits
// whatever the split of the sequence into steps.
#include <algorithm>
#include <cmath>
#include <map>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_rows.h"
#include "tests/kernels/cpu_test_util.h"

namespace dsv4::kernels::cpu {
namespace {

using testing::HostPool;
using testing::HostStep;
using testing::HostTables;
using testing::Near;
using testing::Rand;
using testing::SameBits;

// Two phases leave the ring exactly as writing every token's key in order would, and every real token's key
// in its staging row; after phase 1 only each sequence's first token is in the ring.
TEST(CpuKvTest, WindowWriteStagesEveryTokenAndCommitsTheLastW) {
  constexpr int P = 4, W = 8, Dk = 16;
  std::mt19937 rng(11);
  auto be = MakeCpuBackend(2);
  HostStep step;
  step.AddSeq(20, 1, 0);   // b0: decode
  step.AddSeq(3, 11, 1);   // b1: a chunk longer than W (positions 3..13 wrap the ring)
  step.AddPadding();       // b2: padding
  step.AddSeq(0, 3, 2);    // b3: a fresh sequence
  const int64_t T = step.t();
  HostTables tab(4, W / P);
  const int32_t pages[4][2] = {{5, 1}, {0, 3}, {-1, -1}, {4, 2}};
  for (int b = 0; b < 4; ++b) tab.at(b, 0) = pages[b][0], tab.at(b, 1) = pages[b][1];
  const int32_t staging0 = 6 * P;
  HostPool pool(KvFormat::kF32, Dk, P, 6 + (T + P - 1) / P);
  auto rows = Rand(T * Dk, rng);
  // b0's ring holds positions 13..19 from earlier steps.
  std::map<std::pair<int, int>, std::vector<float>> ring;  // (b, slot) -> key: the reference ring
  for (int32_t p = 13; p < 20; ++p) {
    auto k = Rand(Dk, rng);
    WriteKvRow(pool.view, PhysicalRow(tab.view(), 0, p % W, P), k.data());
    ring[{0, p % W}] = k;
  }
  auto slot_row = [&](int b, int slot) {
    std::vector<float> out(Dk);
    ReadKvRow(pool.view, PhysicalRow(tab.view(), b, slot, P), out.data());
    return out;
  };
  KvWindowWriteArgs a{.rows = rows.data(), .cache = pool.view, .step = step.view(), .tables = tab.view(),
                      .staging_row0 = staging0, .window = W};
  be->ops().KvWindowWrite(a);
  ASSERT_TRUE(be->Synchronize().ok());
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> got(Dk);
    ReadKvRow(pool.view, staging0 + t, got.data());
    const std::vector<float> want = step.pos[t] < 0 ? std::vector<float>(Dk, 0.f)
                                                    : std::vector<float>(&rows[t * Dk], &rows[t * Dk] + Dk);
    EXPECT_TRUE(SameBits(got, want)) << "staging row of token " << t;
  }
  // Phase 1: b1's ring has only its first token (position 3 -> slot 3).
  for (int s = 0; s < W; ++s) {
    const std::vector<float> want = s == 3 ? std::vector<float>(&rows[1 * Dk], &rows[2 * Dk]) : std::vector<float>(Dk, 0.f);
    EXPECT_TRUE(SameBits(slot_row(1, s), want)) << "b1 slot " << s << " after phase 1";
  }
  a.commit = true;
  be->ops().KvWindowWrite(a);
  ASSERT_TRUE(be->Synchronize().ok());
  for (int64_t t = 0; t < T; ++t) {
    if (step.pos[t] >= 0) ring[{step.seq[t], step.pos[t] % W}] = std::vector<float>(&rows[t * Dk], &rows[(t + 1) * Dk]);
  }
  for (int b : {0, 1, 3}) {
    for (int s = 0; s < W; ++s) {
      auto it = ring.find({b, s});
      const std::vector<float> want = it == ring.end() ? std::vector<float>(Dk, 0.f) : it->second;
      EXPECT_TRUE(SameBits(slot_row(b, s), want)) << "b" << b << " slot " << s << " after commit";
    }
  }
}

// The production row format goes through the 584-byte encode: what is read back is the encoded key.
TEST(CpuKvTest, WindowWriteFp8RowsRoundTripThroughTheRecord) {
  constexpr int P = 4, W = 8, Dk = 512;
  std::mt19937 rng(12);
  auto be = MakeCpuBackend(1);
  HostStep step;
  step.AddSeq(9, 2, 0);
  HostTables tab(1, W / P);
  tab.at(0, 0) = 1, tab.at(0, 1) = 0;
  HostPool pool(KvFormat::kFp8Row584, Dk, P, 3);
  auto rows = Rand(2 * Dk, rng, 3.f);
  KvWindowWriteArgs a{.rows = rows.data(), .cache = pool.view, .step = step.view(), .tables = tab.view(),
                      .staging_row0 = 2 * P, .window = W};
  be->ops().KvWindowWrite(a);
  a.commit = true;
  be->ops().KvWindowWrite(a);
  ASSERT_TRUE(be->Synchronize().ok());
  for (int t = 0; t < 2; ++t) {
    std::vector<float> staged(Dk), ringed(Dk);
    ReadKvRow(pool.view, 2 * P + t, staged.data());
    ReadKvRow(pool.view, PhysicalRow(tab.view(), 0, (9 + t) % W, P), ringed.data());
    EXPECT_TRUE(SameBits(staged, ringed)) << "token " << t;
    for (int d = 0; d < Dk; ++d) {  // e4m3: within half a step of the tile scale; rope dims bf16
      const double tol = d < 448 ? std::fabs(rows[t * Dk + d]) / 16 + 1e-3 : std::fabs(rows[t * Dk + d]) / 256;
      ASSERT_LE(std::fabs(staged[d] - rows[t * Dk + d]), tol) << "dim " << d;
    }
  }
}

// Runs a compressor over two sequences split into steps; returns the compressed rows each sequence emitted.
struct CompressorRun {
  static constexpr int P = 4;
  int ratio, d, pairs, len0, len1;
  bool fp4;
  std::vector<float> kv, gate, ape, norm_w, inv_freq;  // kv/gate: [seq][pos][C*d]
  int64_t cd() const { return (ratio == 4 ? 2 : 1) * int64_t{d}; }

  CompressorRun(int ratio_, int d_, int pairs_, bool fp4_, int len0_, int len1_, uint32_t seed)
      : ratio(ratio_), d(d_), pairs(pairs_), len0(len0_), len1(len1_), fp4(fp4_) {
    std::mt19937 rng(seed);
    const int64_t maxlen = std::max(len0, len1);
    kv = Rand(2 * maxlen * cd(), rng);
    gate = Rand(2 * maxlen * cd(), rng);
    ape = Rand(ratio * cd(), rng);
    norm_w = Rand(d, rng);
    for (int i = 0; i < pairs; ++i) inv_freq.push_back(std::pow(1000.f, -2.f * i / (2 * pairs)));
  }

  // steps[s] = {tokens of sequence 0, tokens of sequence 1} in step s.
  std::vector<std::vector<float>> Run(const std::vector<std::pair<int, int>>& steps, int threads) {
    auto be = MakeCpuBackend(threads);
    const int64_t rows0 = len0 / ratio, rows1 = len1 / ratio;
    const int64_t pages = (std::max<int64_t>(std::max(rows0, rows1), 1) + P - 1) / P;
    // Step rows: b0 = sequence 0, b1 = a padding sequence, b2 = sequence 1 (interleaved physical pages).
    HostTables tab(3, pages);
    for (int64_t i = 0; i < pages; ++i) tab.at(0, i) = static_cast<int32_t>(2 * i + 1), tab.at(2, i) = static_cast<int32_t>(2 * i);
    HostPool pool(KvFormat::kF32, d, P, 2 * pages);
    const int64_t stride = (ratio == 4 ? 2 : 1) * ratio * cd();
    std::vector<float> skv(3 * stride), ssc(3 * stride);  // slots 0..2; the sequences use slots 2 and 0
    be->ops().Fill({.x = skv.data(), .n = 3 * stride, .value = 0.f});
    be->ops().Fill({.x = ssc.data(), .n = 3 * stride, .value = -INFINITY});
    int done[2] = {0, 0};
    for (auto [n0, n1] : steps) {
      HostStep step;
      step.AddSeq(done[0], n0, 2);
      step.AddPadding();
      step.AddSeq(done[1], n1, 0);
      std::vector<float> skv_in(step.t() * cd()), sgate_in(step.t() * cd());
      for (int64_t t = 0; t < step.t(); ++t) {
        if (step.pos[t] < 0) continue;
        const int s = step.seq[t] == 0 ? 0 : 1;
        const int64_t src = (int64_t{s} * std::max(len0, len1) + step.pos[t]) * cd();
        std::copy_n(&kv[src], cd(), &skv_in[t * cd()]);
        std::copy_n(&gate[src], cd(), &sgate_in[t * cd()]);
      }
      be->ops().Compressor({.state_kv = skv.data(), .state_score = ssc.data(), .state_stride = stride,
                            .kv = skv_in.data(), .gate = sgate_in.data(), .ape = ape.data(), .norm_w = norm_w.data(),
                            .inv_freq = inv_freq.data(), .cache = pool.view, .tables = tab.view(), .step = step.view(),
                            .ratio = ratio, .d = d, .pairs = pairs, .hadamard_fp4 = fp4});
      done[0] += n0, done[1] += n1;
    }
    EXPECT_TRUE(be->Synchronize().ok());
    std::vector<std::vector<float>> out(2);
    for (int s = 0; s < 2; ++s) {
      const int64_t n = s == 0 ? rows0 : rows1;
      out[s].resize(n * d);
      for (int64_t i = 0; i < n; ++i) ReadKvRow(pool.view, PhysicalRow(tab.view(), 2 * s, i, P), &out[s][i * d]);
    }
    return out;
  }

  // Row n of sequence s from the whole sequence at once, in double: pool, normalise, rotate at n * R.
  std::vector<double> Reference(int s) const {
    const int len = s == 0 ? len0 : len1;
    const int64_t maxlen = std::max(len0, len1), c = cd();
    std::vector<double> out;
    for (int n = 0; n < len / ratio; ++n) {
      std::vector<double> row(d);
      for (int j = 0; j < d; ++j) {
        std::vector<std::pair<double, double>> cand;  // (score, value)
        for (int t = 0; t < ratio; ++t) {
          const int64_t q = (s * maxlen + int64_t{n} * ratio + t) * c;
          const int col = ratio == 4 ? d + j : j;
          cand.push_back({double(gate[q + col]) + ape[t * c + col], kv[q + col]});
          if (ratio == 4 && n > 0) {
            const int64_t qp = (s * maxlen + int64_t{n - 1} * ratio + t) * c;
            cand.push_back({double(gate[qp + j]) + ape[t * c + j], kv[qp + j]});
          }
        }
        double mx = -1e300, num = 0, den = 0;
        for (auto [sc, v] : cand) mx = std::max(mx, sc);
        for (auto [sc, v] : cand) num += std::exp(sc - mx) * v, den += std::exp(sc - mx);
        row[j] = num / den;
      }
      double ss = 0;
      for (double v : row) ss += v * v;
      for (int j = 0; j < d; ++j) row[j] = row[j] / std::sqrt(ss / d + 1e-6) * norm_w[j];
      for (int i = 0; i < pairs; ++i) {
        const double a = double(float(n * ratio) * inv_freq[i]);
        double& x0 = row[d - 2 * pairs + 2 * i];
        double& x1 = row[d - 2 * pairs + 2 * i + 1];
        const double r0 = x0 * std::cos(a) - x1 * std::sin(a), r1 = x0 * std::sin(a) + x1 * std::cos(a);
        x0 = r0, x1 = r1;
      }
      out.insert(out.end(), row.begin(), row.end());
    }
    return out;
  }
};

TEST(CpuKvTest, CompressorRatio4And128MatchTheWholeSequenceAndAnySplit) {
  struct Case {
    int ratio, d, pairs, len0, len1;
  };
  for (const Case& c : {Case{4, 32, 8, 23, 17}, Case{128, 16, 4, 300, 260}}) {
    CompressorRun run(c.ratio, c.d, c.pairs, false, c.len0, c.len1, 40 + c.ratio);
    // Chunked prefill steps, then decode steps, vs one token per step for both sequences.
    std::vector<std::pair<int, int>> chunked, single;
    int a = 0, b = 0;
    const int chunks[] = {7, 1, 9, 2, 150, 1, 1, 200};
    for (int i = 0; a < c.len0 || b < c.len1; ++i) {
      const int n = chunks[i % 8];
      const int n0 = std::min(n, c.len0 - a), n1 = std::min(n + 3, c.len1 - b);
      chunked.push_back({n0, n1});
      a += n0, b += n1;
    }
    for (int i = 0; i < std::max(c.len0, c.len1); ++i) single.push_back({i < c.len0 ? 1 : 0, i < c.len1 ? 1 : 0});
    auto got = run.Run(chunked, 2);
    auto one = run.Run(single, 1);
    for (int s = 0; s < 2; ++s) {
      EXPECT_TRUE(Near(got[s], run.Reference(s), 1e-5)) << "ratio " << c.ratio << " seq " << s;
      EXPECT_TRUE(SameBits(got[s], one[s])) << "ratio " << c.ratio << " seq " << s << ": split changes bits";
    }
  }
}

TEST(CpuKvTest, CompressorHadamardFp4RowsAreTheSimulationOfTheExactRows) {
  CompressorRun exact(4, 32, 8, false, 21, 12, 7), fp4(4, 32, 8, true, 21, 12, 7);
  const std::vector<std::pair<int, int>> steps = {{5, 12}, {16, 0}};
  auto a = exact.Run(steps, 2), b = fp4.Run(steps, 2);
  for (int s = 0; s < 2; ++s) {
    for (size_t r = 0; r < a[s].size() / 32; ++r) HadamardFp4Row(a[s].data() + r * 32, 32);
    EXPECT_TRUE(SameBits(a[s], b[s])) << "seq " << s;
  }
}

}  // namespace
}  // namespace dsv4::kernels::cpu
