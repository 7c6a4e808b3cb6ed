// See gpu_check.h.
#include "tests/gpu_check/gpu_check.h"

#include <cuda_runtime.h>

namespace dsv4::testing {

int GpuCount(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  std::string reason;
  if (err != cudaSuccess) {
    reason = std::string("no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(err) + ")";
    n = 0;
  } else if (n == 0) {
    reason = "no CUDA device present";
  }
  if (why != nullptr) *why = reason;
  return n;
}

}  // namespace dsv4::testing
