// One row of RMSNorm by one block, shared by the kernels that normalise a row (dense.cu RmsNormKernel and
// NormRopeKernel, hc.cu HcPreFinishKernel's fused sublayer norm). The sum of squares is taken in double by the
// first `threads` threads of the block in a fixed order (thread i: float4 elements i, i + threads, ...; then
// the warps' butterflies and warp 0's sum), so every kernel that runs it with the same `threads` gets the same
// bits: NormThreads(dim) is that count (RmsNormKernel's block size).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::kernels::cuda {

// Largest block that runs RmsNormRow (its shared `partial` holds one double a warp).
inline constexpr int kNormMaxThreads = 256;

// The threads that normalise a row of `dim` floats (and RmsNormKernel's block size).
inline unsigned NormThreads(int64_t dim) { return dim >= 1024 ? kNormMaxThreads : kNormMaxThreads / 2; }

#if defined(__CUDACC__)
// Sum over the first `threads` threads of the block in double (threads past them pass 0); every thread of the
// block must call it; thread 0's result is returned to every thread. `shared`: one double per warp of the block.
__device__ __forceinline__ double NormBlockSum(double v, double* shared, int threads) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < (threads >> 5) ? shared[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  return shared[0];
}

// out = x / sqrt(mean(x^2) + eps) * (wt or 1) for one row, by threads [0, threads) of the block (a multiple of
// 32, <= blockDim.x; every thread of the block must call it: it holds two block barriers). x and out may alias:
// every read of the row happens before the first barrier, and each thread rewrites only the elements it reads
// again itself. Rows of a multiple of 4 floats on 16-byte boundaries (every row of the model) move as float4
// with four loads in flight per thread (a short latency-bound pass per row at decode sizes).
__device__ __forceinline__ void RmsNormRow(const float* x, const float* wt, float* out, int64_t dim, float eps,
                                           double* partial, int threads) {
  const int tid = static_cast<int>(threadIdx.x);
  const bool mine = tid < threads;
  const bool vec = dim % 4 == 0 &&
                   (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(out) |
                    reinterpret_cast<uintptr_t>(wt)) % 16 == 0;
  double ss = 0.0;
  if (vec) {
    const int64_t d4 = mine ? dim / 4 : 0;
    const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll 4
    for (int64_t i = tid; i < d4; i += threads) {
      const float4 v = x4[i];
      ss += static_cast<double>(v.x) * v.x;
      ss += static_cast<double>(v.y) * v.y;
      ss += static_cast<double>(v.z) * v.z;
      ss += static_cast<double>(v.w) * v.w;
    }
    ss = NormBlockSum(ss, partial, threads);
    const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(dim) + eps));
    float4* out4 = reinterpret_cast<float4*>(out);
    const float4* w4 = reinterpret_cast<const float4*>(wt);
#pragma unroll 4
    for (int64_t i = tid; i < d4; i += threads) {
      float4 v = x4[i];
      v = make_float4(__fmul_rn(v.x, inv), __fmul_rn(v.y, inv), __fmul_rn(v.z, inv), __fmul_rn(v.w, inv));
      if (w4 != nullptr) {
        const float4 w = w4[i];
        v = make_float4(__fmul_rn(v.x, w.x), __fmul_rn(v.y, w.y), __fmul_rn(v.z, w.z), __fmul_rn(v.w, w.w));
      }
      out4[i] = v;
    }
    return;
  }
  const int64_t n = mine ? dim : 0;
  for (int64_t i = tid; i < n; i += threads) ss += static_cast<double>(x[i]) * x[i];
  ss = NormBlockSum(ss, partial, threads);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(dim) + eps));
  for (int64_t i = tid; i < n; i += threads) {
    const float v = __fmul_rn(x[i], inv);
    out[i] = wt != nullptr ? __fmul_rn(v, wt[i]) : v;
  }
}
#endif

}  // namespace dsv4::kernels::cuda
