// The mHC kernels (contract and the two-pass scheme: hc_params.h; host side: hc.cc). The per-token maths
// (sigmoids, the Sinkhorn iterations, the stream mixes) follows the CPU reference's operation order with
// explicitly rounded fp32 operations (no FMA contraction), so the only differences from it are the order of
// the long dot products and the last bits of expf.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/hc_params.h"

namespace dsv4::kernels::cuda {
namespace {

constexpr int kSplitThreads = 256;
constexpr int kFinishThreads = 128;
constexpr int kRowsPerBlock = 4;  // rows of the split pass sharing one read of the mix weights

__device__ __forceinline__ float Sigmoid(float v) { return __fdiv_rn(1.f, __fadd_rn(1.f, expf(-v))); }
__device__ __forceinline__ float MulAdd(float a, float b, float c) { return __fadd_rn(__fmul_rn(a, b), c); }

// Split pass: block (split, row group) -> partial[row, split * (M + 1) + m] = fn[m, slice] . x[token, slice]
// for m < M, and the slice's sum of squares at m = M.
template <int M>
__global__ void __launch_bounds__(kSplitThreads) HcMixSplitKernel(const HcMixParams p) {
  constexpr int kV = M + 1;
  __shared__ float reduce[kSplitThreads / 32][kV][kRowsPerBlock];
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
  float acc[kV][kRowsPerBlock];
#pragma unroll
  for (int m = 0; m < kV; ++m)
#pragma unroll
    for (int j = 0; j < kRowsPerBlock; ++j) acc[m][j] = 0.f;
  for (int64_t k = k0 + threadIdx.x; k < k1; k += kSplitThreads) {
    float xv[kRowsPerBlock];
#pragma unroll
    for (int j = 0; j < kRowsPerBlock; ++j) {
      xv[j] = ok[j] ? xr[j][k] : 0.f;
      acc[M][j] += xv[j] * xv[j];
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float f = __ldg(p.fn + m * width + k);
#pragma unroll
      for (int j = 0; j < kRowsPerBlock; ++j) acc[m][j] += f * xv[j];
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int m = 0; m < kV; ++m) {
#pragma unroll
    for (int j = 0; j < kRowsPerBlock; ++j) {
      float v = acc[m][j];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) reduce[warp][m][j] = v;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kV * kRowsPerBlock; i += kSplitThreads) {
    const int m = i / kRowsPerBlock, j = i % kRowsPerBlock;
    if (!ok[j]) continue;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kSplitThreads / 32; ++w) v += reduce[w][m][j];
    p.partial[(r0 + j) * p.d + static_cast<int64_t>(blockIdx.x) * kV + m] = v;
  }
}

// Adds row r's partials in split order: m[0..M) (scaled by the RMS factor) into `mix`.
template <int M>
__device__ void FinishMix(const HcMixParams& p, int64_t r, float norm_eps, float* mix) {
  __shared__ float raw[M];
  __shared__ float rho;
  const float* part = p.partial + r * p.d;
  if (threadIdx.x < M) {
    float v = 0.f;
    for (int s = 0; s < p.splits; ++s) v += part[s * (M + 1) + threadIdx.x];
    raw[threadIdx.x] = v;
  } else if (threadIdx.x == M) {
    double ss = 0.0;
    for (int s = 0; s < p.splits; ++s) ss += part[s * (M + 1) + M];
    rho = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(p.s * p.d) + norm_eps));
  }
  __syncthreads();
  if (threadIdx.x < M) mix[threadIdx.x] = __fmul_rn(raw[threadIdx.x], rho);
  __syncthreads();
}

// out[k] = sum_i w[i] x_i[k] in stream order (the CPU's accumulation).
template <int S>
__device__ void MixStreams(const float* x, const float* w, int64_t d, float* out) {
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < S; ++i) acc = MulAdd(w[i], x[i * d + k], acc);
    out[k] = acc;
  }
}

template <int S>
__global__ void __launch_bounds__(kFinishThreads) HcPreFinishKernel(const HcPreParams p) {
  constexpr int M = (2 + S) * S;
  __shared__ float mix[M];
  __shared__ float pre[S];
  const int64_t t = blockIdx.x;
  FinishMix<M>(p.mix, t, p.norm_eps, mix);
  if (threadIdx.x == 0) {
    const float eps = p.hc_eps;
    for (int i = 0; i < S; ++i) {
      pre[i] = __fadd_rn(Sigmoid(MulAdd(p.scale[0], mix[i], p.base[i])), eps);
      p.post[t * S + i] = __fmul_rn(2.f, Sigmoid(MulAdd(p.scale[1], mix[S + i], p.base[S + i])));
    }
    // Sinkhorn: row softmax (+eps), one column normalisation, then (iters - 1) x (rows, columns).
    float c[S][S];
    for (int i = 0; i < S; ++i) {
      float mx = -INFINITY;
      for (int j = 0; j < S; ++j) {
        c[i][j] = MulAdd(p.scale[2], mix[2 * S + i * S + j], p.base[2 * S + i * S + j]);
        mx = fmaxf(mx, c[i][j]);
      }
      float sum = 0.f;
      for (int j = 0; j < S; ++j) sum = __fadd_rn(sum, c[i][j] = expf(__fsub_rn(c[i][j], mx)));
      for (int j = 0; j < S; ++j) c[i][j] = __fadd_rn(__fdiv_rn(c[i][j], sum), eps);
    }
    const int iters = p.sinkhorn_iters > 1 ? p.sinkhorn_iters : 1;  // columns are normalised at least once
    for (int it = 0; it < iters; ++it) {
      if (it > 0) {
        for (int i = 0; i < S; ++i) {
          float sum = 0.f;
          for (int j = 0; j < S; ++j) sum = __fadd_rn(sum, c[i][j]);
          for (int j = 0; j < S; ++j) c[i][j] = __fdiv_rn(c[i][j], __fadd_rn(sum, eps));
        }
      }
      for (int j = 0; j < S; ++j) {
        float sum = 0.f;
        for (int i = 0; i < S; ++i) sum = __fadd_rn(sum, c[i][j]);
        for (int i = 0; i < S; ++i) c[i][j] = __fdiv_rn(c[i][j], __fadd_rn(sum, eps));
      }
    }
    for (int i = 0; i < S; ++i)
      for (int j = 0; j < S; ++j) p.comb[(t * S + i) * S + j] = c[i][j];
  }
  __syncthreads();
  MixStreams<S>(p.mix.x + t * S * p.mix.d, pre, p.mix.d, p.u + t * p.mix.d);
}

template <int S>
__global__ void __launch_bounds__(kFinishThreads) HcHeadFinishKernel(const HcHeadParams p) {
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
  MixStreams<S>(p.mix.x + tok * S * p.mix.d, pre, p.mix.d, h);
}

// One thread per (token, dim): all S output streams from the S input streams and the sublayer output.
template <int S>
__global__ void __launch_bounds__(256) HcPostKernel(const HcPostParams p) {
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
  HcMixSplitKernel<(2 + S) * S><<<dim3(p.mix.splits, SplitRows(p.mix.r)), kSplitThreads, 0, stream>>>(p.mix);
  HcPreFinishKernel<S><<<static_cast<unsigned>(p.mix.r), kFinishThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <int S>
cudaError_t LaunchHead(const HcHeadParams& p, cudaStream_t stream) {
  HcMixSplitKernel<S><<<dim3(p.mix.splits, SplitRows(p.mix.r)), kSplitThreads, 0, stream>>>(p.mix);
  HcHeadFinishKernel<S><<<static_cast<unsigned>(p.mix.r), kFinishThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <int S>
cudaError_t LaunchPost(const HcPostParams& p, cudaStream_t stream) {
  int64_t blocks = (p.t * p.d + 255) / 256;
  if (blocks > 8192) blocks = 8192;
  HcPostKernel<S><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p);
  return cudaGetLastError();
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
