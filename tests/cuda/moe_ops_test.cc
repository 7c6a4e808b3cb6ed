// The CUDA MoE family (moe_router.cu, moe.cu, moe_prepare.cu) against the CPU reference op (CpuOps::Moe) on
// fresh random inputs: the real shapes of configs/flash.json (D 4096, I 2048, 256 experts top-6; the
// 64-expert shard of TP4), small.json and tiny.json; T = 1..256; NVFP4 and MXFP4 with subnormal, zero and
// negative block scales and a shifted MXFP4 exponent range; hash layers with crafted tables (experts with no
// token, one token, every token, a token naming an expert twice); padding tokens; a bias that sends every
// token to one expert. Each run prints max abs error, relative error by norm, the worst element and the worst
// token; NaN never passes. The host-only tests check the packed layout's bit map and exactness without a GPU.
//
// The shared expert here is the CPU op's with a zero w2 (its output is exactly 0), so the routed path
// (moe::LaunchRouted: router + experts + combine) is compared on its own.
// Tests whose names contain "Gpu" need a GPU and skip with a message without one.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/float_formats.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/moe_internal.h"
#include "kernels/cuda/moe_layout.h"

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
// GPU helpers.

bool HaveGpu(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    *why = std::string("no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(err) + ")";
    return false;
  }
  if (n == 0) {
    *why = "no CUDA device present";
    return false;
  }
  return true;
}

#define SKIP_WITHOUT_GPU()                   \
  do {                                       \
    std::string why;                         \
    if (!HaveGpu(&why)) GTEST_SKIP() << why; \
  } while (0)

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DevicePtr = std::unique_ptr<void, CudaFree>;

DevicePtr DeviceAlloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(bytes, 16)) != cudaSuccess) return nullptr;
  return DevicePtr(p);
}
template <typename T>
DevicePtr UploadVector(const std::vector<T>& v) {
  DevicePtr p = DeviceAlloc(v.size() * sizeof(T));
  if (p && !v.empty()) cudaMemcpy(p.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return p;
}

// Ops for a Backend that only prepares experts (the test launches the MoE kernels itself).
class NoOps final : public Ops {
 public:
  void Embed(const EmbedArgs&) override {}
  void Linear(const LinearArgs&) override {}
  void RmsNorm(const RmsNormArgs&) override {}
  void Rope(const RopeArgs&) override {}
  void HcPre(const HcPreArgs&) override {}
  void HcPost(const HcPostArgs&) override {}
  void HcHead(const HcHeadArgs&) override {}
  void Scale(const ScaleArgs&) override {}
  void KvWindowWrite(const KvWindowWriteArgs&) override {}
  void Compressor(const CompressorArgs&) override {}
  void Indexer(const IndexerArgs&) override {}
  void Attention(const AttentionArgs&) override {}
  void Moe(const MoeArgs&) override {}
  void HadamardFp4(const HadamardFp4Args&) override {}
  void Fill(const FillArgs&) override {}
};

// The smallest CUDA Backend PrepareCudaExperts needs: device memory (pinned for kHostStaging), synchronous
// copies. (The family-independent CudaBackend lives in cuda_backend.h.)
class TestCudaBackend final : public Backend {
 public:
  ~TestCudaBackend() override = default;
  std::string name() const override { return "moe-test-cuda"; }
  Ops& ops() override { return ops_; }
  absl::Status Reserve(const StepLimits&) override { return absl::OkStatus(); }
  absl::StatusOr<Buffer> Allocate(int64_t bytes, MemoryKind kind) override {
    void* p = nullptr;
    const size_t n = static_cast<size_t>(std::max<int64_t>(bytes, 16));
    const cudaError_t err = kind == MemoryKind::kHostStaging ? cudaMallocHost(&p, n) : cudaMalloc(&p, n);
    if (err != cudaSuccess) return moe::CudaStatus(err, "test Allocate");
    if (kind == MemoryKind::kHostStaging) {
      std::memset(p, 0, n);
    } else if (cudaMemset(p, 0, n) != cudaSuccess) {
      return absl::InternalError("cudaMemset");
    }
    Count(kind, bytes);
    return Buffer(this, p, bytes, kind);
  }
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    return moe::CudaStatus(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault), "test copy");
  }
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    return moe::CudaStatus(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault), "test copy");
  }
  absl::Status Synchronize() override { return moe::CudaStatus(cudaDeviceSynchronize(), "test sync"); }
  absl::StatusOr<LinearHandle> PrepareLinear(const WeightView&) override {
    return absl::UnimplementedError("the MoE test backend prepares experts only");
  }
  absl::StatusOr<ExpertsHandle> PrepareExperts(std::span<const WeightView> w1, std::span<const WeightView> w3,
                                               std::span<const WeightView> w2) override {
    return PrepareCudaExperts(w1, w3, w2, *this);
  }

 protected:
  void Free(void* data, int64_t bytes, MemoryKind kind) override {
    if (kind == MemoryKind::kHostStaging) {
      cudaFreeHost(data);
    } else {
      cudaFree(data);
    }
    Count(kind, -bytes);
  }

 private:
  NoOps ops_;
};

// ---------------------------------------------------------------------------------------------------------
// Random layers.

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
// The two sides.

// The CPU reference with a zero shared expert, so its y is the routed sum alone.
class CpuSide {
 public:
  CpuSide(const Shape& sh, const HostExperts& hx, const Router& r)
      : sh_(sh), backend_(cpu::MakeCpuBackend(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())))) {
    const WeightView gate{.name = "gate", .format = WeightFormat::kBF16, .n = sh.experts, .k = sh.d,
                          .data = reinterpret_cast<const uint8_t*>(r.gate.data())};
    gate_ = Must(backend_->PrepareLinear(gate));
    experts_ = Must(backend_->PrepareExperts(hx.views[0], hx.views[1], hx.views[2]));
    shared_in_.assign(kShared * sh.d, 0.25f);
    shared_out_.assign(sh.d * kShared, 0.f);
    const WeightView s13{.name = "shared.w13", .format = WeightFormat::kF32, .n = kShared, .k = sh.d,
                         .data = reinterpret_cast<const uint8_t*>(shared_in_.data())};
    const WeightView s2{.name = "shared.w2", .format = WeightFormat::kF32, .n = sh.d, .k = kShared,
                        .data = reinterpret_cast<const uint8_t*>(shared_out_.data())};
    s1_ = Must(backend_->PrepareLinear(s13));
    s3_ = Must(backend_->PrepareLinear(s13));
    s2_ = Must(backend_->PrepareLinear(s2));
  }
  bool ok() const { return ok_; }

  std::vector<float> Run(const Step& st, const Router& r, float routed_scale, float limit) {
    std::vector<float> y(st.t * sh_.d, 0.f);
    MoeArgs a{.x = st.x.data(),
              .tokens = st.tokens.data(),
              .pos = st.pos.data(),
              .gate = gate_.get(),
              .bias = r.tid2eid.empty() ? r.bias.data() : nullptr,
              .tid2eid = r.tid2eid.empty() ? nullptr : r.tid2eid.data(),
              .experts = experts_.get(),
              .shared_w1 = s1_.get(),
              .shared_w3 = s3_.get(),
              .shared_w2 = s2_.get(),
              .y = y.data(),
              .t = st.t,
              .topk = sh_.topk,
              .routed_scale = routed_scale,
              .swiglu_limit = limit};
    backend_->ops().Moe(a);
    const absl::Status s = backend_->Synchronize();
    EXPECT_TRUE(s.ok()) << s;
    return y;
  }

 private:
  static constexpr int64_t kShared = 8;
  template <typename T>
  T Must(absl::StatusOr<T> v) {
    if (!v.ok()) {
      ADD_FAILURE() << v.status();
      ok_ = false;
      return T();
    }
    return std::move(v).value();
  }
  Shape sh_;
  std::unique_ptr<Backend> backend_;
  LinearHandle gate_, s1_, s3_, s2_;
  ExpertsHandle experts_;
  std::vector<float> shared_in_, shared_out_;
  bool ok_ = true;
};

// The CUDA side: prepared experts, the router's device tables and a scratch for up to max_t tokens.
class GpuSide {
 public:
  GpuSide(const Shape& sh, const HostExperts& hx, int64_t max_t) : sh_(sh) {
    auto ex = PrepareCudaExperts(hx.views[0], hx.views[1], hx.views[2], backend_);
    EXPECT_TRUE(ex.ok()) << ex.status();
    if (!ex.ok()) return;
    experts_ = std::move(ex).value();
    plan_ = moe::MakeScratchPlan(max_t, sh.experts, sh.topk, sh.d, sh.inter, 0);
    scratch_mem_ = DeviceAlloc(static_cast<size_t>(plan_.bytes));
    auto s = moe::CarveScratch({.data = scratch_mem_.get(), .bytes = plan_.bytes}, plan_);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) scratch_ = *s;
  }
  bool ok() const { return experts_ != nullptr; }
  const moe::CudaExperts& experts() const { return static_cast<const moe::CudaExperts&>(*experts_); }
  const moe::ScratchPointers& scratch() const { return scratch_; }

  // Uploads the step and the router, runs the routed MoE (y poisoned with NaN first), returns y.
  std::vector<float> Run(const Step& st, const Router& r, float routed_scale, float limit) {
    Upload(st, r);
    cudaMemset(y_.get(), 0xff, st.t * sh_.d * 4);
    EXPECT_TRUE(Launch(st.t, !r.tid2eid.empty(), routed_scale, limit).ok());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
    std::vector<float> y(st.t * sh_.d);
    cudaMemcpy(y.data(), y_.get(), y.size() * 4, cudaMemcpyDeviceToHost);
    return y;
  }

  void Upload(const Step& st, const Router& r) {
    x_ = UploadVector(st.x);
    tokens_ = UploadVector(st.tokens);
    pos_ = UploadVector(st.pos);
    gate_ = UploadVector(r.gate);
    bias_ = UploadVector(r.bias);
    tid2eid_ = r.tid2eid.empty() ? nullptr : UploadVector(r.tid2eid);
    y_ = DeviceAlloc(st.t * sh_.d * 4);
  }

  absl::Status Launch(int64_t t, bool hash, float routed_scale, float limit) {
    const MoeArgs a{.x = static_cast<const float*>(x_.get()),
                    .tokens = static_cast<const int32_t*>(tokens_.get()),
                    .pos = static_cast<const int32_t*>(pos_.get()),
                    .bias = hash ? nullptr : static_cast<const float*>(bias_.get()),
                    .tid2eid = hash ? static_cast<const int32_t*>(tid2eid_.get()) : nullptr,
                    .experts = experts_.get(),
                    .y = static_cast<float*>(y_.get()),
                    .t = t,
                    .topk = sh_.topk,
                    .routed_scale = routed_scale,
                    .swiglu_limit = limit};
    return moe::LaunchRouted(a, static_cast<const uint16_t*>(gate_.get()), experts(), scratch_, false, nullptr);
  }

  template <typename T>
  std::vector<T> Read(const T* p, int64_t n) const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }

 private:
  Shape sh_;
  TestCudaBackend backend_;
  ExpertsHandle experts_;
  moe::ScratchPlan plan_;
  DevicePtr scratch_mem_, x_, tokens_, pos_, gate_, bias_, tid2eid_, y_;
  moe::ScratchPointers scratch_;
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
    if (r > worst_tok_rel) {
      worst_tok_rel = r;
      worst_tok = t;
    }
  }
  const double rel = std::sqrt(num / std::max(den, 1e-30));
  std::printf("  %-44s max_abs %.3e  rel %.3e  worst [%lld, %lld] got %.5f want %.5f  worst token %lld rel %.3e\n",
              what.c_str(), max_abs, rel, static_cast<long long>(worst / d), static_cast<long long>(worst % d),
              got[worst], want[worst], static_cast<long long>(worst_tok), worst_tok_rel);
  EXPECT_EQ(nan, 0) << what << ": non-finite outputs";
  EXPECT_LE(rel, 1e-2) << what;
  EXPECT_LE(worst_tok_rel, 2e-2) << what << ": token " << worst_tok;
}

constexpr float kRoutedScale = 1.5f, kLimit = 10.f;

// Runs every T of `ts` on both sides (score routing, some padding tokens) and compares.
void CompareScoreRouting(const std::string& name, const Shape& sh, const std::vector<int64_t>& ts) {
  const HostExperts hx = MakeExperts(sh);
  const Router r = MakeRouter(sh.experts, sh.d, sh.seed + 7);
  CpuSide cpu(sh, hx, r);
  ASSERT_TRUE(cpu.ok());
  GpuSide gpu(sh, hx, *std::max_element(ts.begin(), ts.end()));
  ASSERT_TRUE(gpu.ok());
  for (int64_t t : ts) {
    const Step st = MakeStep(t, sh.d, 1000, sh.seed + 100 + static_cast<uint64_t>(t), t >= 4 ? 7 : 0);
    ExpectClose(name + " T=" + std::to_string(t), gpu.Run(st, r, kRoutedScale, kLimit),
                cpu.Run(st, r, kRoutedScale, kLimit), st, sh.d);
  }
}

// ---------------------------------------------------------------------------------------------------------
// GPU tests.

TEST(MoeGpu, TinyNvfp4) {
  SKIP_WITHOUT_GPU();
  CompareScoreRouting("tiny nvfp4", {.d = 512, .inter = 256, .experts = 8, .topk = 2, .seed = 11}, {1, 5, 33, 256});
}

TEST(MoeGpu, TinyMxfp4WithShiftedExponents) {
  SKIP_WITHOUT_GPU();
  CompareScoreRouting("tiny mxfp4",
                      {.d = 512, .inter = 256, .experts = 8, .topk = 2, .format = WeightFormat::kMxfp4, .seed = 12},
                      {1, 40});
}

TEST(MoeGpu, SmallNvfp4ManyTokensPerExpert) {
  SKIP_WITHOUT_GPU();
  // 16 experts top-6: ~T * 6 / 16 tokens per expert, so the 1-, 2- and 4-tile passes and second passes run.
  CompareScoreRouting("small nvfp4", {.d = 4096, .inter = 2048, .experts = 16, .topk = 6, .seed = 13}, {1, 16, 64});
}

// Hash routing with a crafted table: expert 0 in every row, expert 7 in none, expert 5 only in token 3's row,
// token 2's row naming expert 4 twice; padding tokens; counts read back from the router's lists.
TEST(MoeGpu, TinyHashCraftedRouting) {
  SKIP_WITHOUT_GPU();
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
  CpuSide cpu(sh, hx, r);
  ASSERT_TRUE(cpu.ok());
  GpuSide gpu(sh, hx, 64);
  ASSERT_TRUE(gpu.ok());
  for (int64_t t : {1, 20, 64}) {
    Step st = MakeStep(t, sh.d, vocab, 200 + static_cast<uint64_t>(t), 9);
    for (int64_t i = 0; i < t; ++i) st.tokens[i] = static_cast<int32_t>(i % vocab);
    const std::vector<float> got = gpu.Run(st, r, kRoutedScale, kLimit);
    ExpectClose("tiny hash T=" + std::to_string(t), got, cpu.Run(st, r, kRoutedScale, kLimit), st, sh.d);
    std::vector<int32_t> want(sh.experts, 0);
    for (int64_t i = 0; i < t; ++i) {
      if (st.pos[i] < 0) continue;
      want[r.tid2eid[2 * st.tokens[i]]]++;
      want[r.tid2eid[2 * st.tokens[i] + 1]]++;
    }
    const auto counts = gpu.Read(gpu.scratch().expert_count, sh.experts);
    for (int64_t e = 0; e < sh.experts; ++e) EXPECT_EQ(counts[e], want[e]) << "expert " << e << " T=" << t;
    EXPECT_EQ(counts[7], 0);
  }
}

// The flash layer (TP1, NVFP4): T = 1..256 with score routing, then a bias that sends every token to one
// expert and starves others, then the same experts as a hash layer; and the CUDA-event timing of the routed
// path next to the byte floor (14.2 MB per touched expert at 4.2 TB/s).
TEST(MoeGpu, FlashNvfp4Tp1) {
  SKIP_WITHOUT_GPU();
  const Shape sh{.d = 4096, .inter = 2048, .experts = 256, .topk = 6, .seed = 21};
  const HostExperts hx = MakeExperts(sh);
  Router r = MakeRouter(sh.experts, sh.d, 22);
  CpuSide cpu(sh, hx, r);
  ASSERT_TRUE(cpu.ok());
  GpuSide gpu(sh, hx, 256);
  ASSERT_TRUE(gpu.ok());
  for (int64_t t : {1, 4, 16, 64, 256}) {
    const Step st = MakeStep(t, sh.d, 1000, 300 + static_cast<uint64_t>(t), t >= 16 ? 13 : 0);
    ExpectClose("flash nvfp4 T=" + std::to_string(t), gpu.Run(st, r, kRoutedScale, kLimit),
                cpu.Run(st, r, kRoutedScale, kLimit), st, sh.d);
  }
  {
    Router rb = r;
    rb.bias[17] = 50.f;                         // every token
    for (int e = 100; e < 140; ++e) rb.bias[e] = -50.f;  // none
    const Step st = MakeStep(64, sh.d, 1000, 400, 0);
    ExpectClose("flash nvfp4 expert 17 takes all T=64", gpu.Run(st, rb, kRoutedScale, kLimit),
                cpu.Run(st, rb, kRoutedScale, kLimit), st, sh.d);
    const auto counts = gpu.Read(gpu.scratch().expert_count, sh.experts);
    EXPECT_EQ(counts[17], 64);
    for (int e = 100; e < 140; ++e) EXPECT_EQ(counts[e], 0) << e;
  }
  {
    Router rh = r;
    rh.tid2eid = RandomTid2eid(1000, sh.experts, sh.topk, 23);
    const Step st = MakeStep(64, sh.d, 1000, 500, 5);
    ExpectClose("flash nvfp4 hash T=64", gpu.Run(st, rh, kRoutedScale, kLimit), cpu.Run(st, rh, kRoutedScale, kLimit),
                st, sh.d);
  }
  // Timing (printed, not asserted).
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int64_t t : {1, 16, 64}) {
    const Step st = MakeStep(t, sh.d, 1000, 600 + static_cast<uint64_t>(t), 0);
    gpu.Upload(st, r);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(gpu.Launch(t, false, kRoutedScale, kLimit).ok());
    constexpr int kIters = 20;
    cudaEventRecord(e0);
    for (int i = 0; i < kIters; ++i) (void)gpu.Launch(t, false, kRoutedScale, kLimit);
    cudaEventRecord(e1);
    ASSERT_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const int touched = gpu.Read(gpu.scratch().num_active, 1)[0];
    const double us = 1e3 * ms / kIters;
    const double floor_us = touched * static_cast<double>(gpu.experts().layout().bytes) / 4.2e12 * 1e6;
    std::printf("  timing routed MoE T=%-3lld  %8.1f us  experts touched %3d  byte floor %7.1f us  (%.0f%% of floor)\n",
                static_cast<long long>(t), us, touched, floor_us, 100.0 * floor_us / us);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

// The 64-expert shard of TP4 (experts 64..127 held here): tokens routed elsewhere contribute nothing.
TEST(MoeGpu, FlashNvfp4Tp4Shard) {
  SKIP_WITHOUT_GPU();
  CompareScoreRouting("flash nvfp4 tp4 shard",
                      {.d = 4096, .inter = 2048, .experts = 256, .topk = 6, .hold_first = 64, .hold_count = 64,
                       .seed = 31},
                      {16, 256});
}

TEST(MoeGpu, FlashMxfp4Tp4Shard) {
  SKIP_WITHOUT_GPU();
  CompareScoreRouting("flash mxfp4 tp4 shard",
                      {.d = 4096, .inter = 2048, .experts = 256, .topk = 6, .format = WeightFormat::kMxfp4,
                       .hold_first = 0, .hold_count = 64, .seed = 41},
                      {1, 64});
}

TEST(MoeGpu, PrepareRefusesBadExperts) {
  SKIP_WITHOUT_GPU();
  const Shape sh{.d = 512, .inter = 256, .experts = 4, .topk = 2, .seed = 51};
  HostExperts hx = MakeExperts(sh);
  TestCudaBackend backend;
  {
    std::vector<WeightView> w3 = hx.views[1];
    w3[2].data = nullptr;  // expert 2 half held
    const auto r = PrepareCudaExperts(hx.views[0], w3, hx.views[2], backend);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  }
  {
    hx.scales[3 * 1 + 2][5] = 0x7f;  // NaN block scale in expert 1's w2
    const auto r = PrepareCudaExperts(hx.views[0], hx.views[1], hx.views[2], backend);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find("experts.1.w2"), std::string::npos) << r.status();
  }
  {
    std::vector<WeightView> w1 = hx.views[0];
    w1[0].format = WeightFormat::kFp8Block128;
    const auto r = PrepareCudaExperts(w1, hx.views[1], hx.views[2], backend);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  }
}

}  // namespace
}  // namespace dsv4::kernels::cuda
