// Kernels behind nccl_convert.h: one thread per element, grid-stride so any n fits one launch.
#include <cuda_runtime.h>

#include "comm/nccl_convert.h"
#include "common/float_formats.h"

namespace dsv4::comm::detail {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 4096;

__global__ void Bf16ToF32Kernel(const uint16_t* in, float* out, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = Bf16ToF32(in[i]);
  }
}

__global__ void F32ToBf16Kernel(const float* in, uint16_t* out, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = F32ToBf16(in[i]);
  }
}

unsigned Blocks(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < kMaxBlocks ? (b == 0 ? 1 : b) : kMaxBlocks);
}

}  // namespace

int LaunchBf16ToF32(const uint16_t* in, float* out, size_t n, void* stream) {
  Bf16ToF32Kernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(in, out, n);
  return static_cast<int>(cudaGetLastError());
}

int LaunchF32ToBf16(const float* in, uint16_t* out, size_t n, void* stream) {
  F32ToBf16Kernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(in, out, n);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace dsv4::comm::detail
