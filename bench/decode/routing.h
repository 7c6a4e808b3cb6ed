// Routing of dsv4-decode-bench's synthetic model: which experts a step touches decides how many expert bytes it
// must read, so the bench makes the routing realistic instead of leaving it to whatever random weights give.
//   random: router scores from random weights and activations (gate.bias +-0.1, tid2eid uniform), so every
//           expert is about equally likely;
//   skewed: 20% of the experts ("hot", a fixed seeded set) get ~80% of the token-expert pairs: score layers get a
//           gate.bias of +b on the hot experts (b calibrated below so that the hot share of top-k picks is 80% for
//           N(0, sigma^2) router logits), hash layers' tid2eid draw each pick from the hot set with probability 0.8.
// The share actually reached is measured on the GPU (routing probe) and printed beside the results.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dsv4::bench {

struct RoutingSpec {
  bool skewed = false;
  double hot_fraction = 0.2;  // of the experts
  double hot_share = 0.8;     // of the token-expert pairs they get (skewed)
  uint64_t seed = 1;
};
absl::StatusOr<RoutingSpec> ParseRouting(const std::string& name, uint64_t seed);

// The hot experts of a layer (sorted ids; round(hot_fraction * experts) of them, seeded by the spec and the layer:
// each layer has its own hot set, as each layer of a trained model has its own popular experts).
std::vector<int32_t> HotExperts(const RoutingSpec& spec, int64_t experts, int layer);

// The gate.bias that makes hot experts take `hot_share` of the top-k picks when each expert's logit is
// N(0, logit_std^2) and the score is sqrt(softplus(logit)) (Monte Carlo, seeded; bisection on b).
double CalibrateHotBias(const RoutingSpec& spec, int64_t experts, int64_t topk, double logit_std);

// gate.bias [E]: +-0.1 uniform (random), plus `hot_bias` on the hot experts (skewed).
std::vector<float> GateBias(const RoutingSpec& spec, int64_t experts, double hot_bias, uint64_t seed, int layer);

// tid2eid [V, K] as int64: K distinct experts per token id; skewed: each pick from the hot set with probability
// hot_share.
std::vector<int64_t> Tid2Eid(const RoutingSpec& spec, int64_t vocab, int64_t experts, int64_t topk, uint64_t seed,
                             int layer);

// Expected distinct experts among `held` (of `experts`) that `tokens` tokens touch with top-k routing under the
// spec (used where no probe can read the device's routing: the CPU backend).
double ExpectedTouched(const RoutingSpec& spec, int64_t experts, int64_t held, int64_t topk, int64_t tokens);

}  // namespace dsv4::bench
