// See sampler.h.
#include "worker/sampler.h"

#include "kernels/cpu/cpu_sample.h"
#include "kernels/ops.h"
#include "kernels/sample_math.h"

namespace dsv4::worker {

double CounterUniform(uint64_t seed, uint64_t index) {
  return static_cast<double>(kernels::sample::RandomBits53(seed, index)) * (1.0 / 9007199254740992.0);  // 2^-53
}

int32_t ArgMax(std::span<const float> logits) { return kernels::cpu::ArgMaxRow(logits); }

int32_t Sampler::Sample(std::span<const float> logits, const SamplingConfig& c, uint64_t index) {
  if (scratch_.size() < logits.size()) scratch_.resize(logits.size());
  const kernels::SampleParams p{.temperature = c.temperature > 0.0f ? c.temperature : 0.0f,
                                .top_k = c.top_k,
                                .top_p = c.top_p,
                                .min_p = c.min_p,
                                .seed = c.seed,
                                .index = index};
  return kernels::cpu::SampleRow(logits, p, scratch_);
}

}  // namespace dsv4::worker
