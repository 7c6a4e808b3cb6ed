// SIMT sparse-MLA decode: the readable fast path and the benchmark baseline of the MMA kernel.
// One block of 4 warps per (sequence, head), f32 on CUDA cores. Each warp runs its own online softmax over
// every 4th selected row; lane l owns dims [16l, 16l + 16) (lanes 0..27 one e4m3 tile quarter each, lanes
// 28..31 the bf16 rope dims), so a row is one coalesced 584-byte read per warp. Every head re-reads every
// row (from L2 for the heads after the first), which is what the MMA kernel avoids.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/sparse_mla/sparse_mla_device.cuh"
#include "kernels/sparse_mla/sparse_mla_kernels.h"

namespace dsv4::kernels::sparse_mla {
namespace {

using namespace device;  // NOLINT(build/namespaces): kernel-local helpers

constexpr int kSimtWarps = 4;
constexpr int kDimsPerLane = kKvDim / 32;  // 16
constexpr float kLn2 = 0.6931471805599453f;

// The two bf16 halves of a word as floats (bf16 is the top half of an f32).
__device__ __forceinline__ float2 Bf16x2ToFloat2(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// 8 bf16 (one 16-byte word) -> 8 floats at k[0..7].
__device__ __forceinline__ void Bf16x8ToFloat(const uint4& v, float* k) {
  const float2 a = Bf16x2ToFloat2(v.x), b = Bf16x2ToFloat2(v.y), c = Bf16x2ToFloat2(v.z), d = Bf16x2ToFloat2(v.w);
  k[0] = a.x, k[1] = a.y, k[2] = b.x, k[3] = b.y, k[4] = c.x, k[5] = c.y, k[6] = d.x, k[7] = d.y;
}

// The 16 dims of lane `lane` of one row, as f32.
__device__ __forceinline__ void LoadRowSlice(const RowAddress& row, int lane, float (&k)[kDimsPerLane]) {
  if (lane < kNopeDim / kDimsPerLane) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(row.data) + lane);
    const float scale = Ue8m0ToF32(__ldg(row.scales + lane / 4));
    uint4 lo, hi;  // exact bf16 copies of the dequantised values
    DequantE4m3x4(v.x, scale, lo.x, lo.y);
    DequantE4m3x4(v.y, scale, lo.z, lo.w);
    DequantE4m3x4(v.z, scale, hi.x, hi.y);
    DequantE4m3x4(v.w, scale, hi.z, hi.w);
    Bf16x8ToFloat(lo, k);
    Bf16x8ToFloat(hi, k + 8);
  } else {
    // Rope dims follow the 448 e4m3 bytes: lane 28 + i owns bytes 448 + 32i .. 448 + 32i + 31.
    const uint4* src = reinterpret_cast<const uint4*>(row.data + kNopeDim) + 2 * (lane - kNopeDim / kDimsPerLane);
    Bf16x8ToFloat(__ldg(src), k);
    Bf16x8ToFloat(__ldg(src + 1), k + 8);
  }
}

__global__ void __launch_bounds__(kSimtWarps * 32) SparseMlaSimtKernel(const SparseMlaParams p, float scale_log2) {
  __shared__ float acc_s[kSimtWarps][kKvDim];
  __shared__ float max_s[kSimtWarps], sum_s[kSimtWarps];
  const int h = blockIdx.x, b = blockIdx.y, H = p.num_heads;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t bh = static_cast<int64_t>(b) * H + h;

  float q[kDimsPerLane];
  {
    const uint4* src = reinterpret_cast<const uint4*>(p.q + bh * kKvDim + lane * kDimsPerLane);
    Bf16x8ToFloat(__ldg(src), q);
    Bf16x8ToFloat(__ldg(src + 1), q + 8);
  }

  const int ew = UsedEntries(p.window.topk, p.window.lengths, b);
  const int n = ew + UsedEntries(p.extra.topk, p.extra.lengths, b);
  float run_max = -INFINITY, run_sum = 0.f, acc[kDimsPerLane] = {};
  for (int pos = warp; pos < n; pos += kSimtWarps) {
    RowAddress row;
    if (!LocateRow(p, b, pos, ew, row)) continue;  // warp-uniform
    float k[kDimsPerLane];
    LoadRowSlice(row, lane, k);
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) dot = fmaf(q[i], k[i], dot);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(~0u, dot, off);
    const float s = dot * scale_log2;
    const float new_max = fmaxf(run_max, s);
    const float alpha = exp2f(run_max - new_max), w = exp2f(s - new_max);
    run_sum = run_sum * alpha + w;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) acc[i] = acc[i] * alpha + w * k[i];
    run_max = new_max;
  }
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) acc_s[warp][lane * kDimsPerLane + i] = acc[i];
  if (lane == 0) {
    max_s[warp] = run_max;
    sum_s[warp] = run_sum;
  }
  __syncthreads();

  // Merge the warps: thread i owns dims 4i..4i+3.
  float m = -INFINITY;
#pragma unroll
  for (int w = 0; w < kSimtWarps; ++w) m = fmaxf(m, max_s[w]);
  float l = 0.f, o[4] = {};
  if (m != -INFINITY) {
#pragma unroll
    for (int w = 0; w < kSimtWarps; ++w) {
      const float c = exp2f(max_s[w] - m);
      l += sum_s[w] * c;
#pragma unroll
      for (int i = 0; i < 4; ++i) o[i] += acc_s[w][4 * threadIdx.x + i] * c;
    }
  }
  float factor = 0.f, lse = INFINITY;
  if (l != 0.f) {
    lse = (m + log2f(l)) * kLn2;
    factor = 1.f / l;
    if (p.attn_sink != nullptr) factor /= 1.f + expf(__ldg(p.attn_sink + h) - lse);
  }
  uint2* out = reinterpret_cast<uint2*>(p.out + bh * kKvDim) + threadIdx.x;
  *out = make_uint2(PackBf16x2(o[0] * factor, o[1] * factor), PackBf16x2(o[2] * factor, o[3] * factor));
  if (threadIdx.x == 0) p.lse[bh] = lse;
}

}  // namespace

namespace internal {

cudaError_t LaunchSimtDecode(const SparseMlaParams& p, cudaStream_t stream) {
  const dim3 grid(p.num_heads, p.batch);
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  SparseMlaSimtKernel<<<grid, kSimtWarps * 32, 0, stream>>>(p, scale_log2);
  return cudaGetLastError();
}

}  // namespace internal
}  // namespace dsv4::kernels::sparse_mla
