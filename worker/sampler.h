// Token sampling for the engine: greedy, temperature, top-k, top-p, min-p, drawn from a counter-based generator.
// A thin adapter over the one reference sampler, kernels/cpu/cpu_sample.h (the algorithm is documented at
// SampleArgs in kernels/ops.h, its arithmetic in kernels/sample_math.h); a device backend's Sample op computes
// the same token from the same logits.
//
// Reproducibility: the random bits for a request's i-th generated token are Philox4x32-10 keyed by the
// request's seed with counter i. No generator state is carried between steps, so the same seed gives the same
// tokens whatever the batch, after preemption and recompute, and on another worker resuming the request at
// token index i (GenerateRequest.resume_generated).
//
// Filter order (as vLLM): temperature, then top-k, then top-p (smallest set of most likely tokens whose
// probability reaches top_p), then min-p (drop tokens below min_p times the most likely one's probability).
// Ties are broken by the lower token id, so greedy is argmax with the lowest id winning.
//
// Threads: pure functions; Sampler holds scratch space and belongs to one thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dsv4::worker {

struct SamplingConfig {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  uint64_t seed = 0;
};

// Philox4x32-10 of (key = seed, counter = index): a uniform double in [0, 1) with 53 random bits (the bits the
// sampler draws with).
double CounterUniform(uint64_t seed, uint64_t index);

// Index of the largest logit (lowest index among equals).
int32_t ArgMax(std::span<const float> logits);

class Sampler {
 public:
  // Samples the token with generation index `index` from one row of logits.
  int32_t Sample(std::span<const float> logits, const SamplingConfig& config, uint64_t index);

 private:
  std::vector<uint64_t> scratch_;  // the reference sampler's sort space, one value per token
};

}  // namespace dsv4::worker
