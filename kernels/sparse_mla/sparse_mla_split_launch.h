// Host helpers of the split-KV main kernels (CUDA translation units only): the launch with the splits of each
// (head group, sequence) -- grid.y -- as one thread-block cluster, the kernel attributes that launch needs,
// and how many such clusters the GPU co-schedules (the plan uses the cluster merge only where all of a
// batch's clusters run in one wave).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/sparse_mla/sparse_mla_kernels.h"

namespace dsv4::kernels::sparse_mla::internal {

// Raises the kernel's dynamic shared memory limit and, on sm_90+, allows clusters above the portable 8.
template <typename... Params>
cudaError_t PrepareSplitKernel(void (*kernel)(Params...), int smem_bytes) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return err;
  }
  int device = 0, major = 0;
  err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess || major < 9) return err;
  // Where clusters above 8 are refused the capacity query simply finds none; not an error for the kernel.
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  return cudaSuccess;
}

// The launch configuration; with cluster_y > 1 the blocks (x, y0..y0 + cluster_y - 1, z) form clusters
// through `attr`, which the caller keeps alive while the configuration is used.
inline cudaLaunchConfig_t SplitLaunchConfig(dim3 grid, int threads, int smem_bytes, int cluster_y,
                                            cudaStream_t stream, cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 1;
  attr.val.clusterDim.y = cluster_y;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = cluster_y > 1 ? 1 : 0;
  return config;
}

// Launches kernel(args...) on grid, with the splits (grid.y) as clusters of cluster_y blocks when > 1.
template <typename... Params, typename... Args>
cudaError_t LaunchSplitKernel(void (*kernel)(Params...), dim3 grid, int threads, int smem_bytes, int cluster_y,
                              cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = SplitLaunchConfig(grid, threads, smem_bytes, cluster_y, stream, attr);
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) (void)cudaGetLastError();  // returned here, not left for an unrelated later check
  return err;
}

// Clusters of `splits` blocks the device can hold at once (0 where it cannot run them; errors are cleared).
template <typename... Params>
int SplitClusterCapacity(void (*kernel)(Params...), int threads, int smem_bytes, int splits) {
  if (splits < 2 || splits > kMaxClusterSplits) return 0;
  if (PrepareSplitKernel(kernel, smem_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = SplitLaunchConfig(dim3(1, splits, 1), threads, smem_bytes, splits, nullptr, attr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, reinterpret_cast<const void*>(kernel), &config) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return clusters;
}

}  // namespace dsv4::kernels::sparse_mla::internal
