// The CUDA MoE op (LaunchMoe: moe_router.cu, moe.cu, moe_prepare.cu, moe_routed.cc, moe_launch.cc) against
// the CPU reference op (CpuOps::Moe), both driven through their backends (PrepareLinear / PrepareExperts /
// ops().Moe), on fresh random inputs: the real shapes of configs/flash.json (D 4096, I 2048, 256 experts
// top-6, FP8 shared expert of width 2048; the 64-expert shard of TP4), small.json and tiny.json; T = 1..256;
// NVFP4 and MXFP4 experts with subnormal, zero and negative block scales and a shifted MXFP4 exponent range;
// hash layers with crafted tables (experts with no token, one token, every token, a token naming an expert
// twice); skewed hash routing (20% of the experts take 80% of the picks); padding tokens; a bias that sends
// every token to one expert. Each CUDA step runs twice and must repeat bit for bit. Each run prints max abs
// error, relative error by norm, the worst element and the worst token; NaN never passes; outputs start as NaN. The flash
// test also times the op with CUDA events next to the byte floor. The host-only tests check the packed
// layout's bit map and exactness without a GPU.
// Tests whose names contain "Gpu" need a GPU and skip with a message without one.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/float_formats.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/moe_internal.h"
#include "kernels/cuda/moe_layout.h"
#include "tests/cuda/test_util.h"

namespace dsv4::kernels::cuda {
namespace {

using moe::Fp4Kind;

// ---------------------------------------------------------------------------------------------------------
// Host-only: the packed layout (moe_layout.h).

uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

TEST(MoeLayout, WordBitsCoverTheWordAndMatchTheExtraction) {
  std::set<int> bits;
  for (int j = 0; j < 4; ++j)
    for (int h = 0; h < 2; ++h)
      for (int b = 0; b < 4; ++b) bits.insert(moe::Fp4WordBit(j, h, b));
  ASSERT_EQ(bits.size(), 32u);
  EXPECT_EQ(*bits.begin(), 0);
  EXPECT_EQ(*bits.rbegin(), 31);
  uint64_t rng = 1;
  for (int it = 0; it < 20000; ++it) {
    uint32_t codes[4][2];
    uint32_t w = 0;
    for (int j = 0; j < 4; ++j)
      for (int h = 0; h < 2; ++h) {
        codes[j][h] = static_cast<uint32_t>(SplitMix(rng) & 15u);
        for (int b = 0; b < 4; ++b) w |= ((codes[j][h] >> b) & 1u) << moe::Fp4WordBit(j, h, b);
      }
    uint32_t r[4];
    moe::Fp4WordToTrick(w, r);
    for (int j = 0; j < 4; ++j)
      for (int h = 0; h < 2; ++h) {
        ASSERT_EQ((r[j] >> (16 * h)) & 0xffffu, moe::Fp4CodeTrickBits(codes[j][h])) << "reg " << j << " half " << h;
      }
  }
}

// The bf16 trick value of a code times the block factor is the exact weight, and that weight is a bf16.
double TrickTimesFactor(uint32_t code, Fp4Kind kind, uint32_t byte) {
  const double trick = Bf16ToF32(moe::Fp4CodeTrickBits(code));  // e2m1 * 2^-126 (a subnormal for 0.5)
  const double factor = Bf16ToF32(static_cast<uint16_t>(moe::ScaleFactorBits(kind, byte)));
  const double product = trick * factor;
  EXPECT_EQ(static_cast<double>(Bf16ToF32(F32ToBf16(static_cast<float>(product)))), product);
  return product;
}

TEST(MoeLayout, Nvfp4FactorsDequantiseExactly) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f || (b & 0x7f) == 0 || (b & 0x80)) continue;  // NaN; zero / negative: codes rewritten
    const uint8_t enc = moe::EncodeNvfp4Scale(static_cast<uint8_t>(b));
    for (uint32_t code = 0; code < 16; ++code) {
      const double want = static_cast<double>(E2m1ToF32(static_cast<uint8_t>(code))) *
                          E4m3ToF32(static_cast<uint8_t>(b)) / moe::kNvfp4EpilogueShift;
      ASSERT_EQ(TrickTimesFactor(code, Fp4Kind::kNvfp4, enc), want) << "scale byte " << b << " code " << code;
    }
  }
}

TEST(MoeLayout, Mxfp4FactorsDequantiseExactly) {
  for (int shift : {0, 3}) {
    for (int s = shift; s <= 128 + shift; ++s) {
      for (uint32_t code = 0; code < 16; ++code) {
        const double want = std::ldexp(static_cast<double>(E2m1ToF32(static_cast<uint8_t>(code))), s - 127 - shift);
        ASSERT_EQ(TrickTimesFactor(code, Fp4Kind::kMxfp4, static_cast<uint32_t>(s - shift)), want)
            << "ue8m0 " << s << " shift " << shift << " code " << code;
      }
    }
  }
}

TEST(MoeLayout, ExpertBytesMatchTheByteFloorFigure) {
  const moe::ExpertLayout l = moe::MakeExpertLayout(Fp4Kind::kNvfp4, 4096, 2048);
  EXPECT_EQ(l.w2_codes, 2 * 2048 * 4096 / 2);
  EXPECT_EQ(l.bytes, 3 * 2048 * 4096 / 2 + 3 * 2048 * 4096 / 16);  // 14.16 MB per expert
  const moe::ExpertLayout m = moe::MakeExpertLayout(Fp4Kind::kMxfp4, 4096, 2048);
  EXPECT_EQ(m.bytes, 3 * 2048 * 4096 / 2 + 3 * 2048 * 4096 / 32);
}

// ---------------------------------------------------------------------------------------------------------
// Random layers.

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

struct Rng {
  uint64_t s;
  uint64_t Next() { return SplitMix(s); }
  float Uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(Next() >> 40) * 0x1p-24f; }
  int Int(int n) { return static_cast<int>(Next() % static_cast<uint64_t>(n)); }
};

struct Shape {
  int64_t d = 0, inter = 0, experts = 0;
  int topk = 0;
  WeightFormat format = WeightFormat::kNvfp4;
  int64_t hold_first = 0, hold_count = -1;  // held experts [first, first + count); -1 = all
  uint64_t seed = 1;
};

// Every expert's checkpoint bytes and their views (null data for experts another rank holds).
struct HostExperts {
  std::vector<std::vector<uint8_t>> codes, scales;  // [3 * E]: w1, w3, w2 of expert e at 3e + m
  std::vector<WeightView> views[3];
};

// e4m3 block scales around 1 with a few subnormal, zero and negative ones; ue8m0 in [120, 123] (one block of
// expert 1's w1 at 130, so that its matrix needs the exponent shift).
void FillScales(Rng& rng, WeightFormat format, std::vector<uint8_t>& s, bool shifted) {
  for (size_t i = 0; i < s.size(); i += 8) {
    uint64_t r = rng.Next();
    for (size_t j = i; j < std::min(s.size(), i + 8); ++j, r >>= 8) {
      const uint32_t v = static_cast<uint32_t>(r & 0xff);
      if (format == WeightFormat::kMxfp4) {
        s[j] = static_cast<uint8_t>(120 + (v & 3));
        continue;
      }
      uint8_t b = static_cast<uint8_t>(((5 + v % 5) << 3) | ((v >> 4) & 7));  // 2^-2 .. 2^2 * 1.mmm
      if (v == 0) b = static_cast<uint8_t>(1 + ((r >> 8) & 7) % 7);           // subnormal
      if (v == 1) b = 0;                                                      // zero block
      if (v == 2) b |= 0x80;                                                  // negative scale
      s[j] = b;
    }
  }
  if (shifted) s[s.size() / 2] = 130;
}

HostExperts MakeExperts(const Shape& sh) {
  HostExperts h;
  const int64_t E = sh.experts, D = sh.d, I = sh.inter;
  const int64_t held_end = sh.hold_count < 0 ? E : sh.hold_first + sh.hold_count;
  h.codes.resize(3 * E);
  h.scales.resize(3 * E);
  const int64_t block = sh.format == WeightFormat::kNvfp4 ? 16 : 32;
  for (int m = 0; m < 3; ++m) h.views[m].resize(E);
  for (int64_t e = 0; e < E; ++e) {
    Rng rng{sh.seed * 1000003u + static_cast<uint64_t>(e)};
    const bool held = e >= sh.hold_first && e < held_end;
    for (int m = 0; m < 3; ++m) {
      const int64_t n = m < 2 ? I : D, k = m < 2 ? D : I;
      WeightView& v = h.views[m][e];
      v.name = "layers.0.ffn.experts." + std::to_string(e) + ".w" + std::to_string(m == 0 ? 1 : (m == 1 ? 3 : 2));
      v.format = sh.format;
      v.n = n;
      v.k = k;
      // ~N(0, 3) pre-activations for x in [-1, 1]: some gates pass the clamp.
      v.global_scale = 1.f / std::sqrt(static_cast<float>(k)) * rng.Uniform(0.8f, 1.2f);
      if (!held) continue;
      std::vector<uint8_t>& c = h.codes[3 * e + m];
      std::vector<uint8_t>& s = h.scales[3 * e + m];
      c.resize(n * k / 2);
      s.resize(n * k / block);
      for (size_t i = 0; i < c.size(); i += 8) {
        const uint64_t r = rng.Next();
        std::memcpy(c.data() + i, &r, std::min<size_t>(8, c.size() - i));
      }
      FillScales(rng, sh.format, s, sh.format == WeightFormat::kMxfp4 && e == 1 && m == 0);
      v.data = c.data();
      v.scale = s.data();
    }
  }
  return h;
}

// The same experts as held by one rank: views outside [first, first + count) lose their data.
HostExperts Shard(const HostExperts& all, int64_t first, int64_t count) {
  HostExperts h;
  for (int m = 0; m < 3; ++m) {
    h.views[m] = all.views[m];
    for (int64_t e = 0; e < static_cast<int64_t>(h.views[m].size()); ++e) {
      if (e < first || e >= first + count) h.views[m][e].data = h.views[m][e].scale = nullptr;
    }
  }
  return h;
}

// One step's routing inputs.
struct Step {
  int64_t t = 0;
  std::vector<float> x;
  std::vector<int32_t> tokens, pos;
};

Step MakeStep(int64_t t, int64_t d, int vocab, uint64_t seed, int pad_every) {
  Rng rng{seed};
  Step s;
  s.t = t;
  s.x.resize(t * d);
  for (float& v : s.x) v = rng.Uniform(-1.f, 1.f);
  s.tokens.resize(t);
  s.pos.resize(t);
  for (int64_t i = 0; i < t; ++i) {
    s.tokens[i] = rng.Int(vocab);
    s.pos[i] = pad_every > 0 && i % pad_every == pad_every - 1 ? -1 : static_cast<int32_t>(i);
  }
  return s;
}

struct Router {
  std::vector<uint16_t> gate;     // [E, D] bf16
  std::vector<float> bias;        // [E] (empty: hash layer)
  std::vector<int32_t> tid2eid;   // [V, Ek] (empty: score layer)
};

Router MakeRouter(int64_t experts, int64_t d, uint64_t seed) {
  Rng rng{seed};
  Router r;
  r.gate.resize(experts * d);
  const float a = 2.f / std::sqrt(static_cast<float>(d));
  for (uint16_t& g : r.gate) g = F32ToBf16(rng.Uniform(-a, a));
  r.bias.resize(experts);
  for (float& b : r.bias) b = rng.Uniform(-0.05f, 0.05f);
  return r;
}

// Skewed hash rows of distinct experts: each pick lands in a hot set of 20% of the experts (every fifth id)
// with probability 0.8, as the benchmark's skewed routing.
std::vector<int32_t> SkewedTid2eid(int vocab, int64_t experts, int topk, uint64_t seed) {
  Rng rng{seed};
  std::vector<int32_t> t(static_cast<size_t>(vocab) * topk);
  for (int v = 0; v < vocab; ++v) {
    for (int i = 0; i < topk;) {
      const int e = rng.Uniform(0.f, 1.f) < 0.8f ? 5 * rng.Int(static_cast<int>((experts + 4) / 5))
                                                 : rng.Int(static_cast<int>(experts));
      if (std::find(&t[static_cast<size_t>(v) * topk], &t[static_cast<size_t>(v) * topk + i], e) !=
          &t[static_cast<size_t>(v) * topk + i]) {
        continue;
      }
      t[static_cast<size_t>(v) * topk + i++] = e;
    }
  }
  return t;
}

// Random hash rows of distinct experts.
std::vector<int32_t> RandomTid2eid(int vocab, int64_t experts, int topk, uint64_t seed) {
  Rng rng{seed};
  std::vector<int32_t> t(static_cast<size_t>(vocab) * topk);
  std::vector<int32_t> perm(experts);
  for (int v = 0; v < vocab; ++v) {
    for (int64_t e = 0; e < experts; ++e) perm[e] = static_cast<int32_t>(e);
    for (int i = 0; i < topk; ++i) {
      std::swap(perm[i], perm[i + rng.Int(static_cast<int>(experts - i))]);
      t[static_cast<size_t>(v) * topk + i] = perm[i];
    }
  }
  return t;
}

// ---------------------------------------------------------------------------------------------------------
// A layer on a backend.

// Shared-expert weights like test_util's FP8 ones but 2^log2_gain larger (ue8m0 scales raised), so that the
// pre-activations reach the clamp and the output weighs about as much as the routed sum.
testing::HostWeight SharedWeight(std::mt19937& rng, int64_t n, int64_t k, const std::string& name, int log2_gain) {
  testing::HostWeight w = testing::RandomWeight(rng, WeightFormat::kFp8Block128, n, k);
  for (uint8_t& s : w.scale) s = static_cast<uint8_t>(s + log2_gain);
  w.view.name = name;
  return w;
}

struct SharedExpert {
  testing::HostWeight w1, w3, w2;
};
SharedExpert MakeShared(int64_t d, int64_t inter, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  SharedExpert s;
  s.w1 = SharedWeight(rng, inter, d, "shared.w1", 3);
  s.w3 = SharedWeight(rng, inter, d, "shared.w3", 3);
  s.w2 = SharedWeight(rng, d, inter, "shared.w2", 1);
  return s;
}

template <typename T>
Buffer UploadTyped(Backend& b, const std::vector<T>& v) {
  return testing::UploadBytes(b, v.data(), static_cast<int64_t>(v.size() * sizeof(T)));
}

// One backend's prepared layer (gate, experts, shared expert) and the buffers of the step it runs.
class Side {
 public:
  Side(Backend& b, const Shape& sh, const HostExperts& hx, const Router& r, const SharedExpert& se, int64_t max_t)
      : b_(b), sh_(sh) {
    const WeightView gate{.name = "layers.0.ffn.gate", .format = WeightFormat::kBF16, .n = sh.experts, .k = sh.d,
                          .data = reinterpret_cast<const uint8_t*>(r.gate.data())};
    gate_ = Must(b.PrepareLinear(gate));
    experts_ = Must(b.PrepareExperts(hx.views[0], hx.views[1], hx.views[2]));
    s1_ = Must(b.PrepareLinear(se.w1.view));
    s3_ = Must(b.PrepareLinear(se.w3.view));
    s2_ = Must(b.PrepareLinear(se.w2.view));
    const absl::Status s = b.Reserve({.max_tokens = max_t,
                                      .hidden = sh.d,
                                      .experts = sh.experts,
                                      .experts_per_token = sh.topk,
                                      .moe_inter = sh.inter,
                                      .shared_inter = se.w1.view.n});
    EXPECT_TRUE(s.ok()) << s;
    ok_ = ok_ && s.ok();
  }
  bool ok() const { return ok_; }
  Backend& backend() { return b_; }

  // Uploads the step's inputs and the router's bias / table, y poisoned with NaN.
  void Upload(const Step& st, const Router& r) {
    x_ = UploadTyped(b_, st.x);
    tokens_ = UploadTyped(b_, st.tokens);
    pos_ = UploadTyped(b_, st.pos);
    bias_ = UploadTyped(b_, r.bias);
    tid2eid_ = r.tid2eid.empty() ? Buffer() : UploadTyped(b_, r.tid2eid);
    y_ = testing::Poisoned(b_, st.t * sh_.d);
    t_ = st.t;
  }
  // Rewrites the uploaded step's inputs in place (same T: a captured graph keeps the buffers' addresses).
  void Overwrite(const Step& st, const Router& r) {
    ASSERT_EQ(st.t, t_);
    ASSERT_TRUE(b_.CopyToDevice(x_.data(), st.x.data(), st.t * sh_.d * 4).ok());
    ASSERT_TRUE(b_.CopyToDevice(tokens_.data(), st.tokens.data(), st.t * 4).ok());
    ASSERT_TRUE(b_.CopyToDevice(pos_.data(), st.pos.data(), st.t * 4).ok());
    ASSERT_TRUE(b_.CopyToDevice(bias_.data(), r.bias.data(), sh_.experts * 4).ok());
    ASSERT_TRUE(b_.Synchronize().ok());
  }
  std::vector<float> Y() { return testing::Download(b_, y_, t_ * sh_.d); }
  // Enqueues the op on the uploaded step.
  void Enqueue() {
    b_.ops().Moe({.x = x_.as<const float>(),
                  .tokens = tokens_.as<const int32_t>(),
                  .pos = pos_.as<const int32_t>(),
                  .gate = gate_.get(),
                  .bias = tid2eid_.empty() ? bias_.as<const float>() : nullptr,
                  .tid2eid = tid2eid_.empty() ? nullptr : tid2eid_.as<const int32_t>(),
                  .experts = experts_.get(),
                  .shared_w1 = s1_.get(),
                  .shared_w3 = s3_.get(),
                  .shared_w2 = s2_.get(),
                  .y = y_.as<float>(),
                  .t = t_,
                  .topk = sh_.topk,
                  .routed_scale = kRoutedScale,
                  .swiglu_limit = kLimit});
  }
  std::vector<float> Run(const Step& st, const Router& r) {
    Upload(st, r);
    Enqueue();
    const absl::Status s = b_.Synchronize();
    EXPECT_TRUE(s.ok()) << s;
    return testing::Download(b_, y_, st.t * sh_.d);
  }
  // CUDA only: tokens per expert of the last step (read from the MoE scratch).
  std::vector<int32_t> ExpertCounts() {
    auto& cb = dynamic_cast<CudaBackend&>(b_);
    const moe::ScratchPlan plan = moe::MakeScratchPlan(t_, sh_.experts, sh_.topk, sh_.d, sh_.inter, s1_->n());
    const auto s = moe::CarveScratch(cb.scratch().moe, plan);
    EXPECT_TRUE(s.ok()) << s.status();
    std::vector<int32_t> counts(sh_.experts + 1, -1);
    if (!s.ok()) return counts;
    EXPECT_TRUE(b_.CopyToHost(counts.data(), s->expert_count, sh_.experts * 4).ok());
    EXPECT_TRUE(b_.CopyToHost(&counts[sh_.experts], s->num_active, 4).ok());
    return counts;  // [E] counts, then the number of active experts
  }
  const ExpertWeights& experts() const { return *experts_; }

  static constexpr float kRoutedScale = 1.5f, kLimit = 10.f;

 private:
  template <typename T>
  T Must(absl::StatusOr<T> v) {
    if (!v.ok()) {
      ADD_FAILURE() << v.status();
      ok_ = false;
      return T();
    }
    return std::move(v).value();
  }
  Backend& b_;
  Shape sh_;
  LinearHandle gate_, s1_, s3_, s2_;
  ExpertsHandle experts_;
  Buffer x_, tokens_, pos_, bias_, tid2eid_, y_;
  int64_t t_ = 0;
  bool ok_ = true;
};

// max |got - want|, ||got - want|| / ||want||, the worst element and the worst token (by its own relative
// error); NaN anywhere fails. Padding tokens must be exact zeros.
void ExpectClose(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                 const Step& st, int64_t d) {
  ASSERT_EQ(got.size(), want.size());
  double max_abs = 0, num = 0, den = 0, worst_tok_rel = 0;
  int64_t worst = 0, worst_tok = 0, nan = 0;
  for (int64_t t = 0; t < st.t; ++t) {
    double tn = 0, td = 0;
    for (int64_t i = t * d; i < (t + 1) * d; ++i) {
      if (!std::isfinite(got[i])) ++nan;
      const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
      if (!(e <= max_abs)) {
        max_abs = e;
        worst = i;
      }
      tn += e * e;
      td += static_cast<double>(want[i]) * want[i];
    }
    num += tn;
    den += td;
    if (st.pos[t] < 0) {
      EXPECT_EQ(tn, 0.0) << what << ": padding token " << t << " is not zero";
      continue;
    }
    const double r = std::sqrt(tn / std::max(td, 1e-30));
    if (!(r <= worst_tok_rel)) {
      worst_tok_rel = r;
      worst_tok = t;
    }
  }
  const double rel = std::sqrt(num / std::max(den, 1e-30));
  std::printf("  %-40s max_abs %.3e  rel %.3e  worst [%lld, %lld] got %.5f want %.5f  worst token %lld rel %.3e\n",
              what.c_str(), max_abs, rel, static_cast<long long>(worst / d), static_cast<long long>(worst % d),
              got[worst], want[worst], static_cast<long long>(worst_tok), worst_tok_rel);
  EXPECT_EQ(nan, 0) << what << ": non-finite outputs";
  EXPECT_LE(rel, 1e-2) << what;
  EXPECT_LE(worst_tok_rel, 2e-2) << what << ": token " << worst_tok;
}

// The CPU reference with every core (dequantising 256 flash experts is most of this test's time).
Backend& CpuReference() {
  static std::unique_ptr<Backend> cpu =
      cpu::MakeCpuBackend(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  return *cpu;
}

// A layer on both backends; Compare runs one step on each.
struct Pair {
  Pair(const Shape& sh, const HostExperts& hx, const Router& r, const SharedExpert& se, int64_t max_t)
      : sh(sh), cpu(CpuReference(), sh, hx, r, se, max_t), cuda(testing::GetBackends().cuda, sh, hx, r, se, max_t) {}
  bool ok() const { return cpu.ok() && cuda.ok(); }
  // One step on both backends; the CUDA step runs twice and must repeat bit for bit.
  void Compare(const std::string& what, const Step& st, const Router& r) {
    const std::vector<float> got = cuda.Run(st, r);
    const std::vector<float> again = cuda.Run(st, r);
    ASSERT_EQ(got.size(), again.size());
    EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * 4), 0) << what << ": a repeat differs";
    ExpectClose(what, got, cpu.Run(st, r), st, sh.d);
  }
  Shape sh;
  Side cpu, cuda;
};

// Every T of `ts` with score routing (every 7th token padding from T = 4 on).
void CompareScoreRouting(const std::string& name, const Shape& sh, const std::vector<int64_t>& ts) {
  const HostExperts hx = MakeExperts(sh);
  const Router r = MakeRouter(sh.experts, sh.d, sh.seed + 7);
  const SharedExpert se = MakeShared(sh.d, sh.inter, sh.seed + 8);
  Pair p(sh, hx, r, se, *std::max_element(ts.begin(), ts.end()));
  ASSERT_TRUE(p.ok());
  for (int64_t t : ts) {
    p.Compare(name + " T=" + std::to_string(t), MakeStep(t, sh.d, 1000, sh.seed + 100 + static_cast<uint64_t>(t), t >= 4 ? 7 : 0), r);
  }
}

// The op captured into a CUDA graph on the backend's stream (no host read, sync or allocation inside).
cudaGraphExec_t CaptureMoe(Side& side) {
  auto& cb = dynamic_cast<CudaBackend&>(side.backend());
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(cb.stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  side.Enqueue();
  EXPECT_EQ(cudaStreamEndCapture(cb.stream(), &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cudaGraphDestroy(graph);
  return exec;
}

// ---------------------------------------------------------------------------------------------------------
// GPU tests.

TEST(MoeGpu, TinyNvfp4) {
  DSV4_REQUIRE_GPU();
  CompareScoreRouting("tiny nvfp4", {.d = 512, .inter = 256, .experts = 8, .topk = 2, .seed = 11}, {1, 5, 33, 256});
}

TEST(MoeGpu, TinyMxfp4WithShiftedExponents) {
  DSV4_REQUIRE_GPU();
  CompareScoreRouting("tiny mxfp4",
                      {.d = 512, .inter = 256, .experts = 8, .topk = 2, .format = WeightFormat::kMxfp4, .seed = 12},
                      {1, 40});
}

TEST(MoeGpu, SmallNvfp4ManyTokensPerExpert) {
  DSV4_REQUIRE_GPU();
  // 16 experts top-6: ~T * 6 / 16 tokens per expert, so the 1-, 2- and 4-tile passes and second passes run.
  CompareScoreRouting("small nvfp4", {.d = 4096, .inter = 2048, .experts = 16, .topk = 6, .seed = 13}, {1, 16, 64});
}

// Hash routing with a crafted table: expert 0 in every row, expert 7 in none, expert 5 only in token 3's row,
// token 2's row naming expert 4 twice; padding tokens; the router's counts read back from the scratch.
TEST(MoeGpu, TinyHashCraftedRouting) {
  DSV4_REQUIRE_GPU();
  const Shape sh{.d = 512, .inter = 256, .experts = 8, .topk = 2, .seed = 14};
  const HostExperts hx = MakeExperts(sh);
  Router r = MakeRouter(sh.experts, sh.d, 15);
  const int vocab = 16;
  r.tid2eid.resize(vocab * 2);
  for (int v = 0; v < vocab; ++v) {
    r.tid2eid[2 * v] = 0;
    r.tid2eid[2 * v + 1] = 1 + v % 4;  // 1..4
  }
  r.tid2eid[2 * 3 + 1] = 5;
  r.tid2eid[2 * 2] = 4;
  r.tid2eid[2 * 2 + 1] = 4;
  const SharedExpert se = MakeShared(sh.d, sh.inter, 16);
  Pair p(sh, hx, r, se, 64);
  ASSERT_TRUE(p.ok());
  for (int64_t t : {1, 3, 20, 64}) {
    Step st = MakeStep(t, sh.d, vocab, 200 + static_cast<uint64_t>(t), 9);
    for (int64_t i = 0; i < t; ++i) st.tokens[i] = static_cast<int32_t>(i % vocab);
    p.Compare("tiny hash T=" + std::to_string(t), st, r);
    std::vector<int32_t> want(sh.experts, 0);
    for (int64_t i = 0; i < t; ++i) {
      if (st.pos[i] < 0) continue;
      want[r.tid2eid[2 * st.tokens[i]]]++;
      want[r.tid2eid[2 * st.tokens[i] + 1]]++;
    }
    const std::vector<int32_t> counts = p.cuda.ExpertCounts();
    int active = 0;
    for (int64_t e = 0; e < sh.experts; ++e) {
      EXPECT_EQ(counts[e], want[e]) << "expert " << e << " T=" << t;
      active += want[e] > 0;
    }
    EXPECT_EQ(counts[sh.experts], active) << "T=" << t;
  }
}

// The flash layer (TP1, NVFP4): T = 1..256 with score routing, then a bias that sends every token to one
// expert and starves others, then the same experts as a hash layer and as the 64-expert shard of TP4; and the
// CUDA-event timing of the whole op next to the byte floor (14.2 MB per touched expert at 4.2 TB/s, plus the
// 50 MB FP8 shared expert and the 2 MB gate). One test, so the 256 experts are generated and dequantised for
// the CPU once.
TEST(MoeGpu, FlashNvfp4Tp1) {
  DSV4_REQUIRE_GPU();
  const Shape sh{.d = 4096, .inter = 2048, .experts = 256, .topk = 6, .seed = 21};
  const HostExperts hx = MakeExperts(sh);
  Router r = MakeRouter(sh.experts, sh.d, 22);
  const SharedExpert se = MakeShared(sh.d, sh.inter, 23);
  Pair p(sh, hx, r, se, 256);
  ASSERT_TRUE(p.ok());
  // T = 13: a partial 8-token block of the router's shared-memory logits kernel (T > 4).
  for (int64_t t : {1, 4, 13, 16, 64, 256}) {
    p.Compare("flash nvfp4 T=" + std::to_string(t), MakeStep(t, sh.d, 1000, 300 + static_cast<uint64_t>(t), t >= 16 ? 13 : 0), r);
  }
  {
    Router rb = r;
    rb.bias[17] = 50.f;                                  // every token
    for (int e = 100; e < 140; ++e) rb.bias[e] = -50.f;  // none
    p.Compare("flash nvfp4 expert 17 takes all T=64", MakeStep(64, sh.d, 1000, 400, 0), rb);
    const std::vector<int32_t> counts = p.cuda.ExpertCounts();
    EXPECT_EQ(counts[17], 64);
    for (int e = 100; e < 140; ++e) EXPECT_EQ(counts[e], 0) << e;
  }
  {
    Router rh = r;
    rh.tid2eid = RandomTid2eid(1000, sh.experts, sh.topk, 24);
    p.Compare("flash nvfp4 hash T=64", MakeStep(64, sh.d, 1000, 500, 5), rh);
    // Skewed: ~24 tokens on each hot expert at T = 256 (the 4-tile passes), one or two on the others.
    rh.tid2eid = SkewedTid2eid(1000, sh.experts, sh.topk, 25);
    p.Compare("flash nvfp4 skewed hash T=256", MakeStep(256, sh.d, 1000, 501, 0), rh);
  }
  {
    // The 64-expert shard of TP4 (experts 64..127 held here): tokens routed elsewhere contribute nothing.
    const HostExperts shard = Shard(hx, 64, 64);
    Pair p4(sh, shard, r, se, 256);
    ASSERT_TRUE(p4.ok());
    for (int64_t t : {16, 256}) {
      p4.Compare("flash nvfp4 tp4 shard T=" + std::to_string(t), MakeStep(t, sh.d, 1000, 700 + static_cast<uint64_t>(t), 11), r);
    }
  }
  // Timing of the whole op (shared expert included), printed, not asserted.
  auto& cb = dynamic_cast<CudaBackend&>(p.cuda.backend());
  const double expert_bytes = static_cast<double>(p.cuda.experts().device_bytes()) / sh.experts;
  const double fixed_bytes = 3.0 * sh.d * sh.inter * (1 + 4.0 / (128 * 128)) + 2.0 * sh.experts * sh.d;
  cudaEvent_t e0, e1;
  ASSERT_CUDA(cudaEventCreate(&e0));
  ASSERT_CUDA(cudaEventCreate(&e1));
  for (int64_t t : {1, 16, 64}) {
    p.cuda.Upload(MakeStep(t, sh.d, 1000, 600 + static_cast<uint64_t>(t), 0), r);
    for (int i = 0; i < 3; ++i) p.cuda.Enqueue();
    constexpr int kIters = 20;
    ASSERT_CUDA(cudaEventRecord(e0, cb.stream()));
    for (int i = 0; i < kIters; ++i) p.cuda.Enqueue();
    ASSERT_CUDA(cudaEventRecord(e1, cb.stream()));
    ASSERT_TRUE(cb.Synchronize().ok());
    float ms = 0;
    ASSERT_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    const int touched = p.cuda.ExpertCounts()[sh.experts];
    const double us = 1e3 * ms / kIters;
    const double floor_us = (touched * expert_bytes + fixed_bytes) / 4.2e12 * 1e6;
    // The same step as one CUDA graph (9 kernels: the shared expert's 3 linears + SwiGLU, router 2, GEMMs 2,
    // combine).
    const cudaGraphExec_t exec = CaptureMoe(p.cuda);
    ASSERT_NE(exec, nullptr);
    ASSERT_CUDA(cudaGraphLaunch(exec, cb.stream()));
    ASSERT_CUDA(cudaEventRecord(e0, cb.stream()));
    for (int i = 0; i < kIters; ++i) ASSERT_CUDA(cudaGraphLaunch(exec, cb.stream()));
    ASSERT_CUDA(cudaEventRecord(e1, cb.stream()));
    ASSERT_TRUE(cb.Synchronize().ok());
    float graph_ms = 0;
    ASSERT_CUDA(cudaEventElapsedTime(&graph_ms, e0, e1));
    cudaGraphExecDestroy(exec);
    const double graph_us = 1e3 * graph_ms / kIters;
    std::printf("  timing LaunchMoe T=%-3lld eager %7.1f us  graph %7.1f us  experts touched %3d  byte floor %6.1f us"
                " (%.0f%% of it in the graph)\n",
                static_cast<long long>(t), us, graph_us, touched, floor_us, 100.0 * floor_us / graph_us);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

// The 64-expert shard of TP4 (experts 0..63 held here) with MXFP4 experts (the MTP layer's format).
TEST(MoeGpu, FlashMxfp4Tp4Shard) {
  DSV4_REQUIRE_GPU();
  CompareScoreRouting("flash mxfp4 tp4 shard",
                      {.d = 4096, .inter = 2048, .experts = 256, .topk = 6, .format = WeightFormat::kMxfp4,
                       .hold_first = 0, .hold_count = 64, .seed = 41},
                      {1, 64});
}

// One captured graph serves any routing: replays on new inputs (other experts, other counts, padding moved)
// match the CPU and are bit-identical to eager runs on the same inputs.
TEST(MoeGpu, GraphReplayServesAnyRouting) {
  DSV4_REQUIRE_GPU();
  const Shape sh{.d = 4096, .inter = 2048, .experts = 16, .topk = 6, .seed = 71};
  const HostExperts hx = MakeExperts(sh);
  const Router r = MakeRouter(sh.experts, sh.d, 72);
  const SharedExpert se = MakeShared(sh.d, sh.inter, 73);
  Pair p(sh, hx, r, se, 16);
  ASSERT_TRUE(p.ok());
  auto& cb = dynamic_cast<CudaBackend&>(p.cuda.backend());
  p.cuda.Upload(MakeStep(16, sh.d, 1000, 74, 0), r);
  const cudaGraphExec_t exec = CaptureMoe(p.cuda);
  ASSERT_NE(exec, nullptr);
  for (uint64_t round = 0; round < 3; ++round) {
    Router rr = r;
    rr.bias[round * 5] = 50.f;  // a different expert takes every token each round
    const Step st = MakeStep(16, sh.d, 1000, 80 + round, 3 + static_cast<int>(round));
    p.cuda.Overwrite(st, rr);
    ASSERT_CUDA(cudaGraphLaunch(exec, cb.stream()));
    ASSERT_TRUE(cb.Synchronize().ok());
    const std::vector<float> replay = p.cuda.Y();
    ExpectClose("graph replay round " + std::to_string(round), replay, p.cpu.Run(st, rr), st, sh.d);
    p.cuda.Enqueue();  // eagerly, on the same buffers (the graph holds their addresses)
    ASSERT_TRUE(cb.Synchronize().ok());
    const std::vector<float> eager = p.cuda.Y();
    EXPECT_EQ(std::memcmp(replay.data(), eager.data(), replay.size() * 4), 0) << "replay vs eager, round " << round;
    EXPECT_EQ(p.cuda.ExpertCounts()[round * 5], 16 - (16 / (3 + static_cast<int>(round))));
  }
  cudaGraphExecDestroy(exec);
}

TEST(MoeGpu, PrepareRefusesBadExperts) {
  DSV4_REQUIRE_GPU();
  const Shape sh{.d = 512, .inter = 256, .experts = 4, .topk = 2, .seed = 51};
  HostExperts hx = MakeExperts(sh);
  Backend& cuda = testing::GetBackends().cuda;
  {
    std::vector<WeightView> w3 = hx.views[1];
    w3[2].data = nullptr;  // expert 2 half held
    const auto r = cuda.PrepareExperts(hx.views[0], w3, hx.views[2]);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  }
  {
    std::vector<WeightView> w1 = hx.views[0];
    w1[0].format = WeightFormat::kFp8Block128;
    const auto r = cuda.PrepareExperts(w1, hx.views[1], hx.views[2]);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  }
  {
    hx.scales[3 * 1 + 2][5] = 0x7f;  // NaN block scale in expert 1's w2
    const auto r = cuda.PrepareExperts(hx.views[0], hx.views[1], hx.views[2]);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find("experts.1.w2"), std::string::npos) << r.status();
  }
}

// Bad arguments come back as errors from Synchronize, and the backend keeps serving.
TEST(MoeGpu, LaunchRefusesBadArguments) {
  DSV4_REQUIRE_GPU();
  const Shape sh{.d = 512, .inter = 256, .experts = 8, .topk = 2, .seed = 61};
  const HostExperts hx = MakeExperts(sh);
  const Router r = MakeRouter(sh.experts, sh.d, 62);
  const SharedExpert se = MakeShared(sh.d, sh.inter, 63);
  Backend& cuda = testing::GetBackends().cuda;
  Side side(cuda, sh, hx, r, se, 8);
  ASSERT_TRUE(side.ok());
  const Step st = MakeStep(4, sh.d, 100, 64, 0);
  side.Upload(st, r);
  auto cpu_experts = CpuReference().PrepareExperts(hx.views[0], hx.views[1], hx.views[2]);
  ASSERT_TRUE(cpu_experts.ok());
  // Experts of another backend.
  cuda.ops().Moe({.experts = cpu_experts->get(), .t = 4, .topk = 2});
  absl::Status s = cuda.Synchronize();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // The valid call still works afterwards.
  const std::vector<float> y = side.Run(st, r);
  EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return std::isfinite(v); }));
}

}  // namespace
}  // namespace dsv4::kernels::cuda
