// CPU backend, the Backend side: memory (zero-filled, 64-byte aligned, counted per kind), copies, errors kept
// until Synchronize, Reserve counted as workspace, and weight preparation: each checkpoint format against
// values worked out by hand from kernels/weights.h, non-finite results refused with DataLoss naming the
// weight, malformed views and experts refused.
#include <cmath>
#include <cstring>

#include "common/float_formats.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_weights.h"
#include "tests/kernels/cpu_test_util.h"

namespace dsv4::kernels::cpu {
namespace {

int64_t Held(const Backend& be, MemoryKind kind) { return be.allocated()[static_cast<int>(kind)]; }

TEST(CpuBackendTest, AllocateIsZeroedAlignedAndCountedPerKind) {
  auto be = MakeCpuBackend(1);
  EXPECT_EQ(be->name(), "cpu (1 threads)");
  auto a = be->Allocate(100, MemoryKind::kKvCache);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 64, 0u);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a->as<uint8_t>()[i], 0);
  EXPECT_EQ(Held(*be, MemoryKind::kKvCache), 100);
  {
    auto b = be->Allocate(7, MemoryKind::kState);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(Held(*be, MemoryKind::kState), 7);
    Buffer moved = std::move(b).value();
    EXPECT_EQ(moved.bytes(), 7);
  }
  EXPECT_EQ(Held(*be, MemoryKind::kState), 0);
  EXPECT_TRUE(be->Allocate(0, MemoryKind::kWorkspace)->empty());
  EXPECT_EQ(be->Allocate(-1, MemoryKind::kWorkspace).status().code(), absl::StatusCode::kInvalidArgument);

  const float host[3] = {1, 2, 3};
  ASSERT_TRUE(be->CopyToDevice(a->data(), host, 12).ok());
  float back[3] = {};
  ASSERT_TRUE(be->CopyToHost(back, a->data(), 12).ok());
  EXPECT_EQ(back[2], 3.f);
  auto up = be->UploadF32(std::span<const float>(host, 3));
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->as<float>()[1], 2.f);
  EXPECT_EQ(Held(*be, MemoryKind::kWeights), 12);
  a->Reset();
  EXPECT_EQ(Held(*be, MemoryKind::kKvCache), 0);
}

TEST(CpuBackendTest, OpErrorsSurfaceOnceFromSynchronizeOrCopyToHost) {
  auto be = MakeCpuBackend(1);
  std::vector<float> x(48);
  be->ops().HadamardFp4({.x = x.data(), .rows = 1, .dim = 48});
  be->ops().HadamardFp4({.x = x.data(), .rows = 1, .dim = 24});
  const absl::Status s = be->Synchronize();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("48"), std::string::npos) << s;  // the first error is the one kept
  EXPECT_TRUE(be->Synchronize().ok());
  be->ops().HadamardFp4({.x = x.data(), .rows = 1, .dim = 48});
  float f;
  EXPECT_EQ(be->CopyToHost(&f, x.data(), 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(be->Synchronize().ok());
}

TEST(CpuBackendTest, ReserveCountsScratchAsWorkspace) {
  auto be = MakeCpuBackend(2);
  EXPECT_EQ(Held(*be, MemoryKind::kWorkspace), 0);
  ASSERT_TRUE(be->Reserve({.max_tokens = 16, .max_seqs = 4, .max_context = 1024, .hidden = 64, .heads = 2,
                           .head_dim = 512, .window = 128, .index_heads = 4, .index_dim = 128, .index_topk = 16,
                           .experts = 8, .experts_per_token = 2, .moe_inter = 32, .shared_inter = 32, .vocab = 100})
                  .ok());
  const int64_t first = Held(*be, MemoryKind::kWorkspace);
  // Two threads each hold (W + max(Ksel, ctx/128 + 1)) decoded 512-dim keys at least.
  EXPECT_GE(first, 2 * (128 + 16) * 512 * 4);
  ASSERT_TRUE(be->Reserve({.max_tokens = 1, .max_seqs = 1, .max_context = 16}).ok());  // smaller: no change
  EXPECT_EQ(Held(*be, MemoryKind::kWorkspace), first);
  EXPECT_EQ(be->Reserve({.max_tokens = -1}).code(), absl::StatusCode::kInvalidArgument);
}

// Dequantises a view through the backend and returns the fp32 matrix.
absl::StatusOr<std::vector<float>> Prepare(Backend& be, const WeightView& v) {
  auto h = be.PrepareLinear(v);
  if (!h.ok()) return h.status();
  EXPECT_EQ((*h)->n(), v.n);
  EXPECT_EQ((*h)->k(), v.k);
  EXPECT_EQ((*h)->format(), v.format);
  EXPECT_EQ((*h)->device_bytes(), v.n * v.k * 4);
  const float* p = static_cast<const CpuLinearWeight*>(h->get())->data();
  return std::vector<float>(p, p + v.n * v.k);
}

const uint8_t* Bytes(const void* p) { return static_cast<const uint8_t*>(p); }

TEST(CpuWeightsTest, F32AndBf16) {
  auto be = MakeCpuBackend(1);
  const float f[6] = {1, -2, 0.5f, 3, 4, -0.25f};
  auto w = Prepare(*be, {.name = "f32", .format = WeightFormat::kF32, .n = 2, .k = 3, .data = Bytes(f)});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, std::vector<float>(f, f + 6));
  const uint16_t b[4] = {0x3f80, 0xc000, 0x3e80, 0x0000};  // 1, -2, 0.25, 0
  w = Prepare(*be, {.name = "bf16", .format = WeightFormat::kBF16, .n = 2, .k = 2, .data = Bytes(b)});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, (std::vector<float>{1, -2, 0.25f, 0}));
  EXPECT_EQ(Held(*be, MemoryKind::kWeights), 0);  // the handles went away with their StatusOr
}

TEST(CpuWeightsTest, Fp8Block128WithUe8m0AndF32Scales) {
  auto be = MakeCpuBackend(2);
  const int64_t N = 130, K = 130;  // 2 x 2 scale blocks, the last ones partial
  std::vector<uint8_t> data(N * K, 0x38);  // e4m3 1.0
  data[0 * K + 1] = 0x40;    // 2.0
  data[129 * K + 128] = 0xb8;  // -1.0
  const uint8_t ue8m0[4] = {127, 128, 126, 129};  // 1, 2, 0.5, 4
  auto w = Prepare(*be, {.name = "fp8", .format = WeightFormat::kFp8Block128, .n = N, .k = K, .data = data.data(),
                         .scale = ue8m0});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)[0], 1.f);
  EXPECT_EQ((*w)[1], 2.f);
  EXPECT_EQ((*w)[127 * K + 129], 2.f);
  EXPECT_EQ((*w)[128 * K + 5], 0.5f);
  EXPECT_EQ((*w)[129 * K + 129], 4.f);
  EXPECT_EQ((*w)[129 * K + 128], -4.f);
  const float f32[4] = {0.75f, 1.5f, -1.f, 3.f};
  w = Prepare(*be, {.name = "fp8f", .format = WeightFormat::kFp8Block128, .n = N, .k = K, .data = data.data(),
                    .scale = Bytes(f32), .scale_f32 = true});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)[1], 1.5f);
  EXPECT_EQ((*w)[3 * K + 128], 1.5f);
  EXPECT_EQ((*w)[128 * K], -1.f);
  EXPECT_EQ((*w)[129 * K + 128], -3.f);
}

TEST(CpuWeightsTest, Nvfp4AndMxfp4) {
  auto be = MakeCpuBackend(1);
  // NVFP4 [1, 32]: byte j holds elements 2j (low nibble) and 2j + 1; e4m3 scale per 16; global scale 0.25.
  uint8_t nv[16] = {};
  nv[0] = 0xF2;  // element 0: code 2 (1.0), element 1: code 0xF (-6)
  nv[8] = 0x71;  // element 16: code 1 (0.5), element 17: code 7 (6)
  const uint8_t nv_scale[2] = {0x40, 0x30};  // e4m3 2.0, 0.5
  auto w = Prepare(*be, {.name = "nvfp4", .format = WeightFormat::kNvfp4, .n = 1, .k = 32, .data = nv,
                         .scale = nv_scale, .global_scale = 0.25f});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)[0], 0.5f);
  EXPECT_EQ((*w)[1], -3.f);
  EXPECT_EQ((*w)[2], 0.f);
  EXPECT_EQ((*w)[16], 0.0625f);
  EXPECT_EQ((*w)[17], 0.75f);
  // MXFP4 [2, 32]: ue8m0 scale per 32.
  uint8_t mx[32] = {};
  mx[0] = 0x9A;   // row 0: element 0 code 0xA (-1), element 1 code 9 (-0.5)
  mx[16] = 0x35;  // row 1: element 0 code 5 (3), element 1 code 3 (1.5)
  const uint8_t mx_scale[2] = {126, 130};  // 0.5, 8
  w = Prepare(*be, {.name = "mxfp4", .format = WeightFormat::kMxfp4, .n = 2, .k = 32, .data = mx, .scale = mx_scale});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)[0], -0.5f);
  EXPECT_EQ((*w)[1], -0.25f);
  EXPECT_EQ((*w)[32], 24.f);
  EXPECT_EQ((*w)[33], 12.f);
}

TEST(CpuWeightsTest, NonFiniteValuesAreDataLossNamingTheWeight) {
  auto be = MakeCpuBackend(2);
  std::vector<uint8_t> data(4 * 8, 0x38);
  data[2 * 8 + 5] = 0x7f;  // e4m3 NaN
  const uint8_t scale[1] = {127};
  auto w = be->PrepareLinear({.name = "layers.3.attn.wq_a", .format = WeightFormat::kFp8Block128, .n = 4, .k = 8,
                              .data = data.data(), .scale = scale});
  ASSERT_EQ(w.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(w.status().message().find("layers.3.attn.wq_a"), std::string::npos) << w.status();
  EXPECT_NE(w.status().message().find("[2, 5]"), std::string::npos) << w.status();
  const uint8_t bad_scale[1] = {0xff};  // ue8m0 NaN
  data[2 * 8 + 5] = 0x38;
  EXPECT_EQ(be->PrepareLinear({.name = "s", .format = WeightFormat::kFp8Block128, .n = 4, .k = 8,
                               .data = data.data(), .scale = bad_scale})
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  const float inf[2] = {1.f, INFINITY};
  EXPECT_EQ(be->PrepareLinear({.name = "f", .format = WeightFormat::kF32, .n = 1, .k = 2, .data = Bytes(inf)})
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(Held(*be, MemoryKind::kWeights), 0);
}

TEST(CpuWeightsTest, MalformedViewsAreRefused) {
  auto be = MakeCpuBackend(1);
  uint8_t bytes[64] = {};
  auto code = [&](const WeightView& v) { return be->PrepareLinear(v).status().code(); };
  EXPECT_EQ(code({.name = "a", .format = WeightFormat::kNvfp4, .n = 1, .k = 24, .data = bytes, .scale = bytes}),
            absl::StatusCode::kInvalidArgument);  // Kin not a multiple of 16
  EXPECT_EQ(code({.name = "b", .format = WeightFormat::kMxfp4, .n = 1, .k = 32, .data = bytes}),
            absl::StatusCode::kInvalidArgument);  // no scale
  EXPECT_EQ(code({.name = "c", .format = WeightFormat::kF32, .n = 0, .k = 4, .data = bytes}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.name = "d", .format = WeightFormat::kBF16, .n = 1, .k = 4}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.name = "e", .format = WeightFormat::kNvfp4, .n = 1, .k = 16, .data = bytes, .scale = bytes,
                  .global_scale = NAN}),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuWeightsTest, ExpertsAllOrNoneOfThreeMatricesWithConsistentShapes) {
  auto be = MakeCpuBackend(1);
  std::vector<float> a(4 * 6, 1.f);
  auto v = [&](int64_t n, int64_t k, bool held) {
    return WeightView{.name = "layers.1.ffn.experts.0.w1", .format = WeightFormat::kF32, .n = n, .k = k,
                      .data = held ? Bytes(a.data()) : nullptr};
  };
  std::vector<WeightView> w1 = {v(4, 6, true), v(4, 6, false)}, w3 = {v(4, 6, true), v(4, 6, false)},
                          w2 = {v(6, 4, true), v(6, 4, false)};
  auto ok = be->PrepareExperts(w1, w3, w2);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE((*ok)->Holds(0));
  EXPECT_FALSE((*ok)->Holds(1));
  EXPECT_EQ((*ok)->device_bytes(), 3 * 24 * 4);
  w3[1] = v(4, 6, true);  // expert 1: one matrix of three
  EXPECT_EQ(be->PrepareExperts(w1, w3, w2).status().code(), absl::StatusCode::kInvalidArgument);
  w3[1] = v(4, 6, false);
  w2[0] = v(4, 6, true);  // w2 must be [D, I]
  EXPECT_EQ(be->PrepareExperts(w1, w3, w2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(be->PrepareExperts(w1, w3, std::span<const WeightView>(w2.data(), 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsv4::kernels::cpu
