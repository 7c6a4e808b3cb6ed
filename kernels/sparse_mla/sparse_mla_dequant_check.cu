// Test hook for the kernels' e4m3 -> bf16 dequantisation (DequantE4m3x4 in sparse_mla_device.cuh):
// decodes every e4m3 code under every ue8m0 scale byte on the device, so a test can compare all 65,536
// results bit for bit with common/float_formats.h. Not used by the decode path.
#include <cuda_runtime.h>

#include "kernels/sparse_mla/sparse_mla_device.cuh"
#include "kernels/sparse_mla/sparse_mla_kernels.h"

namespace dsv4::kernels::sparse_mla {
namespace {

// Block = one scale byte; thread i converts codes 16i .. 16i + 15.
__global__ void __launch_bounds__(16) DequantTableKernel(uint16_t* out) {
  const uint32_t s = blockIdx.x, c0 = 16 * threadIdx.x;
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    w[k] = (c0 + 4 * k) | (c0 + 4 * k + 1) << 8 | (c0 + 4 * k + 2) << 16 | (c0 + 4 * k + 3) << 24;
  }
  const float scale = device::ScaleFromUe8m0(s);
  uint4 lo, hi;
  device::DequantE4m3x4(w[0], scale, lo.x, lo.y);
  device::DequantE4m3x4(w[1], scale, lo.z, lo.w);
  device::DequantE4m3x4(w[2], scale, hi.x, hi.y);
  device::DequantE4m3x4(w[3], scale, hi.z, hi.w);
  uint4* dst = reinterpret_cast<uint4*>(out + 256 * s + c0);
  dst[0] = lo;
  dst[1] = hi;
}

}  // namespace

namespace internal {

cudaError_t LaunchDequantTable(uint16_t* out, cudaStream_t stream) {
  DequantTableKernel<<<256, 16, 0, stream>>>(out);
  return cudaGetLastError();
}

}  // namespace internal
}  // namespace dsv4::kernels::sparse_mla
