// Properties of the current CUDA device that launch plans depend on (host side, cheap to call per launch:
// cudaDeviceGetAttribute reads a cached value and is legal while a stream is being captured).
#pragma once

#include <cuda_runtime_api.h>

namespace dsv4::kernels::cuda {

// SMs of the current device (132 when it cannot be read: only a plan's balance depends on it).
inline int CurrentDeviceSms() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) {
    return 132;
  }
  return sms;
}

}  // namespace dsv4::kernels::cuda
