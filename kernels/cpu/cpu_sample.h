// The reference token sampler: one row of logits -> one token, exactly as SampleArgs (kernels/ops.h) defines it,
// with the arithmetic of kernels/sample_math.h. CpuOps::Sample runs it per row, the worker's Sampler
// (worker/sampler.h) calls it for the CPU engine, and the CUDA kernel (kernels/cuda/sample.cu) is tested
// against it token for token.
//
// Threading: pure functions; the caller owns the scratch.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/ops.h"

namespace dsv4::kernels::cpu {

// The lowest id among the largest logits; NaNs are skipped, except that a NaN at id 0 gives 0 (the result of the
// scan `if (l[i] > l[best]) best = i` from best = 0). 0 for an empty row.
int32_t ArgMaxRow(std::span<const float> logits);

// The token SampleArgs draws from `logits` under `p` (a padding row - temperature < 0 - is the op's business:
// here a temperature that is not > 0 means greedy). `scratch` must hold at least logits.size() values.
int32_t SampleRow(std::span<const float> logits, const SampleParams& p, std::span<uint64_t> scratch);

}  // namespace dsv4::kernels::cpu
