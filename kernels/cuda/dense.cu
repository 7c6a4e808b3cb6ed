// The dense element-wise kernels (contract: dense_params.h; host side: dense.cc). Each follows the CPU
// reference op's arithmetic order where that is cheap (RMSNorm's sum of squares in double, RoPE's angle in fp32
// and cos/sin in double, no FMA contraction in the rotation) so results match it to the last bit or nearly;
// the Hadamard + FP4 simulation matches it exactly (same butterflies, same scale rule, same e2m1 rounding).
#include <cuda_bf16.h>

#include <cstdint>

#include "common/float_formats.h"
#include "kernels/cuda/dense_params.h"
#include "kernels/cuda/norm_row.cuh"
#include "kernels/cuda/pdl.h"

namespace dsv4::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(int64_t n, int64_t per_block, int64_t max_blocks) {
  const int64_t b = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 1 ? 1 : (b > max_blocks ? max_blocks : b));
}

// One block per token: the table row (zeros for padding or an id outside the table) into every stream.
__global__ void __launch_bounds__(kThreads) EmbedKernel(const EmbedParams p) {
  PdlEnter();
  const int64_t t = blockIdx.x;
  const int32_t tok = p.tokens[t];
  const bool ok = p.pos[t] >= 0 && tok >= 0 && tok < p.v;
  float* out = p.x + t * p.s * p.d;
  for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) {
    float v = 0.f;
    if (ok) {
      v = p.table_bf16 ? __bfloat162float(__ushort_as_bfloat16(static_cast<const uint16_t*>(p.table)[tok * p.d + i]))
                       : static_cast<const float*>(p.table)[tok * p.d + i];
    }
    for (int64_t s = 0; s < p.s; ++s) out[s * p.d + i] = v;
  }
}

// cos / sin of RoPE's pairs at `pos` into cs ([pairs] cos, then [pairs] sin), by the block's threads.
__device__ __forceinline__ void RopeAngles(int32_t pos, const float* inv_freq, int pairs, bool inverse, float* cs) {
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const float angle = __fmul_rn(static_cast<float>(pos), inv_freq[i]);
    cs[i] = static_cast<float>(cos(static_cast<double>(angle)));
    cs[pairs + i] = static_cast<float>(sin(static_cast<double>(angle))) * (inverse ? -1.f : 1.f);
  }
}

// Rotates pair i of a row (x: the pair's first element) by the angles in cs.
__device__ __forceinline__ void RotatePair(float* x, const float* cs, int pairs, int i) {
  const float c = cs[i], s = cs[pairs + i];
  const float x0 = x[0], x1 = x[1];
  x[0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  x[1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// One block per row.
__global__ void __launch_bounds__(kThreads) RmsNormKernel(const RmsNormParams p) {
  PdlEnter();
  __shared__ double partial[kNormMaxThreads / 32];
  RmsNormRow(p.x + static_cast<int64_t>(blockIdx.x) * p.dim, p.w, p.out + static_cast<int64_t>(blockIdx.x) * p.dim,
             p.dim, p.eps, partial, static_cast<int>(blockDim.x));
}

// RmsNorm then RoPE of one row (token t = row / heads) per block, in place: the norm exactly as RmsNormKernel
// (same threads, same sums), then - where pos >= 0 - the rotation of its last 2 * pairs elements exactly as
// RopeKernel (same angle, cos / sin and products). The row's normed values are re-read after a barrier (the
// block's global writes are visible to it). One launch instead of two for the q and kv norms at decode. Each
// head's block computes its token's cos / sin again (pairs double-precision cos and sin in parallel: the same
// latency as once per token, more FP64 work - cheap on sm_90, to watch on sm_120).
__global__ void __launch_bounds__(kThreads) NormRopeKernel(const NormRopeParams p) {
  PdlEnter();
  __shared__ double partial[kNormMaxThreads / 32];
  extern __shared__ float rope_cs[];  // [pairs] cos, then [pairs] sin
  const int64_t row = blockIdx.x;
  float* out = p.out + row * p.dim;
  RmsNormRow(p.x + row * p.dim, p.w, out, p.dim, p.eps, partial, static_cast<int>(blockDim.x));
  const int32_t pos = p.pos[row / p.heads];
  if (pos < 0) return;  // uniform over the block
  RopeAngles(pos, p.inv_freq, p.pairs, p.inverse, rope_cs);
  __syncthreads();  // the angles, and the normed row's writes before the rotation reads them
  float* first = out + (p.dim - 2 * p.pairs);
  for (int i = threadIdx.x; i < p.pairs; i += blockDim.x) RotatePair(first + 2 * i, rope_cs, p.pairs, i);
}

// One block per token: cos/sin of each pair once (shared), then every head's pairs.
__global__ void __launch_bounds__(kThreads) RopeKernel(const RopeParams p) {
  PdlEnter();
  extern __shared__ float cs[];  // [pairs] cos, then [pairs] sin
  const int64_t t = blockIdx.x;
  const int32_t pos = p.pos[t];
  if (pos < 0) return;
  RopeAngles(pos, p.inv_freq, p.pairs, p.inverse, cs);
  __syncthreads();
  const int64_t first = p.row_dim - 2 * p.pairs;
  for (int64_t j = threadIdx.x; j < p.heads * p.pairs; j += blockDim.x) {
    const int64_t h = j / p.pairs;
    const int i = static_cast<int>(j % p.pairs);
    RotatePair(p.x + (t * p.heads + h) * p.row_dim + first + 2 * i, cs, p.pairs, i);
  }
}

__global__ void __launch_bounds__(kThreads) ScaleKernel(const ScaleParams p) {
  PdlEnter();
  const int64_t n = p.rows * p.dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    p.x[i] *= p.scale;
  }
}

__global__ void __launch_bounds__(kThreads) FillKernel(const FillParams p) {
  PdlEnter();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < p.n; i += int64_t{gridDim.x} * blockDim.x) {
    p.x[i] = p.value;
  }
}

// One warp per row; lane l holds elements [l E, l E + E). The fast Walsh-Hadamard butterflies run in the CPU's
// order (h = 1, 2, 4, ...; lower index gets p + q, upper p - q), inside a lane while h < E and across lanes
// (shuffles) after, so every value is the same fp32 sum as on the CPU. Then the 1/sqrt(dim) scaling and, per 32
// elements (32 / E lanes), the ue8m0 scale 2^ceil(log2(amax / 6)) (amax floored at 1e-4) and the e2m1 round trip.
template <int E>
__global__ void __launch_bounds__(kThreads) HadamardFp4Kernel(const HadamardFp4Params p) {
  PdlEnter();
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  float* x = p.x + row * p.dim + lane * E;
  float v[E];
#pragma unroll
  for (int e = 0; e < E; ++e) v[e] = x[e];
#pragma unroll
  for (int h = 1; h < E; h *= 2) {
#pragma unroll
    for (int i = 0; i < E; i += 2 * h) {
#pragma unroll
      for (int j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = __fadd_rn(a, b);
        v[j + h] = __fsub_rn(a, b);
      }
    }
  }
#pragma unroll
  for (int lanes = 1; lanes < 32; lanes *= 2) {
    const bool upper = (lane & lanes) != 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float other = __shfl_xor_sync(0xffffffffu, v[e], lanes);
      v[e] = upper ? __fsub_rn(other, v[e]) : __fadd_rn(v[e], other);
    }
  }
  float amax = 1e-4f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    v[e] = __fmul_rn(v[e], p.norm);
    amax = fmaxf(amax, fabsf(v[e]));
  }
  for (int o = 1; o < 32 / E; o *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float scale = Ue8m0ToF32(Ue8m0CeilFromF32(__fdiv_rn(amax, 6.f)));
#pragma unroll
  for (int e = 0; e < E; ++e) x[e] = __fmul_rn(E2m1ToF32(F32ToE2m1(__fdiv_rn(v[e], scale))), scale);
}

}  // namespace

namespace internal {

cudaError_t LaunchEmbedKernel(const EmbedParams& p, cudaStream_t stream) {
  return LaunchPdl(EmbedKernel, dim3(static_cast<unsigned>(p.t)), dim3(kThreads), 0, stream, p);
}

cudaError_t LaunchRmsNormKernel(const RmsNormParams& p, cudaStream_t stream) {
  return LaunchPdl(RmsNormKernel, dim3(static_cast<unsigned>(p.rows)), dim3(NormThreads(p.dim)), 0, stream, p);
}

cudaError_t LaunchNormRopeKernel(const NormRopeParams& p, cudaStream_t stream) {
  return LaunchPdl(NormRopeKernel, dim3(static_cast<unsigned>(p.rows)), dim3(NormThreads(p.dim)),
                   2 * p.pairs * sizeof(float), stream, p);
}

cudaError_t LaunchRopeKernel(const RopeParams& p, cudaStream_t stream) {
  const int threads = p.heads * p.pairs >= kThreads ? kThreads : 64;
  return LaunchPdl(RopeKernel, dim3(static_cast<unsigned>(p.t)), dim3(threads), 2 * p.pairs * sizeof(float), stream, p);
}

cudaError_t LaunchScaleKernel(const ScaleParams& p, cudaStream_t stream) {
  return LaunchPdl(ScaleKernel, dim3(GridFor(p.rows * p.dim, 4 * kThreads, 4096)), dim3(kThreads), 0, stream, p);
}

cudaError_t LaunchFillKernel(const FillParams& p, cudaStream_t stream) {
  return LaunchPdl(FillKernel, dim3(GridFor(p.n, 4 * kThreads, 4096)), dim3(kThreads), 0, stream, p);
}

cudaError_t LaunchHadamardFp4Kernel(const HadamardFp4Params& p, cudaStream_t stream) {
  const unsigned grid = GridFor(p.rows, kThreads / 32, (int64_t{1} << 31) - 1);
  switch (p.dim) {
    case 32:
      return LaunchPdl(HadamardFp4Kernel<1>, dim3(grid), dim3(kThreads), 0, stream, p);
    case 64:
      return LaunchPdl(HadamardFp4Kernel<2>, dim3(grid), dim3(kThreads), 0, stream, p);
    case 128:
      return LaunchPdl(HadamardFp4Kernel<4>, dim3(grid), dim3(kThreads), 0, stream, p);
    case 256:
      return LaunchPdl(HadamardFp4Kernel<8>, dim3(grid), dim3(kThreads), 0, stream, p);
    case 512:
      return LaunchPdl(HadamardFp4Kernel<16>, dim3(grid), dim3(kThreads), 0, stream, p);
    case 1024:
      return LaunchPdl(HadamardFp4Kernel<32>, dim3(grid), dim3(kThreads), 0, stream, p);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t ProbeKernelImage() {
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, FillKernel);
}

}  // namespace internal
}  // namespace dsv4::kernels::cuda
