// The static work partition of the 8-warp MMA kernel (fourth pass, docs/sparse-mla.md "Partition"): the
// batch's selected rows, as units of one tile (kTileRows rows), laid end to end -- sequence 0's T tiles,
// then sequence 1's, ... -- and cut into N equal runs, one per block (per head group). A block walks its run
// sequence by sequence ("segments"); a sequence cut by a run boundary is finished by a merge of its parts'
// partial results. This fills every SM at any batch (B = 96 on 132 SMs: 15 tiles per block instead of 20
// for 96 blocks), where splitting each sequence into equal pieces leaves SMs idle or runs a second wave.
//
// Plain arithmetic shared by the host (plan, launcher, unit tests) and the kernel; the partition uses the
// launch's top-k (T = tiles of window.topk + extra.topk), so sequences shortened by `lengths` simply do less
// work inside their units.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DSV4_SPARSE_MLA_HD __host__ __device__ __forceinline__
#else
#define DSV4_SPARSE_MLA_HD inline
#endif

namespace dsv4::kernels::sparse_mla {

struct MmaPartition {
  int batch = 0;          // B >= 1
  int tiles_per_seq = 0;  // T >= 1
  int parts = 0;          // 1 <= N <= B T: blocks per head group; part i holds units [Begin(i), Begin(i + 1))

  // The partition with `parts` clamped to [1, B T]: no part is empty, so every part between a sequence's
  // first and last part holds some of its tiles (and takes part in its merge).
  static MmaPartition Of(int batch, int tiles_per_seq, int64_t parts) {
    MmaPartition m{.batch = batch < 1 ? 1 : batch, .tiles_per_seq = tiles_per_seq < 1 ? 1 : tiles_per_seq};
    const int64_t units = m.Units();
    m.parts = static_cast<int>(parts < 1 ? 1 : parts > units ? units : parts);
    return m;
  }

  DSV4_SPARSE_MLA_HD int64_t Units() const { return static_cast<int64_t>(batch) * tiles_per_seq; }
  DSV4_SPARSE_MLA_HD int64_t Begin(int part) const { return part * Units() / parts; }
  // The part holding unit u (< Units()): the largest i with Begin(i) <= u, i.e. floor(((u + 1) N - 1) / U).
  DSV4_SPARSE_MLA_HD int PartOf(int64_t u) const { return static_cast<int>(((u + 1) * parts - 1) / Units()); }
  // Sequence b's units lie in parts FirstPart(b) .. LastPart(b); it is split when they differ.
  DSV4_SPARSE_MLA_HD int FirstPart(int b) const { return PartOf(static_cast<int64_t>(b) * tiles_per_seq); }
  DSV4_SPARSE_MLA_HD int LastPart(int b) const { return PartOf(static_cast<int64_t>(b + 1) * tiles_per_seq - 1); }
  // Workspace slot of (part, sequence) for a split sequence's partial result: part + b. Parts and sequences
  // are both consecutive runs of units, so the (part, sequence) pairs that meet form a staircase on which
  // part + b strictly increases: slots are unique, below parts + batch, and sequence b's are consecutive
  // (FirstPart(b) + b .. LastPart(b) + b).
  static DSV4_SPARSE_MLA_HD int Slot(int part, int b) { return part + b; }
  DSV4_SPARSE_MLA_HD int64_t Slots() const { return static_cast<int64_t>(parts) + batch; }
};

// Estimated time of a partition, in tiles of one block: the longest part's tiles, plus kSegmentCost for each
// further sequence that part starts (Q reload, pipeline refill, epilogue), plus kMergeCost when any
// sequence is split (partials written, the last block merges them). H200 estimates (bench/RESULTS.md,
// fourth pass): a 32-row tile costs ~3.8 us per block at B = 128, a segment start or a merge ~1.5-2 us.
inline constexpr double kSegmentCost = 0.5;
inline constexpr double kMergeCost = 0.5;
double MmaPartitionCost(const MmaPartition& partition);

// The partition for `batch` sequences of `tiles_per_seq` tiles on at most `max_parts` blocks per head group
// (SMs / head groups: one wave at one block per SM): the cheapest by MmaPartitionCost among N = k B
// (k = 1 .. T, each sequence cut into k equal pieces), N = ceil(B / j) for the least j that fits (j whole
// sequences per part) and N = max_parts; ties go to fewer parts.
MmaPartition ChooseMmaPartition(int batch, int tiles_per_seq, int max_parts);

}  // namespace dsv4::kernels::sparse_mla
