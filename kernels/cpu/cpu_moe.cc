// CPU backend, mixture of experts: sqrt-softplus router (hash or biased top-k selection), SwiGLU experts with
// the clamp, shared expert. Tokens are grouped per expert so a prefill chunk streams each expert once; every
// token's sum runs over its experts in ascending id, then the shared expert, whatever the batch.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

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
  const int k = a.topk;
  std::vector<int32_t> chosen(a.t * k);
  std::vector<float> weight(a.t * k), logits(a.t * a.experts);
  Linear({.x = a.x, .w = a.gate, .y = logits.data(), .t = a.t, .n = a.experts, .k = a.d});
  std::vector<float> score(a.experts), key(a.experts);
  std::vector<int32_t> order(a.experts);
  for (int64_t t = 0; t < a.t; ++t) {
    for (int64_t e = 0; e < a.experts; ++e) score[e] = std::sqrt(Softplus(logits[t * a.experts + e]));
    int32_t* sel = &chosen[t * k];
    if (a.tid2eid) {
      std::copy(a.tid2eid + int64_t{a.tokens[t]} * k, a.tid2eid + int64_t{a.tokens[t]} * k + k, sel);
    } else {  // the bias steers selection only
      for (int64_t e = 0; e < a.experts; ++e) key[e] = score[e] + a.bias[e];
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t x, int32_t y) { return key[x] != key[y] ? key[x] > key[y] : x < y; });
      std::copy(order.begin(), order.begin() + k, sel);
    }
    float sum = 0;
    for (int i = 0; i < k; ++i) sum += score[sel[i]];
    for (int i = 0; i < k; ++i) weight[t * k + i] = score[sel[i]] / (sum + 1e-20f) * a.routed_scale;
  }
  // Per-token expert outputs, kept separately so the final sum has a fixed order.
  moe_o_.assign(a.t * k * a.d, 0.f);
  for (int64_t e = 0; e < a.experts; ++e) {
    std::vector<std::pair<int64_t, int>> users;  // (token, slot)
    for (int64_t t = 0; t < a.t; ++t)
      for (int i = 0; i < k; ++i)
        if (chosen[t * k + i] == e) users.push_back({t, i});
    if (users.empty() || a.w1[e] == nullptr) continue;  // null: held by another rank (expert parallel)
    const int64_t m = static_cast<int64_t>(users.size());
    moe_x_.resize(m * a.d);
    moe_g_.resize(m * a.inter);
    moe_h_.resize(m * a.inter);
    for (int64_t u = 0; u < m; ++u) std::copy_n(a.x + users[u].first * a.d, a.d, &moe_x_[u * a.d]);
    Linear({.x = moe_x_.data(), .w = a.w1[e], .y = moe_g_.data(), .t = m, .n = a.inter, .k = a.d});
    Linear({.x = moe_x_.data(), .w = a.w3[e], .y = moe_h_.data(), .t = m, .n = a.inter, .k = a.d});
    SwiGlu(moe_g_.data(), moe_h_.data(), m * a.inter, a.swiglu_limit);
    std::vector<float> out(m * a.d);
    Linear({.x = moe_g_.data(), .w = a.w2[e], .y = out.data(), .t = m, .n = a.d, .k = a.inter});
    for (int64_t u = 0; u < m; ++u) {
      const auto [t, i] = users[u];
      const float w = weight[t * k + i];
      for (int64_t d = 0; d < a.d; ++d) moe_o_[(t * k + i) * a.d + d] = w * out[u * a.d + d];
    }
  }
  // Shared expert over all tokens.
  moe_g_.resize(a.t * a.shared_inter);
  moe_h_.resize(a.t * a.shared_inter);
  Linear({.x = a.x, .w = a.shared_w1, .y = moe_g_.data(), .t = a.t, .n = a.shared_inter, .k = a.d});
  Linear({.x = a.x, .w = a.shared_w3, .y = moe_h_.data(), .t = a.t, .n = a.shared_inter, .k = a.d});
  SwiGlu(moe_g_.data(), moe_h_.data(), a.t * a.shared_inter, a.swiglu_limit);
  Linear({.x = moe_g_.data(), .w = a.shared_w2, .y = a.y, .t = a.t, .n = a.d, .k = a.shared_inter});
  for (int64_t t = 0; t < a.t; ++t) {
    std::vector<int> slots(k);
    std::iota(slots.begin(), slots.end(), 0);
    std::sort(slots.begin(), slots.end(), [&](int x, int y) { return chosen[t * k + x] < chosen[t * k + y]; });
    for (int64_t d = 0; d < a.d; ++d) {
      float acc = 0;
      for (int i : slots) acc += moe_o_[(t * k + i) * a.d + d];
      a.y[t * a.d + d] += acc;
    }
  }
}

}  // namespace dsv4::kernels::cpu
