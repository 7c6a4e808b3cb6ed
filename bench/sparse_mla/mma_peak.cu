// The achievable bf16 mma.sync.m16n8k16 rate of the current GPU (the compute ceiling the sparse-MLA kernels
// are reported against in bench/RESULTS.md): every warp of every SM issues independent accumulator chains
// from registers, no memory traffic in the loop. Several (warps per SM, chains per warp) points are timed;
// the best is the ceiling.
#include "bench/sparse_mla/mma_peak.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "kernels/sparse_mla/sparse_mla_device.cuh"

namespace dsv4::kernels::sparse_mla {
namespace {

constexpr int kIters = 4096;

template <int kChains>
__global__ void MmaPeakKernel(float* sink) {
  // Non-zero, lane-dependent bf16 operands (0x3f80 = 1.0, small mantissa noise).
  const uint32_t lane = threadIdx.x & 31;
  uint32_t a[4], b0 = 0x3f803f80u ^ (lane << 1), b1 = 0x3f813f7fu ^ lane;
  for (int i = 0; i < 4; ++i) a[i] = 0x3f803f80u ^ ((lane * 7 + i) & 15);
  float acc[kChains][4] = {};
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) device::Mma16816(acc[c], a, b0, b1);
  }
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  if (s == 1.2345f) sink[threadIdx.x] = s;  // never true in practice; keeps the loop alive
}

template <int kChains>
double TimePoint(int blocks, int threads, float* sink) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  MmaPeakKernel<kChains><<<blocks, threads>>>(sink);  // warm-up (clocks up, module loaded)
  std::vector<double> t;
  for (int r = 0; r < 7; ++r) {
    cudaEventRecord(e0);
    MmaPeakKernel<kChains><<<blocks, threads>>>(sink);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  const double flop = 4096.0 * kIters * kChains * (static_cast<double>(blocks) * threads / 32);
  return flop / t[t.size() / 2];
}

}  // namespace

double MeasureMmaSyncPeak(bool verbose) {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  float* sink = nullptr;
  if (cudaMalloc(&sink, 1024 * sizeof(float)) != cudaSuccess) return 0;
  double best = 0;
  for (const int warps : {8, 16, 32}) {
    const int threads = 256, blocks = sms * warps / 8;
    const double r4 = TimePoint<4>(blocks, threads, sink);
    const double r8 = TimePoint<8>(blocks, threads, sink);
    if (verbose) {
      std::printf("mma.sync m16n8k16 bf16: %2d warps/SM: %.0f TFLOP/s (4 chains/warp), %.0f (8 chains/warp)\n", warps,
                  r4 * 1e-12, r8 * 1e-12);
    }
    best = std::max({best, r4, r8});
  }
  cudaFree(sink);
  if (cudaGetLastError() != cudaSuccess) return 0;
  return best;
}

}  // namespace dsv4::kernels::sparse_mla
