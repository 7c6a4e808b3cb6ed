// Host side of the Sample op: argument checks, then the kernel of sample.cu (sample_params.h). No scratch: each
// row's block works in shared memory. R = 0 enqueues nothing.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/sample_params.h"
#include "kernels/sample_math.h"

namespace dsv4::kernels::cuda {

absl::Status LaunchSample(const SampleArgs& a, cudaStream_t stream) {
  const int64_t stride = a.logits_stride == 0 ? a.v : a.logits_stride;
  if (a.r < 0 || a.r > (int64_t{1} << 31) - 1 || a.v < 1 || a.v > sample::kMaxVocab || stride < a.v) {
    return absl::InvalidArgumentError(absl::StrCat("sample: bad sizes r=", a.r, " v=", a.v, " stride=", stride,
                                                   " (1 <= v <= ", sample::kMaxVocab, ", stride >= v)"));
  }
  if (a.r == 0) return absl::OkStatus();
  if (a.logits == nullptr || a.params == nullptr || a.tokens == nullptr) {
    return absl::InvalidArgumentError("sample: null logits, params or tokens");
  }
  const SampleKernelParams p{.logits = a.logits, .params = a.params, .tokens = a.tokens, .r = a.r,
                             .stride = stride, .v = static_cast<int>(a.v)};
  return CudaStatus(internal::LaunchSampleKernel(p, stream), "sample launch");
}

}  // namespace dsv4::kernels::cuda
