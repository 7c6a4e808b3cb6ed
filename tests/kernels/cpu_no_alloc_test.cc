// After Backend::Reserve, no CPU op heap-allocates: every op of ops.h runs in the order a production-mode
// layer runs them (FP8 window and compressed rows, Hadamard + FP4 indexer), over a prefill step of two
// sequences and then decode steps with a padding token, on a two-thread pool, while global operator new is
// counted (alloc_counter.h). The count must be 0 from the very first call after Reserve.
#include <cmath>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/alloc_counter.h"
#include "tests/kernels/cpu_test_util.h"

namespace dsv4::kernels::cpu {
namespace {

using testing::F32Weight;
using testing::HostPool;
using testing::HostStep;
using testing::HostTables;
using testing::Rand;

constexpr int64_t T = 8, B = 3, Ctx = 1024, D = 64, S = 4, H = 2, Dh = 512, W = 128, IH = 4, ID = 64, Ksel = 8;
constexpr int64_t E = 4, Ek = 2, I = 32, Is = 32, V = 50;
constexpr int P = 64;

struct Layer {
  std::mt19937 rng{5};
  std::unique_ptr<Backend> be = MakeCpuBackend(2);
  // Weights.
  LinearHandle embed, wq, wkv, wcomp, widxq, wo, gate, s1, s3, s2;
  ExpertsHandle experts;
  std::vector<std::vector<float>> expert_data;
  std::vector<float> fn = Rand((2 + S) * S * S * D, rng, 0.05f), base = Rand((2 + S) * S, rng),
                     scale = Rand(3, rng), norm = Rand(Dh, rng), ape = Rand(4 * 2 * Dh, rng),
                     ape128 = Rand(128 * Dh, rng), sink = Rand(H, rng), bias = Rand(E, rng), inv_freq;
  // Pools: window (+ staging), compressed ratio 4 / 128, indexer; tables with one row per sequence slot.
  HostPool window{KvFormat::kFp8Row584, Dh, P, B * (W / P) + 1}, comp4{KvFormat::kFp8Row584, Dh, P, 2 * 4},
      comp128{KvFormat::kFp8Row584, Dh, P, 2}, index{KvFormat::kF32, ID, P, 2 * 4};
  HostTables wtab{B, W / P}, c4tab{B, 4}, c128tab{B, 1}, itab{B, 4};
  std::vector<float> st4kv, st4sc, sti_kv, sti_sc, st128kv, st128sc;
  // Activations.
  std::vector<int32_t> tokens = std::vector<int32_t>(T, 3), rows = {0, 1}, sel = std::vector<int32_t>(T * Ksel),
                       sel_count = std::vector<int32_t>(T);
  std::vector<float> x = std::vector<float>(T * S * D), x2 = x, u = std::vector<float>(T * D),
                     post = std::vector<float>(T * S), comb = std::vector<float>(T * S * S),
                     q = std::vector<float>(T * H * Dh), kv = std::vector<float>(T * Dh),
                     ckv = Rand(T * 2 * Dh, rng), cgate = Rand(T * 2 * Dh, rng), ikv = Rand(T * 2 * ID, rng),
                     igate = Rand(T * 2 * ID, rng), k128 = Rand(T * Dh, rng), g128 = Rand(T * Dh, rng),
                     iq = std::vector<float>(T * IH * ID), iw = Rand(T * IH, rng), o = std::vector<float>(T * H * Dh),
                     o2 = std::vector<float>(T * H * Dh), z = std::vector<float>(T * 2 * 16), y = std::vector<float>(T * D),
                     h = std::vector<float>(2 * D), logits = Rand(2 * V, rng);
  std::vector<SampleParams> sampling = {{.temperature = 0.8f, .top_k = 10, .top_p = 0.9f, .seed = 1},
                                        {.temperature = 1.0f, .min_p = 0.1f, .seed = 2}};
  std::vector<int32_t> sampled = std::vector<int32_t>(2);

  Layer() {
    for (int i = 0; i < 32; ++i) inv_freq.push_back(std::pow(10000.f, -i / 32.f));
    embed = F32Weight(*be, Rand(V * D, rng), V, D);
    wq = F32Weight(*be, Rand(H * Dh * D, rng, 0.1f), H * Dh, D);
    wkv = F32Weight(*be, Rand(Dh * D, rng, 0.1f), Dh, D);
    widxq = F32Weight(*be, Rand(IH * ID * D, rng, 0.1f), IH * ID, D);
    wo = F32Weight(*be, Rand(2 * 16 * Dh, rng, 0.1f), 2 * 16, Dh);  // two groups of [16, Dh]
    gate = F32Weight(*be, Rand(E * D, rng), E, D);
    s1 = F32Weight(*be, Rand(Is * D, rng), Is, D);
    s3 = F32Weight(*be, Rand(Is * D, rng), Is, D);
    s2 = F32Weight(*be, Rand(D * Is, rng), D, Is);
    std::vector<WeightView> v1, v3, v2;
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t m = 0; m < 3; ++m) expert_data.push_back(Rand(I * D, rng));
      auto view = [&](int64_t m, int64_t n, int64_t k) {
        return WeightView{.name = "e", .format = WeightFormat::kF32, .n = n, .k = k,
                          .data = reinterpret_cast<const uint8_t*>(expert_data[e * 3 + m].data())};
      };
      v1.push_back(view(0, I, D)), v3.push_back(view(1, I, D)), v2.push_back(view(2, D, I));
    }
    experts = std::move(be->PrepareExperts(v1, v3, v2)).value();
    for (int64_t b = 0; b < B; ++b) {
      for (int i = 0; i < W / P; ++i) wtab.at(b, i) = static_cast<int32_t>(b * (W / P) + i);
      for (int i = 0; i < 4; ++i) c4tab.at(b, i) = itab.at(b, i) = static_cast<int32_t>((b % 2) * 4 + i);
      c128tab.at(b, 0) = static_cast<int32_t>(b % 2);
    }
    const int64_t st4 = 8 * 2 * Dh, sti = 8 * 2 * ID, st128 = 128 * Dh;
    st4kv.resize(2 * st4), st4sc.resize(2 * st4), sti_kv.resize(2 * sti), sti_sc.resize(2 * sti);
    st128kv.resize(2 * st128), st128sc.resize(2 * st128);
    EXPECT_TRUE(be->Reserve({.max_tokens = T, .max_seqs = B, .max_context = Ctx, .hidden = D, .hc_mult = S,
                             .heads = H, .head_dim = Dh, .window = W, .index_heads = IH, .index_dim = ID,
                             .index_topk = Ksel, .experts = E, .experts_per_token = Ek, .moe_inter = I,
                             .shared_inter = Is, .vocab = V})
                    .ok());
    Ops& ops = be->ops();  // state resets, as a new sequence gets
    for (auto* st : {&st4kv, &sti_kv, &st128kv}) ops.Fill({.x = st->data(), .n = static_cast<int64_t>(st->size())});
    for (auto* st : {&st4sc, &sti_sc, &st128sc}) {
      ops.Fill({.x = st->data(), .n = static_cast<int64_t>(st->size()), .value = -INFINITY});
    }
  }

  void Step(const HostStep& hs) {
    Ops& ops = be->ops();
    const StepIndex st = hs.view();
    const int64_t t = hs.t();
    const int32_t staging0 = static_cast<int32_t>(B * W);  // the page after every sequence's ring
    ops.Embed({.table = embed.get(), .tokens = tokens.data(), .pos = st.pos, .x = x.data(), .t = t, .s = S});
    ops.HcPre({.x = x.data(), .fn = fn.data(), .base = base.data(), .scale = scale.data(), .u = u.data(),
               .post = post.data(), .comb = comb.data(), .t = t, .s = S, .d = D});
    ops.RmsNorm({.x = u.data(), .w = nullptr, .out = u.data(), .rows = t, .dim = D});
    ops.Linear({.w = wq.get(), .x = {.data = u.data()}, .y = q.data(), .t = t});
    ops.Rope({.x = q.data(), .pos = st.pos, .inv_freq = inv_freq.data(), .t = t, .heads = H, .row_dim = Dh});
    ops.Linear({.w = wkv.get(), .x = {.data = u.data()}, .y = kv.data(), .t = t});
    ops.Linear({.w = widxq.get(), .x = {.data = u.data()}, .y = iq.data(), .t = t});
    ops.HadamardFp4({.x = iq.data(), .rows = t * IH, .dim = ID});
    ops.Scale({.x = iw.data(), .rows = t, .dim = IH, .scale = 0.5f});
    KvWindowWriteArgs kw{.rows = kv.data(), .cache = window.view, .step = st, .tables = wtab.view(),
                         .staging_row0 = staging0, .window = W};
    ops.KvWindowWrite(kw);
    ops.Compressor({.state_kv = st4kv.data(), .state_score = st4sc.data(), .state_stride = 8 * 2 * Dh,
                    .kv = ckv.data(), .gate = cgate.data(), .ape = ape.data(), .norm_w = norm.data(),
                    .inv_freq = inv_freq.data(), .cache = comp4.view, .tables = c4tab.view(), .step = st,
                    .ratio = 4, .d = Dh});
    ops.Compressor({.state_kv = sti_kv.data(), .state_score = sti_sc.data(), .state_stride = 8 * 2 * ID,
                    .kv = ikv.data(), .gate = igate.data(), .ape = ape.data(), .norm_w = norm.data(),
                    .inv_freq = inv_freq.data(), .cache = index.view, .tables = itab.view(), .step = st, .ratio = 4,
                    .d = ID, .hadamard_fp4 = true});
    ops.Compressor({.state_kv = st128kv.data(), .state_score = st128sc.data(), .state_stride = 128 * Dh,
                    .kv = k128.data(), .gate = g128.data(), .ape = ape128.data(), .norm_w = norm.data(),
                    .inv_freq = inv_freq.data(), .cache = comp128.view, .tables = c128tab.view(), .step = st,
                    .ratio = 128, .d = Dh});
    ops.Indexer({.q = iq.data(), .w = iw.data(), .weight_scale = 0.1f, .cache = index.view,
                 .index_tables = itab.view(), .target_tables = c4tab.view(), .step = st, .selected = sel.data(),
                 .selected_count = sel_count.data(), .heads = IH, .dim = ID, .k = Ksel, .max_rows = Ctx / 4});
    ops.Attention({.q = q.data(), .window = window.view, .window_tables = wtab.view(), .staging_row0 = staging0,
                   .window_size = W, .compressed = comp4.view, .compressed_tables = {}, .compressed_ratio = 4, .selected = sel.data(),
                   .selected_count = sel_count.data(), .ksel = Ksel, .max_compressed = Ksel, .step = st,
                   .sink = sink.data(), .out = o.data(), .heads = H, .dim = Dh, .scale = 0.04f});
    ops.Attention({.q = q.data(), .window = window.view, .window_tables = wtab.view(), .staging_row0 = staging0,
                   .window_size = W, .compressed = comp128.view, .compressed_tables = c128tab.view(),
                   .compressed_ratio = 128, .max_compressed = Ctx / 128, .step = st, .sink = sink.data(),
                   .out = o2.data(), .heads = H, .dim = Dh, .scale = 0.04f});
    kw.commit = true;
    ops.KvWindowWrite(kw);
    ops.Rope({.x = o.data(), .pos = st.pos, .inv_freq = inv_freq.data(), .t = t, .heads = H, .row_dim = Dh,
              .inverse = true});
    ops.Linear({.w = wo.get(), .x = {.data = o.data()}, .y = z.data(), .t = t, .groups = 2});
    ops.HcPost({.x = x.data(), .y = y.data(), .post = post.data(), .comb = comb.data(), .x_out = x2.data(), .t = t,
                .s = S, .d = D});
    ops.Moe({.x = u.data(), .tokens = tokens.data(), .pos = st.pos, .gate = gate.get(), .bias = bias.data(),
             .experts = experts.get(), .shared_w1 = s1.get(), .shared_w3 = s3.get(), .shared_w2 = s2.get(),
             .y = y.data(), .t = t, .topk = Ek});
    ops.HcHead({.x = x2.data(), .rows = rows.data(), .fn = fn.data(), .base = base.data(), .scale = scale.data(),
                .h = h.data(), .r = 2, .s = S, .d = D});
    ops.Sample({.logits = logits.data(), .params = sampling.data(), .tokens = sampled.data(), .r = 2, .v = V});
  }
};

TEST(CpuNoAllocTest, NoOpAllocatesAfterReserve) {
  Layer layer;
  std::vector<HostStep> steps(5);
  steps[0].AddSeq(500, 5, 0);  // prefill chunks of two sequences (crossing ratio-4 and ratio-128 emissions)
  steps[0].AddSeq(100, 3, 1);
  for (int i = 1; i < 5; ++i) {  // decode, with a padding token
    steps[i].AddSeq(505 + i - 1, 1, 0);
    steps[i].AddPadding();
    steps[i].AddSeq(103 + i - 1, 1, 1);
  }
  dsv4::testing::StartCountingAllocations();
  for (const HostStep& s : steps) layer.Step(s);
  const int64_t allocations = dsv4::testing::StopCountingAllocations();
  EXPECT_EQ(allocations, 0);
  ASSERT_TRUE(layer.be->Synchronize().ok());
  // The count works: an allocation between Start and Stop is seen.
  dsv4::testing::StartCountingAllocations();
  auto* p = new std::vector<int>(3);
  EXPECT_GE(dsv4::testing::StopCountingAllocations(), 1);
  delete p;
}

}  // namespace
}  // namespace dsv4::kernels::cpu
