// CPU backend, mixture of experts against a double reference from §2.4 (score and hash routing, the clamped
// SwiGLU, routed scaling, the shared expert), with a padding token and an expert this rank does not hold; and
// the batch invariance the goldens rely on: tokens run one per call give the same bits as one batched call.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/cpu_test_util.h"

namespace dsv4::kernels::cpu {
namespace {

using testing::F32Weight;
using testing::Near;
using testing::Rand;
using testing::SameBits;

constexpr int T = 5, D = 32, E = 6, I = 16, Is = 24, K = 2, V = 10;
constexpr int kNotHeld = 3;

struct MoeFixture {
  std::mt19937 rng{7};
  std::unique_ptr<Backend> be = MakeCpuBackend(2);
  std::vector<float> x = Rand(T * D, rng, 3.f), gate = Rand(E * D, rng), bias = Rand(E, rng);
  std::vector<std::vector<float>> w1, w3, w2;
  std::vector<float> s1 = Rand(Is * D, rng), s3 = Rand(Is * D, rng), s2 = Rand(D * Is, rng);
  std::vector<int32_t> tid2eid = std::vector<int32_t>(V * K), tokens = {3, 7, 3, 9, 1};
  std::vector<int32_t> pos = {10, 11, -1, 12, 13};  // token 2 is padding
  LinearHandle gate_h, s1_h, s3_h, s2_h;
  ExpertsHandle experts;

  MoeFixture() {
    for (int e = 0; e < E; ++e) w1.push_back(Rand(I * D, rng)), w3.push_back(Rand(I * D, rng)), w2.push_back(Rand(D * I, rng));
    for (int i = 0; i < V * K; ++i) tid2eid[i] = (i * 5 + 1) % E;
    gate_h = F32Weight(*be, gate, E, D, "gate");
    s1_h = F32Weight(*be, s1, Is, D);
    s3_h = F32Weight(*be, s3, Is, D);
    s2_h = F32Weight(*be, s2, D, Is);
    std::vector<WeightView> v1, v3, v2;
    for (int e = 0; e < E; ++e) {
      auto view = [&](const std::vector<float>& w, int64_t n, int64_t k) {
        return WeightView{.name = "expert", .format = WeightFormat::kF32, .n = n, .k = k,
                          .data = e == kNotHeld ? nullptr : reinterpret_cast<const uint8_t*>(w.data())};
      };
      v1.push_back(view(w1[e], I, D)), v3.push_back(view(w3[e], I, D)), v2.push_back(view(w2[e], D, I));
    }
    auto h = be->PrepareExperts(v1, v3, v2);
    EXPECT_TRUE(h.ok()) << h.status();
    experts = std::move(h).value();
  }

  MoeArgs Args(bool hash, float* y, int64_t t0, int64_t t) {
    return {.x = x.data() + t0 * D, .tokens = tokens.data() + t0, .pos = pos.data() + t0, .gate = gate_h.get(),
            .bias = hash ? nullptr : bias.data(), .tid2eid = hash ? tid2eid.data() : nullptr,
            .experts = experts.get(), .shared_w1 = s1_h.get(), .shared_w3 = s3_h.get(), .shared_w2 = s2_h.get(),
            .y = y, .t = t, .topk = K, .routed_scale = 1.5f, .swiglu_limit = 10.f};
  }
};

TEST(CpuMoeTest, RoutingClampedSwiGluSharedExpertPaddingAndExpertParallel) {
  MoeFixture f;
  EXPECT_EQ(f.experts->experts(), E);
  EXPECT_EQ(f.experts->inter(), I);
  EXPECT_EQ(f.experts->dim(), D);
  for (int e = 0; e < E; ++e) EXPECT_EQ(f.experts->Holds(e), e != kNotHeld);
  EXPECT_EQ(f.experts->device_bytes(), int64_t{E - 1} * 3 * I * D * 4);
  for (bool hash : {false, true}) {
    std::vector<float> y(T * D, 7.f);
    f.be->ops().Moe(f.Args(hash, y.data(), 0, T));
    ASSERT_TRUE(f.be->Synchronize().ok());
    std::vector<double> ref;
    auto ffn = [&](const float* a, const float* b, const float* c, int64_t inter, const float* xt, double wgt,
                   std::vector<double>& acc) {
      std::vector<double> h(inter);
      for (int i = 0; i < inter; ++i) {
        double g = 0, u = 0;
        for (int d = 0; d < D; ++d) g += double(a[i * D + d]) * xt[d], u += double(b[i * D + d]) * xt[d];
        g = std::min(g, 10.0), u = std::clamp(u, -10.0, 10.0);
        h[i] = g / (1 + std::exp(-g)) * u;
      }
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int i = 0; i < inter; ++i) o += double(c[d * inter + i]) * h[i];
        acc[d] += wgt * o;
      }
    };
    for (int t = 0; t < T; ++t) {
      std::vector<double> acc(D, 0);
      if (f.pos[t] < 0) {
        ref.insert(ref.end(), acc.begin(), acc.end());
        continue;
      }
      const float* xt = &f.x[t * D];
      std::vector<double> s(E);
      for (int e = 0; e < E; ++e) {
        double l = 0;
        for (int d = 0; d < D; ++d) l += double(f.gate[e * D + d]) * xt[d];
        s[e] = std::sqrt(std::log1p(std::exp(l)));
      }
      std::vector<int> sel(E);
      std::iota(sel.begin(), sel.end(), 0);
      if (hash) {
        sel = {f.tid2eid[f.tokens[t] * K], f.tid2eid[f.tokens[t] * K + 1]};
      } else {
        std::sort(sel.begin(), sel.end(), [&](int a, int b) { return s[a] + f.bias[a] > s[b] + f.bias[b]; });
        sel.resize(K);
      }
      double sum = 0;
      for (int e : sel) sum += s[e];
      for (int e : sel) {
        if (e != kNotHeld) ffn(f.w1[e].data(), f.w3[e].data(), f.w2[e].data(), I, xt, s[e] / sum * 1.5, acc);
      }
      ffn(f.s1.data(), f.s3.data(), f.s2.data(), Is, xt, 1.0, acc);
      ref.insert(ref.end(), acc.begin(), acc.end());
    }
    EXPECT_TRUE(Near(y, ref, 1e-5)) << (hash ? "hash" : "score");

    // One token per call: the same bits (padding gives zeros either way).
    std::vector<float> y1(T * D, 7.f);
    for (int t = 0; t < T; ++t) f.be->ops().Moe(f.Args(hash, y1.data() + t * D, t, 1));
    ASSERT_TRUE(f.be->Synchronize().ok());
    EXPECT_TRUE(SameBits(y, y1)) << (hash ? "hash" : "score");
  }
}

TEST(CpuMoeTest, RefusesMismatchedShapes) {
  MoeFixture f;
  std::vector<float> y(T * D);
  MoeArgs a = f.Args(false, y.data(), 0, T);
  a.shared_w2 = f.s1_h.get();  // [Is, D] where [D, Is] is needed
  f.be->ops().Moe(a);
  EXPECT_EQ(f.be->Synchronize().code(), absl::StatusCode::kInvalidArgument);
  a = f.Args(false, y.data(), 0, T);
  a.bias = nullptr;  // neither bias nor tid2eid: no routing
  f.be->ops().Moe(a);
  EXPECT_EQ(f.be->Synchronize().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsv4::kernels::cpu
