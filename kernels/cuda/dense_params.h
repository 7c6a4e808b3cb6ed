// The contract of the dense element-wise kernels (dense.cu): embedding, RMSNorm, RoPE, scale, fill and the
// production-mode Hadamard + FP4 simulation. Filled by the launchers in dense.cc from the ops.h Args (which
// define the maths); plain C++ so the .cu includes it. Shapes use ops.h's letters.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace dsv4::kernels::cuda {

struct EmbedParams {
  const void* table = nullptr;    // [V, D] bf16 bits or f32 (table_bf16)
  bool table_bf16 = true;
  int64_t v = 0, d = 0;           // V, D
  const int32_t* tokens = nullptr;  // [T]; ids outside [0, V) give zeros
  const int32_t* pos = nullptr;   // [T]; pos < 0 (padding) gives zeros
  float* x = nullptr;             // [T, S, D]
  int64_t t = 0, s = 0;
};

struct RmsNormParams {
  const float* x = nullptr;  // [rows, dim]
  const float* w = nullptr;  // [dim] or null (unweighted)
  float* out = nullptr;      // [rows, dim]; may alias x
  int64_t rows = 0, dim = 0;
  float eps = 0.f;
};

struct RopeParams {
  float* x = nullptr;               // [T, heads, row_dim], rotated in place
  const int32_t* pos = nullptr;     // [T]; pos < 0: row left as it is
  const float* inv_freq = nullptr;  // [pairs]
  int64_t t = 0, heads = 0, row_dim = 0;
  int pairs = 0;
  bool inverse = false;
};

// RmsNorm of rows [T * heads, dim] then RoPE of each row's last 2 * pairs elements (rows of tokens with pos >= 0).
struct NormRopeParams {
  const float* x = nullptr;         // [rows, dim]
  const float* w = nullptr;         // [dim] or null
  float* out = nullptr;             // [rows, dim]; may alias x
  int64_t rows = 0, dim = 0;        // rows = T * heads
  float eps = 0.f;
  const int32_t* pos = nullptr;     // [T]
  const float* inv_freq = nullptr;  // [pairs]
  int64_t heads = 1;
  int pairs = 0;
  bool inverse = false;
};

struct ScaleParams {
  float* x = nullptr;  // [rows, dim]
  int64_t rows = 0, dim = 0;
  float scale = 1.f;
};

struct FillParams {
  float* x = nullptr;  // [n]
  int64_t n = 0;
  float value = 0.f;
};

struct HadamardFp4Params {
  float* x = nullptr;  // [rows, dim], in place; dim a power of two in [32, 1024]
  int64_t rows = 0;
  int dim = 0;
  float norm = 0.f;    // 1 / sqrt(dim), computed on the host exactly as the CPU reference does
};

namespace internal {
// Each enqueues its kernel (sizes already validated) and returns the launch error, if any.
cudaError_t LaunchEmbedKernel(const EmbedParams& p, cudaStream_t stream);
cudaError_t LaunchRmsNormKernel(const RmsNormParams& p, cudaStream_t stream);
cudaError_t LaunchRopeKernel(const RopeParams& p, cudaStream_t stream);
cudaError_t LaunchNormRopeKernel(const NormRopeParams& p, cudaStream_t stream);
cudaError_t LaunchScaleKernel(const ScaleParams& p, cudaStream_t stream);
cudaError_t LaunchFillKernel(const FillParams& p, cudaStream_t stream);
cudaError_t LaunchHadamardFp4Kernel(const HadamardFp4Params& p, cudaStream_t stream);
// cudaSuccess when the current device can load this build's kernels (checked once by MakeCudaBackend).
cudaError_t ProbeKernelImage();
}  // namespace internal

}  // namespace dsv4::kernels::cuda
