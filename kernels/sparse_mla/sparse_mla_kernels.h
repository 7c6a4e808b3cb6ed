// Internal interface between the host launcher (sparse_mla_launch.cc) and the CUDA translation units.
// Plain C++ and the CUDA runtime types only; validation and plans live in the launcher.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/sparse_mla/sparse_mla_params.h"
#include "kernels/sparse_mla/sparse_mla_partition.h"

namespace dsv4::kernels::sparse_mla::internal {

// Heads of one MMA block: 16 * m_tiles (m_tiles = 1, 2 or 4; H = 128 runs two 64-head groups).
// Tile rows: KV rows per pipeline step (16 or 32). Dynamic shared memory of that configuration.
int MmaSmemBytes(int m_tiles, int tile_rows);
// Raises the kernel's dynamic shared memory limit (once, at plan time, outside any graph capture).
cudaError_t PrepareMmaKernel(int m_tiles, int tile_rows);
// Workspace for `partial_rows` split rows (0 when nothing is split): 256 KB of merge counters (zero
// between launches), then [rows, 512] f32 partial outputs + [rows] f32 running max (log2 units) + [rows] f32
// running sum. Rows: the 8-warp kernel partition.Slots() x H, the wide kernel B x H x splits.
size_t MmaWorkspaceBytes(int64_t partial_rows);
// Merge counters: two per (sequence, head group) of a launch of the 8-warp kernel (written, merged).
inline constexpr int64_t kMmaMergeCounters = 65536;
// Blocks of the 8-warp kernel one SM holds (after PrepareMmaKernel): its launches must fit in one wave.
int MmaBlocksPerSm(int m_tiles, int tile_rows);
// The most parts one sequence may be cut into for the 8-warp kernel's merge (its weights fill the shared
// memory below the block statistics).
int MmaMergeMaxSplits(int m_tiles, int tile_rows);
// The wide (16-warp, 32-row tile) MMA kernel of sparse_mla_mma_wide.cu: dynamic shared memory (0 for an
// unsupported m_tiles), the shared memory limit, and the main-kernel launch alone.
int MmaWideSmemBytes(int m_tiles);
cudaError_t PrepareMmaWideKernel(int m_tiles);
cudaError_t LaunchMmaWideMain(const SparseMlaParams& p, int m_tiles, int num_splits, cudaStream_t stream);
// The wide kernel over (head group, split, sequence) and, when num_splits > 1, the LSE combine kernel (with
// programmatic dependent launch when pdl); or the 8-warp kernel with tile_rows over (head group, part of
// `partition`), which merges split sequences itself.
cudaError_t LaunchMmaDecode(const SparseMlaParams& p, bool wide, int m_tiles, int tile_rows, int num_splits,
                            const MmaPartition& partition, bool pdl, cudaStream_t stream);
// Test hook (sparse_mla_dequant_check.cu): out[256 s + c] = the kernels' bf16 dequantisation of e4m3
// code c under ue8m0 scale byte s, for all 256 x 256 pairs (out: 65,536 uint16 in device memory).
cudaError_t LaunchDequantTable(uint16_t* out, cudaStream_t stream);
// One block per (sequence, head), f32 on CUDA cores.
cudaError_t LaunchSimtDecode(const SparseMlaParams& p, cudaStream_t stream);

}  // namespace dsv4::kernels::sparse_mla::internal
