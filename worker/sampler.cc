// See sampler.h.
#include "worker/sampler.h"

#include <algorithm>
#include <cmath>

namespace dsv4::worker {
namespace {

// Philox4x32 round constants (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

void Philox4x32(uint32_t ctr[4], uint32_t key0, uint32_t key1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
    const uint32_t out[4] = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key0, static_cast<uint32_t>(p1),
                             static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key1, static_cast<uint32_t>(p0)};
    for (int i = 0; i < 4; ++i) ctr[i] = out[i];
    key0 += kW0;
    key1 += kW1;
  }
}

// Better order for ties: larger value first, then the lower token id.
bool Before(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

double CounterUniform(uint64_t seed, uint64_t index) {
  uint32_t ctr[4] = {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0u};
  Philox4x32(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint64_t bits = (static_cast<uint64_t>(ctr[0]) << 32 | ctr[1]) >> 11;
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);  // 2^-53
}

int32_t ArgMax(std::span<const float> logits) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

int32_t Sampler::Sample(std::span<const float> logits, const SamplingConfig& c, uint64_t index) {
  if (c.temperature <= 0.0f || c.top_k == 1) return ArgMax(logits);
  const int32_t vocab = static_cast<int32_t>(logits.size());
  candidates_.clear();
  for (int32_t i = 0; i < vocab; ++i) candidates_.emplace_back(logits[i], i);
  // Sorting is needed only for top-k / top-p; min-p and plain temperature work in id order.
  const bool need_sort = (c.top_k > 0 && c.top_k < vocab) || c.top_p < 1.0f;
  if (c.top_k > 0 && c.top_k < vocab) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + c.top_k, candidates_.end(), Before);
    candidates_.resize(c.top_k);
  } else if (need_sort) {
    std::sort(candidates_.begin(), candidates_.end(), Before);
  }
  float max_logit = -INFINITY;
  for (const auto& [logit, id] : candidates_) max_logit = std::max(max_logit, logit);
  double sum = 0;
  for (auto& [value, id] : candidates_) {
    value = static_cast<float>(std::exp((static_cast<double>(value) - max_logit) / c.temperature));
    sum += value;
  }
  double pmax = 0;
  for (auto& [value, id] : candidates_) {
    value = static_cast<float>(value / sum);
    pmax = std::max(pmax, static_cast<double>(value));
  }
  if (c.top_p < 1.0f) {  // candidates are sorted: keep the shortest prefix reaching top_p
    double cumulative = 0;
    size_t keep = 0;
    while (keep < candidates_.size() && cumulative < c.top_p) cumulative += candidates_[keep++].first;
    candidates_.resize(std::max<size_t>(keep, 1));
  }
  if (c.min_p > 0.0f) {
    const double threshold = c.min_p * pmax;
    std::erase_if(candidates_, [&](const auto& e) { return e.first < threshold; });
  }
  double total = 0;
  for (const auto& e : candidates_) total += e.first;
  const double u = CounterUniform(c.seed, index) * total;
  double cumulative = 0;
  for (const auto& [p, id] : candidates_) {
    cumulative += p;
    if (u < cumulative) return id;
  }
  return candidates_.back().second;  // rounding left u at the very top
}

}  // namespace dsv4::worker
