// The CUDA dense ops against the CPU reference ops (cuda_ops_test, label gpu): embedding, RMSNorm, RoPE, both in one,
// scale, fill, the Hadamard + FP4 simulation (bit for bit) and the mHC pre / post / head mixes, at the shapes
// of configs/flash.json (D 4096, 64 heads of 512, indexer 64 x 128, S 4) and tiny.json (D 512), with padding
// tokens, in-place calls and zero-sized calls. Outputs start as NaN, so an element an op forgets fails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/float_formats.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launchers.h"
#include "tests/cuda/test_util.h"

namespace dsv4::kernels::cuda {
namespace {

using testing::Download;
using testing::ExpectBitEqual;
using testing::ExpectClose;
using testing::GetBackends;
using testing::HostWeight;
using testing::Poisoned;
using testing::RandomNormal;
using testing::RandomWeight;
using testing::Upload;
using testing::UploadI32;

// The same host data in both backends.
struct Pair {
  Buffer cpu, gpu;
};
Pair Both(std::span<const float> host) {
  auto b = GetBackends();
  return {Upload(b.cpu, host), Upload(b.cuda, host)};
}
Pair BothI32(std::span<const int32_t> host) {
  auto b = GetBackends();
  return {UploadI32(b.cpu, host), UploadI32(b.cuda, host)};
}
Pair BothPoisoned(int64_t n) {
  auto b = GetBackends();
  return {Poisoned(b.cpu, n), Poisoned(b.cuda, n)};
}
// Synchronizes both backends (failing the test on an error) and returns {got (CUDA), want (CPU)}.
std::pair<std::vector<float>, std::vector<float>> Results(const Pair& p, int64_t n) {
  auto b = GetBackends();
  const absl::Status sc = b.cpu.Synchronize(), sg = b.cuda.Synchronize();
  EXPECT_TRUE(sc.ok()) << sc;
  EXPECT_TRUE(sg.ok()) << sg;
  return {Download(b.cuda, p.gpu, n), Download(b.cpu, p.cpu, n)};
}

TEST(DenseEmbed, Bf16AndF32TablesWithPadding) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  for (const WeightFormat f : {WeightFormat::kBF16, WeightFormat::kF32}) {
    std::mt19937 rng(1);
    const int64_t v = 1000, d = 4096, s = 4, t = 7;
    HostWeight table = RandomWeight(rng, f, v, d);
    auto tc = b.cpu.PrepareLinear(table.view);
    auto tg = b.cuda.PrepareLinear(table.view);
    ASSERT_TRUE(tc.ok() && tg.ok());
    const std::vector<int32_t> tokens = {0, 999, 5, 5, 123, 7, 998};
    const std::vector<int32_t> pos = {0, 1, 2, -1, 3, -1, 4};  // two padding tokens: zeros
    Pair tok = BothI32(tokens), ps = BothI32(pos), x = BothPoisoned(t * s * d);
    b.cpu.ops().Embed({.table = tc->get(), .tokens = tok.cpu.as<int32_t>(), .pos = ps.cpu.as<int32_t>(),
                       .x = x.cpu.as<float>(), .t = t, .s = s});
    b.cuda.ops().Embed({.table = tg->get(), .tokens = tok.gpu.as<int32_t>(), .pos = ps.gpu.as<int32_t>(),
                        .x = x.gpu.as<float>(), .t = t, .s = s});
    auto [got, want] = Results(x, t * s * d);
    ExpectBitEqual(absl::StrCat("embed ", WeightFormatName(f), " [1000x4096] T=7 S=4"), got, want);
  }
}

TEST(DenseEmbed, TokenOutsideTableGivesZerosOnDevice) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  std::mt19937 rng(2);
  HostWeight table = RandomWeight(rng, WeightFormat::kBF16, 16, 64);
  auto tg = b.cuda.PrepareLinear(table.view);
  ASSERT_TRUE(tg.ok());
  // The CPU reference reports OutOfRange on the host; a device op cannot, so it writes zeros (no stray read).
  Buffer tok = UploadI32(b.cuda, std::vector<int32_t>{16, -3}), pos = UploadI32(b.cuda, std::vector<int32_t>{0, 1});
  Buffer x = Poisoned(b.cuda, 2 * 64);
  b.cuda.ops().Embed({.table = tg->get(), .tokens = tok.as<int32_t>(), .pos = pos.as<int32_t>(),
                      .x = x.as<float>(), .t = 2, .s = 1});
  ASSERT_TRUE(b.cuda.Synchronize().ok());
  ExpectBitEqual("embed ids 16 and -3 of a 16-row table", Download(b.cuda, x, 128), std::vector<float>(128, 0.f));
}

void CheckRmsNorm(const std::string& what, int64_t rows, int64_t dim, bool weighted, bool in_place) {
  auto b = GetBackends();
  std::mt19937 rng(static_cast<uint32_t>(rows * 131 + dim));
  std::vector<float> x = RandomNormal(rng, rows * dim, 3.f);
  std::vector<float> w = RandomNormal(rng, dim);
  Pair xs = Both(x), ws = Both(w), out = in_place ? Pair{} : BothPoisoned(rows * dim);
  auto args = [&](const Buffer& xb, const Buffer& wb, const Buffer& ob) {
    return RmsNormArgs{.x = xb.as<float>(), .w = weighted ? wb.as<float>() : nullptr,
                       .out = in_place ? xb.as<float>() : ob.as<float>(), .rows = rows, .dim = dim, .eps = 1e-6f};
  };
  b.cpu.ops().RmsNorm(args(xs.cpu, ws.cpu, out.cpu));
  b.cuda.ops().RmsNorm(args(xs.gpu, ws.gpu, out.gpu));
  auto [got, want] = Results(in_place ? xs : out, rows * dim);
  ExpectClose(what, got, want, 1e-6);
}

TEST(DenseRmsNorm, FlashAndTinyShapes) {
  DSV4_REQUIRE_GPU();
  CheckRmsNorm("attn_norm [9, 4096]", 9, 4096, true, false);
  CheckRmsNorm("q_norm [9, 1024] in place", 9, 1024, true, true);
  CheckRmsNorm("per-head q [5*64, 512] unweighted", 5 * 64, 512, false, false);
  CheckRmsNorm("kv_norm [3, 512] in place", 3, 512, true, true);
  CheckRmsNorm("odd dim [4, 77]", 4, 77, true, false);
  CheckRmsNorm("no rows", 0, 4096, true, false);
}

void CheckRope(const std::string& what, int64_t heads, int64_t row_dim, int pairs, bool inverse) {
  auto b = GetBackends();
  std::mt19937 rng(static_cast<uint32_t>(heads + row_dim + inverse));
  const std::vector<int32_t> pos = {0, 1, 65535, 1048575, -1, 77, 4096};  // -1: padding, left as it is
  const int64_t t = static_cast<int64_t>(pos.size());
  std::vector<float> inv_freq(static_cast<size_t>(pairs));
  for (int i = 0; i < pairs; ++i) inv_freq[i] = std::pow(10000.f, -static_cast<float>(i) / pairs) / (i % 3 + 1.f);
  Pair x = Both(RandomNormal(rng, t * heads * row_dim)), p = BothI32(pos), f = Both(inv_freq);
  auto args = [&](const Pair& xp, const Pair& pp, const Pair& fp, bool gpu) {
    return RopeArgs{.x = (gpu ? xp.gpu : xp.cpu).as<float>(), .pos = (gpu ? pp.gpu : pp.cpu).as<int32_t>(),
                    .inv_freq = (gpu ? fp.gpu : fp.cpu).as<float>(), .t = t, .heads = heads, .row_dim = row_dim,
                    .pairs = pairs, .inverse = inverse};
  };
  b.cpu.ops().Rope(args(x, p, f, false));
  b.cuda.ops().Rope(args(x, p, f, true));
  auto [got, want] = Results(x, t * heads * row_dim);
  ExpectClose(what, got, want, 1e-6, 1e-5);
}

TEST(DenseRope, FlashShapesForwardAndInverse) {
  DSV4_REQUIRE_GPU();
  CheckRope("q rope [7, 64, 512] pairs 32", 64, 512, 32, false);
  CheckRope("q rope inverse [7, 64, 512]", 64, 512, 32, true);
  CheckRope("kv rope [7, 1, 512]", 1, 512, 32, false);
  CheckRope("indexer q rope [7, 64, 128]", 64, 128, 32, false);
  CheckRope("whole row [7, 2, 64] pairs 32", 2, 64, 32, false);
}

// NormRope (RmsNorm then RoPE of the same rows in one kernel) against the two CUDA ops on a copy of the same input
// (bit for bit: same threads, sums and products) and against the CPU reference's composition.
void CheckNormRope(const std::string& what, int64_t heads, int64_t dim, int pairs, bool weighted, bool inverse) {
  auto b = GetBackends();
  std::mt19937 rng(static_cast<uint32_t>(heads * 7 + dim + pairs + weighted + 2 * inverse));
  const std::vector<int32_t> pos = {0, 1, 65535, -1, 77, 4096};  // -1: padding, normed but not rotated
  const int64_t t = static_cast<int64_t>(pos.size()), rows = t * heads;
  std::vector<float> inv_freq(static_cast<size_t>(pairs));
  for (int i = 0; i < pairs; ++i) inv_freq[i] = std::pow(10000.f, -static_cast<float>(i) / pairs);
  const std::vector<float> x = RandomNormal(rng, rows * dim, 3.f);
  Pair fused = Both(x), ps = BothI32(pos), f = Both(inv_freq), ws = Both(RandomNormal(rng, dim));
  Buffer two = Upload(b.cuda, x);
  auto args = [&](float* xb, const Pair& pp, const Pair& fp, const Pair& wp, bool gpu) {
    return NormRopeArgs{
        .norm = {.x = xb, .w = weighted ? (gpu ? wp.gpu : wp.cpu).as<float>() : nullptr, .out = xb, .rows = rows,
                 .dim = dim, .eps = 1e-6f},
        .rope = {.x = xb, .pos = (gpu ? pp.gpu : pp.cpu).as<int32_t>(), .inv_freq = (gpu ? fp.gpu : fp.cpu).as<float>(),
                 .t = t, .heads = heads, .row_dim = dim, .pairs = pairs, .inverse = inverse}};
  };
  b.cpu.ops().NormRope(args(fused.cpu.as<float>(), ps, f, ws, false));
  b.cuda.ops().NormRope(args(fused.gpu.as<float>(), ps, f, ws, true));
  const NormRopeArgs sep = args(two.as<float>(), ps, f, ws, true);
  b.cuda.ops().RmsNorm(sep.norm);
  b.cuda.ops().Rope(sep.rope);
  auto [got, want] = Results(fused, rows * dim);
  ExpectBitEqual(what + ": one kernel vs RmsNorm + Rope", got, Download(b.cuda, two, rows * dim));
  ExpectClose(what + ": vs the CPU", got, want, 1e-6, 1e-5);
}

TEST(DenseNormRope, SameBitsAsTheTwoOps) {
  DSV4_REQUIRE_GPU();
  if (const char* v = std::getenv("DSV4_NORM_ROPE"); v != nullptr && std::strcmp(v, "0") == 0) {
    GTEST_SKIP() << "DSV4_NORM_ROPE=0 runs the two kernels: nothing to compare";
  }
  CheckNormRope("q [6, 64, 512] unweighted", 64, 512, 32, false, false);
  CheckNormRope("q TP 4 shard [6, 16, 512]", 16, 512, 32, false, false);
  CheckNormRope("kv [6, 1, 512] weighted", 1, 512, 32, true, false);
  CheckNormRope("inverse [6, 4, 512]", 4, 512, 32, true, true);
  CheckNormRope("256-thread rows [6, 2, 1024]", 2, 1024, 32, true, false);
  CheckNormRope("odd dim [6, 3, 77] pairs 8", 3, 77, 8, true, false);
}

TEST(DenseNormRope, RefusesBadSizesAndFallsBackWhereRowsDiffer) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  cudaStream_t stream = static_cast<CudaBackend&>(b.cuda).stream();
  Buffer x = Upload(b.cuda, std::vector<float>(4 * 64, 1.f)), f = Upload(b.cuda, std::vector<float>(64, 0.5f));
  Buffer p = UploadI32(b.cuda, std::vector<int32_t>{0, 1, 2, 3});
  NormRopeArgs a{.norm = {.x = x.as<float>(), .out = x.as<float>(), .rows = 4, .dim = 64},
                 .rope = {.x = x.as<float>(), .pos = p.as<int32_t>(), .inv_freq = f.as<float>(), .t = 4, .heads = 1,
                          .row_dim = 64, .pairs = 33}};
  EXPECT_EQ(LaunchNormRope(a, stream).code(), absl::StatusCode::kInvalidArgument);  // 2 * pairs > dim
  a.rope.pairs = 32;
  a.rope.pos = nullptr;
  EXPECT_EQ(LaunchNormRope(a, stream).code(), absl::StatusCode::kInvalidArgument);
  a.rope.pos = p.as<int32_t>();
  EXPECT_TRUE(LaunchNormRope(a, stream).ok());
  // Rotating only the first two rows is not the norm's rows, so the two ops run: the same bits as launching them.
  std::mt19937 rng(5);
  const std::vector<float> host = RandomNormal(rng, 4 * 64);
  Buffer y = Upload(b.cuda, host), z = Upload(b.cuda, host);
  a.norm.x = a.norm.out = a.rope.x = y.as<float>();
  a.rope.t = 2;
  ASSERT_TRUE(LaunchNormRope(a, stream).ok());
  a.norm.x = a.norm.out = a.rope.x = z.as<float>();
  ASSERT_TRUE(LaunchRmsNorm(a.norm, stream).ok());
  ASSERT_TRUE(LaunchRope(a.rope, stream).ok());
  ASSERT_TRUE(b.cuda.Synchronize().ok());
  ExpectBitEqual("norm + rope of other rows: the two ops", Download(b.cuda, y, 4 * 64), Download(b.cuda, z, 4 * 64));
}

TEST(DenseScaleFill, ExactAndZeroSized) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  std::mt19937 rng(3);
  Pair x = Both(RandomNormal(rng, 5 * 4096));
  b.cpu.ops().Scale({.x = x.cpu.as<float>(), .rows = 5, .dim = 4096, .scale = 0.0883883f});
  b.cuda.ops().Scale({.x = x.gpu.as<float>(), .rows = 5, .dim = 4096, .scale = 0.0883883f});
  b.cuda.ops().Scale({.x = x.gpu.as<float>(), .rows = 0, .dim = 4096, .scale = 0.f});
  auto [got, want] = Results(x, 5 * 4096);
  ExpectBitEqual("scale [5, 4096]", got, want);

  Pair f = BothPoisoned(1000003);
  for (Backend* be : {&b.cpu, &b.cuda}) {
    Buffer& buf = be == &b.cpu ? f.cpu : f.gpu;
    be->ops().Fill({.x = buf.as<float>(), .n = 1000000, .value = -INFINITY});
    be->ops().Fill({.x = buf.as<float>() + 1000000, .n = 3, .value = 0.f});
    be->ops().Fill({.x = buf.as<float>(), .n = 0, .value = 1.f});
  }
  auto [fg, fw] = Results(f, 1000003);
  ExpectBitEqual("fill 1e6 x -inf + 3 x 0", fg, fw);
}

// Rows that stress the scale rule: zeros (amax floor 1e-4), constants (one Hadamard output), spikes, tiny and
// huge magnitudes, then random rows.
std::vector<float> HadamardRows(std::mt19937& rng, int64_t rows, int64_t dim) {
  std::vector<float> x = RandomNormal(rng, rows * dim);
  auto row = [&](int64_t r) { return x.data() + r * dim; };
  std::fill_n(row(0), dim, 0.f);
  std::fill_n(row(1), dim, 0.75f);
  std::fill_n(row(2), dim, 0.f);
  row(2)[dim / 3] = 1000.f;
  for (int64_t i = 0; i < dim; ++i) row(3)[i] *= 1e-30f;
  for (int64_t i = 0; i < dim; ++i) row(4)[i] *= 1e30f;
  for (int64_t i = 0; i < dim; ++i) row(5)[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
  return x;
}

TEST(DenseHadamardFp4, BitExactAgainstCpu) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  for (const int64_t dim : {32, 64, 128, 256, 512, 1024}) {
    std::mt19937 rng(static_cast<uint32_t>(dim));
    const int64_t rows = dim == 128 ? 9 * 64 : 40;  // the indexer's q: [T * 64 heads, 128]
    Pair x = Both(HadamardRows(rng, rows, dim));
    b.cpu.ops().HadamardFp4({.x = x.cpu.as<float>(), .rows = rows, .dim = dim});
    b.cuda.ops().HadamardFp4({.x = x.gpu.as<float>(), .rows = rows, .dim = dim});
    auto [got, want] = Results(x, rows * dim);
    ExpectBitEqual(absl::StrCat("hadamard_fp4 [", rows, ", ", dim, "]"), got, want);
  }
}

TEST(DenseHadamardFp4, RefusesDimsOutsideTheKernel) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  Buffer x = Upload(b.cuda, std::vector<float>(96, 1.f));
  b.cuda.ops().HadamardFp4({.x = x.as<float>(), .rows = 1, .dim = 96});
  const absl::Status s = b.cuda.Synchronize();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

// mHC parameters like a trained model's: small mix rows, O(1) bases and scales.
struct HcParams {
  std::vector<float> fn, base, scale;
};
HcParams RandomHc(std::mt19937& rng, int64_t mixes, int64_t width) {
  HcParams p{.fn = RandomNormal(rng, mixes * width, 0.5f / std::sqrt(static_cast<float>(width)) * 8.f),
             .base = RandomNormal(rng, mixes, 0.5f), .scale = RandomNormal(rng, 3, 0.7f)};
  return p;
}

void CheckHcPre(const std::string& what, int64_t t, int64_t d, int iters) {
  auto b = GetBackends();
  const int64_t s = 4, mixes = (2 + s) * s;
  std::mt19937 rng(static_cast<uint32_t>(t * 7 + d + iters));
  HcParams hp = RandomHc(rng, mixes, s * d);
  Pair x = Both(RandomNormal(rng, t * s * d, 2.f)), fn = Both(hp.fn), base = Both(hp.base), sc = Both(hp.scale);
  Pair u = BothPoisoned(t * d), post = BothPoisoned(t * s), comb = BothPoisoned(t * s * s);
  auto args = [&](bool gpu) {
    auto pick = [gpu](const Pair& p) { return (gpu ? p.gpu : p.cpu).as<float>(); };
    return HcPreArgs{.x = pick(x), .fn = pick(fn), .base = pick(base), .scale = pick(sc), .u = pick(u),
                     .post = pick(post), .comb = pick(comb), .t = t, .s = s, .d = d, .sinkhorn_iters = iters};
  };
  b.cpu.ops().HcPre(args(false));
  b.cuda.ops().HcPre(args(true));
  const std::string shape = absl::StrCat(" T=", t, " D=", d, " iters=", iters);
  auto [ug, uw] = Results(u, t * d);
  ExpectClose(what + " u" + shape, ug, uw, 2e-5);
  auto [pg, pw] = Results(post, t * s);
  ExpectClose(what + " post" + shape, pg, pw, 2e-5, 1e-5);
  auto [cg, cw] = Results(comb, t * s * s);
  ExpectClose(what + " comb" + shape, cg, cw, 2e-5, 1e-5);
}

TEST(DenseHcPre, FlashAndTinyShapes) {
  DSV4_REQUIRE_GPU();
  CheckHcPre("hc_pre flash decode", 1, 4096, 20);
  CheckHcPre("hc_pre flash batch", 37, 4096, 20);
  CheckHcPre("hc_pre flash prefill", 300, 4096, 20);
  CheckHcPre("hc_pre tiny", 3, 512, 20);
  CheckHcPre("hc_pre one Sinkhorn iteration", 2, 512, 1);
}

// HcPreNorm (the sublayer's RMSNorm of u inside the mHC pre's finish kernel) against HcPre + RmsNorm on the GPU
// (bit for bit: the norm runs RmsNormKernel's row code on the same thread count) and against the CPU reference's
// composition.
void CheckHcPreNorm(const std::string& what, int64_t t, int64_t d, bool weighted) {
  auto b = GetBackends();
  const int64_t s = 4, mixes = (2 + s) * s;
  std::mt19937 rng(static_cast<uint32_t>(t * 11 + d + weighted));
  HcParams hp = RandomHc(rng, mixes, s * d);
  Pair x = Both(RandomNormal(rng, t * s * d, 2.f)), fn = Both(hp.fn), base = Both(hp.base), sc = Both(hp.scale);
  Pair w = Both(RandomNormal(rng, d));
  Pair u = BothPoisoned(t * d), post = BothPoisoned(t * s), comb = BothPoisoned(t * s * s);
  Buffer u2 = Poisoned(b.cuda, t * d), post2 = Poisoned(b.cuda, t * s), comb2 = Poisoned(b.cuda, t * s * s);
  auto args = [&](bool gpu, const Buffer* uo, const Buffer* po, const Buffer* co) {
    auto pick = [gpu](const Pair& p) { return (gpu ? p.gpu : p.cpu).as<float>(); };
    float* ub = uo ? uo->as<float>() : pick(u);
    return HcPreNormArgs{
        .pre = {.x = pick(x), .fn = pick(fn), .base = pick(base), .scale = pick(sc), .u = ub,
                .post = po ? po->as<float>() : pick(post), .comb = co ? co->as<float>() : pick(comb), .t = t, .s = s,
                .d = d, .sinkhorn_iters = 20},
        .norm = {.x = ub, .w = weighted ? pick(w) : nullptr, .out = ub, .rows = t, .dim = d, .eps = 1e-6f}};
  };
  b.cpu.ops().HcPreNorm(args(false, nullptr, nullptr, nullptr));
  b.cuda.ops().HcPreNorm(args(true, nullptr, nullptr, nullptr));
  const HcPreNormArgs two = args(true, &u2, &post2, &comb2);
  b.cuda.ops().HcPre(two.pre);
  b.cuda.ops().RmsNorm(two.norm);
  const std::string shape = absl::StrCat(" T=", t, " D=", d, weighted ? "" : " unweighted");
  auto [ug, uw] = Results(u, t * d);
  ExpectBitEqual(what + " u: fused vs HcPre + RmsNorm" + shape, ug, Download(b.cuda, u2, t * d));
  ExpectClose(what + " u vs the CPU" + shape, ug, uw, 1e-4);
  auto [pg, pw] = Results(post, t * s);
  ExpectBitEqual(what + " post" + shape, pg, Download(b.cuda, post2, t * s));
  auto [cg, cw] = Results(comb, t * s * s);
  ExpectBitEqual(what + " comb" + shape, cg, Download(b.cuda, comb2, t * s * s));
}

TEST(DenseHcPreNorm, SameBitsAsHcPreThenRmsNorm) {
  DSV4_REQUIRE_GPU();
  if (const char* v = std::getenv("DSV4_HC_NORM"); v != nullptr && std::strcmp(v, "0") == 0) {
    GTEST_SKIP() << "DSV4_HC_NORM=0 runs the two ops: nothing to compare";
  }
  CheckHcPreNorm("hc_pre+norm flash decode", 1, 4096, true);
  CheckHcPreNorm("hc_pre+norm flash batch", 37, 4096, true);
  CheckHcPreNorm("hc_pre+norm flash prefill", 300, 4096, true);
  CheckHcPreNorm("hc_pre+norm tiny (128-thread norm)", 3, 512, true);
  CheckHcPreNorm("hc_pre+norm unweighted", 2, 4096, false);
}

TEST(DenseHcPre, RefusesRowsTooNarrowForItsPartials) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  // d = 16 cannot hold the 25 partial sums a row parks in u: a documented limit of the CUDA op.
  Buffer x = Upload(b.cuda, std::vector<float>(64, 1.f)), fn = Upload(b.cuda, std::vector<float>(24 * 64, 0.f));
  Buffer base = Upload(b.cuda, std::vector<float>(24, 0.f)), sc = Upload(b.cuda, std::vector<float>(3, 1.f));
  Buffer u = Poisoned(b.cuda, 16), post = Poisoned(b.cuda, 4), comb = Poisoned(b.cuda, 16);
  b.cuda.ops().HcPre({.x = x.as<float>(), .fn = fn.as<float>(), .base = base.as<float>(), .scale = sc.as<float>(),
                      .u = u.as<float>(), .post = post.as<float>(), .comb = comb.as<float>(), .t = 1, .s = 4,
                      .d = 16});
  const absl::Status s = b.cuda.Synchronize();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(DenseHcPost, FlashShapes) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  for (const int64_t t : {1, 6, 200}) {
    const int64_t s = 4, d = 4096;
    std::mt19937 rng(static_cast<uint32_t>(t));
    Pair x = Both(RandomNormal(rng, t * s * d)), y = Both(RandomNormal(rng, t * d));
    Pair post = Both(RandomNormal(rng, t * s)), comb = Both(RandomNormal(rng, t * s * s, 0.3f));
    Pair out = BothPoisoned(t * s * d);
    auto args = [&](bool gpu) {
      auto pick = [gpu](const Pair& p) { return (gpu ? p.gpu : p.cpu).as<float>(); };
      return HcPostArgs{.x = pick(x), .y = pick(y), .post = pick(post), .comb = pick(comb), .x_out = pick(out),
                        .t = t, .s = s, .d = d};
    };
    b.cpu.ops().HcPost(args(false));
    b.cuda.ops().HcPost(args(true));
    auto [got, want] = Results(out, t * s * d);
    ExpectClose(absl::StrCat("hc_post T=", t, " D=4096"), got, want, 1e-6);
  }
}

TEST(DenseHcHead, RowsWithRepeatsAndGaps) {
  DSV4_REQUIRE_GPU();
  auto b = GetBackends();
  for (const int64_t d : {4096, 512}) {
    const int64_t s = 4, t = 8;
    std::mt19937 rng(static_cast<uint32_t>(d));
    HcParams hp = RandomHc(rng, s, s * d);
    const std::vector<int32_t> rows = {7, 0, -1, 3, 3};  // -1: no token (zeros)
    const int64_t r = static_cast<int64_t>(rows.size());
    Pair x = Both(RandomNormal(rng, t * s * d, 2.f)), fn = Both(hp.fn), base = Both(hp.base);
    Pair sc = Both(hp.scale), rw = BothI32(rows), h = BothPoisoned(r * d);
    auto args = [&](bool gpu) {
      auto pick = [gpu](const Pair& p) { return (gpu ? p.gpu : p.cpu).as<float>(); };
      return HcHeadArgs{.x = pick(x), .rows = (gpu ? rw.gpu : rw.cpu).as<int32_t>(), .fn = pick(fn),
                        .base = pick(base), .scale = pick(sc), .h = pick(h), .r = r, .s = s, .d = d};
    };
    b.cpu.ops().HcHead(args(false));
    b.cuda.ops().HcHead(args(true));
    auto [got, want] = Results(h, r * d);
    ExpectClose(absl::StrCat("hc_head rows {7,0,-1,3,3} D=", d), got, want, 2e-5);
  }
}

}  // namespace
}  // namespace dsv4::kernels::cuda
