// The contract of the sampling kernel (sample.cu): one token per row of logits, exactly the CPU reference's
// (kernels/cpu/cpu_sample.h; the algorithm is documented at SampleArgs in kernels/ops.h). Filled by LaunchSample
// (sample.cc) from SampleArgs; plain C++ so the .cu includes it.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/ops.h"

namespace dsv4::kernels::cuda {

struct SampleKernelParams {
  const float* logits = nullptr;         // [R, V], row stride `stride`
  const SampleParams* params = nullptr;  // [R]
  int32_t* tokens = nullptr;             // [R]
  int64_t r = 0;                         // R (the grid)
  int64_t stride = 0;                    // elements between rows (>= V)
  int v = 0;                             // V, 1 <= V <= sample::kMaxVocab
};

namespace internal {
// Enqueues the kernel (sizes already validated; R >= 1) and returns the launch error, if any.
cudaError_t LaunchSampleKernel(const SampleKernelParams& p, cudaStream_t stream);
}  // namespace internal

}  // namespace dsv4::kernels::cuda
