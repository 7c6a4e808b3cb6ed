// RoPE frequency tables: see rope.h.
#include "model/dsv4/rope.h"

#include <algorithm>
#include <cmath>

namespace dsv4::model {

std::vector<float> PlainInvFreq(double theta, int rope_dims) {
  std::vector<float> f(rope_dims / 2);
  for (int i = 0; i < rope_dims / 2; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(rope_dims);
    f[i] = 1.0f / std::pow(static_cast<float>(theta), expo);
  }
  return f;
}

std::vector<float> YarnInvFreq(double theta, int rope_dims, const RopeScaling& s) {
  // transformers' _compute_yarn_parameters with truncate=True.
  auto correction_dim = [&](double rotations) {
    return rope_dims * std::log(static_cast<double>(s.original_max_position_embeddings) / (rotations * 2 * M_PI)) /
           (2 * std::log(theta));
  };
  const double lo = std::max(0.0, std::floor(correction_dim(s.beta_fast)));
  double hi = std::min(static_cast<double>(rope_dims - 1), std::ceil(correction_dim(s.beta_slow)));
  if (lo == hi) hi += 0.001;
  std::vector<float> f(rope_dims / 2);
  for (int i = 0; i < rope_dims / 2; ++i) {
    const float ramp = std::clamp(static_cast<float>((i - lo) / (hi - lo)), 0.f, 1.f);
    const float pos_freq =
        std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(rope_dims));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (static_cast<float>(s.factor) * pos_freq);
    const float keep = 1.f - ramp;  // transformers' inv_freq_extrapolation_factor
    f[i] = interpolation * (1.f - keep) + extrapolation * keep;
  }
  return f;
}

std::vector<float> LayerInvFreq(const Config& config, int ratio) {
  const int dims = static_cast<int>(config.qk_rope_head_dim);
  if (ratio == 0) return PlainInvFreq(config.rope_theta, dims);
  if (config.rope_scaling) return YarnInvFreq(config.compress_rope_theta, dims, *config.rope_scaling);
  return PlainInvFreq(config.compress_rope_theta, dims);
}

}  // namespace dsv4::model
