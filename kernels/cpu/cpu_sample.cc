// See cpu_sample.h; also CpuOps::Sample (cpu_ops.h). The plain version of the algorithm: sort the candidates,
// cut, then walk the survivors in id order. Compiled with -ffp-contract=off (kernels/cpu/CMakeLists.txt), which
// sample_math.h relies on.
#include "kernels/cpu/cpu_sample.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/sample_math.h"

namespace dsv4::kernels::cpu {

int32_t ArgMaxRow(std::span<const float> logits) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

int32_t SampleRow(std::span<const float> logits, const SampleParams& p, std::span<uint64_t> scratch) {
  namespace s = sample;
  const int64_t v = static_cast<int64_t>(logits.size());
  if (!(p.temperature > 0.0f) || p.top_k == 1) return ArgMaxRow(logits);
  float max_logit = -INFINITY;
  for (const float l : logits) {
    if (std::isnan(l)) return ArgMaxRow(logits);
    max_logit = std::max(max_logit, l);
  }
  if (std::isinf(max_logit)) return ArgMaxRow(logits);  // +inf, or every logit -inf
  const float inv_t = s::Div(1.0f, p.temperature);
  auto prob = [&](int64_t i) { return s::ExpNeg(s::ScaledLogit(logits[i], max_logit, inv_t)); };

  // cut: the rank key of the last token that top-k and top-p keep (0 = no cut). Only tokens with a nonzero
  // weight can matter, and they are a prefix of the rank order (x is monotone in the logit), so only that prefix
  // is sorted: a top-k boundary beyond it cuts nothing that weighs, and top-p's boundary is always inside it.
  uint64_t cut = 0;
  const bool top_k = p.top_k > 1 && p.top_k < v;
  const bool top_p = p.top_p < 1.0f;
  if (top_k || top_p) {
    int64_t n = 0;
    for (int64_t i = 0; i < v; ++i) {
      if (s::ScaledLogit(logits[i], max_logit, inv_t) >= s::kMinX) {
        scratch[n++] = s::RankKey(s::OrderKey(logits[i]), static_cast<int32_t>(i));
      }
    }
    int64_t kept = n;
    if (top_k && p.top_k < n) {
      kept = p.top_k;
      std::partial_sort(scratch.begin(), scratch.begin() + kept, scratch.begin() + n, std::greater<uint64_t>());
      cut = scratch[kept - 1];
    } else if (top_p) {
      std::sort(scratch.begin(), scratch.begin() + n, std::greater<uint64_t>());
    }
    if (top_p) {
      auto weight = [&](uint64_t key) { return s::Weight(prob(s::IdOfRankKey(key))); };
      uint64_t total = 0;
      for (int64_t j = 0; j < kept; ++j) total += weight(scratch[j]);
      const double target = s::TopPTarget(p.top_p, total);
      uint64_t cumulative = 0;
      for (int64_t j = 0; j < kept; ++j) {
        cumulative += weight(scratch[j]);
        if (s::TopPReached(cumulative, target)) {
          cut = scratch[j];
          break;
        }
      }
    }
  }

  // Survivors (rank key >= cut, p >= min_p) in id order; the draw lands in their running weight sum.
  const bool min_p = p.min_p > 0.0f;
  auto survivor_weight = [&](int64_t i) -> uint64_t {
    if (s::RankKey(s::OrderKey(logits[i]), static_cast<int32_t>(i)) < cut) return 0;
    const float pi = prob(i);
    if (min_p && !(pi >= p.min_p)) return 0;
    return s::Weight(pi);
  };
  uint64_t total = 0;
  for (int64_t i = 0; i < v; ++i) total += survivor_weight(i);
  if (total == 0) return ArgMaxRow(logits);  // min_p > 1 dropped even the top token
  const uint64_t target = s::DrawTarget(s::RandomBits53(p.seed, p.index), total);
  uint64_t cumulative = 0;
  for (int64_t i = 0; i < v; ++i) {
    cumulative += survivor_weight(i);
    if (cumulative > target) return static_cast<int32_t>(i);
  }
  return ArgMaxRow(logits);  // unreachable: target < total
}

void CpuOps::Sample(const SampleArgs& a) {
  const int64_t stride = a.logits_stride == 0 ? a.v : a.logits_stride;
  if (a.r < 0 || a.v < 1 || a.v > sample::kMaxVocab || stride < a.v) {
    Fail(absl::InvalidArgumentError(absl::StrCat("sample: bad sizes r=", a.r, " v=", a.v, " stride=", stride,
                                                 " (1 <= v <= ", sample::kMaxVocab, ", stride >= v)")));
    return;
  }
  if (a.r == 0) return;
  if (a.logits == nullptr || a.params == nullptr || a.tokens == nullptr) {
    Fail(absl::InvalidArgumentError("sample: null logits, params or tokens"));
    return;
  }
  Grow({.vocab = a.v});  // nothing after Reserve with limits.vocab >= v
  pool_.ParallelFor(a.r, 1, [&](int64_t begin, int64_t end, int thread) {
    std::span<uint64_t> scratch(threads_[thread].sample.data(), static_cast<size_t>(a.v));
    for (int64_t r = begin; r < end; ++r) {
      const SampleParams& p = a.params[r];
      a.tokens[r] = p.temperature >= 0.0f
                        ? SampleRow(std::span<const float>(a.logits + r * stride, static_cast<size_t>(a.v)), p, scratch)
                        : -1;  // padding (negative or NaN temperature)
    }
  });
}

}  // namespace dsv4::kernels::cpu
