// dsv4-cpu-step-bench: decode steps of a synthetic model with the tiny config's shapes (configs/tiny.json:
// hidden 512, 8 heads of 512, q/o LoRA 256 in 2 groups, compress ratios 0/0/4/128, indexer 8 x 128 top-16,
// 8 experts top-2 of 256 + a shared one, vocabulary 4096) run on the CPU backend's ops alone, B sequences
// one token each per step. It isolates the backend from the model and the engine: how decode tokens/s grows
// with the batch (issue 12 item 7). Weights are random fp32; the op sequence is the forward's.
//
//   dsv4-cpu-step-bench --batches=1,8,32 --threads=2 --context=100 --steps=30
//
// Prints per batch: wall ms/step and tokens/s, CPU ms/step (all threads; less sensitive to a busy machine).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/cpu/cpu_backend.h"

ABSL_FLAG(std::string, batches, "1,8,32", "comma-separated batch sizes (sequences per decode step)");
ABSL_FLAG(int, threads, 2, "CPU backend threads");
ABSL_FLAG(int, context, 100, "positions decoded before timing starts");
ABSL_FLAG(int, steps, 30, "timed decode steps per batch");

namespace dsv4::kernels::cpu {
namespace {

constexpr int64_t D = 512, S = 4, H = 8, Dh = 512, QL = 256, G = 2, OL = 256, V = 4096, W = 128, IH = 8,
                  ID = 128, Ksel = 16, E = 8, Ek = 2, I = 256, L = 4, kMaxContext = 4096;
constexpr int P = 64, kPairs = 32;
constexpr int kRatio[L] = {0, 0, 4, 128};

std::mt19937 rng(1);

std::vector<float> Rand(int64_t n, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

LinearHandle Weight(Backend& be, int64_t n, int64_t k) {
  const std::vector<float> w = Rand(n * k, 0.05f);
  return std::move(be.PrepareLinear({.name = "w", .format = WeightFormat::kF32, .n = n, .k = k,
                                     .data = reinterpret_cast<const uint8_t*>(w.data())}))
      .value();
}

struct LayerWeights {
  LinearHandle wq_a, wq_b, wkv, comp_kv, comp_gate, idx_q, idx_w, idx_kv, idx_gate, wo_a, wo_b, gate, s1, s3, s2;
  ExpertsHandle experts;
};

struct Model {
  std::vector<LayerWeights> layers = std::vector<LayerWeights>(L);
  LinearHandle embed, head;
  std::vector<float> hc_fn = Rand((2 + S) * S * S * D, 0.02f), hc_base = Rand((2 + S) * S, 1.f),
                     hc_scale = Rand(3, 1.f), norm = Rand(2 * Dh, 1.f), ape = Rand(128 * 2 * Dh, 1.f),
                     sink = Rand(H, 1.f), bias = Rand(E, 1.f), inv_freq;

  explicit Model(Backend& be) {
    for (int i = 0; i < kPairs; ++i) inv_freq.push_back(std::pow(10000.f, -static_cast<float>(i) / kPairs));
    embed = Weight(be, V, D);
    head = Weight(be, V, D);
    for (int l = 0; l < L; ++l) {
      LayerWeights& w = layers[l];
      const int64_t c = kRatio[l] == 4 ? 2 : 1;
      w.wq_a = Weight(be, QL, D), w.wq_b = Weight(be, H * Dh, QL), w.wkv = Weight(be, Dh, D);
      if (kRatio[l] != 0) w.comp_kv = Weight(be, c * Dh, D), w.comp_gate = Weight(be, c * Dh, D);
      if (kRatio[l] == 4) {
        w.idx_q = Weight(be, IH * ID, QL), w.idx_w = Weight(be, IH, D);
        w.idx_kv = Weight(be, 2 * ID, D), w.idx_gate = Weight(be, 2 * ID, D);
      }
      w.wo_a = Weight(be, G * OL, H * Dh / G), w.wo_b = Weight(be, D, G * OL);
      w.gate = Weight(be, E, D), w.s1 = Weight(be, I, D), w.s3 = Weight(be, I, D), w.s2 = Weight(be, D, I);
      std::vector<std::vector<float>> data;
      std::vector<WeightView> v1, v3, v2;
      for (int64_t e = 0; e < 3 * E; ++e) data.push_back(Rand(I * D, 0.05f));
      for (int64_t e = 0; e < E; ++e) {
        auto view = [&](int64_t m, int64_t n, int64_t k) {
          return WeightView{.name = "expert", .format = WeightFormat::kF32, .n = n, .k = k,
                            .data = reinterpret_cast<const uint8_t*>(data[3 * e + m].data())};
        };
        v1.push_back(view(0, I, D)), v3.push_back(view(1, I, D)), v2.push_back(view(2, D, I));
      }
      w.experts = std::move(be.PrepareExperts(v1, v3, v2)).value();
    }
  }
};

// KV pools, compressor state, block tables and activations for B sequences (one token each per step).
struct Batch {
  int64_t b;
  std::vector<std::vector<uint8_t>> window, comp, index;
  std::vector<std::vector<float>> state_kv, state_score, idx_kv, idx_score;
  std::vector<int32_t> window_pages, comp_pages, pos, seq, first, len, slot, tokens, rows, sel, sel_count;
  std::vector<float> x, x2, a, post, comb, cq, q, kv, ckv, cgate, iq, iw, ikv, igate, o, z, y, h, logits;

  explicit Batch(int64_t b_) : b(b_) {
    const int64_t wp = W / P, cp = kMaxContext / 4 / P;
    for (int l = 0; l < L; ++l) {
      window.emplace_back((b * wp + (b + P - 1) / P) * KvPageBytes(KvFormat::kF32, Dh, P));
      comp.emplace_back(b * cp * KvPageBytes(KvFormat::kF32, Dh, P));
      index.emplace_back(b * cp * KvPageBytes(KvFormat::kF32, ID, P));
      const int64_t r = kRatio[l], c = r == 4 ? 2 : 1;
      state_kv.emplace_back(b * c * r * c * Dh, 0.f), state_score.emplace_back(b * c * r * c * Dh, -INFINITY);
      idx_kv.emplace_back(b * 8 * 2 * ID, 0.f), idx_score.emplace_back(b * 8 * 2 * ID, -INFINITY);
    }
    for (int64_t s = 0; s < b; ++s) {
      for (int64_t i = 0; i < wp; ++i) window_pages.push_back(static_cast<int32_t>(s * wp + i));
      for (int64_t i = 0; i < cp; ++i) comp_pages.push_back(static_cast<int32_t>(s * cp + i));
      first.push_back(static_cast<int32_t>(s)), len.push_back(1), slot.push_back(static_cast<int32_t>(s));
      seq.push_back(static_cast<int32_t>(s)), rows.push_back(static_cast<int32_t>(s)), tokens.push_back(7);
    }
    pos.assign(b, 0);
    for (auto* v : {&x, &x2}) v->resize(b * S * D);
    for (auto* v : {&a, &y, &h}) v->resize(b * D);
    post.resize(b * S), comb.resize(b * S * S), cq.resize(b * QL), q.resize(b * H * Dh), kv.resize(b * Dh);
    ckv = Rand(b * 2 * Dh, 1.f), cgate = Rand(b * 2 * Dh, 1.f), ikv = Rand(b * 2 * ID, 1.f);
    igate = Rand(b * 2 * ID, 1.f), iq.resize(b * IH * ID), iw.resize(b * IH), o.resize(b * H * Dh);
    z.resize(b * G * OL), logits.resize(b * V), sel.resize(b * Ksel), sel_count.resize(b);
  }
  KvCacheView View(std::vector<uint8_t>& pool, int64_t dim) {
    return {.base = pool.data(), .format = KvFormat::kF32, .dim = static_cast<int>(dim), .page_rows = P,
            .page_bytes = KvPageBytes(KvFormat::kF32, static_cast<int>(dim), P)};
  }
};

void Step(Ops& ops, Model& m, Batch& bt) {
  const int64_t T = bt.b;
  const StepIndex st{.pos = bt.pos.data(), .seq = bt.seq.data(), .seq_first = bt.first.data(),
                     .seq_len = bt.len.data(), .state_slot = bt.slot.data(), .t = T, .b = T, .max_seq_len = 1};
  const BlockTables wt{.pages = bt.window_pages.data(), .stride = W / P};
  const BlockTables ct{.pages = bt.comp_pages.data(), .stride = kMaxContext / 4 / P};
  auto linear = [&](const LinearHandle& w, const float* x, float* y) {
    ops.Linear({.w = w.get(), .x = {.data = x}, .y = y, .t = T});
  };
  auto norm = [&](float* x, int64_t rows, int64_t dim, bool weighted) {
    ops.RmsNorm({.x = x, .w = weighted ? m.norm.data() : nullptr, .out = x, .rows = rows, .dim = dim});
  };
  auto rope = [&](float* x, int64_t heads, int64_t dim, bool inverse) {
    ops.Rope({.x = x, .pos = st.pos, .inv_freq = m.inv_freq.data(), .t = T, .heads = heads, .row_dim = dim,
              .pairs = kPairs, .inverse = inverse});
  };
  auto hc_pre = [&](const float* x) {
    ops.HcPre({.x = x, .fn = m.hc_fn.data(), .base = m.hc_base.data(), .scale = m.hc_scale.data(), .u = bt.a.data(),
               .post = bt.post.data(), .comb = bt.comb.data(), .t = T, .s = S, .d = D});
    norm(bt.a.data(), T, D, true);
  };
  auto hc_post = [&](const float* x, float* out) {
    ops.HcPost({.x = x, .y = bt.y.data(), .post = bt.post.data(), .comb = bt.comb.data(), .x_out = out, .t = T,
                .s = S, .d = D});
  };
  ops.Embed({.table = m.embed.get(), .tokens = bt.tokens.data(), .pos = st.pos, .x = bt.x.data(), .t = T, .s = S});
  for (int l = 0; l < L; ++l) {
    LayerWeights& w = m.layers[l];
    const int r = kRatio[l];
    const int64_t c = r == 4 ? 2 : 1;
    const KvCacheView window = bt.View(bt.window[l], Dh), comp = bt.View(bt.comp[l], Dh), index = bt.View(bt.index[l], ID);
    hc_pre(bt.x.data());
    linear(w.wq_a, bt.a.data(), bt.cq.data()), norm(bt.cq.data(), T, QL, true);
    linear(w.wq_b, bt.cq.data(), bt.q.data()), norm(bt.q.data(), T * H, Dh, false), rope(bt.q.data(), H, Dh, false);
    linear(w.wkv, bt.a.data(), bt.kv.data()), norm(bt.kv.data(), T, Dh, true), rope(bt.kv.data(), 1, Dh, false);
    if (r != 0) linear(w.comp_kv, bt.a.data(), bt.ckv.data()), linear(w.comp_gate, bt.a.data(), bt.cgate.data());
    if (r == 4) {
      linear(w.idx_q, bt.cq.data(), bt.iq.data()), rope(bt.iq.data(), IH, ID, false);
      linear(w.idx_w, bt.a.data(), bt.iw.data());
      linear(w.idx_kv, bt.a.data(), bt.ikv.data()), linear(w.idx_gate, bt.a.data(), bt.igate.data());
    }
    KvWindowWriteArgs kw{.rows = bt.kv.data(), .cache = window, .step = st, .tables = wt,
                         .staging_row0 = static_cast<int32_t>(T * W), .window = W};
    ops.KvWindowWrite(kw);
    if (r != 0) {
      ops.Compressor({.state_kv = bt.state_kv[l].data(), .state_score = bt.state_score[l].data(),
                      .state_stride = c * r * c * Dh, .kv = bt.ckv.data(), .gate = bt.cgate.data(),
                      .ape = m.ape.data(), .norm_w = m.norm.data(), .inv_freq = m.inv_freq.data(), .cache = comp,
                      .tables = ct, .step = st, .ratio = r, .d = Dh, .pairs = kPairs});
    }
    if (r == 4) {
      ops.Compressor({.state_kv = bt.idx_kv[l].data(), .state_score = bt.idx_score[l].data(),
                      .state_stride = 8 * 2 * ID, .kv = bt.ikv.data(), .gate = bt.igate.data(), .ape = m.ape.data(),
                      .norm_w = m.norm.data(), .inv_freq = m.inv_freq.data(), .cache = index, .tables = ct,
                      .step = st, .ratio = 4, .d = ID, .pairs = kPairs});
      ops.Indexer({.q = bt.iq.data(), .w = bt.iw.data(), .weight_scale = 0.03f, .cache = index, .index_tables = ct,
                   .target_tables = ct, .step = st, .selected = bt.sel.data(), .selected_count = bt.sel_count.data(),
                   .heads = IH, .dim = ID, .k = Ksel, .max_rows = kMaxContext / 4});
    }
    ops.Attention({.q = bt.q.data(), .window = window, .window_tables = wt, .staging_row0 = static_cast<int32_t>(T * W),
                   .window_size = W, .compressed = comp, .compressed_tables = ct, .compressed_ratio = r,
                   .selected = bt.sel.data(), .selected_count = bt.sel_count.data(), .ksel = Ksel,
                   .max_compressed = r == 4 ? Ksel : kMaxContext / 128, .step = st, .sink = m.sink.data(),
                   .out = bt.o.data(), .heads = H, .dim = Dh, .scale = 0.044f});
    kw.commit = true;
    ops.KvWindowWrite(kw);
    rope(bt.o.data(), H, Dh, true);
    ops.Linear({.w = w.wo_a.get(), .x = {.data = bt.o.data()}, .y = bt.z.data(), .t = T, .groups = G});
    linear(w.wo_b, bt.z.data(), bt.y.data());
    hc_post(bt.x.data(), bt.x2.data());
    hc_pre(bt.x2.data());
    ops.Moe({.x = bt.a.data(), .tokens = bt.tokens.data(), .pos = st.pos, .gate = w.gate.get(), .bias = m.bias.data(),
             .experts = w.experts.get(), .shared_w1 = w.s1.get(), .shared_w3 = w.s3.get(), .shared_w2 = w.s2.get(),
             .y = bt.y.data(), .t = T, .topk = Ek});
    hc_post(bt.x2.data(), bt.x.data());
  }
  ops.HcHead({.x = bt.x.data(), .rows = bt.rows.data(), .fn = m.hc_fn.data(), .base = m.hc_base.data(),
              .scale = m.hc_scale.data(), .h = bt.h.data(), .r = T, .s = S, .d = D});
  norm(bt.h.data(), T, D, true);
  linear(m.head, bt.h.data(), bt.logits.data());
  for (int32_t& p : bt.pos) ++p;
}

double CpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

}  // namespace
}  // namespace dsv4::kernels::cpu

int main(int argc, char** argv) {
  using namespace dsv4::kernels;
  using namespace dsv4::kernels::cpu;
  absl::ParseCommandLine(argc, argv);
  const int steps = absl::GetFlag(FLAGS_steps), context = absl::GetFlag(FLAGS_context);
  auto be = MakeCpuBackend(absl::GetFlag(FLAGS_threads));
  Model model(*be);
  std::printf("%s, tiny-config shapes, context %d\n", be->name().c_str(), context);
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_batches), ',')) {
    int64_t b = 0;
    if (!absl::SimpleAtoi(s, &b) || b < 1) {
      std::fprintf(stderr, "bad --batches entry '%s'\n", std::string(s).c_str());
      return 2;
    }
    Batch batch(b);
    const absl::Status reserved =
        be->Reserve({.max_tokens = b, .max_seqs = b, .max_context = kMaxContext, .hidden = D, .hc_mult = S,
                     .heads = H, .head_dim = Dh, .window = W, .index_heads = IH, .index_dim = ID, .index_topk = Ksel,
                     .experts = E, .experts_per_token = Ek, .moe_inter = I, .shared_inter = I, .vocab = V});
    if (!reserved.ok()) return std::fprintf(stderr, "%s\n", reserved.ToString().c_str()), 1;
    for (int i = 0; i < context; ++i) Step(be->ops(), model, batch);
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = CpuSeconds();
    for (int i = 0; i < steps; ++i) Step(be->ops(), model, batch);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
    const double cpu = (CpuSeconds() - c0) / steps;
    const absl::Status s2 = be->Synchronize();
    if (!s2.ok()) return std::fprintf(stderr, "%s\n", s2.ToString().c_str()), 1;
    std::printf("batch %3ld: %7.2f ms/step wall, %7.1f tok/s; %7.2f ms CPU/step, %7.1f tok/CPU-s\n",
                static_cast<long>(b), wall * 1e3, b / wall, cpu * 1e3, b / cpu);
  }
  return 0;
}
