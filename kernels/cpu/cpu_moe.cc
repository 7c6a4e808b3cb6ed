// CPU backend, mixture of experts: sqrt-softplus router (hash or biased top-k selection), SwiGLU experts with
// the clamp, shared expert. Each expert runs one blocked GEMM over all the step's tokens routed to it. Every
// token's routed sum runs over its experts in ascending id (experts are visited in that order and each adds
// into the token's accumulator), then the shared expert's output is added - whatever the batch.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_weights.h"

namespace dsv4::kernels::cpu {
namespace {

float Softplus(float v) { return v > 20.f ? v : std::log1p(std::exp(v)); }  // torch's threshold 20

// h[i] = silu(min(g, L)) * clamp(v, -L, L), in place into g.
void SwiGlu(float* g, const float* v, int64_t n, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = std::min(g[i], limit);
    const float vi = std::clamp(v[i], -limit, limit);
    g[i] = gi / (1.f + std::exp(-gi)) * vi;
  }
}

}  // namespace

void CpuOps::Moe(const MoeArgs& a) {
  const auto* gate = static_cast<const CpuLinearWeight*>(a.gate);
  const auto* ex = static_cast<const CpuExpertWeights*>(a.experts);
  const auto* s1 = static_cast<const CpuLinearWeight*>(a.shared_w1);
  const auto* s3 = static_cast<const CpuLinearWeight*>(a.shared_w3);
  const auto* s2 = static_cast<const CpuLinearWeight*>(a.shared_w2);
  if (gate == nullptr || ex == nullptr || s1 == nullptr || s3 == nullptr || s2 == nullptr) {
    return Fail(absl::InvalidArgumentError("Moe: gate, experts and the shared expert's weights are required"));
  }
  const int64_t E = gate->n(), D = gate->k(), I = ex->inter(), Is = s1->n(), T = a.t;
  const int k = a.topk;
  if (ex->experts() != E || ex->dim() != D || s1->k() != D || s3->n() != Is || s3->k() != D || s2->n() != D ||
      s2->k() != Is || k < 1 || k > E || (a.tid2eid == nullptr && a.bias == nullptr)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("Moe: shapes do not fit (gate [", E, ", ", D, "], experts ",
                                                        ex->experts(), " x [", I, ", ", ex->dim(), "], shared [", Is,
                                                        ", ", s1->k(), "], Ek ", k, ") or no routing given")));
  }
  if (T <= 0) return;
  Grow({.moe_tokens = T, .experts = E, .topk = k, .hidden = D, .inter = std::max(I, Is)});
  MoeScratch& m = moe_;
  float* logits = m.logits.data();
  GemmF32(a.x, D, gate->data(), E, D, logits, E, T, 1);
  // Routing (fp32): the bias steers selection only; weights are normalised over the chosen experts.
  for (int64_t t = 0; t < T; ++t) {
    int32_t* sel = m.chosen.data() + t * k;
    if (a.pos[t] < 0) {  // padding: routed nowhere
      std::fill_n(sel, k, -1);
      continue;
    }
    float* score = m.score.data();
    for (int64_t e = 0; e < E; ++e) score[e] = std::sqrt(Softplus(logits[t * E + e]));
    if (a.tid2eid != nullptr) {
      std::copy_n(a.tid2eid + int64_t{a.tokens[t]} * k, k, sel);
    } else {
      float* key = m.key.data();
      int32_t* order = m.order.data();
      for (int64_t e = 0; e < E; ++e) key[e] = score[e] + a.bias[e];
      std::iota(order, order + E, 0);
      std::partial_sort(order, order + k, order + E,
                        [&](int32_t x, int32_t y) { return key[x] != key[y] ? key[x] > key[y] : x < y; });
      std::copy_n(order, k, sel);
    }
    float sum = 0;
    for (int i = 0; i < k; ++i) sum += score[sel[i]];
    for (int i = 0; i < k; ++i) m.weight[t * k + i] = score[sel[i]] / (sum + 1e-20f) * a.routed_scale;
  }
  // Routed experts in ascending id, each over its tokens (in chunks of at most T rows: a hash table may name
  // one expert twice for a token).
  float* acc = m.acc.data();
  std::fill_n(acc, T * D, 0.f);
  const int64_t chunk = sizes_.moe_tokens;
  for (int64_t e = 0; e < E; ++e) {
    if (!ex->Holds(e)) continue;  // another rank's expert (expert parallel)
    int64_t u = 0;
    auto run = [&] {
      if (u == 0) return;
      GemmF32(m.x.data(), D, ex->w1(e), I, D, m.g.data(), I, u, 1);
      GemmF32(m.x.data(), D, ex->w3(e), I, D, m.h.data(), I, u, 1);
      SwiGlu(m.g.data(), m.h.data(), u * I, a.swiglu_limit);
      GemmF32(m.g.data(), I, ex->w2(e), D, I, m.out.data(), D, u, 1);
      for (int64_t r = 0; r < u; ++r) {
        const int64_t t = m.user_t[r];
        const float w = m.weight[t * k + m.user_i[r]];
        for (int64_t d = 0; d < D; ++d) acc[t * D + d] += w * m.out[r * D + d];
      }
      u = 0;
    };
    for (int64_t t = 0; t < T; ++t) {
      for (int i = 0; i < k; ++i) {
        if (m.chosen[t * k + i] != e) continue;
        m.user_t[u] = static_cast<int32_t>(t);
        m.user_i[u] = i;
        std::copy_n(a.x + t * D, D, m.x.data() + u * D);
        if (++u == chunk) run();
      }
    }
    run();
  }
  // Shared expert over all tokens into y, then the routed sum.
  GemmF32(a.x, D, s1->data(), Is, D, m.g.data(), Is, T, 1);
  GemmF32(a.x, D, s3->data(), Is, D, m.h.data(), Is, T, 1);
  SwiGlu(m.g.data(), m.h.data(), T * Is, a.swiglu_limit);
  GemmF32(m.g.data(), Is, s2->data(), D, Is, a.y, D, T, 1);
  for (int64_t t = 0; t < T; ++t) {
    float* y = a.y + t * D;
    if (a.pos[t] < 0) {
      std::fill_n(y, D, 0.f);
      continue;
    }
    for (int64_t d = 0; d < D; ++d) y[d] += acc[t * D + d];
  }
}

}  // namespace dsv4::kernels::cpu
