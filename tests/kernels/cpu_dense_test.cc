// CPU backend, dense ops on fresh random inputs against plain loops written here: the linear (any row count,
// thread count, groups, strides, bf16 activations) bit for bit against one Dot per element and within 1e-5 of
// a double reference; the fused linear bit for bit against the single ones; RMSNorm, RoPE (padding rows
// untouched), Scale, Fill, Embed (streams, padding), the mHC pre / post / head mixes, the Hadamard + FP4
// simulation; and the thread pool's split.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include "common/float_formats.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/cpu_test_util.h"

namespace dsv4::kernels::cpu {
namespace {

using testing::F32Weight;
using testing::Near;
using testing::Rand;
using testing::RefDot;
using testing::SameBits;

TEST(CpuThreadPoolTest, ParallelForCoversEachItemOnceWithDistinctThreads) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 100, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      std::vector<std::atomic<int>> ranges_of(pool.size());
      pool.ParallelFor(n, 1, [&](int64_t b, int64_t e, int thread) {
        ASSERT_GE(thread, 0);
        ASSERT_LT(thread, pool.size());
        ranges_of[thread]++;
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "item " << i;
      for (int t = 0; t < pool.size(); ++t) ASSERT_LE(ranges_of[t].load(), 1);
    }
  }
}

TEST(CpuDenseTest, DotAndAxpyFollowTheDocumentedOrder) {
  std::mt19937 rng(9);
  auto a = Rand(600, rng), b = Rand(600, rng);
  for (int64_t n = 0; n < 70; ++n) ASSERT_EQ(Dot(a.data(), b.data(), n), RefDot(a.data(), b.data(), n)) << n;
  ASSERT_EQ(Dot(a.data() + 1, b.data() + 3, 517), RefDot(a.data() + 1, b.data() + 3, 517));  // unaligned
  std::vector<double> acc(37, 0.5), want = acc;
  AxpyF64(acc.data() + 1, 0.3, a.data() + 1, 35);
  for (int i = 1; i < 36; ++i) want[i] += 0.3 * a[i];
  EXPECT_EQ(acc, want);
}

// y[t, g*N + n] = RefDot(x[t, g*K ..], W[g*N + n]) for every row count and thread count, exactly.
TEST(CpuDenseTest, LinearIsOneDotPerElementWhateverTheBatchOrThreads) {
  std::mt19937 rng(1);
  const int64_t N = 77, K = 131, G = 2, xs = G * K + 9, ys = G * N + 5;
  auto w = Rand(G * N * K, rng);
  auto x = Rand(32 * xs, rng);
  std::vector<float> want(32 * ys, 0.f);
  std::vector<double> ref;
  for (int64_t t = 0; t < 32; ++t)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 0; n < N; ++n) {
        want[t * ys + g * N + n] = RefDot(&x[t * xs + g * K], &w[(g * N + n) * K], K);
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += double(x[t * xs + g * K + k]) * w[(g * N + n) * K + k];
        ref.push_back(s);
      }
  for (int threads : {1, 3}) {
    auto be = MakeCpuBackend(threads);
    LinearHandle h = F32Weight(*be, w, G * N, K);
    for (int64_t T : {1, 2, 3, 5, 7, 13, 32}) {
      std::vector<float> y(32 * ys, 0.f);
      be->ops().Linear({.w = h.get(), .x = {.data = x.data()}, .y = y.data(), .t = T, .groups = G, .x_stride = xs,
                        .y_stride = ys});
      ASSERT_TRUE(SameBits(y.data(), want.data(), T * ys)) << "T " << T << " threads " << threads;
      std::vector<float> got;
      for (int64_t t = 0; t < T; ++t) got.insert(got.end(), &y[t * ys], &y[t * ys] + G * N);
      EXPECT_TRUE(Near(got, std::vector<double>(ref.begin(), ref.begin() + T * G * N), 1e-5));
    }
    ASSERT_TRUE(be->Synchronize().ok());
  }
}

TEST(CpuDenseTest, LinearDenseAndBf16Activations) {
  std::mt19937 rng(2);
  auto be = MakeCpuBackend(2);
  const int64_t T = 6, N = 40, K = 64;
  auto w = Rand(N * K, rng), x = Rand(T * K, rng);
  std::vector<uint16_t> xb(T * K);
  for (int64_t i = 0; i < T * K; ++i) xb[i] = F32ToBf16(x[i]);
  LinearHandle h = F32Weight(*be, w, N, K);
  std::vector<float> y(T * N), yb(T * N);
  be->ops().Linear({.w = h.get(), .x = {.data = x.data()}, .y = y.data(), .t = T});
  be->ops().Linear({.w = h.get(), .x = {.data = xb.data(), .dtype = DType::kBF16}, .y = yb.data(), .t = T});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      std::vector<float> xr(K);
      for (int64_t k = 0; k < K; ++k) xr[k] = Bf16ToF32(xb[t * K + k]);
      ASSERT_EQ(y[t * N + n], RefDot(&x[t * K], &w[n * K], K));
      ASSERT_EQ(yb[t * N + n], RefDot(xr.data(), &w[n * K], K));
    }
  ASSERT_TRUE(be->Synchronize().ok());
}

// FusedLinear is the loop of the single linears it stands for (ops.h): every output bit for bit, whatever the
// formats (FP8 block-128, BF16, F32), row counts and strides, and for bf16 activations; bad arguments are refused
// and write nothing.
TEST(CpuDenseTest, FusedLinearEqualsTheSeparateLinears) {
  std::mt19937 rng(21);
  auto be = MakeCpuBackend(2);
  const int64_t K = 384, T = 5, xs = K + 8;
  struct Spec {
    WeightFormat format;
    int64_t n;
    int64_t y_pad;
  };
  const std::vector<Spec> specs = {{WeightFormat::kFp8Block128, 200, 0}, {WeightFormat::kBF16, 64, 3},
                                   {WeightFormat::kFp8Block128, 16, 0},  {WeightFormat::kF32, 33, 1},
                                   {WeightFormat::kBF16, 130, 0},        {WeightFormat::kFp8Block128, 512, 7},
                                   {WeightFormat::kBF16, 8, 0},          {WeightFormat::kFp8Block128, 1, 2}};
  ASSERT_EQ(specs.size(), static_cast<size_t>(kMaxFusedLinears));
  std::vector<std::vector<uint8_t>> data(specs.size()), scales(specs.size());
  std::vector<LinearHandle> w;
  std::uniform_int_distribution<int> byte(0, 255);
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& sp = specs[i];
    WeightView v{.name = std::string(1, static_cast<char>('a' + i)), .format = sp.format, .n = sp.n, .k = K};
    if (sp.format == WeightFormat::kFp8Block128) {
      data[i].resize(sp.n * K);
      for (auto& b : data[i]) {
        b = static_cast<uint8_t>(byte(rng));
        if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
      }
      scales[i].resize(((sp.n + 127) / 128) * ((K + 127) / 128));
      for (auto& s : scales[i]) s = static_cast<uint8_t>(120 + byte(rng) % 8);
      v.scale = scales[i].data();
    } else if (sp.format == WeightFormat::kBF16) {
      const std::vector<float> f = Rand(sp.n * K, rng, 0.05f);
      data[i].resize(sp.n * K * 2);
      for (int64_t j = 0; j < sp.n * K; ++j) {
        const uint16_t b = F32ToBf16(f[j]);
        std::memcpy(&data[i][2 * j], &b, 2);
      }
    } else {
      const std::vector<float> f = Rand(sp.n * K, rng, 0.05f);
      data[i].resize(sp.n * K * 4);
      std::memcpy(data[i].data(), f.data(), data[i].size());
    }
    v.data = data[i].data();
    auto h = be->PrepareLinear(v);
    ASSERT_TRUE(h.ok()) << h.status();
    w.push_back(std::move(*h));
  }
  const std::vector<float> x = Rand(T * xs, rng);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = F32ToBf16(x[i]);
  for (const bool bf16_x : {false, true}) {
    for (const int count : {1, 2, 7, kMaxFusedLinears}) {
      const ActView xv = bf16_x ? ActView{.data = xb.data(), .dtype = DType::kBF16} : ActView{.data = x.data()};
      std::vector<std::vector<float>> fused(count), single(count);
      FusedLinearArgs f{.x = xv, .t = T, .x_stride = xs, .count = count};
      for (int i = 0; i < count; ++i) {
        const int64_t ys = specs[i].n + specs[i].y_pad;
        fused[i].assign(T * ys, -7.f);
        single[i].assign(T * ys, -7.f);
        f.out[i] = {.w = w[i].get(), .y = fused[i].data(), .y_stride = specs[i].y_pad ? ys : 0};
        be->ops().Linear({.w = w[i].get(), .x = xv, .y = single[i].data(), .t = T, .x_stride = xs,
                          .y_stride = specs[i].y_pad ? ys : 0});
      }
      be->ops().FusedLinear(f);
      ASSERT_TRUE(be->Synchronize().ok());
      for (int i = 0; i < count; ++i) {
        EXPECT_TRUE(SameBits(fused[i], single[i])) << "output " << i << " of " << count << (bf16_x ? " bf16 x" : "");
      }
    }
  }
  // Refused: a weight of another Kin, too many outputs, a missing y. Nothing is written.
  auto other = F32Weight(*be, Rand(4 * 128, rng), 4, 128);
  std::vector<float> y(T * 600, -7.f);
  const std::vector<float> y0 = y;
  FusedLinearArgs bad{.x = {.data = x.data()}, .t = T, .x_stride = xs, .count = 2};
  bad.out[0] = {.w = w[0].get(), .y = y.data()};
  bad.out[1] = {.w = other.get(), .y = y.data() + T * 200};
  be->ops().FusedLinear(bad);
  EXPECT_FALSE(be->Synchronize().ok());
  bad.out[1] = {.w = w[1].get(), .y = nullptr};
  be->ops().FusedLinear(bad);
  EXPECT_FALSE(be->Synchronize().ok());
  bad.count = kMaxFusedLinears + 1;
  be->ops().FusedLinear(bad);
  EXPECT_FALSE(be->Synchronize().ok());
  EXPECT_TRUE(SameBits(y, y0));
}

TEST(CpuDenseTest, RmsNormRopeScaleFill) {
  std::mt19937 rng(3);
  auto be = MakeCpuBackend(2);
  Ops& ops = be->ops();
  auto x = Rand(200 * 128, rng), w = Rand(128, rng);
  std::vector<float> y(x.size());
  ops.RmsNorm({.x = x.data(), .w = w.data(), .out = y.data(), .rows = 200, .dim = 128, .eps = 1e-6f});
  std::vector<double> ref;
  for (int r = 0; r < 200; ++r) {
    double ss = 0;
    for (int i = 0; i < 128; ++i) ss += double(x[r * 128 + i]) * x[r * 128 + i];
    for (int i = 0; i < 128; ++i) ref.push_back(x[r * 128 + i] / std::sqrt(ss / 128 + 1e-6) * w[i]);
  }
  EXPECT_TRUE(Near(y, ref, 1e-6));
  ops.RmsNorm({.x = y.data(), .w = nullptr, .out = y.data(), .rows = 200, .dim = 128});  // in place, unweighted
  ref.clear();
  for (int r = 0; r < 200; ++r) {
    double ss = 0;
    for (int i = 0; i < 128; ++i) ss += double(x[r * 128 + i]) * w[i] * x[r * 128 + i] * w[i];
    for (int i = 0; i < 128; ++i) ref.push_back(x[r * 128 + i] * w[i] / std::sqrt(ss / 128));
  }
  EXPECT_TRUE(Near(y, ref, 1e-5));

  // RoPE: pairs (2i, 2i+1) of the last 64 dims rotate by pos * f_i; a padding token's rows stay; the inverse
  // restores the input.
  std::vector<float> f(32);
  for (int i = 0; i < 32; ++i) f[i] = std::pow(10000.f, -2.f * i / 64);
  const int32_t pos[3] = {0, 301, -1};
  auto q = Rand(3 * 3 * 128, rng), orig = q;
  ops.Rope({.x = q.data(), .pos = pos, .inv_freq = f.data(), .t = 3, .heads = 3, .row_dim = 128, .pairs = 32});
  std::vector<double> rref;
  for (int t = 0; t < 3; ++t)
    for (int h = 0; h < 3; ++h)
      for (int d = 0; d < 128; ++d) {
        const float* v = &orig[(t * 3 + h) * 128];
        if (d < 64 || pos[t] < 0) {
          rref.push_back(v[d]);
          continue;
        }
        const int i = (d - 64) / 2;
        const double a = double(pos[t]) * f[i], c = std::cos(a), s = std::sin(a);
        rref.push_back(d % 2 == 0 ? v[d] * c - v[d + 1] * s : v[d - 1] * s + v[d] * c);
      }
  EXPECT_TRUE(Near(q, rref, 1e-5));
  EXPECT_TRUE(SameBits(&q[2 * 3 * 128], &orig[2 * 3 * 128], 3 * 128)) << "padding row touched";
  ops.Rope({.x = q.data(), .pos = pos, .inv_freq = f.data(), .t = 3, .heads = 3, .row_dim = 128, .pairs = 32,
            .inverse = true});
  EXPECT_TRUE(Near(q, std::vector<double>(orig.begin(), orig.end()), 1e-5));

  std::vector<float> s = {1, -2, 3, 4, 5, 6};
  ops.Scale({.x = s.data(), .rows = 2, .dim = 2, .scale = 0.5f});
  EXPECT_EQ(s, (std::vector<float>{0.5f, -1, 1.5f, 2, 5, 6}));
  ops.Fill({.x = s.data(), .n = 5, .value = -INFINITY});
  EXPECT_EQ(s, (std::vector<float>{-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, 6}));
  ASSERT_TRUE(be->Synchronize().ok());
}

TEST(CpuDenseTest, EmbedCopiesTheRowIntoEveryStreamAndZeroesPadding) {
  std::mt19937 rng(4);
  auto be = MakeCpuBackend(1);
  const int64_t V = 10, D = 12, S = 3;
  auto table = Rand(V * D, rng);
  LinearHandle h = F32Weight(*be, table, V, D, "embed");
  const int32_t tokens[3] = {7, 0, 99}, pos[3] = {4, 5, -1};  // the padding token's id is never read
  std::vector<float> x(3 * S * D, 1.f);
  be->ops().Embed({.table = h.get(), .tokens = tokens, .pos = pos, .x = x.data(), .t = 3, .s = S});
  for (int t = 0; t < 3; ++t)
    for (int s = 0; s < S; ++s)
      for (int d = 0; d < D; ++d) {
        const float want = t < 2 ? table[tokens[t] * D + d] : 0.f;
        ASSERT_EQ(x[(t * S + s) * D + d], want) << t << " " << s << " " << d;
      }
  ASSERT_TRUE(be->Synchronize().ok());
}

// mHC on a batch of tokens, from §2.2 in double.
TEST(CpuDenseTest, HcPreSinkhornPostAndHead) {
  std::mt19937 rng(5);
  auto be = MakeCpuBackend(2);
  Ops& ops = be->ops();
  const int64_t T = 9, S = 4, D = 64, M = (2 + S) * S;
  auto x = Rand(T * S * D, rng), fn = Rand(M * S * D, rng, 0.05f), base = Rand(M, rng), scale = Rand(3, rng);
  std::vector<float> u(T * D), post(T * S), comb(T * S * S);
  ops.HcPre({.x = x.data(), .fn = fn.data(), .base = base.data(), .scale = scale.data(), .u = u.data(),
             .post = post.data(), .comb = comb.data(), .t = T, .s = S, .d = D});
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  std::vector<double> cref, uref, pref, headref;
  std::vector<std::vector<double>> mix(T);
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = &x[t * S * D];
    double ss = 0;
    for (int64_t k = 0; k < S * D; ++k) ss += double(xt[k]) * xt[k];
    const double rho = 1 / std::sqrt(ss / (S * D) + 1e-6);
    std::vector<double> m(M);
    for (int r = 0; r < M; ++r) {
      for (int k = 0; k < S * D; ++k) m[r] += double(fn[r * S * D + k]) * xt[k];
      m[r] *= rho;
    }
    mix[t] = m;
    std::vector<double> c(S * S), ut(D, 0);
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
    cref.insert(cref.end(), c.begin(), c.end());
    for (int i = 0; i < S; ++i) {
      pref.push_back(2 * sig(scale[1] * m[S + i] + base[S + i]));
      const double pre = sig(scale[0] * m[i] + base[i]) + 1e-6;
      for (int d = 0; d < D; ++d) ut[d] += pre * xt[i * D + d];
    }
    uref.insert(uref.end(), ut.begin(), ut.end());
  }
  EXPECT_TRUE(Near(comb, cref, 1e-5));
  EXPECT_TRUE(Near(post, pref, 1e-5));
  EXPECT_TRUE(Near(u, uref, 1e-5));

  // Post: X'_j = post_j y + sum_i C_ij X_i (transposed comb).
  auto y = Rand(T * D, rng);
  std::vector<float> xo(T * S * D);
  ops.HcPost({.x = x.data(), .y = y.data(), .post = post.data(), .comb = comb.data(), .x_out = xo.data(), .t = T,
              .s = S, .d = D});
  std::vector<double> xref;
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < S; ++j)
      for (int d = 0; d < D; ++d) {
        double v = double(post[t * S + j]) * y[t * D + d];
        for (int i = 0; i < S; ++i) v += double(comb[t * S * S + i * S + j]) * x[(t * S + i) * D + d];
        xref.push_back(v);
      }
  EXPECT_TRUE(Near(xo, xref, 1e-5));

  // Head: pre weights only (the first S rows of the same fn), for the named rows; -1 gives zeros.
  const int32_t rows[3] = {8, 2, -1};
  std::vector<float> h(3 * D);
  ops.HcHead({.x = x.data(), .rows = rows, .fn = fn.data(), .base = base.data(), .scale = scale.data(),
              .h = h.data(), .r = 3, .s = S, .d = D});
  for (int r = 0; r < 3; ++r)
    for (int d = 0; d < D; ++d) {
      double v = 0;
      for (int i = 0; r < 2 && i < S; ++i) {
        v += (sig(scale[0] * mix[rows[r]][i] + base[i]) + 1e-6) * x[(rows[r] * S + i) * D + d];
      }
      headref.push_back(v);
    }
  EXPECT_TRUE(Near(h, headref, 1e-5));
  ASSERT_TRUE(be->Synchronize().ok());
}

TEST(CpuDenseTest, HadamardFp4LandsOnTheScaledGridAndKeepsTheNorm) {
  std::mt19937 rng(8);
  auto be = MakeCpuBackend(1);
  auto h = Rand(3 * 128, rng), h0 = h;
  be->ops().HadamardFp4({.x = h.data(), .rows = 3, .dim = 128});
  for (int r = 0; r < 3; ++r) {
    double n0 = 0, n1 = 0;
    for (int i = 0; i < 128; ++i) n0 += double(h0[r * 128 + i]) * h0[r * 128 + i], n1 += double(h[r * 128 + i]) * h[r * 128 + i];
    EXPECT_NEAR(std::sqrt(n1 / n0), 1.0, 0.2);
    for (int b = 0; b < 4; ++b) {
      bool on_grid = false;  // some power-of-two scale puts all 32 values on the e2m1 grid
      for (int e = -30; e <= 10 && !on_grid; ++e) {
        const float s = std::ldexp(1.f, e);
        on_grid = true;
        for (int i = 0; i < 32 && on_grid; ++i) {
          const float v = h[r * 128 + b * 32 + i] / s;
          on_grid = E2m1ToF32(F32ToE2m1(v)) == v;
        }
      }
      EXPECT_TRUE(on_grid) << "row " << r << " block " << b;
    }
  }
  // H e0 / sqrt(32) is 1/sqrt(32) in every dim: one block, one scale, 32 equal values.
  std::vector<float> e(32, 0.f);
  e[0] = 1.f;
  be->ops().HadamardFp4({.x = e.data(), .rows = 1, .dim = 32});
  for (int i = 1; i < 32; ++i) EXPECT_EQ(e[i], e[0]);
  EXPECT_TRUE(be->Synchronize().ok());
  be->ops().HadamardFp4({.x = e.data(), .rows = 1, .dim = 48});  // not a power of two: refused
  EXPECT_EQ(be->Synchronize().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsv4::kernels::cpu
