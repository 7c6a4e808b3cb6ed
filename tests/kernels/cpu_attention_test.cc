// CPU backend, the indexer and sparse attention over batched steps. The indexer against a plain loop (ties
// keep the lower row, top-k larger than the rows that exist, padding, physical ids through both block
// tables). Attention in the step pipeline the model runs (window write, attention, commit) over two
// sequences - a prefill chunk longer than W that wraps the ring, a decode token, a padding token - for
// compressed ratios 0, 4 and 128, against a double reference over each token's logical key history and bit
// for bit against the documented summation order, with the same bits when every token runs as its own step;
// and on the FP8 row format.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

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
using testing::RefDot;
using testing::SameBits;

TEST(CpuIndexerTest, TopKKeepsLowestTiedRows) {
  auto be = MakeCpuBackend(1);
  const int H = 2, Di = 4;
  // Rows 1, 3 and 5 score exactly 0 (every head product <= 0); rows 0, 2, 4 score 3, 1, 2.
  HostPool pool(KvFormat::kF32, Di, 8, 1);
  const std::vector<float> rows = {1, 0, 0, 0, -1, 0, 0, 0, 0, 1, 0, 0, -2, -2, 0, 0, 0, 0, 1, 0, 0, 0, 0, -5};
  for (int i = 0; i < 6; ++i) WriteKvRow(pool.view, i, &rows[i * Di]);
  const std::vector<float> q = {3, 1, 2, 0, 0, 0, 0, 0};  // head 0 only
  const std::vector<float> w = {1, 1};
  HostStep step;
  step.AddSeq(23, 1, 0);  // (23 + 1) / 4 = 6 visible rows
  HostTables index_tab(1, 1), target_tab(1, 1);
  index_tab.at(0, 0) = 0;
  target_tab.at(0, 0) = 1;  // target ids are 8 + row
  std::vector<int32_t> sel(5, 99), count(1, 99);
  be->ops().Indexer({.q = q.data(), .w = w.data(), .weight_scale = 1.f, .cache = pool.view,
                     .index_tables = index_tab.view(), .target_tables = target_tab.view(), .step = step.view(),
                     .selected = sel.data(), .selected_count = count.data(), .heads = H, .dim = Di, .k = 5,
                     .max_rows = 6});
  ASSERT_TRUE(be->Synchronize().ok());
  EXPECT_EQ(count[0], 5);
  EXPECT_EQ(sel, (std::vector<int32_t>{8, 9, 10, 11, 12}));
}

TEST(CpuIndexerTest, BatchedTokensAgainstAPlainLoop) {
  constexpr int P = 4, H = 3, Di = 8, Ksel = 6;
  constexpr float kScale = 0.37f;
  std::mt19937 rng(21);
  auto be = MakeCpuBackend(2);
  HostStep step;
  step.AddSeq(30, 8, 3);  // b0: a chunk, 7..9 visible rows
  step.AddPadding();      // b1
  step.AddSeq(9, 1, 1);   // b2: decode, 2 visible rows (< Ksel)
  const int64_t T = step.t();
  HostTables itab(3, 3), ttab(3, 3);
  const int32_t ipages[3][3] = {{4, 0, 2}, {-1, -1, -1}, {5, -1, -1}}, tpages[3][3] = {{1, 3, 6}, {-1, -1, -1}, {0, -1, -1}};
  for (int b = 0; b < 3; ++b)
    for (int i = 0; i < 3; ++i) itab.at(b, i) = ipages[b][i], ttab.at(b, i) = tpages[b][i];
  HostPool pool(KvFormat::kF32, Di, P, 6);
  std::vector<std::vector<float>> logical[3];
  for (int b : {0, 2}) {
    for (int n = 0; n < (b == 0 ? 9 : 2); ++n) {
      auto k = Rand(Di, rng);
      if (n == 3) k = logical[b][1];  // a tie
      WriteKvRow(pool.view, PhysicalRow(itab.view(), b, n, P), k.data());
      logical[b].push_back(k);
    }
  }
  auto q = Rand(T * H * Di, rng), w = Rand(T * H, rng);
  std::vector<int32_t> sel(T * Ksel, 99), count(T, 99);
  be->ops().Indexer({.q = q.data(), .w = w.data(), .weight_scale = kScale, .cache = pool.view,
                     .index_tables = itab.view(), .target_tables = ttab.view(), .step = step.view(),
                     .selected = sel.data(), .selected_count = count.data(), .heads = H, .dim = Di, .k = Ksel,
                     .max_rows = 9});
  ASSERT_TRUE(be->Synchronize().ok());
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> want(Ksel, -1);
    int want_count = 0;
    if (step.pos[t] >= 0) {
      const int b = step.seq[t];
      const int n = (step.pos[t] + 1) / 4;
      std::vector<float> score(n);
      for (int i = 0; i < n; ++i) {
        float s = 0;
        for (int h = 0; h < H; ++h) s += (w[t * H + h] * kScale) * std::max(0.f, RefDot(&q[(t * H + h) * Di], logical[b][i].data(), Di));
        score[i] = s;
      }
      std::vector<int> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return score[x] > score[y]; });
      want_count = std::min(n, Ksel);
      order.resize(want_count);
      std::sort(order.begin(), order.end());
      for (int i = 0; i < want_count; ++i) want[i] = static_cast<int32_t>(PhysicalRow(ttab.view(), b, order[i], P));
    }
    EXPECT_EQ(count[t], want_count) << "token " << t;
    EXPECT_EQ(std::vector<int32_t>(&sel[t * Ksel], &sel[(t + 1) * Ksel]), want) << "token " << t;
  }
}

// Two sequences with logical key histories; steps are lists of chunks (seq -1: a padding token).
struct Chunk {
  int seq;
  int32_t start;
  int len;
};
using Steps = std::vector<std::vector<Chunk>>;
using Outputs = std::map<std::pair<int, int32_t>, std::vector<float>>;

struct AttentionWorld {
  static constexpr int P = 4, W = 8, Dk = 16, H = 3, Ksel = 5, kCompPages = 34;  // 17 pages = 68 rows per sequence
  static constexpr int32_t kStart0 = 250;  // sequence 0's ring already holds 242..249 when the steps begin
  int ratio;
  std::map<std::pair<int, int32_t>, std::vector<float>> key, q;  // (seq, pos)
  std::map<std::pair<int, int32_t>, std::vector<int>> chosen;    // ratio 4: logical compressed rows
  std::vector<std::vector<float>> comp[2];                       // compressed rows by logical id
  std::vector<float> sink;
  int32_t wpages[2][2] = {{3, 0}, {1, 2}};
  int32_t cpages[2][kCompPages / 2];

  AttentionWorld(int ratio_, uint32_t seed) : ratio(ratio_) {
    std::mt19937 rng(seed);
    for (int s = 0; s < 2; ++s)
      for (int32_t p = s == 0 ? kStart0 - W : 0; p < (s == 0 ? 264 : 15); ++p) {
        key[{s, p}] = Rand(Dk, rng);
        q[{s, p}] = Rand(H * Dk, rng, 0.5f);
      }
    for (int s = 0; s < 2; ++s)
      for (int n = 0; n < 66; ++n) comp[s].push_back(Rand(Dk, rng));
    for (int i = 0; i < kCompPages / 2; ++i) cpages[0][i] = 2 * i + 1, cpages[1][i] = 2 * (kCompPages / 2 - 1 - i);
    sink = Rand(H, rng);
    for (auto& [sp, k] : q) {
      const int visible = (sp.second + 1) / 4;
      const int n = std::min<int>(visible, std::uniform_int_distribution<int>(0, Ksel)(rng));
      std::vector<int> rows(visible);
      std::iota(rows.begin(), rows.end(), 0);
      std::shuffle(rows.begin(), rows.end(), rng);
      rows.resize(n);
      std::sort(rows.begin(), rows.end());
      chosen[sp] = rows;
    }
  }

  int64_t max_compressed() const { return ratio == 128 ? 3 : (ratio == 4 ? Ksel : 0); }

  Outputs Run(const Steps& steps, int threads) {
    auto be = MakeCpuBackend(threads);
    const int64_t max_t = 32;
    const int32_t staging0 = 4 * P;
    HostPool window(KvFormat::kF32, Dk, P, 4 + max_t / P);
    HostPool compressed(KvFormat::kF32, Dk, P, kCompPages);
    for (int32_t p = kStart0 - W; p < kStart0; ++p) {
      WriteKvRow(window.view, int64_t{wpages[0][(p % W) / P]} * P + (p % W) % P, key[{0, p}].data());
    }
    for (int s = 0; s < 2; ++s)
      for (int n = 0; n < 66; ++n) WriteKvRow(compressed.view, int64_t{cpages[s][n / P]} * P + n % P, comp[s][n].data());
    Outputs out;
    for (const auto& chunks : steps) {
      HostStep step;
      std::vector<int> seq_of;  // b -> sequence
      for (const Chunk& c : chunks) {
        if (c.seq < 0) {
          step.AddPadding();
        } else {
          step.AddSeq(c.start, c.len, c.seq);
        }
        seq_of.push_back(c.seq);
      }
      const int64_t T = step.t(), B = static_cast<int64_t>(chunks.size());
      HostTables wtab(B, 2), ctab(B, kCompPages / 2);
      for (int64_t b = 0; b < B; ++b) {
        if (seq_of[b] < 0) continue;
        for (int i = 0; i < 2; ++i) wtab.at(b, i) = wpages[seq_of[b]][i];
        for (int i = 0; i < kCompPages / 2; ++i) ctab.at(b, i) = cpages[seq_of[b]][i];
      }
      std::vector<float> rows(T * Dk, 0.f), qs(T * H * Dk, 0.f), o(T * H * Dk, 5.f);
      std::vector<int32_t> sel(T * Ksel, -1), count(T, 0);
      for (int64_t t = 0; t < T; ++t) {
        if (step.pos[t] < 0) continue;
        const std::pair<int, int32_t> sp{seq_of[step.seq[t]], step.pos[t]};
        std::copy_n(key[sp].data(), Dk, &rows[t * Dk]);
        std::copy_n(q[sp].data(), H * Dk, &qs[t * H * Dk]);
        const auto& c = chosen[sp];
        count[t] = static_cast<int32_t>(c.size());
        for (size_t j = 0; j < c.size(); ++j) sel[t * Ksel + j] = static_cast<int32_t>(PhysicalRow(ctab.view(), step.seq[t], c[j], P));
      }
      KvWindowWriteArgs kw{.rows = rows.data(), .cache = window.view, .step = step.view(), .tables = wtab.view(),
                           .staging_row0 = staging0, .window = W};
      be->ops().KvWindowWrite(kw);
      be->ops().Attention({.q = qs.data(), .window = window.view, .window_tables = wtab.view(),
                           .staging_row0 = staging0, .window_size = W, .compressed = compressed.view,
                           .compressed_tables = ctab.view(), .compressed_ratio = ratio, .selected = sel.data(),
                           .selected_count = count.data(), .ksel = Ksel, .max_compressed = max_compressed(),
                           .step = step.view(), .sink = sink.data(), .out = o.data(), .heads = H, .dim = Dk,
                           .scale = 0.25f});
      kw.commit = true;
      be->ops().KvWindowWrite(kw);
      EXPECT_TRUE(be->Synchronize().ok());
      for (int64_t t = 0; t < T; ++t) {
        const std::vector<float> ot(&o[t * H * Dk], &o[(t + 1) * H * Dk]);
        if (step.pos[t] < 0) {
          EXPECT_TRUE(SameBits(ot, std::vector<float>(H * Dk, 0.f))) << "padding token " << t;
          continue;
        }
        out[{seq_of[step.seq[t]], step.pos[t]}] = ot;
      }
    }
    return out;
  }

  // Keys token (s, p) attends: its window by position, then its compressed rows by logical id.
  std::vector<const std::vector<float>*> Keys(int s, int32_t p) {
    std::vector<const std::vector<float>*> keys;
    for (int32_t x = std::max(0, p - W + 1); x <= p; ++x) keys.push_back(&key[{s, x}]);
    if (ratio == 128) {
      for (int n = 0; n < (p + 1) / 128; ++n) keys.push_back(&comp[s][n]);
    } else if (ratio == 4) {
      for (int n : chosen[{s, p}]) keys.push_back(&comp[s][n]);
    }
    return keys;
  }

  // The CPU backend's documented order, bit for bit: fp32 scores (RefDot), max with the sink, then exp and
  // the weighted sum of keys in double, keys in list order, one division per dim.
  std::vector<float> Exact(int s, int32_t p) {
    const auto keys = Keys(s, p);
    const std::vector<float>& qp = q[{s, p}];
    std::vector<float> o;
    for (int h = 0; h < H; ++h) {
      std::vector<float> sc;
      float mx = sink[h];
      for (auto* k : keys) {
        sc.push_back(0.25f * RefDot(&qp[h * Dk], k->data(), Dk));
        mx = std::max(mx, sc.back());
      }
      double den = std::exp(static_cast<double>(sink[h]) - mx);
      std::vector<double> acc(Dk, 0.0);
      for (size_t j = 0; j < keys.size(); ++j) {
        const double e = std::exp(static_cast<double>(sc[j]) - mx);
        den += e;
        for (int d = 0; d < Dk; ++d) acc[d] += e * (*keys[j])[d];
      }
      for (int d = 0; d < Dk; ++d) o.push_back(static_cast<float>(acc[d] / den));
    }
    return o;
  }

  std::vector<double> Reference(int s, int32_t p) {
    const auto keys = Keys(s, p);
    std::vector<double> o;
    const std::vector<float>& qp = q[{s, p}];
    for (int h = 0; h < H; ++h) {
      std::vector<double> sc;
      double mx = sink[h];
      for (auto* k : keys) {
        double dot = 0;
        for (int d = 0; d < Dk; ++d) dot += double(qp[h * Dk + d]) * (*k)[d];
        sc.push_back(0.25 * dot);
        mx = std::max(mx, sc.back());
      }
      double den = std::exp(sink[h] - mx);
      for (double v : sc) den += std::exp(v - mx);
      for (int d = 0; d < Dk; ++d) {
        double v = 0;
        for (size_t j = 0; j < keys.size(); ++j) v += std::exp(sc[j] - mx) * (*keys[j])[d];
        o.push_back(v / den);
      }
    }
    return o;
  }
};

TEST(CpuAttentionTest, StepPipelineMatchesTheKeyHistoryAndTokenByToken) {
  // Step 1: sequence 0 prefills 250..262 (13 > W tokens, across the ratio-128 boundary at 255), a padding
  // token, sequence 1 prefills 0..4. Step 2: sequence 1's chunk 5..14 (wraps its ring), sequence 0 decodes 263.
  const Steps batched = {{{0, 250, 13}, {-1, 0, 0}, {1, 0, 5}}, {{1, 5, 10}, {0, 263, 1}}};
  Steps single;
  for (const auto& step : batched)
    for (const Chunk& c : step)
      for (int i = 0; i < c.len; ++i) single.push_back({{c.seq, c.start + i, 1}});
  for (int ratio : {0, 4, 128}) {
    AttentionWorld world(ratio, 31);
    Outputs got = world.Run(batched, 2), one = world.Run(single, 1);
    ASSERT_EQ(got.size(), 29u);
    for (auto& [sp, o] : got) {
      EXPECT_TRUE(Near(o, world.Reference(sp.first, sp.second), 1e-5)) << "ratio " << ratio << " seq " << sp.first
                                                                       << " pos " << sp.second;
      EXPECT_TRUE(SameBits(o, one[sp])) << "ratio " << ratio << " seq " << sp.first << " pos " << sp.second;
      EXPECT_TRUE(SameBits(o, world.Exact(sp.first, sp.second))) << "ratio " << ratio << " seq " << sp.first
                                                                  << " pos " << sp.second;
    }
  }
}

// Decode on the production row format: keys are what the 584-byte record decodes to.
TEST(CpuAttentionTest, Fp8RowsDecodeOnceAndAttend) {
  constexpr int P = 16, W = 128, Dk = 512, H = 4;
  std::mt19937 rng(6);
  auto be = MakeCpuBackend(2);
  HostPool window(KvFormat::kFp8Row584, Dk, P, W / P + 1), compressed(KvFormat::kFp8Row584, Dk, P, 2);
  HostTables wtab(1, W / P), ctab(1, 2);
  for (int i = 0; i < W / P; ++i) wtab.at(0, i) = W / P - 1 - i;
  ctab.at(0, 0) = 1, ctab.at(0, 1) = 0;
  const int32_t p = 300;  // window 173..300, compressed rows 0 and 1
  std::vector<std::vector<float>> keys;
  auto row = Rand(Dk, rng);
  for (int32_t x = p - W + 1; x < p; ++x) {
    auto k = Rand(Dk, rng);
    WriteKvRow(window.view, PhysicalRow(wtab.view(), 0, x % W, P), k.data());
  }
  HostStep step;
  step.AddSeq(p, 1, 0);
  be->ops().KvWindowWrite({.rows = row.data(), .cache = window.view, .step = step.view(), .tables = wtab.view(),
                           .staging_row0 = W, .window = W});
  for (int n = 0; n < 2; ++n) {
    auto k = Rand(Dk, rng);
    WriteKvRow(compressed.view, PhysicalRow(ctab.view(), 0, n, P), k.data());
  }
  for (int32_t x = p - W + 1; x <= p; ++x) {
    std::vector<float> k(Dk);
    ReadKvRow(window.view, x == p ? W : PhysicalRow(wtab.view(), 0, x % W, P), k.data());
    keys.push_back(k);
  }
  for (int n = 0; n < 2; ++n) {
    std::vector<float> k(Dk);
    ReadKvRow(compressed.view, PhysicalRow(ctab.view(), 0, n, P), k.data());
    keys.push_back(k);
  }
  auto q = Rand(H * Dk, rng, 0.2f), sink = Rand(H, rng);
  std::vector<float> out(H * Dk);
  const float scale = 1 / std::sqrt(512.f);
  be->ops().Attention({.q = q.data(), .window = window.view, .window_tables = wtab.view(), .staging_row0 = W,
                       .window_size = W, .compressed = compressed.view, .compressed_tables = ctab.view(),
                       .compressed_ratio = 128, .max_compressed = 3, .step = step.view(), .sink = sink.data(),
                       .out = out.data(), .heads = H, .dim = Dk, .scale = scale});
  ASSERT_TRUE(be->Synchronize().ok());
  std::vector<double> ref;
  for (int h = 0; h < H; ++h) {
    std::vector<double> s;
    double mx = sink[h];
    for (auto& k : keys) {
      double dot = 0;
      for (int d = 0; d < Dk; ++d) dot += double(q[h * Dk + d]) * k[d];
      s.push_back(dot * scale);
      mx = std::max(mx, s.back());
    }
    double den = std::exp(sink[h] - mx);
    for (double v : s) den += std::exp(v - mx);
    for (int d = 0; d < Dk; ++d) {
      double o = 0;
      for (size_t j = 0; j < keys.size(); ++j) o += std::exp(s[j] - mx) * keys[j][d];
      ref.push_back(o / den);
    }
  }
  EXPECT_TRUE(Near(out, ref, 1e-5));
}

TEST(CpuAttentionTest, RefusesMoreCompressedKeysThanPlanned) {
  auto be = MakeCpuBackend(1);
  HostPool window(KvFormat::kF32, 16, 4, 3), compressed(KvFormat::kF32, 16, 4, 2);
  HostStep step;
  step.AddSeq(600, 1, 0);  // (600 + 1) / 128 = 4 rows > max_compressed 3
  HostTables wtab(1, 2), ctab(1, 2);
  wtab.at(0, 0) = 0, wtab.at(0, 1) = 1, ctab.at(0, 0) = 0, ctab.at(0, 1) = 1;
  std::vector<float> q(3 * 16, 0.f), sink(3, 0.f), out(3 * 16);
  be->ops().Attention({.q = q.data(), .window = window.view, .window_tables = wtab.view(), .staging_row0 = 8,
                       .window_size = 8, .compressed = compressed.view, .compressed_tables = ctab.view(),
                       .compressed_ratio = 128, .max_compressed = 3, .step = step.view(), .sink = sink.data(),
                       .out = out.data(), .heads = 3, .dim = 16, .scale = 0.25f});
  EXPECT_EQ(be->Synchronize().code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace dsv4::kernels::cpu
