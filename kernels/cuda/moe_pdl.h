// Programmatic dependent launch (PDL) helpers of the MoE family's kernels (moe_router.cu, moe.cu).
//
// The routed chain (logits -> select -> up GEMM -> down GEMM -> combine) is launched with programmatic stream
// serialization, so a kernel's blocks may become resident (and its launch cost is paid) while the kernel before
// it drains. The rule that keeps this correct: every kernel calls GridDepWait() before it reads or writes any
// memory (it returns once the previous kernel has completed and its writes are visible; a no-op when the
// kernel was launched without the attribute), and calls GridDepLaunch() right after, which lets the next
// kernel's blocks be scheduled. CUDA only (included by .cu files).
#pragma once

#if defined(__CUDACC__)
#include <cuda_runtime.h>

namespace dsv4::kernels::cuda::moe {

__device__ __forceinline__ void GridDepWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void GridDepLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Launches `kernel` with programmatic stream serialization (see above).
template <typename P>
cudaError_t LaunchPdl(void (*kernel)(P), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const P& p) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, p);
}

}  // namespace dsv4::kernels::cuda::moe
#endif
