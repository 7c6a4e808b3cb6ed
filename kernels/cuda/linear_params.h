// The contract of the CUDA linear kernels (linear.cu), filled by LaunchLinear (linear.cc) from LinearArgs.
// Plain C++ with no library types so the .cu includes it.
//
//   y[t, g*N + n] = sum_k x[t, g*Kin + k] * W[g*N + n, k]     for t < T, g < groups, n < N, k < Kin
//
// Formats: kFp8 (e4m3 bytes + f32 block scales [ceil(groups*N/128), ceil(Kin/128)], the prepared form of the
// checkpoint's ue8m0 or f32 scales), kBf16 (W as bf16 bits) - both through the tensor-core kernel: x rounded to
// bf16, e4m3 -> bf16 exact in registers, bf16 mma.sync with fp32 accumulation, the block scale applied in fp32
// per 64-wide K step. kF32: a plain fp32 SIMT kernel (x not rounded; the model has no F32 linears, tests do).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace dsv4::kernels::cuda {

enum class LinearKernelFormat { kFp8, kBf16, kF32 };

// Work split of the tensor-core kernel, planned on the host from (groups, N, T, Kin): each warp computes
// 16*m_tiles rows x 8*n_tiles tokens over every warps_k-th 64-wide K step; a block holds warps_m x warps_k
// warps and reduces the warps_k partial sums in shared memory in a fixed order (deterministic).
struct LinearPlan {
  int m_tiles = 2;   // MW: 16-row MMA tiles per warp (1 or 2)
  int n_tiles = 1;   // NW: 8-token MMA tiles per warp (1, 2 or 4)
  int warps_m = 8;   // WM
  int warps_k = 1;   // WK (warps_m * warps_k <= 16)
};

struct LinearParams {
  LinearKernelFormat format = LinearKernelFormat::kFp8;
  const void* w = nullptr;        // [groups*N, Kin]: e4m3 bytes, bf16 bits or f32
  const float* scale = nullptr;   // kFp8: [ceil(groups*N/128), scale_cols] f32; else null
  int64_t scale_cols = 0;         // ceil(Kin/128)
  const void* x = nullptr;        // [T, x_stride]: f32 or bf16 bits (x_bf16)
  bool x_bf16 = false;
  float* y = nullptr;             // [T, y_stride] f32
  int64_t t = 0;                  // T
  int64_t n = 0;                  // N per group
  int64_t k = 0;                  // Kin per group
  int groups = 1;
  int64_t x_stride = 0, y_stride = 0;  // elements (already resolved: never 0)
  bool vec = false;               // 16-byte loads are aligned for W rows and x rows (host-checked)
  LinearPlan plan;
};

namespace internal {
// Enqueues the kernel for `p` (sizes already validated); returns the launch error, if any.
cudaError_t LaunchLinearKernel(const LinearParams& p, cudaStream_t stream);
// Dynamic shared memory the tensor-core kernel of `plan` takes (the split-K reduction).
int64_t LinearSharedBytes(const LinearPlan& plan);
}  // namespace internal

}  // namespace dsv4::kernels::cuda
