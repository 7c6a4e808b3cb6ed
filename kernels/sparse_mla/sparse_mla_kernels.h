// Internal interface between the host launcher (sparse_mla_launch.cc) and the CUDA translation units.
// Plain C++ and the CUDA runtime types only; validation and plans live in the launcher.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/sparse_mla/sparse_mla_params.h"

namespace dsv4::kernels::sparse_mla::internal {

// Largest split count the in-cluster merge takes (sparse_mla_cluster_merge.cuh): sm_90's non-portable cluster
// limit; the plan also checks the GPU co-schedules a batch's clusters (cudaOccupancyMaxActiveClusters).
constexpr int kMaxClusterSplits = 16;

// Heads of one MMA block: 16 * m_tiles (m_tiles = 1, 2 or 4; H = 128 runs two 64-head groups).
// Tile rows: KV rows per pipeline step (16 or 32). Dynamic shared memory of that configuration.
int MmaSmemBytes(int m_tiles, int tile_rows);
// Raises the kernel's dynamic shared memory limit (once, at plan time, outside any graph capture).
cudaError_t PrepareMmaKernel(int m_tiles, int tile_rows);
// Split-KV scratch: [B, H, splits, 512] f32 partial outputs + [B, H, splits] f32 running max (log2 units)
// + [B, H, splits] f32 running sum.
// (0 with the cluster merge: nothing goes through global memory.)
size_t MmaWorkspaceBytes(int batch, int num_heads, int num_splits, bool cluster_merge = false);
// The wide (16-warp, 32-row tile) MMA kernel of sparse_mla_mma_wide.cu: dynamic shared memory (0 for an
// unsupported m_tiles), the shared memory limit, and the main-kernel launch alone.
int MmaWideSmemBytes(int m_tiles);
cudaError_t PrepareMmaWideKernel(int m_tiles);
cudaError_t LaunchMmaWideMain(const SparseMlaParams& p, int m_tiles, int num_splits, bool cluster_merge,
                              cudaStream_t stream);
// Clusters of num_splits blocks the GPU holds at once for the 8-warp (MmaClusterCapacity) or wide kernel, with
// the splits merged in the cluster; 0 where that configuration cannot run the cluster merge (its shared memory
// has no room for the merge's scratch, num_splits outside [2, kMaxClusterSplits], or no cluster support).
int MmaClusterCapacity(int m_tiles, int tile_rows, int num_splits);
int MmaWideClusterCapacity(int m_tiles, int num_splits);
// The sm_90a wgmma kernel of sparse_mla_wgmma.cu (64-head blocks, 32-row tiles): whether this build holds
// its sm_90a code (the target list has 90a), its dynamic shared memory, limit and main-kernel launch.
bool MmaWgmmaBuilt();
int MmaWgmmaSmemBytes();
cudaError_t PrepareMmaWgmmaKernel();
cudaError_t LaunchMmaWgmmaMain(const SparseMlaParams& p, int num_splits, bool cluster_merge,
                               cudaStream_t stream);
// Clusters of num_splits blocks the GPU holds at once for the wgmma kernel with the splits merged in the cluster
// (0 where it cannot: not built, num_splits outside [2, kMaxClusterSplits], no cluster support).
int MmaWgmmaClusterCapacity(int num_splits);
// The warp-specialised sm_90a wgmma kernel of sparse_mla_wgmma_ws.cu (same blocks; built where the other is).
int MmaWgmmaWsSmemBytes();
cudaError_t PrepareMmaWgmmaWsKernel();
cudaError_t LaunchMmaWgmmaWsMain(const SparseMlaParams& p, int num_splits, bool cluster_merge,
                                 cudaStream_t stream);
int MmaWgmmaWsClusterCapacity(int num_splits);
// Main kernel over (head group, split, sequence) -- the wide one when `wide`, the wgmma one when `wgmma` (the
// warp-specialised one when also `wgmma_ws`), else the 8-warp one with tile_rows -- and, when num_splits > 1,
// either the splits as one cluster merging in place (`cluster_merge`, every main kernel on sm_90+) or the LSE
// combine kernel (with programmatic dependent launch when pdl).
cudaError_t LaunchMmaDecode(const SparseMlaParams& p, bool wide, bool wgmma, bool wgmma_ws, int m_tiles,
                            int tile_rows, int num_splits, bool cluster_merge, bool pdl, cudaStream_t stream);
// Test hook (sparse_mla_dequant_check.cu): out[256 s + c] = the kernels' bf16 dequantisation of e4m3
// code c under ue8m0 scale byte s, for all 256 x 256 pairs (out: 65,536 uint16 in device memory).
cudaError_t LaunchDequantTable(uint16_t* out, cudaStream_t stream);
// One block per (sequence, head), f32 on CUDA cores.
cudaError_t LaunchSimtDecode(const SparseMlaParams& p, cudaStream_t stream);

}  // namespace dsv4::kernels::sparse_mla::internal
