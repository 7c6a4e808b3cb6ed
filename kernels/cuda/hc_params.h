// The contract of the mHC kernels (hc.cu), filled by the launchers in hc.cc from ops.h's HcPreArgs /
// HcPostArgs / HcHeadArgs (which define the maths). Plain C++ so the .cu includes it. S (streams) is 1, 2 or
// 4; all arithmetic is fp32 (the sum of squares of the RMS factor in double, as the CPU reference).
//
// HcPre and HcHead run in two kernels: a split pass computes, per token and per slice of the S*D inputs, the
// partial dot products of the mix rows and the partial sum of squares, and parks them in the op's own output
// rows (u / h: [rows, D] with D >= splits * (mixes + 1)); a finish pass per token adds the partials in a fixed
// order (deterministic), applies the RMS factor, the sigmoids and (HcPre) the Sinkhorn iterations, and only then
// overwrites its row with the mixed stream. So a decode step of one token still spreads the mix rows' 1.5 MB
// (flash: 24 x 16384 fp32) over many SMs, without scratch memory.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace dsv4::kernels::cuda {

// What the split pass of HcPre / HcHead reads and where it parks partial sums.
struct HcMixParams {
  const float* x = nullptr;        // [T, S, D] residual streams
  const int32_t* rows = nullptr;   // [R] token of each output row (HcHead) or null (row r = token r)
  const float* fn = nullptr;       // [mixes, S*D]
  float* partial = nullptr;        // [R, D]: row r holds [splits][mixes + 1] partial sums (the op's output)
  int64_t r = 0;                   // rows (T for HcPre, R for HcHead)
  int64_t s = 0, d = 0;
  int mixes = 0;                   // (2 + S) * S for HcPre, S for HcHead
  int splits = 1;                  // slices of the S*D inputs
  int64_t slice = 0;               // inputs per slice (a multiple of the block size)
};

struct HcPreParams {
  HcMixParams mix;                 // mix.partial == u
  const float* base = nullptr;     // [(2 + S) * S]
  const float* scale = nullptr;    // [3]
  float* u = nullptr;              // [T, D]
  float* post = nullptr;           // [T, S]
  float* comb = nullptr;           // [T, S, S]
  int sinkhorn_iters = 20;
  float norm_eps = 0.f, hc_eps = 0.f;
  // The sublayer's RMSNorm of u, fused into the finish kernel (HcPreNorm): on when rms_threads > 0, with the
  // first rms_threads threads (NormThreads(d): RmsNormKernel's sums, so the same bits).
  const float* rms_w = nullptr;  // [D] or null (unweighted)
  float rms_eps = 0.f;
  int rms_threads = 0;
};

struct HcHeadParams {
  HcMixParams mix;                 // mix.partial == h
  const float* base = nullptr;     // [S]
  const float* scale = nullptr;    // [1]
  float* h = nullptr;              // [R, D]; rows whose token index is negative get zeros
  float norm_eps = 0.f, hc_eps = 0.f;
};

struct HcPostParams {
  const float* x = nullptr;     // [T, S, D]
  const float* y = nullptr;     // [T, D]
  const float* post = nullptr;  // [T, S]
  const float* comb = nullptr;  // [T, S, S]
  float* x_out = nullptr;       // [T, S, D]; must not alias x
  int64_t t = 0, s = 0, d = 0;
};

namespace internal {
// Each enqueues its kernels (sizes already validated) and returns the launch error, if any.
cudaError_t LaunchHcPreKernels(const HcPreParams& p, cudaStream_t stream);
cudaError_t LaunchHcHeadKernels(const HcHeadParams& p, cudaStream_t stream);
cudaError_t LaunchHcPostKernel(const HcPostParams& p, cudaStream_t stream);
}  // namespace internal

}  // namespace dsv4::kernels::cuda
