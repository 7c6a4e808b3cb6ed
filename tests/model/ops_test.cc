// CPU ops on fresh random inputs against plain double-precision references written here from the equations
// of dsv4-decode.md §2 (not from the backend's code): linear, RMSNorm, RoPE, mHC Sinkhorn, the compressor's
// windowed softmax pooling (ratio 4 overlap and ratio 128), indexer top-k with ties, sparse attention with
// the sink, MoE, and the FP8 KV row / FP4 indexer simulations.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "common/float_formats.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"

namespace dsv4::kernels::cpu {
namespace {

std::vector<float> Rand(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// max |a - b| / max |b|; NaN fails.
double RelErr(const std::vector<float>& a, const std::vector<double>& b) {
  double diff = 0, mx = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::isnan(a[i]) ? INFINITY : std::max(diff, std::fabs(a[i] - b[i]));
    mx = std::max(mx, std::fabs(b[i]));
  }
  return diff / mx;
}

TEST(OpsTest, LinearWithStrides) {
  std::mt19937 rng(1);
  CpuOps ops(2);
  const int64_t T = 3, N = 77, K = 131, xs = 140, ys = 80;
  auto x = Rand(T * xs, rng), w = Rand(N * K, rng);
  std::vector<float> y(T * ys, 0.f);
  ops.Linear({.x = x.data(), .w = w.data(), .y = y.data(), .t = T, .n = N, .k = K, .x_stride = xs, .y_stride = ys});
  std::vector<float> got;
  std::vector<double> ref;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(x[t * xs + k]) * w[n * K + k];
      ref.push_back(s);
      got.push_back(y[t * ys + n]);
    }
  EXPECT_LE(RelErr(got, ref), 1e-5);
}

TEST(OpsTest, RmsNormAndRope) {
  std::mt19937 rng(2);
  CpuOps ops(1);
  auto x = Rand(4 * 128, rng), w = Rand(128, rng);
  std::vector<float> y(x.size());
  ops.RmsNorm({.x = x.data(), .w = w.data(), .out = y.data(), .rows = 4, .dim = 128, .eps = 1e-6f});
  std::vector<double> ref;
  for (int r = 0; r < 4; ++r) {
    double ss = 0;
    for (int i = 0; i < 128; ++i) ss += double(x[r * 128 + i]) * x[r * 128 + i];
    for (int i = 0; i < 128; ++i) ref.push_back(x[r * 128 + i] / std::sqrt(ss / 128 + 1e-6) * w[i]);
  }
  EXPECT_LE(RelErr(y, ref), 1e-6);
  // RoPE: pairs (2i, 2i+1) of the last 64 dims rotate by pos * f_i; the inverse restores the input.
  std::vector<float> f(32);
  for (int i = 0; i < 32; ++i) f[i] = std::pow(10000.f, -2.f * i / 64);
  const int32_t pos[2] = {0, 301};
  auto q = Rand(2 * 3 * 128, rng), orig = q;
  ops.Rope({.x = q.data(), .pos = pos, .inv_freq = f.data(), .t = 2, .heads = 3, .row_dim = 128, .pairs = 32});
  std::vector<double> rref;
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < 3; ++h)
      for (int d = 0; d < 128; ++d) {
        const float* v = &orig[(t * 3 + h) * 128];
        if (d < 64) { rref.push_back(v[d]); continue; }
        const int i = (d - 64) / 2;
        const double a = double(pos[t]) * f[i], c = std::cos(a), s = std::sin(a);
        rref.push_back(d % 2 == 0 ? v[d] * c - v[d + 1] * s : v[d - 1] * s + v[d] * c);
      }
  EXPECT_LE(RelErr(q, rref), 1e-5);
  ops.Rope({.x = q.data(), .pos = pos, .inv_freq = f.data(), .t = 2, .heads = 3, .row_dim = 128, .pairs = 32, .inverse = true});
  EXPECT_LE(RelErr(q, std::vector<double>(orig.begin(), orig.end())), 1e-5);
}

TEST(OpsTest, HcPreSinkhornAndPost) {
  std::mt19937 rng(3);
  CpuOps ops(1);
  const int64_t S = 4, D = 64, M = (2 + S) * S;
  auto x = Rand(S * D, rng), fn = Rand(M * S * D, rng, 0.05f), base = Rand(M, rng), scale = Rand(3, rng);
  std::vector<float> u(D), post(S), comb(S * S);
  ops.HcPre({.x = x.data(), .fn = fn.data(), .base = base.data(), .scale = scale.data(), .u = u.data(), .post = post.data(),
             .comb = comb.data(), .t = 1, .s = S, .d = D});
  // Reference in double, straight from §2.2.
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double rho = 1 / std::sqrt(ss / (S * D) + 1e-6);
  std::vector<double> m(M);
  for (int r = 0; r < M; ++r) {
    for (int k = 0; k < S * D; ++k) m[r] += double(fn[r * S * D + k]) * x[k];
    m[r] *= rho;
  }
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  std::vector<double> c(S * S), uref(D, 0), pref;
  for (int i = 0; i < S; ++i) {
    double mx = -1e300, sum = 0;
    for (int j = 0; j < S; ++j) mx = std::max(mx, scale[2] * m[8 + 4 * i + j] + base[8 + 4 * i + j]);
    for (int j = 0; j < S; ++j) sum += c[i * S + j] = std::exp(scale[2] * m[8 + 4 * i + j] + base[8 + 4 * i + j] - mx);
    for (int j = 0; j < S; ++j) c[i * S + j] = c[i * S + j] / sum + 1e-6;
  }
  for (int it = 0; it < 20; ++it) {
    if (it > 0)
      for (int i = 0; i < S; ++i) {
        double s = 0;
        for (int j = 0; j < S; ++j) s += c[i * S + j];
        for (int j = 0; j < S; ++j) c[i * S + j] /= s + 1e-6;
      }
    for (int j = 0; j < S; ++j) {
      double s = 0;
      for (int i = 0; i < S; ++i) s += c[i * S + j];
      for (int i = 0; i < S; ++i) c[i * S + j] /= s + 1e-6;
    }
  }
  for (int i = 0; i < S; ++i) {
    pref.push_back(2 * sig(scale[1] * m[S + i] + base[S + i]));
    const double pre = sig(scale[0] * m[i] + base[i]) + 1e-6;
    for (int d = 0; d < D; ++d) uref[d] += pre * x[i * D + d];
  }
  EXPECT_LE(RelErr(comb, c), 1e-5);
  EXPECT_LE(RelErr(post, pref), 1e-5);
  EXPECT_LE(RelErr(u, uref), 1e-5);
  // Post: X'_j = post_j y + sum_i C_ij X_i (transposed comb).
  auto y = Rand(D, rng);
  std::vector<float> xo(S * D);
  ops.HcPost({.x = x.data(), .y = y.data(), .post = post.data(), .comb = comb.data(), .x_out = xo.data(), .t = 1, .s = S, .d = D});
  std::vector<double> xref;
  for (int j = 0; j < S; ++j)
    for (int d = 0; d < D; ++d) {
      double v = double(post[j]) * y[d];
      for (int i = 0; i < S; ++i) v += double(comb[i * S + j]) * x[i * D + d];
      xref.push_back(v);
    }
  EXPECT_LE(RelErr(xo, xref), 1e-5);
}

// Compressor rows from the whole sequence at once, as transformers pools them: row n softmax-pools window n's
// Cb half and (ratio 4) window n-1's Ca half, per column.
void CheckCompressor(int ratio, int d, int len, uint32_t seed) {
  std::mt19937 rng(seed);
  CpuOps ops(1);
  const int c = ratio == 4 ? 2 : 1, cd = c * d;
  auto kv = Rand(len * cd, rng), gate = Rand(len * cd, rng), ape = Rand(ratio * cd, rng);
  std::vector<float> skv(c * ratio * cd, 0.f), ssc(c * ratio * cd, -INFINITY), pooled(d), got;
  std::vector<double> ref;
  for (int p = 0; p < len; ++p) {
    int32_t emitted = -1;
    ops.Compressor({.state_kv = skv.data(), .state_score = ssc.data(), .kv = &kv[p * cd], .gate = &gate[p * cd],
                    .ape = ape.data(), .pooled = pooled.data(), .emitted = &emitted, .ratio = ratio, .d = d, .pos = p});
    ASSERT_EQ(emitted, (p + 1) % ratio == 0 ? 1 : 0);
    if (!emitted) continue;
    got.insert(got.end(), pooled.begin(), pooled.end());
    const int n = p / ratio;
    for (int j = 0; j < d; ++j) {
      std::vector<std::pair<double, double>> cand;  // (score, value)
      for (int t = 0; t < ratio; ++t) {
        const int q = n * ratio + t, col = ratio == 4 ? d + j : j;
        cand.push_back({double(gate[q * cd + col]) + ape[t * cd + col], kv[q * cd + col]});
        if (ratio == 4 && n > 0) {
          const int qp = (n - 1) * ratio + t;
          cand.push_back({double(gate[qp * cd + j]) + ape[t * cd + j], kv[qp * cd + j]});
        }
      }
      double mx = -1e300, num = 0, den = 0;
      for (auto [s, v] : cand) mx = std::max(mx, s);
      for (auto [s, v] : cand) num += std::exp(s - mx) * v, den += std::exp(s - mx);
      ref.push_back(num / den);
    }
  }
  ASSERT_EQ(got.size(), ref.size());
  EXPECT_LE(RelErr(got, ref), 1e-5) << "ratio " << ratio;
}

TEST(OpsTest, CompressorRatio4OverlapAndRatio128) {
  CheckCompressor(4, 32, 23, 4);
  CheckCompressor(128, 16, 300, 5);
}

TEST(OpsTest, IndexerTopKKeepsLowestTiedRows) {
  CpuOps ops(1);
  const int H = 2, Di = 4, N = 6;
  // Rows 1, 3 and 5 score exactly 0 (every head product <= 0); rows 0, 2, 4 score 3, 1, 2.
  std::vector<float> rows = {1, 0, 0, 0, -1, 0, 0, 0, 0, 1, 0, 0, -2, -2, 0, 0, 0, 0, 1, 0, 0, 0, 0, -5};
  std::vector<float> q = {3, 1, 2, 0, 0, 0, 0, 0};  // head 0 only
  std::vector<float> w = {1, 1};
  std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5}, target = {10, 11, 12, 13, 14, 15}, out(5);
  const int32_t count = N;
  int32_t out_count = 0;
  std::vector<float> scratch(N);
  KvCacheView cache{.base = reinterpret_cast<uint8_t*>(rows.data()), .format = KvFormat::kF32, .dim = Di,
                    .page_rows = 8, .page_bytes = 8 * Di * 4};
  ops.Indexer({.q = q.data(), .w = w.data(), .cache = cache, .index_rows = ids.data(), .target_rows = target.data(),
               .count = &count, .out_rows = out.data(), .out_count = &out_count, .scratch = scratch.data(), .b = 1,
               .heads = H, .dim = Di, .max_rows = N, .k = 5});
  EXPECT_EQ(out_count, 5);
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.end()), (std::vector<int32_t>{10, 11, 12, 13, 14}));
}

TEST(OpsTest, AttentionWithSinkFp32AndFp8Rows) {
  std::mt19937 rng(6);
  CpuOps ops(2);
  const int H = 4, Dh = 512, P = 16, nw = 20, nc = 7;
  for (KvFormat fmt : {KvFormat::kF32, KvFormat::kFp8Row584}) {
    const int64_t pb = KvPageBytes(fmt, Dh, P);
    std::vector<uint8_t> wpool(3 * pb), cpool(2 * pb);
    KvCacheView wv{.base = wpool.data(), .format = fmt, .dim = Dh, .page_rows = P, .page_bytes = pb};
    KvCacheView cv{.base = cpool.data(), .format = fmt, .dim = Dh, .page_rows = P, .page_bytes = pb};
    std::vector<int32_t> wr(nw), cr(nc);
    std::vector<std::vector<float>> keys;
    for (int j = 0; j < nw + nc; ++j) {
      auto k = Rand(Dh, rng);
      const int32_t row = j < nw ? (47 - j) : (j - nw) * 3 + 1;
      (j < nw ? wr[j] : cr[j - nw]) = row;
      WriteKvRow(j < nw ? wv : cv, row, k.data());
      std::vector<float> back(Dh);
      ReadKvRow(j < nw ? wv : cv, row, back.data());
      for (int d = 0; d < Dh; ++d) {  // FP8: within half an e4m3 step of the tile scale; rope dims bf16
        const double tol = fmt == KvFormat::kF32 ? 0 : (d < 448 ? std::fabs(k[d]) / 16 + 1e-3 : std::fabs(k[d]) / 256);
        ASSERT_LE(std::fabs(back[d] - k[d]), tol) << "dim " << d;
      }
      keys.push_back(back);
    }
    auto q = Rand(H * Dh, rng, 0.2f), sink = Rand(H, rng);
    std::vector<float> out(H * Dh);
    const int32_t wc = nw, cc = nc;
    const float scale = 1 / std::sqrt(512.f);
    ops.Attention({.q = q.data(), .window = wv, .window_rows = wr.data(), .window_count = &wc, .compressed = cv,
                   .compressed_rows = cr.data(), .compressed_count = &cc, .sink = sink.data(), .out = out.data(), .b = 1,
                   .heads = H, .dim = Dh, .max_window = nw, .max_compressed = nc, .scale = scale});
    std::vector<double> ref;
    for (int h = 0; h < H; ++h) {
      std::vector<double> s;
      double mx = sink[h], den = 0;
      for (auto& k : keys) {
        double dot = 0;
        for (int d = 0; d < Dh; ++d) dot += double(q[h * Dh + d]) * k[d];
        s.push_back(dot * scale);
        mx = std::max(mx, s.back());
      }
      den = std::exp(sink[h] - mx);
      for (double v : s) den += std::exp(v - mx);
      for (int d = 0; d < Dh; ++d) {
        double o = 0;
        for (size_t j = 0; j < keys.size(); ++j) o += std::exp(s[j] - mx) * keys[j][d];
        ref.push_back(o / den);
      }
    }
    EXPECT_LE(RelErr(out, ref), 1e-5);
  }
}

TEST(OpsTest, MoeRoutingAndClampedSwiGlu) {
  std::mt19937 rng(7);
  CpuOps ops(2);
  const int T = 3, D = 32, E = 6, I = 16, K = 2, V = 10;
  auto x = Rand(T * D, rng, 3.f), gate = Rand(E * D, rng), bias = Rand(E, rng);
  std::vector<std::vector<float>> w1, w3, w2;
  std::vector<const float*> p1, p3, p2;
  for (int e = 0; e < E; ++e) {
    w1.push_back(Rand(I * D, rng)), w3.push_back(Rand(I * D, rng)), w2.push_back(Rand(D * I, rng));
    p1.push_back(w1.back().data()), p3.push_back(w3.back().data()), p2.push_back(w2.back().data());
  }
  auto s1 = Rand(I * D, rng), s3 = Rand(I * D, rng), s2 = Rand(D * I, rng);
  std::vector<int32_t> tid2eid(V * K), tokens = {3, 7, 3};
  for (int i = 0; i < V * K; ++i) tid2eid[i] = (i * 5 + 1) % E;
  for (bool hash : {false, true}) {
    std::vector<float> y(T * D);
    ops.Moe({.x = x.data(), .tokens = tokens.data(), .gate = gate.data(), .bias = hash ? nullptr : bias.data(),
             .tid2eid = hash ? tid2eid.data() : nullptr, .w1 = p1.data(), .w3 = p3.data(), .w2 = p2.data(),
             .shared_w1 = s1.data(), .shared_w3 = s3.data(), .shared_w2 = s2.data(), .y = y.data(), .t = T, .d = D,
             .experts = E, .inter = I, .shared_inter = I, .vocab = V, .topk = K, .routed_scale = 1.5f, .swiglu_limit = 10.f});
    std::vector<double> ref;
    auto ffn = [&](const float* a, const float* b, const float* c, const float* xt, double wgt, std::vector<double>& acc) {
      std::vector<double> h(I);
      for (int i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int d = 0; d < D; ++d) g += double(a[i * D + d]) * xt[d], u += double(b[i * D + d]) * xt[d];
        g = std::min(g, 10.0), u = std::clamp(u, -10.0, 10.0);
        h[i] = g / (1 + std::exp(-g)) * u;
      }
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int i = 0; i < I; ++i) o += double(c[d * I + i]) * h[i];
        acc[d] += wgt * o;
      }
    };
    for (int t = 0; t < T; ++t) {
      const float* xt = &x[t * D];
      std::vector<double> s(E), acc(D, 0);
      for (int e = 0; e < E; ++e) {
        double l = 0;
        for (int d = 0; d < D; ++d) l += double(gate[e * D + d]) * xt[d];
        s[e] = std::sqrt(std::log1p(std::exp(l)));
      }
      std::vector<int> sel(E);
      std::iota(sel.begin(), sel.end(), 0);
      if (hash) {
        sel = {tid2eid[tokens[t] * K], tid2eid[tokens[t] * K + 1]};
      } else {
        std::sort(sel.begin(), sel.end(), [&](int a, int b) { return s[a] + bias[a] > s[b] + bias[b]; });
        sel.resize(K);
      }
      double sum = 0;
      for (int e : sel) sum += s[e];
      for (int e : sel) ffn(p1[e], p3[e], p2[e], xt, s[e] / sum * 1.5, acc);
      ffn(s1.data(), s3.data(), s2.data(), xt, 1.0, acc);
      ref.insert(ref.end(), acc.begin(), acc.end());
    }
    EXPECT_LE(RelErr(y, ref), 1e-5) << (hash ? "hash" : "score");
  }
}

TEST(OpsTest, QuantisationSimulations) {
  std::mt19937 rng(8);
  CpuOps ops(1);
  // FP8: each 64-tile uses scale 2^ceil(log2(amax/448)); values land on the scaled e4m3 grid.
  auto x = Rand(2 * 512, rng, 5.f), orig = x;
  ops.Fp8RoundTrip(x.data(), 2, 512, 448);
  for (int r = 0; r < 2; ++r)
    for (int t = 0; t < 7; ++t) {
      float amax = 1e-4f;
      for (int i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(orig[r * 512 + t * 64 + i]));
      const float s = Ue8m0ToF32(Ue8m0CeilFromF32(amax / 448));
      for (int i = 0; i < 64; ++i) {
        const int k = r * 512 + t * 64 + i;
        ASSERT_EQ(x[k], E4m3ToF32(F32ToE4m3(orig[k] / s)) * s);
      }
    }
  for (int r = 0; r < 2; ++r)
    for (int i = 448; i < 512; ++i) ASSERT_EQ(x[r * 512 + i], orig[r * 512 + i]);
  // Hadamard + FP4: without rounding, H/sqrt(n) preserves norms; with it, values are e2m1 codes times a
  // power-of-two block scale and the error is bounded by half the largest grid step.
  auto h = Rand(128, rng), h0 = h;
  ops.HadamardFp4RoundTrip(h.data(), 1, 128);
  double n0 = 0, n1 = 0;
  for (int i = 0; i < 128; ++i) n0 += double(h0[i]) * h0[i], n1 += double(h[i]) * h[i];
  EXPECT_NEAR(std::sqrt(n1 / n0), 1.0, 0.2);
  for (int b = 0; b < 4; ++b) {
    bool on_grid = false;  // some power-of-two scale puts all 32 values on the e2m1 grid
    for (int e = -30; e <= 10 && !on_grid; ++e) {
      const float s = std::ldexp(1.f, e);
      on_grid = true;
      for (int i = 0; i < 32 && on_grid; ++i) on_grid = E2m1ToF32(F32ToE2m1(h[b * 32 + i] / s)) == h[b * 32 + i] / s;
    }
    EXPECT_TRUE(on_grid) << "block " << b;
  }
}

}  // namespace
}  // namespace dsv4::kernels::cpu
