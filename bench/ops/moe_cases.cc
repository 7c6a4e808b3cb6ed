// The MoE family of dsv4-ops-bench: the whole Moe op (router, routed experts, shared expert, combine) of one score
// layer, E experts top-Ek, experts [0, held) on this rank, NVFP4 or MXFP4, at each T of --moe_tokens. Routing is
// random (random bf16 gate, random x in [-1, 1], small random bias). Input sets differ in x (so in the routed
// experts) and each has its own copy of the gate and shared expert, so a replay streams well over the L2.
// Bytes moved per call = the held experts the step routes to (their packed codes + scales) + the shared expert
// (FP8) + the gate (bf16) + x read and y written (f32); the routed experts are counted by replaying the router
// on the host in float64 (a near-tie at the k-th score could make that one expert off).
//
// On the CUDA backend the routed half alone (router, the two grouped expert GEMMs, combine; no shared expert) is
// timed too, against the floor of issue 14: the bytes of the held experts the step touches over the copy
// bandwidth. Routing "random" is the score routing above; "skewed" is hash routing over a table where 20% of
// the experts (chosen at random) take 80% of the picks, each set with its own table.
#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/ops/bench.h"
#include "bench/ops/synth.h"
#include "common/float_formats.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/moe_internal.h"

namespace dsv4::bench {
namespace {

using kernels::WeightFormat;

// Experts each token routes to: top-Ek of sqrt(softplus(W_gate x)) + bias (ties: lower id), as ops.h defines.
std::vector<std::vector<int>> HostRoutes(const std::vector<float>& gate, const std::vector<float>& bias,
                                         const std::vector<float>& x, int64_t t, int64_t d, int64_t e, int topk) {
  std::vector<std::vector<int>> routes(static_cast<size_t>(t));
  std::vector<std::pair<double, int>> score(static_cast<size_t>(e));
  for (int64_t i = 0; i < t; ++i) {
    const float* xi = &x[static_cast<size_t>(i * d)];
    for (int64_t j = 0; j < e; ++j) {
      const float* g = &gate[static_cast<size_t>(j * d)];
      double l = 0;
      for (int64_t k = 0; k < d; ++k) l += static_cast<double>(g[k]) * xi[k];
      const double softplus = l > 20 ? l : std::log1p(std::exp(l));
      score[static_cast<size_t>(j)] = {-(std::sqrt(softplus) + bias[static_cast<size_t>(j)]), static_cast<int>(j)};
    }
    std::partial_sort(score.begin(), score.begin() + topk, score.end());
    for (int k = 0; k < topk; ++k) routes[static_cast<size_t>(i)].push_back(score[static_cast<size_t>(k)].second);
  }
  return routes;
}

// Held experts the first t tokens route to.
int Touched(const std::vector<std::vector<int>>& routes, int64_t t, int64_t held) {
  std::set<int> s;
  for (int64_t i = 0; i < t; ++i) {
    for (int e : routes[static_cast<size_t>(i)]) {
      if (e < held) s.insert(e);
    }
  }
  return static_cast<int>(s.size());
}

// One input set: its own x, gate and shared expert copies.
struct MoeSet {
  kernels::Buffer x;
  kernels::LinearHandle gate, w1, w3, w2;
  std::vector<std::vector<int>> routes;  // [T max] the host replay of the router
};

void RunFormat(Bench& b, WeightFormat format, int64_t max_t, uint64_t seed) {
  kernels::Backend& be = b.backend;
  const Shapes& s = b.shapes;
  const int64_t D = s.hidden, E = s.experts, held = std::min(s.experts_held, s.experts);
  const int topk = static_cast<int>(s.topk);
  const std::string op = format == WeightFormat::kNvfp4 ? "moe_nvfp4" : "moe_mxfp4";
  const std::string base = absl::StrFormat("E=%d top-%d, %d held, I=%d, shared %d", E, topk, held, s.moe_inter,
                                           s.shared_inter);
  kernels::ExpertsHandle experts;
  {
    const HostExperts hx = SynthExperts(format, E, D, s.moe_inter, 0, held, seed);
    absl::StatusOr<kernels::ExpertsHandle> ex = be.PrepareExperts(hx.w1, hx.w3, hx.w2);
    if (!ex.ok()) return b.Fail("moe", op, base, ex.status());
    experts = *std::move(ex);
  }
  const double expert_bytes = held > 0 ? static_cast<double>(experts->device_bytes()) / held : 0;
  const HostLinear gate = SynthLinear("ffn.gate", WeightFormat::kBF16, E, D, seed + 1);
  const HostLinear w1 = SynthLinear("ffn.shared_experts.w1", WeightFormat::kFp8Block128, s.shared_inter, D, seed + 2);
  const HostLinear w3 = SynthLinear("ffn.shared_experts.w3", WeightFormat::kFp8Block128, s.shared_inter, D, seed + 3);
  const HostLinear w2 = SynthLinear("ffn.shared_experts.w2", WeightFormat::kFp8Block128, D, s.shared_inter, seed + 4);
  std::vector<float> gate_f(static_cast<size_t>(E * D));
  for (size_t i = 0; i < gate_f.size(); ++i) {
    gate_f[i] = Bf16ToF32(reinterpret_cast<const uint16_t*>(gate.data.data())[i]);
  }
  std::vector<float> bias(static_cast<size_t>(E));
  Rng rng(seed + 5);
  for (float& v : bias) v = rng.Uniform(-0.05f, 0.05f);

  // Sets: enough for the rotation target at T = 1 (Ek experts per set), at least 4 so routing varies.
  const double fixed_guess = 2.0 * E * D + 3.0 * s.shared_inter * D;
  const int sets = b.runner.options().smoke ? 1 : std::clamp(b.SetsFor(topk * std::min<double>(1.0, double(held) / E) *
                                                                       expert_bytes + fixed_guess),
                                                              4, 16);
  std::vector<MoeSet> data(static_cast<size_t>(sets));
  double fixed_bytes = 0;  // gate + shared expert, as prepared
  for (int i = 0; i < sets; ++i) {
    MoeSet& m = data[static_cast<size_t>(i)];
    std::vector<float> x(static_cast<size_t>(max_t * D));
    for (float& v : x) v = rng.Uniform(-1.f, 1.f);
    m.routes = HostRoutes(gate_f, bias, x, max_t, D, E, topk);
    absl::StatusOr<kernels::Buffer> xb = UploadVector(be, x);
    absl::StatusOr<kernels::LinearHandle> g = be.PrepareLinear(gate.view), a = be.PrepareLinear(w1.view),
                                          c = be.PrepareLinear(w3.view), d = be.PrepareLinear(w2.view);
    for (const absl::Status& st : {xb.status(), g.status(), a.status(), c.status(), d.status()}) {
      if (!st.ok()) return b.Fail("moe", op, base, st);
    }
    m.x = *std::move(xb);
    m.gate = *std::move(g);
    m.w1 = *std::move(a);
    m.w3 = *std::move(c);
    m.w2 = *std::move(d);
    fixed_bytes = static_cast<double>(m.gate->device_bytes() + m.w1->device_bytes() + m.w3->device_bytes() +
                                      m.w2->device_bytes());
  }
  std::vector<int32_t> pos(static_cast<size_t>(max_t));
  for (int64_t i = 0; i < max_t; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  absl::StatusOr<kernels::Buffer> pos_b = UploadVector(be, pos);
  absl::StatusOr<kernels::Buffer> tokens_b = UploadVector(be, std::vector<int32_t>(static_cast<size_t>(max_t), 0));
  absl::StatusOr<kernels::Buffer> bias_b = UploadVector(be, bias, kernels::MemoryKind::kWeights);
  absl::StatusOr<kernels::Buffer> y = be.Allocate(max_t * D * 4, kernels::MemoryKind::kWorkspace);
  for (const absl::Status& st : {pos_b.status(), tokens_b.status(), bias_b.status(), y.status()}) {
    if (!st.ok()) return b.Fail("moe", op, base, st);
  }
  float* yp = y->as<float>();
  const kernels::ExpertWeights* ex = experts.get();

  for (int64_t t : b.sweep.moe_tokens) {
    std::vector<int> touched(static_cast<size_t>(sets));
    double mean_touched = 0;
    for (int i = 0; i < sets; ++i) {
      touched[static_cast<size_t>(i)] = Touched(data[static_cast<size_t>(i)].routes, t, held);
      mean_touched += touched[static_cast<size_t>(i)] / static_cast<double>(sets);
    }
    Case c{.family = "moe",
           .op = op,
           .shape = absl::StrFormat("%s T=%d", base, t),
           .params = {{"format", kernels::WeightFormatName(format)}, {"experts", E}, {"held", held}, {"topk", topk},
                      {"inter", s.moe_inter}, {"shared_inter", s.shared_inter}, {"t", t},
                      {"experts_touched_mean", mean_touched}},
           .max_sets = sets,
           .rotated_bytes_per_set = mean_touched * expert_bytes + fixed_bytes,
           .note = absl::StrFormat("%.1f experts touched per call", mean_touched)};
    const int32_t* posp = pos_b->as<const int32_t>();
    const int32_t* tokp = tokens_b->as<const int32_t>();
    const float* biasp = bias_b->as<const float>();
    c.enqueue = [&be, &data, &s, ex, posp, tokp, biasp, yp, t, topk](int i) {
      const MoeSet& m = data[static_cast<size_t>(i)];
      be.ops().Moe({.x = m.x.as<const float>(), .tokens = tokp, .pos = posp, .gate = m.gate.get(), .bias = biasp,
                    .tid2eid = nullptr, .experts = ex, .shared_w1 = m.w1.get(), .shared_w3 = m.w3.get(),
                    .shared_w2 = m.w2.get(), .y = yp, .t = t, .topk = topk, .routed_scale = s.routed_scale,
                    .swiglu_limit = s.swiglu_limit});
    };
    c.bytes = [touched, expert_bytes, fixed_bytes, t, D](int n) {
      double sum = 0;
      for (int i = 0; i < n; ++i) sum += touched[static_cast<size_t>(i)] * expert_bytes;
      return sum / n + fixed_bytes + 8.0 * t * D;
    };
    c.prepare = [&be, yp, t, D] {
      Poison(be, yp, t * D);
      return be.Synchronize();
    };
    c.check = [&be, yp, t, D] { return CheckFinite(be, yp, t * D, "y"); };
    b.Run(be, c);
  }
}


// A hash table [t, Ek] where each pick lands in a hot set of 20% of the experts with probability 0.8
// (distinct experts per token).
std::vector<int32_t> SkewedTable(int64_t t, int64_t e, int topk, const std::vector<int>& hot, Rng& rng) {
  std::vector<int32_t> table(static_cast<size_t>(t * topk));
  for (int64_t i = 0; i < t; ++i) {
    std::set<int> chosen;
    while (static_cast<int>(chosen.size()) < topk) {
      const int pick = rng.Uniform(0.f, 1.f) < 0.8f ? hot[static_cast<size_t>(rng.Int(static_cast<int64_t>(hot.size())))]
                                                    : static_cast<int>(rng.Int(e));
      chosen.insert(pick);
    }
    int k = 0;
    for (int pick : chosen) table[static_cast<size_t>(i * topk + k++)] = pick;
  }
  return table;
}

// The routed half alone (CUDA): moe::LaunchRouted with accumulate = false, floor = touched held experts.
void RunRouted(Bench& b, WeightFormat format, const kernels::ExpertsHandle& experts, int64_t max_t, uint64_t seed,
               const std::string& routing) {
  auto* cb = dynamic_cast<kernels::cuda::CudaBackend*>(&b.backend);
  if (cb == nullptr) return;
  kernels::Backend& be = b.backend;
  const Shapes& s = b.shapes;
  const int64_t D = s.hidden, E = s.experts, held = std::min(s.experts_held, s.experts);
  const int topk = static_cast<int>(s.topk);
  const bool skewed = routing == "skewed";
  const std::string op = std::string(format == WeightFormat::kNvfp4 ? "routed_nvfp4_" : "routed_mxfp4_") + routing;
  const std::string base = absl::StrFormat("E=%d top-%d, %d held, I=%d, %s", E, topk, held, s.moe_inter, routing);
  const auto* cex = dynamic_cast<const kernels::cuda::moe::CudaExperts*>(experts.get());
  const double expert_bytes = held > 0 ? static_cast<double>(cex->layout().bytes) : 0;
  const HostLinear gate = SynthLinear("ffn.gate", WeightFormat::kBF16, E, D, seed + 1);
  absl::StatusOr<kernels::LinearHandle> gate_h = be.PrepareLinear(gate.view);
  if (!gate_h.ok()) return b.Fail("moe", op, base, gate_h.status());
  const auto* cgate = dynamic_cast<const kernels::cuda::CudaLinearWeight*>(gate_h->get());
  std::vector<float> gate_f(static_cast<size_t>(E * D));
  for (size_t i = 0; i < gate_f.size(); ++i) {
    gate_f[i] = Bf16ToF32(reinterpret_cast<const uint16_t*>(gate.data.data())[i]);
  }
  Rng rng(seed + 5);
  std::vector<float> bias(static_cast<size_t>(E));
  for (float& v : bias) v = rng.Uniform(-0.05f, 0.05f);
  std::vector<int> hot;
  for (int64_t e = 0; e < E; ++e) {
    if (rng.Uniform(0.f, 1.f) < 0.2f) hot.push_back(static_cast<int>(e));
  }
  if (hot.empty()) hot.push_back(0);

  const int sets = b.runner.options().smoke ? 1 : std::clamp(b.SetsFor(topk * std::min<double>(1.0, double(held) / E) *
                                                                       expert_bytes), 4, 16);
  struct Set {
    kernels::Buffer x, table;
    std::vector<std::vector<int>> routes;
  };
  std::vector<Set> data(static_cast<size_t>(sets));
  for (int i = 0; i < sets; ++i) {
    Set& m = data[static_cast<size_t>(i)];
    std::vector<float> x(static_cast<size_t>(max_t * D));
    for (float& v : x) v = rng.Uniform(-1.f, 1.f);
    absl::StatusOr<kernels::Buffer> xb = UploadVector(be, x);
    if (!xb.ok()) return b.Fail("moe", op, base, xb.status());
    m.x = *std::move(xb);
    if (skewed) {
      const std::vector<int32_t> table = SkewedTable(max_t, E, topk, hot, rng);
      m.routes.resize(static_cast<size_t>(max_t));
      for (int64_t t = 0; t < max_t; ++t) {
        for (int k = 0; k < topk; ++k) m.routes[static_cast<size_t>(t)].push_back(table[static_cast<size_t>(t * topk + k)]);
      }
      absl::StatusOr<kernels::Buffer> tb = UploadVector(be, table, kernels::MemoryKind::kWeights);
      if (!tb.ok()) return b.Fail("moe", op, base, tb.status());
      m.table = *std::move(tb);
    } else {
      m.routes = HostRoutes(gate_f, bias, x, max_t, D, E, topk);
    }
  }
  std::vector<int32_t> pos(static_cast<size_t>(max_t));
  for (int64_t i = 0; i < max_t; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  const kernels::cuda::moe::ScratchPlan max_plan =
      kernels::cuda::moe::MakeScratchPlan(max_t, E, topk, D, s.moe_inter, 0);
  absl::StatusOr<kernels::Buffer> pos_b = UploadVector(be, pos);  // also the token ids of the hash table rows
  absl::StatusOr<kernels::Buffer> bias_b = UploadVector(be, bias, kernels::MemoryKind::kWeights);
  absl::StatusOr<kernels::Buffer> y = be.Allocate(max_t * D * 4, kernels::MemoryKind::kWorkspace);
  absl::StatusOr<kernels::Buffer> scratch = be.Allocate(max_plan.bytes, kernels::MemoryKind::kWorkspace);
  for (const absl::Status& st : {pos_b.status(), bias_b.status(), y.status(), scratch.status()}) {
    if (!st.ok()) return b.Fail("moe", op, base, st);
  }
  float* yp = y->as<float>();
  auto status = std::make_shared<absl::Status>();

  for (int64_t t : b.sweep.moe_tokens) {
    std::vector<int> touched(static_cast<size_t>(sets));
    double mean_touched = 0;
    for (int i = 0; i < sets; ++i) {
      touched[static_cast<size_t>(i)] = Touched(data[static_cast<size_t>(i)].routes, t, held);
      mean_touched += touched[static_cast<size_t>(i)] / static_cast<double>(sets);
    }
    absl::StatusOr<kernels::cuda::moe::ScratchPointers> sp = kernels::cuda::moe::CarveScratch(
        {.data = scratch->data(), .bytes = scratch->bytes()},
        kernels::cuda::moe::MakeScratchPlan(t, E, topk, D, s.moe_inter, 0));
    if (!sp.ok()) return b.Fail("moe", op, base, sp.status());
    Case c{.family = "moe",
           .op = op,
           .shape = absl::StrFormat("%s T=%d", base, t),
           .params = {{"format", kernels::WeightFormatName(format)}, {"experts", E}, {"held", held}, {"topk", topk},
                      {"inter", s.moe_inter}, {"routing", routing}, {"t", t},
                      {"experts_touched_mean", mean_touched}},
           .max_sets = sets,
           .rotated_bytes_per_set = mean_touched * expert_bytes,
           .note = absl::StrFormat("%.1f experts touched per call", mean_touched)};
    const int32_t* posp = pos_b->as<const int32_t>();
    const float* biasp = bias_b->as<const float>();
    const uint16_t* gate_rows = static_cast<const uint16_t*>(cgate->data());
    const kernels::cuda::moe::ScratchPointers ptrs = *sp;
    cudaStream_t stream = cb->stream();
    c.enqueue = [&data, &s, cex, gate_rows, ptrs, posp, biasp, yp, t, topk, skewed, stream, status](int i) {
      const Set& m = data[static_cast<size_t>(i)];
      const kernels::MoeArgs a{.x = m.x.as<const float>(), .tokens = posp, .pos = posp, .bias = skewed ? nullptr : biasp,
                               .tid2eid = skewed ? m.table.as<const int32_t>() : nullptr, .experts = cex, .y = yp,
                               .t = t, .topk = topk, .routed_scale = s.routed_scale, .swiglu_limit = s.swiglu_limit};
      const absl::Status st = kernels::cuda::moe::LaunchRouted(a, gate_rows, *cex, ptrs, /*accumulate=*/false, stream);
      if (!st.ok() && status->ok()) *status = st;
    };
    c.bytes = [touched, expert_bytes](int n) {
      double sum = 0;
      for (int i = 0; i < n; ++i) sum += touched[static_cast<size_t>(i)] * expert_bytes;
      return sum / n;
    };
    c.prepare = [&be, yp, t, D] {
      Poison(be, yp, t * D);
      return be.Synchronize();
    };
    c.check = [&be, yp, t, D, status] {
      if (!status->ok()) return *status;
      return CheckFinite(be, yp, t * D, "y");
    };
    b.Run(be, c);
  }
}

}  // namespace

void RunMoeCases(Bench& b) {
  int64_t max_t = 1;
  for (int64_t t : b.sweep.moe_tokens) max_t = std::max(max_t, t);
  uint64_t seed = b.seed * 2000;
  for (const std::string& f : b.sweep.moe_formats) {
    const WeightFormat format = f == "MXFP4" ? WeightFormat::kMxfp4 : WeightFormat::kNvfp4;
    seed += 31;
    if (b.sweep.moe_whole) RunFormat(b, format, max_t, seed);
    if (b.cuda && !b.sweep.moe_routings.empty()) {
      const Shapes& s = b.shapes;
      const int64_t held = std::min(s.experts_held, s.experts);
      const HostExperts hx = SynthExperts(format, s.experts, s.hidden, s.moe_inter, 0, held, seed + 7);
      absl::StatusOr<kernels::ExpertsHandle> ex = b.backend.PrepareExperts(hx.w1, hx.w3, hx.w2);
      if (!ex.ok()) {
        b.Fail("moe", "routed", f, ex.status());
        continue;
      }
      for (const std::string& r : b.sweep.moe_routings) RunRouted(b, format, *ex, max_t, seed + 7, r);
    }
  }
}

}  // namespace dsv4::bench
