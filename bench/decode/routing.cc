// Routing of the synthetic model: see routing.h.
#include "bench/decode/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "bench/ops/synth.h"

namespace dsv4::bench {

absl::StatusOr<RoutingSpec> ParseRouting(const std::string& name, uint64_t seed) {
  if (name == "random") return RoutingSpec{.skewed = false, .seed = seed};
  if (name == "skewed") return RoutingSpec{.skewed = true, .seed = seed};
  return absl::InvalidArgumentError(absl::StrCat("--routing must be random or skewed, got '", name, "'"));
}

std::vector<int32_t> HotExperts(const RoutingSpec& spec, int64_t experts, int layer) {
  std::vector<int32_t> ids(static_cast<size_t>(experts));
  std::iota(ids.begin(), ids.end(), 0);
  Rng rng(spec.seed * 7919 + 17 + static_cast<uint64_t>(layer) * 104729);
  for (int64_t i = experts - 1; i > 0; --i) std::swap(ids[i], ids[rng.Int(i + 1)]);
  const int64_t hot = std::max<int64_t>(1, std::llround(spec.hot_fraction * static_cast<double>(experts)));
  ids.resize(static_cast<size_t>(std::min(hot, experts)));
  std::sort(ids.begin(), ids.end());
  return ids;
}

namespace {

double Score(double logit) { return std::sqrt(std::log1p(std::exp(logit))); }

// Hot share of the top-k picks with bias b on the first `hot` of `experts` (the set is exchangeable).
double HotShareAt(double b, int64_t experts, int64_t hot, int64_t topk, double logit_std, uint64_t seed) {
  Rng rng(seed);
  constexpr int kTrials = 400;
  std::vector<std::pair<double, int>> s(static_cast<size_t>(experts));
  int64_t hot_picks = 0;
  for (int t = 0; t < kTrials; ++t) {
    for (int64_t e = 0; e < experts; ++e) s[e] = {Score(rng.Normal() * logit_std) + (e < hot ? b : 0.0), e < hot};
    std::partial_sort(s.begin(), s.begin() + topk, s.end(), [](auto& x, auto& y) { return x.first > y.first; });
    for (int64_t k = 0; k < topk; ++k) hot_picks += s[k].second;
  }
  return static_cast<double>(hot_picks) / static_cast<double>(kTrials * topk);
}

}  // namespace

double CalibrateHotBias(const RoutingSpec& spec, int64_t experts, int64_t topk, double logit_std) {
  if (!spec.skewed || experts <= topk) return 0.0;
  const int64_t hot = static_cast<int64_t>(HotExperts(spec, experts, 0).size());
  double lo = 0.0, hi = 4.0;
  for (int i = 0; i < 30; ++i) {
    const double mid = 0.5 * (lo + hi);
    (HotShareAt(mid, experts, hot, topk, logit_std, spec.seed) < spec.hot_share ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

std::vector<float> GateBias(const RoutingSpec& spec, int64_t experts, double hot_bias, uint64_t seed, int layer) {
  Rng rng(seed + static_cast<uint64_t>(layer) * 7);
  std::vector<float> bias(static_cast<size_t>(experts));
  for (float& b : bias) b = rng.Uniform(-0.1f, 0.1f);
  if (spec.skewed) {
    for (int32_t e : HotExperts(spec, experts, layer)) bias[e] += static_cast<float>(hot_bias);
  }
  return bias;
}

std::vector<int64_t> Tid2Eid(const RoutingSpec& spec, int64_t vocab, int64_t experts, int64_t topk, uint64_t seed,
                             int layer) {
  Rng rng(seed + static_cast<uint64_t>(layer) * 13);
  const std::vector<int32_t> hot = HotExperts(spec, experts, layer);
  std::vector<uint8_t> is_hot(static_cast<size_t>(experts), 0);
  for (int32_t e : hot) is_hot[e] = 1;
  const bool can_skew = spec.skewed && static_cast<int64_t>(hot.size()) >= topk && experts - static_cast<int64_t>(hot.size()) >= topk;
  std::vector<int64_t> out(static_cast<size_t>(vocab * topk));
  for (int64_t t = 0; t < vocab; ++t) {
    int64_t* row = out.data() + t * topk;
    for (int64_t k = 0; k < topk; ++k) {
      int64_t e = 0;
      do {
        if (can_skew) {
          const bool want_hot = rng.Uniform(0.f, 1.f) < static_cast<float>(spec.hot_share);
          do e = rng.Int(experts); while (static_cast<bool>(is_hot[e]) != want_hot);
        } else {
          e = rng.Int(experts);
        }
      } while (std::find(row, row + k, e) != row + k);
      row[k] = e;
    }
  }
  return out;
}

double ExpectedTouched(const RoutingSpec& spec, int64_t experts, int64_t held, int64_t topk, int64_t tokens) {
  // Per pick: hot experts share hot_share, the others the rest (random: uniform). An expert is missed by a token
  // with probability ~(1 - p_e)^topk.
  const int64_t hot = spec.skewed ? static_cast<int64_t>(HotExperts(spec, experts, 0).size()) : 0;
  const double p_hot = spec.skewed ? spec.hot_share / static_cast<double>(hot) : 1.0 / static_cast<double>(experts);
  const double p_cold = spec.skewed ? (1.0 - spec.hot_share) / static_cast<double>(experts - hot)
                                    : 1.0 / static_cast<double>(experts);
  const double frac_hot = static_cast<double>(hot) / static_cast<double>(experts);
  auto touched = [&](double p) { return 1.0 - std::pow(std::max(0.0, 1.0 - p), static_cast<double>(topk * tokens)); };
  return static_cast<double>(held) * (frac_hot * touched(p_hot) + (1.0 - frac_hot) * touched(p_cold));
}

}  // namespace dsv4::bench
