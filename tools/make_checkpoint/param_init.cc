// Parameter values of the synthetic checkpoint. Every value is offset + scale * u with u uniform on
// (-1, 1) from TensorRng (std 1/sqrt(3)), so "std s" below means scale = s * sqrt(3). The aim is a model
// whose activations stay O(1) through every layer, with every mechanism visibly active:
//   - embed: std 1, so each residual stream starts with RMS ~1.
//   - linears W [N, K]: std 1/sqrt(K), so y = W x keeps the RMS of x (x is RMS-normed before every
//     projection chain, so projections and their norms see O(1) inputs).
//   - residual projections (attn.wo_b, experts' and shared w2) get a further 1/sqrt(2L): 2L sublayer
//     outputs of RMS ~1/sqrt(2L) add up to RMS ~1, so the residual neither explodes nor is dominated by
//     the embedding, whatever the depth L.
//   - router gate.weight: std 2/sqrt(D): logits ~N(0, 4), so sqrt(softplus) scores spread over ~[0.1, 2]
//     and the top-k choice is clear (near-ties would make goldens fragile); gate.bias +-0.1 shifts
//     the choice now and then, so a loader that drops it is caught.
//   - RMSNorm weights 1 +- 0.1: near identity, but not exactly, so a missing weight shows.
//   - mHC fn: std 1/sqrt(hc*D): the mixing logits m are ~N(0,1); scale in (0.25, 0.75) and base in
//     (-0.5, 0.5) keep pre/post sigmoids away from saturation and the Sinkhorn matrix near uniform
//     but not symmetric (a transposed comb changes the result).
//   - attn_sink +-0.5: comparable to the attention logits (q and k are RMS-normed, so tau*q.k ~ N(0,1)):
//     it takes a share of the softmax without swamping it.
//   - compressor ape +-0.2: small next to the gate logits W_gate a ~ N(0,1), as a position bias should be.
//   - tid2eid: K distinct experts per token id, uniformly drawn.
// sqrt is IEEE-754 correctly rounded, so computing a scale with it once per tensor is portable; the
// data path itself uses only float multiply-add (compiled with -ffp-contract=off) and integer hashing.
#include "tools/make_checkpoint/param_init.h"

#include <cmath>
#include <cstring>
#include <numeric>

#include "common/float_formats.h"
#include "tools/make_checkpoint/prng.h"

namespace dsv4::gen {
namespace {

constexpr double kSqrt3 = 1.7320508075688772;

// scale of u for standard deviation `std_dev`.
float UniformScale(double std_dev) { return static_cast<float>(std_dev * kSqrt3); }

}  // namespace

Init InitFor(const ParamSpec& p, int64_t num_layers) {
  const double fan_in = p.shape.size() >= 2 ? static_cast<double>(p.shape[1]) : 1.0;
  switch (p.kind) {
    case ParamKind::kEmbedding:
      return {0.0f, UniformScale(1.0)};
    case ParamKind::kLinear:
      return {0.0f, UniformScale(1.0 / std::sqrt(fan_in))};
    case ParamKind::kResidualLinear:
      return {0.0f, UniformScale(1.0 / std::sqrt(fan_in * 2.0 * static_cast<double>(num_layers)))};
    case ParamKind::kRouter:
      return {0.0f, UniformScale(2.0 / std::sqrt(fan_in))};
    case ParamKind::kNorm:
      return {1.0f, 0.1f};
    case ParamKind::kHcFn:
      return {0.0f, UniformScale(1.0 / std::sqrt(fan_in))};
    case ParamKind::kHcBase:
      return {0.0f, 0.5f};
    case ParamKind::kHcScale:
      return {0.5f, 0.25f};
    case ParamKind::kAttnSink:
      return {0.0f, 0.5f};
    case ParamKind::kApe:
      return {0.0f, 0.2f};
    case ParamKind::kRouterBias:
      return {0.0f, 0.1f};
    case ParamKind::kTid2Eid:
      break;
  }
  return {};
}

std::vector<float> FloatValues(const ParamSpec& p, int64_t num_layers, uint64_t seed) {
  const int64_t n = std::accumulate(p.shape.begin(), p.shape.end(), int64_t{1}, std::multiplies<>());
  const Init init = InitFor(p, num_layers);
  const TensorRng rng(seed, p.name);
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = init.offset + init.scale * rng.Uniform(static_cast<uint64_t>(i));
  return out;
}

std::vector<int64_t> Tid2Eid(int64_t vocab, int64_t experts, int64_t per_token, uint64_t seed, std::string_view name) {
  const TensorRng rng(seed, name);
  std::vector<int64_t> perm(static_cast<size_t>(experts));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  std::vector<int64_t> out(static_cast<size_t>(vocab * per_token));
  std::vector<int64_t> swapped(static_cast<size_t>(per_token));
  for (int64_t t = 0; t < vocab; ++t) {
    for (int64_t k = 0; k < per_token; ++k) {
      const uint64_t idx = static_cast<uint64_t>(t * per_token + k);
      const int64_t j = k + static_cast<int64_t>(rng.Below(idx, static_cast<uint64_t>(experts - k)));
      std::swap(perm[k], perm[j]);
      swapped[k] = j;
      out[t * per_token + k] = perm[k];
    }
    // Undo this row's swaps so every row starts from the identity permutation.
    for (int64_t k = per_token - 1; k >= 0; --k) std::swap(perm[k], perm[swapped[k]]);
  }
  return out;
}

std::vector<uint8_t> UnquantizedBytes(const ParamSpec& p, int64_t num_layers, uint64_t seed) {
  const int64_t n = std::accumulate(p.shape.begin(), p.shape.end(), int64_t{1}, std::multiplies<>());
  std::vector<uint8_t> out;
  const Init init = InitFor(p, num_layers);
  const TensorRng rng(seed, p.name);
  if (p.dtype == ckpt::DType::kBF16) {
    out.resize(static_cast<size_t>(n) * 2);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = F32ToBf16(init.offset + init.scale * rng.Uniform(static_cast<uint64_t>(i)));
      std::memcpy(&out[static_cast<size_t>(i) * 2], &h, 2);
    }
  } else {
    out.resize(static_cast<size_t>(n) * 4);
    for (int64_t i = 0; i < n; ++i) {
      const float v = init.offset + init.scale * rng.Uniform(static_cast<uint64_t>(i));
      std::memcpy(&out[static_cast<size_t>(i) * 4], &v, 4);
    }
  }
  return out;
}

std::vector<uint8_t> Tid2EidBytes(const ParamSpec& p, int64_t experts, uint64_t seed) {
  const std::vector<int64_t> ids = Tid2Eid(p.shape[0], experts, p.shape[1], seed, p.name);
  std::vector<uint8_t> out(ids.size() * 8);
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t u = static_cast<uint64_t>(ids[i]);
    for (int b = 0; b < 8; ++b) out[i * 8 + b] = static_cast<uint8_t>(u >> (8 * b));  // little-endian
  }
  return out;
}

}  // namespace dsv4::gen
