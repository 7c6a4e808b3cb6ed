// The attention family's CUDA ops (kernels/cuda: kv_window.cu, compressor.cu, attention.cu; the indexer is in
// indexer_ops_test.cc) against the CPU reference ops (kernels/cpu) on random inputs at the real shapes of
// configs/flash.json (512-dim keys, window 128, 64 heads) and the tiny config (8 heads), with the edge cases:
// padding tokens and sequences, prefill chunks longer than the window, steps that start mid-window with carried
// state, decode steps, the first and last rows of pages. Each comparison prints max abs error, relative error by
// norm and the worst index. The GPU tests skip without a GPU; the launchers' host-side validation runs everywhere.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cuda/launchers.h"
#include "kernels/sparse_mla/kv_row_format.h"
#include "tests/cuda/attention_test_util.h"
#include "tests/cuda/test_util.h"

namespace dsv4::kernels::cuda::testing {
namespace {

namespace sm = sparse_mla;

constexpr int kWindow = 128;

const char* FormatName(KvFormat f) { return f == KvFormat::kF32 ? "f32" : "fp8"; }

// The CPU reference op's error (CPU ops report through their backend), checked after each call.
void ExpectCpuOk() {
  const absl::Status s = GetBackends().cpu.Synchronize();
  EXPECT_TRUE(s.ok()) << "CPU reference op: " << s;
}

// ---- KvWindowWrite ----

void RunKvWindowWrite(KvFormat format, int page_rows, const std::vector<SeqSpec>& seqs, int padding,
                      uint32_t seed) {
  std::mt19937 rng(seed);
  const int dim = sm::kKvDim;
  TestStep step(seqs, padding);
  const int64_t per_seq = (kWindow + page_rows - 1) / page_rows;
  const int64_t ring_pages = step.b() * per_seq;
  TestPool pool(format, dim, page_rows, ring_pages + (step.t() + page_rows - 1) / page_rows);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& x : pool.host) x = static_cast<uint8_t>(byte(rng));  // bytes the op must leave alone
  pool.Upload();
  TestTables tables(step.b(), per_seq, 0, rng);
  std::vector<float> keys = RandomNormal(rng, step.t() * dim);
  for (int64_t i = 0; i < step.t() * dim; ++i) {  // tile magnitudes from 1e-3 to 1e3 (the ue8m0 scales)
    keys[i] *= static_cast<float>(std::pow(10.0, (i / dim + i % dim / 64) % 7 - 3));
  }
  const DeviceArray<float> d_keys(keys);
  const int32_t staging_row0 = static_cast<int32_t>(ring_pages * page_rows);
  for (bool commit : {false, true}) {
    const KvWindowWriteArgs host{.rows = keys.data(), .cache = pool.HostView(), .step = step.Host(),
                                 .tables = tables.Host(), .staging_row0 = staging_row0, .window = kWindow,
                                 .commit = commit};
    KvWindowWriteArgs dev = host;
    dev.rows = d_keys.get();
    dev.cache = pool.DeviceView();
    dev.step = step.Device();
    dev.tables = tables.Device();
    GetBackends().cpu.ops().KvWindowWrite(host);
    ExpectCpuOk();
    const absl::Status st = LaunchKvWindowWrite(dev, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint8_t> got = pool.dev.ToHost();
    int64_t diff = 0, first = -1;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != pool.host[i] && diff++ == 0) first = static_cast<int64_t>(i);
    }
    std::printf("  KvWindowWrite %s P=%d T=%lld commit=%d: %lld of %zu pool bytes differ (first at %lld)\n",
                FormatName(format), page_rows, static_cast<long long>(step.t()), commit,
                static_cast<long long>(diff), got.size(), static_cast<long long>(first));
    EXPECT_EQ(diff, 0);
  }
}

TEST(AttentionOps, KvWindowWriteMatchesCpu) {
  DSV4_REQUIRE_GPU();
  // A prefill chunk longer than the window, a short continuation mid-ring, a decode token, a padding sequence.
  const std::vector<SeqSpec> mixed = {{0, 300, 0}, {200, 5, 1}, {1000, 1, 2}, {0, 0, 3}};
  // Decode tokens on the first and last row of a ring page and across the ring's wrap.
  const std::vector<SeqSpec> decode = {{63, 1, 0}, {127, 1, 1}, {128, 1, 2}, {4095, 1, 3}, {64, 1, 4}};
  for (KvFormat f : {KvFormat::kFp8Row584, KvFormat::kF32}) {
    for (int p : {64, 256}) {
      RunKvWindowWrite(f, p, mixed, 1, 11);
      RunKvWindowWrite(f, p, decode, 2, 12);
    }
  }
}

// ---- Compressor ----

struct CompressorCase {
  const char* name;
  int ratio, d;
  KvFormat format;
  bool hadamard;
};

// Inverse frequencies of theta 160000 (the op takes whatever table the model built).
std::vector<float> InvFreq(int pairs) {
  std::vector<float> f(pairs);
  for (int i = 0; i < pairs; ++i) f[i] = static_cast<float>(std::pow(160000.0, -2.0 * i / (2.0 * pairs)));
  return f;
}

void RunCompressor(const CompressorCase& c) {
  std::printf("Compressor %s (R=%d, d=%d)\n", c.name, c.ratio, c.d);
  std::mt19937 rng(c.ratio * 1000 + c.d + c.hadamard);
  const int halves = c.ratio == 4 ? 2 : 1, pairs = 32, page_rows = 64, seqs = 4;
  const int64_t cd = int64_t{halves} * c.d, stride = halves * c.ratio * cd;
  const int64_t per_seq = (320 / c.ratio + page_rows) / page_rows;
  TestPool pool(c.format, c.d, page_rows, seqs * per_seq);
  TestTables tables(seqs, per_seq, 0, rng);
  std::vector<float> state_kv(seqs * stride, 0.f), state_score(seqs * stride, -INFINITY);
  DeviceArray<float> d_state_kv(state_kv), d_state_score(state_score);
  const std::vector<float> ape = RandomNormal(rng, c.ratio * cd, 0.5f), inv_freq = InvFreq(pairs);
  std::vector<float> norm_w = RandomNormal(rng, c.d, 0.1f);
  for (float& w : norm_w) w += 1.f;
  const DeviceArray<float> d_ape(ape), d_norm_w(norm_w), d_inv_freq(inv_freq);

  // Sequence b keeps state slot b and table row b in every step. Step 0: prefill from 0 (several emissions,
  // ratio 128 at 127 and 255) and a first decode token; step 1: continuations that start mid-window with
  // carried state; then four decode steps (emissions at 311, 203, 7, 255).
  std::vector<std::pair<std::vector<SeqSpec>, int>> steps = {
      {{{0, 300, 0}, {0, 1, 1}, {0, 0, 2}, {0, 0, 3}}, 1},
      {{{300, 9, 0}, {1, 200, 1}, {0, 5, 2}, {0, 254, 3}}, 0},
  };
  for (int i = 0; i < 4; ++i) steps.push_back({{{309 + i, 1, 0}, {201 + i, 1, 1}, {5 + i, 1, 2}, {254 + i, 1, 3}}, 1});
  const bool quantised = c.format == KvFormat::kFp8Row584 || c.hadamard;
  for (size_t si = 0; si < steps.size(); ++si) {
    TestStep step(steps[si].first, steps[si].second);
    const std::vector<float> kv = RandomNormal(rng, step.t() * cd), gate = RandomNormal(rng, step.t() * cd);
    const DeviceArray<float> d_kv(kv), d_gate(gate);
    const CompressorArgs host{.state_kv = state_kv.data(), .state_score = state_score.data(), .state_stride = stride,
                              .kv = kv.data(), .gate = gate.data(), .ape = ape.data(), .norm_w = norm_w.data(),
                              .inv_freq = inv_freq.data(), .cache = pool.HostView(), .tables = tables.Host(),
                              .step = step.Host(), .ratio = c.ratio, .d = c.d, .pairs = pairs, .eps = 1e-6f,
                              .hadamard_fp4 = c.hadamard};
    CompressorArgs dev = host;
    dev.state_kv = d_state_kv.get();
    dev.state_score = d_state_score.get();
    dev.kv = d_kv.get();
    dev.gate = d_gate.get();
    dev.ape = d_ape.get();
    dev.norm_w = d_norm_w.get();
    dev.inv_freq = d_inv_freq.get();
    dev.cache = pool.DeviceView();
    dev.tables = tables.Device();
    dev.step = step.Device();
    GetBackends().cpu.ops().Compressor(host);
    ExpectCpuOk();
    const absl::Status st = LaunchCompressor(dev, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::string tag = "step " + std::to_string(si) + " (T=" + std::to_string(step.t()) + ")";
    ExpectBitEqual(tag + " state kv", d_state_kv.ToHost(), state_kv);
    ExpectBitEqual(tag + " state score", d_state_score.ToHost(), state_score);
    const std::vector<float> got = pool.DecodeDevice(), want = pool.DecodeHost();
    // The emission is the CPU's float for float (same pooling order, double sums, no FMA contraction); a
    // quantised row may still differ by one FP8 / FP4 step where a last-bit difference crosses a rounding edge.
    int64_t off = 0, written = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      written += want[i] != 0.f;
      off += std::fabs(got[i] - want[i]) > 1e-5f * std::max(1.f, std::fabs(want[i]));
    }
    ExpectClose(tag + " emitted rows", got, want, quantised ? 1e-2 : 1e-5);
    std::printf("    %lld of %lld written elements off by more than 1e-5\n", static_cast<long long>(off),
                static_cast<long long>(written));
    EXPECT_LE(off, quantised ? written / 200 : 0);
  }
}

TEST(AttentionOps, CompressorMatchesCpu) {
  DSV4_REQUIRE_GPU();
  for (const CompressorCase& c : std::vector<CompressorCase>{
           {"main ratio 4, FP8 pool", 4, 512, KvFormat::kFp8Row584, false},
           {"main ratio 128, FP8 pool", 128, 512, KvFormat::kFp8Row584, false},
           {"indexer ratio 4, Hadamard + FP4", 4, 128, KvFormat::kF32, true},
           {"main ratio 4, exact", 4, 512, KvFormat::kF32, false},
           {"main ratio 128, exact", 128, 512, KvFormat::kF32, false},
           {"indexer ratio 4, exact", 4, 128, KvFormat::kF32, false},
       }) {
    RunCompressor(c);
  }
}

// ---- Attention ----

struct AttentionCase {
  const char* name;
  int heads, ratio;
  KvFormat format;
  sm::SparseMlaKernel kernel;
  int ksel;
};

void RunAttention(const AttentionCase& c) {
  const std::string path = c.format == KvFormat::kF32 ? "direct" : std::string(sm::SparseMlaKernelName(c.kernel));
  std::printf("Attention %s (H=%d, ratio %d, %s, %s)\n", c.name, c.heads, c.ratio, FormatName(c.format), path.c_str());
  std::mt19937 rng(c.heads + 3 * c.ratio + static_cast<int>(c.kernel));
  const int dim = sm::kKvDim, page_rows = 64;
  // A prefill chunk longer than the window starting past it, a decode token with a full ring, a short one.
  TestStep step({{100, 140, 0}, {5000, 1, 1}, {3, 1, 2}}, 1);
  const int64_t per_seq = kWindow / page_rows, ring_pages = step.b() * per_seq;
  TestPool window(c.format, dim, page_rows, ring_pages + (step.t() + page_rows - 1) / page_rows);
  TestTables window_tables(step.b(), per_seq, 0, rng);
  const int32_t staging_row0 = static_cast<int32_t>(ring_pages * page_rows);
  for (int64_t b = 0; b < step.b(); ++b) {  // ring rows of the positions before the step
    const int32_t p0 = step.pos[step.seq_first[b]];
    for (int32_t q = std::max(0, p0 - kWindow); q < p0; ++q) {
      HostWriteRow(window.HostView(), window_tables.Row(b, q % kWindow, page_rows), RandomNormal(rng, dim).data());
    }
  }
  for (int64_t t = 0; t < step.t(); ++t) HostWriteRow(window.HostView(), staging_row0 + t, RandomNormal(rng, dim).data());
  window.Upload();

  const int64_t visible = c.ratio == 0 ? 1 : (5000 + 1) / c.ratio;  // rows of the longest sequence
  const int64_t per_seq_c = (visible + page_rows - 1) / page_rows;
  TestPool compressed(c.format, dim, page_rows, step.b() * per_seq_c);
  TestTables compressed_tables(step.b(), per_seq_c, 0, rng);
  for (int64_t r = 0; r < compressed.rows(); ++r) HostWriteRow(compressed.HostView(), r, RandomNormal(rng, dim).data());
  compressed.Upload();
  // Ratio 4: the indexer's output format - ascending physical ids, -1 past the count.
  std::vector<int32_t> selected(std::max(1, c.ksel) * step.t(), -1), count(step.t(), 0);
  if (c.ratio == 4) {
    for (int64_t t = 0; t < step.t(); ++t) {
      if (step.pos[t] < 0) continue;
      const int64_t n = (step.pos[t] + 1) / 4, m = std::min<int64_t>(c.ksel, n);
      std::vector<int64_t> rows(n);
      std::iota(rows.begin(), rows.end(), 0);
      std::shuffle(rows.begin(), rows.end(), rng);
      std::sort(rows.begin(), rows.begin() + m);
      for (int64_t i = 0; i < m; ++i) {
        selected[t * c.ksel + i] = static_cast<int32_t>(compressed_tables.Row(step.seq[t], rows[i], page_rows));
      }
      count[t] = static_cast<int32_t>(m);
    }
  }
  const DeviceArray<int32_t> d_selected(selected), d_count(count);
  const std::vector<float> q = RandomNormal(rng, step.t() * c.heads * dim), sink = RandomNormal(rng, c.heads);
  const DeviceArray<float> d_q(q), d_sink(sink);
  std::vector<float> want(step.t() * c.heads * dim, 7.f);
  DeviceArray<float> d_out(want);
  const AttentionArgs host{
      .q = q.data(), .window = window.HostView(), .window_tables = window_tables.Host(),
      .staging_row0 = staging_row0, .window_size = kWindow,
      .compressed = c.ratio > 0 ? compressed.HostView() : KvCacheView{},
      .compressed_tables = compressed_tables.Host(), .compressed_ratio = c.ratio, .selected = selected.data(),
      .selected_count = count.data(), .ksel = c.ksel, .max_compressed = c.ratio == 128 ? visible + 1 : c.ksel,
      .step = step.Host(), .sink = sink.data(), .out = want.data(), .heads = c.heads, .dim = dim,
      .scale = static_cast<float>(1.0 / std::sqrt(dim))};
  AttentionArgs dev = host;
  dev.q = d_q.get();
  dev.window = window.DeviceView();
  dev.window_tables = window_tables.Device();
  dev.compressed = c.ratio > 0 ? compressed.DeviceView() : KvCacheView{};
  dev.compressed_tables = compressed_tables.Device();
  dev.selected = d_selected.get();
  dev.selected_count = d_count.get();
  dev.step = step.Device();
  dev.sink = d_sink.get();
  dev.out = d_out.get();
  GetBackends().cpu.ops().Attention(host);
  ExpectCpuOk();

  // What Reserve does: the plan for the largest step (the backend's --attention-kernel) and its scratch.
  const StepLimits limits{.max_tokens = step.t(), .max_context = 8192, .heads = c.heads, .window = kWindow,
                          .index_topk = c.ksel};
  absl::StatusOr<std::shared_ptr<const AttentionPlan>> plan = MakeAttentionPlan(limits, c.kernel);
  ASSERT_TRUE(plan.ok()) << plan.status();
  DeviceArray<uint8_t> scratch(AttentionScratchBytes(limits));
  const absl::Status st = LaunchAttention(
      dev, {.data = scratch.get(), .bytes = static_cast<int64_t>(scratch.size()), .attention_plan = plan->get()},
      nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = d_out.ToHost();
  // The FP8 path rounds q and the output to bf16 (the sparse-MLA contract); the direct path is fp32.
  ExpectClose("out", got, want, c.format == KvFormat::kF32 ? 1e-5 : 1e-2);
  const int64_t pad = step.t() - 1;  // the padding token: zeros
  for (int64_t i = 0; i < c.heads * dim; ++i) ASSERT_EQ(got[pad * c.heads * dim + i], 0.f) << "padding token";
}

TEST(AttentionOps, AttentionMatchesCpu) {
  DSV4_REQUIRE_GPU();
  const KvFormat fp8 = KvFormat::kFp8Row584, f32 = KvFormat::kF32;
  const sm::SparseMlaKernel mma = sm::SparseMlaKernel::kMma, simt = sm::SparseMlaKernel::kSimt;
  for (const AttentionCase& c : std::vector<AttentionCase>{
           {"flash window only", 64, 0, fp8, mma, 0},
           {"flash ratio 4", 64, 4, fp8, mma, 512},
           {"flash ratio 128", 64, 128, fp8, mma, 0},
           {"flash window only", 64, 0, fp8, simt, 0},
           {"flash ratio 4", 64, 4, fp8, simt, 512},
           {"flash ratio 128", 64, 128, fp8, simt, 0},
           {"flash ratio 4 exact", 64, 4, f32, mma, 512},
           {"flash ratio 128 exact", 64, 128, f32, mma, 0},
           {"tiny ratio 4 (heads padded to 16)", 8, 4, fp8, mma, 16},
           {"TP 4 rank ratio 4", 16, 4, fp8, mma, 512},
           {"20 heads ratio 128 (padded to 32)", 20, 128, fp8, mma, 0},
           {"tiny ratio 128 exact", 8, 128, f32, mma, 0},
       }) {
    RunAttention(c);
  }
}

// ---- host-side validation (nothing is launched, so no GPU is needed) ----

TEST(AttentionOps, LaunchersRejectBadArguments) {
  int32_t ints[4] = {0, 0, 0, 0};
  float f[4] = {};
  alignas(16) static uint8_t pool[64] = {};
  const StepIndex step{.pos = ints, .seq = ints, .seq_first = ints, .seq_len = ints, .state_slot = ints, .t = 1,
                       .b = 1};
  const BlockTables tables{.pages = ints, .stride = 1};
  // An FP8 pool holds 512-dim rows.
  const KvCacheView fp8_128{.base = pool, .format = KvFormat::kFp8Row584, .dim = 128, .page_rows = 64,
                            .page_bytes = sm::KvPageStrideBytes(64)};
  EXPECT_EQ(LaunchKvWindowWrite({.rows = f, .cache = fp8_128, .step = step, .tables = tables}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  // Zero tokens: nothing to do.
  EXPECT_TRUE(LaunchKvWindowWrite({.rows = f, .cache = fp8_128, .step = {.t = 0}, .tables = tables}, nullptr).ok());
  // The FP8 attention path needs the plan Reserve makes.
  const KvCacheView fp8{.base = pool, .format = KvFormat::kFp8Row584, .dim = 512, .page_rows = 64,
                        .page_bytes = sm::KvPageStrideBytes(64)};
  const absl::Status no_plan =
      LaunchAttention({.q = f, .window = fp8, .window_tables = tables, .compressed = {}, .compressed_tables = {},
                       .step = step, .sink = f, .out = f, .heads = 64, .dim = 512, .scale = 0.04f},
                      {}, nullptr);
  EXPECT_EQ(no_plan.code(), absl::StatusCode::kFailedPrecondition) << no_plan;
  // Attention: ratio 4 needs the indexer's selection.
  EXPECT_EQ(LaunchAttention({.q = f, .window = fp8, .window_tables = tables, .compressed = fp8,
                             .compressed_tables = {}, .compressed_ratio = 4, .step = step, .sink = f, .out = f,
                             .heads = 64, .dim = 512, .scale = 0.04f},
                            {}, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Compressor: d must be the pool's.
  const KvCacheView f32_128{.base = pool, .format = KvFormat::kF32, .dim = 128, .page_rows = 1, .page_bytes = 512};
  EXPECT_EQ(LaunchCompressor({.state_kv = f, .state_score = f, .state_stride = 1 << 20, .kv = f, .gate = f, .ape = f,
                              .norm_w = f, .inv_freq = f, .cache = f32_128, .tables = tables, .step = step,
                              .ratio = 4, .d = 512},
                             nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Indexer: k >= 1, and kF32 rows of the indexer's dims.
  const IndexerArgs indexer{.q = f, .w = f, .cache = f32_128, .index_tables = tables, .target_tables = tables,
                            .step = step, .selected = ints, .selected_count = ints, .heads = 64, .dim = 128, .k = 0};
  EXPECT_EQ(LaunchIndexer(indexer, {}, nullptr).code(), absl::StatusCode::kInvalidArgument);
  IndexerArgs fp8_indexer = indexer;
  fp8_indexer.k = 512;
  fp8_indexer.cache = fp8;
  EXPECT_EQ(LaunchIndexer(fp8_indexer, {}, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsv4::kernels::cuda::testing
