// Programmatic dependent launch (PDL) for the CUDA backend's kernels.
//
// A decode step at small batch is a chain of ~35 short kernels per layer (bench/RESULTS.md "Fourth session" ncu
// breakdown), and each boundary costs the drain of one grid plus the launch of the next. Launched with
// programmatic stream serialization, a kernel's blocks may become resident (and its launch cost is paid) while
// the kernel before it drains. The rule that keeps this correct: every kernel launched with LaunchPdl calls
// PdlEnter() as its FIRST statement, in every block: GridDepWait() returns once the previous kernel has completed
// and its writes are visible (a no-op when the kernel was launched without the attribute), then GridDepLaunch()
// lets the next kernel's blocks be scheduled. Because every block of every such kernel waits before it can
// finish, a kernel's completion implies its predecessor's, so reading the output of any earlier kernel (not only
// the one just before) stays safe. Kernels launched without the attribute (sparse-MLA, NCCL, memcpy) serialise as
// usual. DSV4_PDL=0 in the environment launches everything without the attribute (A/B measurements, a fallback) -
// the MoE chain included, which used PDL before the dense kernels did.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace dsv4::kernels::cuda {

// Whether LaunchPdl sets the attribute: true unless the environment has DSV4_PDL=0 (read once per process).
bool PdlEnabled();
// Tests: 1 / 0 force PDL on / off for launches from now on, -1 returns the choice to the environment.
void SetPdlForTesting(int enabled);

#if defined(__CUDACC__)
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

// The first statement of every kernel launched with LaunchPdl (see above).
__device__ __forceinline__ void PdlEnter() {
  GridDepWait();
  GridDepLaunch();
}
#endif

// Launches `kernel` with `config` (which may carry other attributes, e.g. a cluster shape) plus programmatic
// stream serialization when PdlEnabled().
template <typename... KernelArgs, typename... Args>
cudaError_t LaunchPdlConfig(cudaLaunchConfig_t config, void (*kernel)(KernelArgs...), Args&&... args) {
  cudaLaunchAttribute attrs[4];
  if (config.numAttrs > 3) return cudaErrorInvalidValue;
  unsigned n = 0;
  for (unsigned i = 0; i < config.numAttrs; ++i) attrs[n++] = config.attrs[i];
  if (PdlEnabled()) {
    attrs[n] = {};
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  config.attrs = attrs;
  config.numAttrs = n;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  // As `<<<>>>` + cudaGetLastError() did: a failed launch is reported here, not later under another op's name.
  if (err != cudaSuccess) static_cast<void>(cudaGetLastError());
  return err;
}

template <typename... KernelArgs, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  return LaunchPdlConfig(config, kernel, std::forward<Args>(args)...);
}

}  // namespace dsv4::kernels::cuda
