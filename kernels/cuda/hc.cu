// The mHC kernels (contract and the two-pass scheme: hc_params.h; host side: hc.cc). The per-token maths
// (sigmoids, the Sinkhorn iterations, the stream mixes) follows the CPU reference's operation order with
// explicitly rounded fp32 operations (no FMA contraction), so the only differences from it are the order of
// the long dot products and the last bits of expf.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/hc_params.h"
#include "kernels/cuda/norm_row.cuh"
#include "kernels/cuda/pdl.h"

namespace dsv4::kernels::cuda {
namespace {

constexpr int kSplitThreads = 256;
constexpr int kFinishThreads = 256;
static_assert(kFinishThreads == kNormMaxThreads, "the fused norm: NormThreads(d) <= the block, one double a warp");
constexpr int kRowsPerBlock = 4;  // rows of the split pass sharing one read of the mix weights

__device__ __forceinline__ float Sigmoid(float v) { return __fdiv_rn(1.f, __fadd_rn(1.f, expf(-v))); }
__device__ __forceinline__ float MulAdd(float a, float b, float c) { return __fadd_rn(__fmul_rn(a, b), c); }

// One step of a warp's transpose-reduction of N values per lane (N a power of two >= 32): lanes with bit O set
// keep the upper half, the others the lower half, each adding its partner's copy of the half it keeps. After the
// five steps lane l holds the warp's sums of values [l * N / 32, (l + 1) * N / 32): N - N / 32 shuffles in all
// instead of 5 N for one butterfly per value (the split pass reduces 100 values per lane).
template <int O, int N, int P>
__device__ __forceinline__ void TransposeReduce(float (&a)[P], int lane) {
  if constexpr (O > 0) {
    const bool upper = (lane & O) != 0;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float send = upper ? a[i] : a[i + N / 2];
      const float keep = upper ? a[i + N / 2] : a[i];
      a[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, O));
    }
    TransposeReduce<O / 2, N / 2, P>(a, lane);
  }
}

// Split pass: block (split, row group) -> partial[row, split * (M + 1) + m] = fn[m, slice] . x[token, slice]
// for m < M, and the slice's sum of squares at m = M.
template <int M>
__global__ void __launch_bounds__(kSplitThreads) HcMixSplitKernel(const HcMixParams p) {
  PdlEnter();
  constexpr int kV = M + 1;
  constexpr int kN = kV * kRowsPerBlock;  // sums per thread: value m of row j at m * kRowsPerBlock + j
  constexpr int kP = kN <= 32 ? 32 : kN <= 64 ? 64 : kN <= 128 ? 128 : 256;
  static_assert(kN <= 256, "the split pass keeps at most 256 sums per thread");
  __shared__ float reduce[kSplitThreads / 32][kP];
  const int64_t width = p.s * p.d;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * p.slice;
  const int64_t k1 = k0 + p.slice < width ? k0 + p.slice : width;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowsPerBlock;
  const float* xr[kRowsPerBlock];
  bool ok[kRowsPerBlock];
#pragma unroll
  for (int j = 0; j < kRowsPerBlock; ++j) {
    const int64_t r = r0 + j;
    const int64_t tok = r < p.r ? (p.rows != nullptr ? p.rows[r] : r) : -1;
    ok[j] = tok >= 0;
    xr[j] = p.x + (ok[j] ? tok : 0) * width;
  }
  float acc[kP];
#pragma unroll
  for (int i = 0; i < kP; ++i) acc[i] = 0.f;
  for (int64_t k = k0 + threadIdx.x; k < k1; k += kSplitThreads) {
    float xv[kRowsPerBlock];
#pragma unroll
    for (int j = 0; j < kRowsPerBlock; ++j) {
      xv[j] = ok[j] ? xr[j][k] : 0.f;
      acc[M * kRowsPerBlock + j] += xv[j] * xv[j];
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float f = __ldg(p.fn + m * width + k);
#pragma unroll
      for (int j = 0; j < kRowsPerBlock; ++j) acc[m * kRowsPerBlock + j] += f * xv[j];
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  TransposeReduce<16, kP, kP>(acc, lane);
  constexpr int kPerLane = kP / 32;
#pragma unroll
  for (int q = 0; q < kPerLane; ++q) reduce[warp][lane * kPerLane + q] = acc[q];
  __syncthreads();
  for (int i = threadIdx.x; i < kN; i += kSplitThreads) {
    const int m = i / kRowsPerBlock, j = i % kRowsPerBlock;
    const int64_t r = r0 + j;
    if (r >= p.r || (p.rows != nullptr && p.rows[r] < 0)) continue;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kSplitThreads / 32; ++w) v += reduce[w][i];
    p.partial[r * p.d + static_cast<int64_t>(blockIdx.x) * kV + m] = v;
  }
}

// Adds row r's partials in split order: m[0..M) (scaled by the RMS factor) into `mix`. The partials are first
// staged through shared memory a chunk of splits at a time by the whole block (coalesced, all loads in flight),
// so the M + 1 ordered sums run from shared memory instead of one dependent global load per split.
template <int M>
__device__ void FinishMix(const HcMixParams& p, int64_t r, float norm_eps, float* mix) {
  constexpr int kV = M + 1;
  constexpr int kChunk = 32;  // splits staged at once
  __shared__ float stage[kChunk * kV];
  __shared__ float raw[M];
  __shared__ float rho;
  const float* part = p.partial + r * p.d;
  float v = 0.f;
  double ss = 0.0;
  for (int s0 = 0; s0 < p.splits; s0 += kChunk) {
    const int n = (p.splits - s0 < kChunk ? p.splits - s0 : kChunk) * kV;
    for (int i = threadIdx.x; i < n; i += blockDim.x) stage[i] = part[s0 * kV + i];
    __syncthreads();
    const int ns = n / kV;
    if (threadIdx.x < M) {
      for (int s = 0; s < ns; ++s) v += stage[s * kV + threadIdx.x];
    } else if (threadIdx.x == M) {
      for (int s = 0; s < ns; ++s) ss += stage[s * kV + M];
    }
    __syncthreads();
  }
  if (threadIdx.x < M) {
    raw[threadIdx.x] = v;
  } else if (threadIdx.x == M) {
    rho = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(p.s * p.d) + norm_eps));
  }
  __syncthreads();
  if (threadIdx.x < M) mix[threadIdx.x] = __fmul_rn(raw[threadIdx.x], rho);
  __syncthreads();
}

// out[k] = sum_i w[i] x_i[k] in stream order (the CPU's accumulation), by threads [first, first + count) of the
// block. Four dims per thread with 16-byte loads where the rows allow it, so the threads keep all their loads in
// flight (the per-token finish is latency-bound). Which thread computes an output does not change its bits.
template <int S>
__device__ void MixStreams(const float* x, const float* w, int64_t d, float* out, int first, int count) {
  const int tid = static_cast<int>(threadIdx.x) - first;
  const bool vec = d % 4 == 0 && (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(out)) % 16 == 0;
  if (vec) {
    const int64_t d4 = d / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* out4 = reinterpret_cast<float4*>(out);
#pragma unroll 4
    for (int64_t k = tid; k < d4; k += count) {
      float4 xv[S];
#pragma unroll
      for (int i = 0; i < S; ++i) xv[i] = x4[i * d4 + k];
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int i = 0; i < S; ++i) {
        acc.x = MulAdd(w[i], xv[i].x, acc.x);
        acc.y = MulAdd(w[i], xv[i].y, acc.y);
        acc.z = MulAdd(w[i], xv[i].z, acc.z);
        acc.w = MulAdd(w[i], xv[i].w, acc.w);
      }
      out4[k] = acc;
    }
    return;
  }
  for (int64_t k = tid; k < d; k += count) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < S; ++i) acc = MulAdd(w[i], x[i * d + k], acc);
    out[k] = acc;
  }
}

// The Sinkhorn normalisation of one token's S x S logits on the first S*S lanes of warp 0, lane i*S + j holding
// c[i][j]: row softmax (+eps), one column normalisation, then (iters - 1) x (rows, columns). Every sum is taken
// in the serial reference's order (lanes gathered by shuffles, added j = 0.. or i = 0..), so the result is the
// same bits as one thread doing it, at ~1/S*S of the dependent chain. Must be called by all 32 lanes of warp 0.
template <int S>
__device__ float SinkhornLane(float logit, int iters, float eps) {
  static_assert(S * S <= 32, "one warp holds the S x S matrix");
  const int lane = threadIdx.x & 31;
  const int i = (lane / S) % S, j = lane % S;  // lanes past S*S mirror a valid cell (results discarded)
  float mx = -INFINITY;
#pragma unroll
  for (int jj = 0; jj < S; ++jj) mx = fmaxf(mx, __shfl_sync(0xffffffffu, logit, i * S + jj));
  const float e = expf(__fsub_rn(logit, mx));
  float sum = 0.f;
#pragma unroll
  for (int jj = 0; jj < S; ++jj) sum = __fadd_rn(sum, __shfl_sync(0xffffffffu, e, i * S + jj));
  float c = __fadd_rn(__fdiv_rn(e, sum), eps);
  for (int it = 0; it < iters; ++it) {
    if (it > 0) {
      float rs = 0.f;
#pragma unroll
      for (int jj = 0; jj < S; ++jj) rs = __fadd_rn(rs, __shfl_sync(0xffffffffu, c, i * S + jj));
      c = __fdiv_rn(c, __fadd_rn(rs, eps));
    }
    float cs = 0.f;
#pragma unroll
    for (int ii = 0; ii < S; ++ii) cs = __fadd_rn(cs, __shfl_sync(0xffffffffu, c, ii * S + j));
    c = __fdiv_rn(c, __fadd_rn(cs, eps));
  }
  return c;
}

template <int S>
__global__ void __launch_bounds__(kFinishThreads) HcPreFinishKernel(const HcPreParams p) {
  PdlEnter();
  constexpr int M = (2 + S) * S;
  __shared__ float mix[M];
  __shared__ float pre[S];
  const int64_t t = blockIdx.x;
  FinishMix<M>(p.mix, t, p.norm_eps, mix);
  const float eps = p.hc_eps;
  if (threadIdx.x < S) {
    const int lane = threadIdx.x;
    pre[lane] = __fadd_rn(Sigmoid(MulAdd(p.scale[0], mix[lane], p.base[lane])), eps);
    p.post[t * S + lane] = __fmul_rn(2.f, Sigmoid(MulAdd(p.scale[1], mix[S + lane], p.base[S + lane])));
  }
  __syncthreads();
  // The Sinkhorn (a dependent chain of ~2 * iters divisions) on warp 0 while the other warps mix the streams with
  // `pre`: the two do not depend on each other, so the block's time is the longer of them, not their sum.
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const int cell = lane % (S * S);
    const float logit = MulAdd(p.scale[2], mix[2 * S + cell], p.base[2 * S + cell]);
    const int iters = p.sinkhorn_iters > 1 ? p.sinkhorn_iters : 1;  // columns are normalised at least once
    const float c = SinkhornLane<S>(logit, iters, eps);
    if (lane < S * S) p.comb[t * S * S + lane] = c;
  } else {
    MixStreams<S>(p.mix.x + t * S * p.mix.d, pre, p.mix.d, p.u + t * p.mix.d, 32, kFinishThreads - 32);
  }
  if (p.rms_threads > 0) {  // the sublayer's RMSNorm of u (HcPreNorm), uniform over the block
    __shared__ double partial[kNormMaxThreads / 32];
    __syncthreads();  // u's row, written by the mixing warps
    RmsNormRow(p.u + t * p.mix.d, p.rms_w, p.u + t * p.mix.d, p.mix.d, p.rms_eps, partial, p.rms_threads);
  }
}

template <int S>
__global__ void __launch_bounds__(kFinishThreads) HcHeadFinishKernel(const HcHeadParams p) {
  PdlEnter();
  __shared__ float mix[S];
  __shared__ float pre[S];
  const int64_t r = blockIdx.x;
  const int64_t tok = p.mix.rows[r];
  float* h = p.h + r * p.mix.d;
  if (tok < 0) {
    for (int64_t k = threadIdx.x; k < p.mix.d; k += blockDim.x) h[k] = 0.f;
    return;
  }
  FinishMix<S>(p.mix, r, p.norm_eps, mix);
  if (threadIdx.x < S) {
    pre[threadIdx.x] =
        __fadd_rn(Sigmoid(MulAdd(p.scale[0], mix[threadIdx.x], p.base[threadIdx.x])), p.hc_eps);
  }
  __syncthreads();
  MixStreams<S>(p.mix.x + tok * S * p.mix.d, pre, p.mix.d, h, 0, kFinishThreads);
}

// One thread per (token, dim): all S output streams from the S input streams and the sublayer output.
template <int S>
__global__ void __launch_bounds__(256) HcPostKernel(const HcPostParams p) {
  PdlEnter();
  const int64_t n = p.t * p.d;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / p.d, k = i % p.d;
    const float* x = p.x + t * S * p.d + k;
    float xv[S];
#pragma unroll
    for (int s = 0; s < S; ++s) xv[s] = x[s * p.d];
    const float yv = p.y[i];
    const float* comb = p.comb + t * S * S;
#pragma unroll
    for (int j = 0; j < S; ++j) {
      float acc = __fmul_rn(p.post[t * S + j], yv);
#pragma unroll
      for (int s = 0; s < S; ++s) acc = MulAdd(comb[s * S + j], xv[s], acc);
      p.x_out[(t * S + j) * p.d + k] = acc;
    }
  }
}

unsigned SplitRows(int64_t r) { return static_cast<unsigned>((r + kRowsPerBlock - 1) / kRowsPerBlock); }

template <int S>
cudaError_t LaunchPre(const HcPreParams& p, cudaStream_t stream) {
  if (const cudaError_t pdl_err = LaunchPdl(HcMixSplitKernel<(2 + S) * S>, dim3(p.mix.splits, SplitRows(p.mix.r)),
                                            dim3(kSplitThreads), 0, stream, p.mix);
      pdl_err != cudaSuccess) {
    return pdl_err;
  }
  return LaunchPdl(HcPreFinishKernel<S>, dim3(static_cast<unsigned>(p.mix.r)), dim3(kFinishThreads), 0, stream, p);
}

template <int S>
cudaError_t LaunchHead(const HcHeadParams& p, cudaStream_t stream) {
  if (const cudaError_t pdl_err =
          LaunchPdl(HcMixSplitKernel<S>, dim3(p.mix.splits, SplitRows(p.mix.r)), dim3(kSplitThreads), 0, stream, p.mix);
      pdl_err != cudaSuccess) {
    return pdl_err;
  }
  return LaunchPdl(HcHeadFinishKernel<S>, dim3(static_cast<unsigned>(p.mix.r)), dim3(kFinishThreads), 0, stream, p);
}

template <int S>
cudaError_t LaunchPost(const HcPostParams& p, cudaStream_t stream) {
  int64_t blocks = (p.t * p.d + 255) / 256;
  if (blocks > 8192) blocks = 8192;
  return LaunchPdl(HcPostKernel<S>, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream, p);
}

}  // namespace

namespace internal {

cudaError_t LaunchHcPreKernels(const HcPreParams& p, cudaStream_t stream) {
  switch (p.mix.s) {
    case 1: return LaunchPre<1>(p, stream);
    case 2: return LaunchPre<2>(p, stream);
    case 4: return LaunchPre<4>(p, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchHcHeadKernels(const HcHeadParams& p, cudaStream_t stream) {
  switch (p.mix.s) {
    case 1: return LaunchHead<1>(p, stream);
    case 2: return LaunchHead<2>(p, stream);
    case 4: return LaunchHead<4>(p, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchHcPostKernel(const HcPostParams& p, cudaStream_t stream) {
  switch (p.s) {
    case 1: return LaunchPost<1>(p, stream);
    case 2: return LaunchPost<2>(p, stream);
    case 4: return LaunchPost<4>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace internal
}  // namespace dsv4::kernels::cuda
