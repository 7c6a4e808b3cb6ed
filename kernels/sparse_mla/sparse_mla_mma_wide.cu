// Tensor-core sparse-MLA decode, wide variant (16 warps, 32-row tiles, two barriers per tile); design in
// docs/sparse-mla.md ("Wide MMA kernel"). Needs ~200 KB of shared memory (sm_90). The plan picks it for
// few 64-head blocks (small batch), with 16- or 32-head blocks; the 8-warp kernel of sparse_mla_mma.cu
// serves larger batches (measured faster there) and GPUs with less shared memory (sm_120).
//
// One block = one sequence x G = 16 * kMTiles heads x one split of the selected rows, 512 threads. Why 16
// warps: the 8-warp kernel needs 253 registers (128 O accumulators + 64 of Q), so each scheduler had two
// warps and stalled on HMMA / ldmatrix latency. Here each warp owns 32 output dims (64 accumulators at
// G = 64) and one m-tile x 512/(16/kMTiles) dims of Q (32 registers at G = 64), so 128 registers suffice
// and four warps share each scheduler.
//
// Software pipeline over tiles t (raw FP8 tiles in a 3-stage cp.async ring, bf16 tiles in 3 buffers):
//   phase X(t): PV(t) [P(t), bf16 tile t] + QK(t+1) [bf16 tile t+1 -> partial scores]
//               + dequant(t+2) [raw tile t+2 -> bf16 tile t+2]      -- tensor and ALU work of every warp
//   barrier
//   phase Y(t): softmax(t+1) [partial scores -> P(t+1), alpha(t+1)] + gather of raw tile t+5
//   barrier
// so the tensor pipe only idles in the (short) softmax phase, against three phases in the 8-warp kernel.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/sparse_mla/sparse_mla_cluster_merge.cuh"
#include "kernels/sparse_mla/sparse_mla_device.cuh"
#include "kernels/sparse_mla/sparse_mla_kernels.h"
#include "kernels/sparse_mla/sparse_mla_split_launch.h"

namespace dsv4::kernels::sparse_mla {
namespace {

using namespace device;  // NOLINT(build/namespaces): kernel-local helpers
using internal::LaunchSplitKernel;
using internal::PrepareSplitKernel;
using internal::SplitClusterCapacity;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 32;                    // KV rows per tile
constexpr int kStages = 3;                   // raw tiles in the cp.async ring
constexpr int kKbufs = 3;                    // bf16 tiles: PV(t), QK(t+1), dequant(t+2)
constexpr int kKbStride = 2 * kKvDim + 16;   // bytes per bf16 row; +16 B keeps ldmatrix conflict-free
constexpr int kDataChunks = kRowDataBytes / 16;  // 36 chunks of 16 B per row (28 e4m3, 8 rope)
// Raw rows sit 592 B apart in shared memory (148 words = 20 mod 32): eight consecutive rows' 16-byte
// chunks then fall on distinct banks, so the dequant (one row per lane) reads conflict-free.
constexpr int kRawStride = kRowDataBytes + 16;
constexpr int kNopeWarps = kNopeDim / 32;        // dequant: warps 0..13 convert 32 e4m3 dims of every row
constexpr int kAddrSlots = 4;                     // row-address table slots (tile % 4)
constexpr int kPvDims = kKvDim / kWarps;         // 32 output dims per warp
constexpr float kRescaleSlack = 8.f;  // log2 units, see the softmax

template <int kMTiles>
struct WideConfig {
  static constexpr int kHeads = 16 * kMTiles;
  // QK: warp w owns m-tile w % kMTiles and dim group w / kMTiles (the partial scores of the kDimGroups
  // groups are summed by the softmax).
  static constexpr int kDimGroups = kWarps / kMTiles;
  static constexpr int kQkDims = kKvDim / kDimGroups;
  static constexpr int kQkKSteps = kQkDims / 16;
  // Softmax: consecutive threads share a head.
  static constexpr int kThreadsPerHead = kThreads / kHeads;
  static constexpr int kRowsPerThread = kRows / kThreadsPerHead;
  // Shared memory: raw stages [rows x 576][rows x 8 scales][rows x int valid], bf16 tiles and their valid
  // flags, partial scores [kDimGroups][G][rows + 4] f32, P [G][rows + 8] bf16, per-head alpha / stats.
  static constexpr int kRawData = kRows * kRawStride;
  static constexpr int kRawScales = kRows * kRowScaleBytes;
  static constexpr int kRawStage = kRawData + kRawScales + kRows * 4;
  static constexpr int kKbBytes = kRows * kKbStride;
  static constexpr int kSpartStride = kRows + 4;
  static constexpr int kPStride = kRows + 8;
  static constexpr int kOffKb = kStages * kRawStage;
  static constexpr int kOffKbValid = kOffKb + kKbufs * kKbBytes;
  static constexpr int kOffSpart = kOffKbValid + kKbufs * kRows * 4;
  static constexpr int kOffP = kOffSpart + kDimGroups * kHeads * kSpartStride * 4;
  static constexpr int kOffAlpha = kOffP + kHeads * kPStride * 2;
  static constexpr int kOffStatM = kOffAlpha + kHeads * 4;
  static constexpr int kOffStatL = kOffStatM + kHeads * 4;
  static constexpr int kOffStatLq = kOffStatL + kHeads * 4;
  // Row address table: 4 tile slots x rows x {data, scales} pointers (null data = skipped entry).
  static constexpr int kOffAddr = kOffStatLq + kHeads * 4;
  static constexpr int kSmemBytes = kOffAddr + kAddrSlots * kRows * 16;
  // Q is staged (bf16, kKbStride rows) in bf16 buffers 1 and 2 before tile 1 is dequantised.
  static constexpr int kOffQ = kOffKb + kKbBytes;
  // The cluster merge's scratch (from offset 0) stays below the statistics the peers read.
  static constexpr bool kClusterMergeFits = ClusterMergeScratchBytes(kHeads) <= kOffStatM;
  static_assert(kClusterMergeFits, "the wide kernel always has room for the cluster merge");

  static_assert(kMTiles == 1 || kMTiles == 2 || kMTiles == 4, "m-tiles");
  static_assert(kRowsPerThread >= 1 && kThreadsPerHead <= 32, "softmax mapping");
  static_assert(kHeads * kKbStride <= 2 * kKbBytes, "Q staging fits two bf16 buffers");
  static_assert(kRawStage % 16 == 0 && kKbBytes % 16 == 0 && kOffSpart % 16 == 0 && kOffP % 16 == 0 &&
                    kOffAlpha % 16 == 0 && kOffAddr % 16 == 0,
                "16-byte alignment of shared regions");
};

template <int kMTiles>
__global__ void __launch_bounds__(kThreads, 1) SparseMlaMmaWideKernel(const SparseMlaParams p, float scale_log2) {
  using C = WideConfig<kMTiles>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int b = blockIdx.z, split = blockIdx.y, num_splits = gridDim.y;
  const int H = p.num_heads, head0 = blockIdx.x * C::kHeads;
  const BlockRange range = MakeRange<kRows>(p, b, split, num_splits);
  const int n = range.num_tiles;
  // ldmatrix lane addressing of a 16x16 A operand (also V^T): matrices rows 0-7 / 8-15 x cols 0-7 / 8-15.
  const int ld_row = (lane & 7) + ((lane >> 3) & 1) * 8, ld_col = (lane >> 4) * 8;
  int* kb_valid = reinterpret_cast<int*>(smem + C::kOffKbValid);

  // ---- row addresses of one tile (lane = row) -> table slot tile % 4; run by one warp a phase ahead of
  // the gather, so the index load and address decode run once per row, not once per copying warp ----
  const uint8_t** addr_table = reinterpret_cast<const uint8_t**>(smem + C::kOffAddr);
  auto locate_tile = [&](int tile) {
    const int pos = (range.tile_begin + tile) * kRows + lane;
    RowAddress addr{nullptr, nullptr};
    if (!(pos < range.n && LocateRow(p, b, pos, range.ew, addr))) addr.data = nullptr;
    const uint8_t** slot = addr_table + (tile % kAddrSlots) * kRows * 2;
    slot[2 * lane] = addr.data;
    slot[2 * lane + 1] = addr.scales;
  };
  // ---- gather one raw tile (576 data + 8 scale bytes per row) with cp.async, 16 threads per row so each
  // warp's copies cover two contiguous 576-byte rows ----
  auto load_tile = [&](int tile) {
    constexpr int kThreadsPerRow = kThreads / kRows;
    const int row = tid / kThreadsPerRow, sub = tid % kThreadsPerRow;
    const uint8_t* const* slot = addr_table + (tile % kAddrSlots) * kRows * 2;
    const uint8_t* data = slot[2 * row];
    const bool valid = data != nullptr;
    const uint8_t* dummy = reinterpret_cast<const uint8_t*>(p.q);  // never read (zero-fill copies)
    if (!valid) data = dummy;
    uint8_t* st = smem + (tile % kStages) * C::kRawStage;
    const uint32_t dst = SmemAddr(st + row * kRawStride);
#pragma unroll
    for (int part = sub; part < kDataChunks; part += kThreadsPerRow) {
      CpAsync16(dst + part * 16, data + (valid ? part * 16 : 0), valid);
    }
    if (sub == kThreadsPerRow - 1) {
      CpAsync8(SmemAddr(st + C::kRawData + row * kRowScaleBytes), valid ? slot[2 * row + 1] : dummy, valid);
      reinterpret_cast<int*>(st + C::kRawData + C::kRawScales)[row] = valid;
    }
  };
  const bool locator = warp == kWarps - 1;  // a rope-only dequant warp: the lightest X-phase load

  // ---- raw tile -> bf16 [rows][512] (invalid rows were zero-filled, so they give 0) ----
  // Lane = row; warp w < 14 converts e4m3 dims [32w, 32w + 32) (scale tile w / 2), warps 14 and 15 copy
  // 32 rope dims each. Warp-uniform roles, no index arithmetic, conflict-free loads and stores.
  auto dequant_tile = [&](int tile) {
    const uint8_t* stage = smem + (tile % kStages) * C::kRawStage;
    const uint8_t* src = stage + lane * kRawStride;
    uint4* dst = reinterpret_cast<uint4*>(smem + C::kOffKb + (tile % kKbufs) * C::kKbBytes + lane * kKbStride);
    if (warp < kNopeWarps) {
      const float scale = ScaleFromUe8m0(stage[C::kRawData + lane * kRowScaleBytes + (warp >> 1)]);
      const uint4 v0 = reinterpret_cast<const uint4*>(src)[2 * warp];
      const uint4 v1 = reinterpret_cast<const uint4*>(src)[2 * warp + 1];
      uint4 o0, o1, o2, o3;
      DequantE4m3x4(v0.x, scale, o0.x, o0.y);
      DequantE4m3x4(v0.y, scale, o0.z, o0.w);
      DequantE4m3x4(v0.z, scale, o1.x, o1.y);
      DequantE4m3x4(v0.w, scale, o1.z, o1.w);
      DequantE4m3x4(v1.x, scale, o2.x, o2.y);
      DequantE4m3x4(v1.y, scale, o2.z, o2.w);
      DequantE4m3x4(v1.z, scale, o3.x, o3.y);
      DequantE4m3x4(v1.w, scale, o3.z, o3.w);
      dst[4 * warp] = o0;
      dst[4 * warp + 1] = o1;
      dst[4 * warp + 2] = o2;
      dst[4 * warp + 3] = o3;
    } else {
      // rope: raw bytes 448 + 64 (w - 14) .. -> bf16 bytes 896 + 64 (w - 14) ..
      const int c0 = kNopeDim / 16 + 4 * (warp - kNopeWarps);
#pragma unroll
      for (int j = 0; j < 4; ++j) dst[c0 + 28 + j] = reinterpret_cast<const uint4*>(src)[c0 + j];
    }
    if (warp == 0) {
      kb_valid[(tile % kKbufs) * kRows + lane] =
          reinterpret_cast<const int*>(stage + C::kRawData + C::kRawScales)[lane];
    }
  };

  // ---- QK: partial scores of m-tile qm over dim group qd for all 32 rows -> shared memory ----
  const int qm = warp % kMTiles, qd = warp / kMTiles;
  uint32_t qa[C::kQkKSteps][4];
  float* spart = reinterpret_cast<float*>(smem + C::kOffSpart);
  auto qk_tile = [&](int tile) {
    const uint32_t kb_lane = SmemAddr(smem + C::kOffKb + (tile % kKbufs) * C::kKbBytes) +
                             ((lane & 7) + ((lane >> 4) << 3)) * kKbStride +
                             (qd * C::kQkDims + ((lane >> 3) & 1) * 8) * 2;
    // 16 rows at a time: 8 accumulators beside the 64 of O and the 32 of Q.
#pragma unroll
    for (int np = 0; np < kRows / 16; ++np) {
      float acc[2][4] = {};
#pragma unroll
      for (int ks = 0; ks < C::kQkKSteps; ++ks) {
        uint32_t r0, r1, r2, r3;
        Ldsm4(kb_lane + np * 16 * kKbStride + ks * 32, r0, r1, r2, r3);
        Mma16816(acc[0], qa[ks], r0, r1);
        Mma16816(acc[1], qa[ks], r2, r3);
      }
      float* sp = spart + (qd * C::kHeads + 16 * qm + g) * C::kSpartStride + 16 * np + 2 * t4;
#pragma unroll
      for (int ni = 0; ni < 2; ++ni) {
        *reinterpret_cast<float2*>(sp + 8 * ni) = make_float2(acc[ni][0], acc[ni][1]);
        *reinterpret_cast<float2*>(sp + 8 * C::kSpartStride + 8 * ni) = make_float2(acc[ni][2], acc[ni][3]);
      }
    }
  };

  // ---- softmax (base 2) of one head's rows over kThreadsPerHead consecutive lanes ----
  const int sm_head = tid / C::kThreadsPerHead, sm_sub = tid % C::kThreadsPerHead;
  const int sm_row0 = sm_sub * C::kRowsPerThread;
  float run_max = -INFINITY, run_sum = 0.f, run_sum_q = 0.f;
  float* alpha_s = reinterpret_cast<float*>(smem + C::kOffAlpha);
  auto softmax_tile = [&](int tile) {
    const float* sp = spart + sm_head * C::kSpartStride + sm_row0;
    const int* valid = kb_valid + (tile % kKbufs) * kRows + sm_row0;
    float sv[C::kRowsPerThread];
#pragma unroll
    for (int i = 0; i < C::kRowsPerThread; ++i) sv[i] = 0.f;
#pragma unroll
    for (int dg = 0; dg < C::kDimGroups; ++dg) {
      const float* row = sp + dg * C::kHeads * C::kSpartStride;
      if constexpr (C::kRowsPerThread == 4) {
        const float4 v = *reinterpret_cast<const float4*>(row);
        sv[0] += v.x, sv[1] += v.y, sv[2] += v.z, sv[3] += v.w;
      } else if constexpr (C::kRowsPerThread == 2) {
        const float2 v = *reinterpret_cast<const float2*>(row);
        sv[0] += v.x, sv[1] += v.y;
      } else {
        sv[0] += row[0];
      }
    }
    float tmax = -INFINITY;
#pragma unroll
    for (int i = 0; i < C::kRowsPerThread; ++i) {
      sv[i] = valid[i] ? sv[i] * scale_log2 : -INFINITY;
      tmax = fmaxf(tmax, sv[i]);
    }
#pragma unroll
    for (int off = C::kThreadsPerHead / 2; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(~0u, tmax, off));
    // Lazy rescale (as the 8-warp kernel): the running max moves only when a tile beats it by more than
    // kRescaleSlack, so after the first tiles alpha is exactly 1 and PV skips the O rescale.
    const float new_max =
        (run_max == -INFINITY || tmax > run_max + kRescaleSlack) ? fmaxf(run_max, tmax) : run_max;
    const float base = new_max == -INFINITY ? 0.f : new_max;
    const float alpha = exp2f(run_max - base);
    __nv_bfloat16* prow = reinterpret_cast<__nv_bfloat16*>(smem + C::kOffP) + sm_head * C::kPStride + sm_row0;
    // f32 sum for the LSE / split weights, sum of the bf16 weights to normalise O like PV used them.
    float tsum = 0.f, tsum_q = 0.f;
    uint32_t packed[(C::kRowsPerThread + 1) / 2];
#pragma unroll
    for (int i = 0; i < C::kRowsPerThread; i += 2) {
      const float p0 = exp2f(sv[i] - base);
      const float p1 = i + 1 < C::kRowsPerThread ? exp2f(sv[i + 1 < C::kRowsPerThread ? i + 1 : i] - base) : 0.f;
      const uint32_t pair = PackBf16x2(p0, p1);
      packed[i / 2] = pair;
      tsum += p0 + p1;
      tsum_q += __uint_as_float(pair << 16) + __uint_as_float(pair & 0xffff0000u);
    }
    if constexpr (C::kRowsPerThread == 4) {
      *reinterpret_cast<uint2*>(prow) = make_uint2(packed[0], packed[1]);
    } else if constexpr (C::kRowsPerThread == 2) {
      *reinterpret_cast<uint32_t*>(prow) = packed[0];
    } else {
      *reinterpret_cast<uint16_t*>(prow) = static_cast<uint16_t>(packed[0] & 0xffffu);
    }
#pragma unroll
    for (int off = C::kThreadsPerHead / 2; off > 0; off >>= 1) {
      tsum += __shfl_xor_sync(~0u, tsum, off);
      tsum_q += __shfl_xor_sync(~0u, tsum_q, off);
    }
    run_sum = run_sum * alpha + tsum;
    run_sum_q = run_sum_q * alpha + tsum_q;
    run_max = new_max;
    if (sm_sub == 0) alpha_s[sm_head] = alpha;
  };

  // ---- PV: O = alpha * O + P V over this warp's 32 dims, all G heads ----
  float o[kMTiles][kPvDims / 8][4];
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int nj = 0; nj < kPvDims / 8; ++nj) o[mi][nj][0] = o[mi][nj][1] = o[mi][nj][2] = o[mi][nj][3] = 0.f;
  auto pv_tile = [&](int tile) {
    bool ones = true;
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) ones = ones && alpha_s[16 * mi + g] == 1.f && alpha_s[16 * mi + g + 8] == 1.f;
    if (!__all_sync(~0u, ones)) {  // skipping is exact: the running max did not move for these heads
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
        const float a_lo = alpha_s[16 * mi + g], a_hi = alpha_s[16 * mi + g + 8];
#pragma unroll
        for (int nj = 0; nj < kPvDims / 8; ++nj) {
          o[mi][nj][0] *= a_lo;
          o[mi][nj][1] *= a_lo;
          o[mi][nj][2] *= a_hi;
          o[mi][nj][3] *= a_hi;
        }
      }
    }
    const uint32_t p_lane = SmemAddr(smem + C::kOffP) + (ld_row * C::kPStride + ld_col) * 2;
    const uint32_t v_lane = SmemAddr(smem + C::kOffKb + (tile % kKbufs) * C::kKbBytes) + ld_row * kKbStride +
                            (warp * kPvDims + ld_col) * 2;
#pragma unroll
    for (int kr = 0; kr < kRows / 16; ++kr) {
      uint32_t v[kPvDims / 16][4];
#pragma unroll
      for (int njp = 0; njp < kPvDims / 16; ++njp) {
        Ldsm4T(v_lane + 16 * kr * kKbStride + njp * 32, v[njp][0], v[njp][1], v[njp][2], v[njp][3]);
      }
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
        uint32_t pa[4];
        Ldsm4(p_lane + (16 * mi * C::kPStride + 16 * kr) * 2, pa[0], pa[1], pa[2], pa[3]);
#pragma unroll
        for (int njp = 0; njp < kPvDims / 16; ++njp) {
          Mma16816(o[mi][2 * njp], pa, v[njp][0], v[njp][1]);
          Mma16816(o[mi][2 * njp + 1], pa, v[njp][2], v[njp][3]);
        }
      }
    }
  };

  // ---- prologue: Q and raw tiles 0..2 in flight; Q -> fragments; tile 0 dequantised; tile 1 landed ----
  {
    const uint8_t* q_src =
        reinterpret_cast<const uint8_t*>(p.q + (static_cast<int64_t>(b) * H + head0) * kKvDim);
    const uint32_t q_dst = SmemAddr(smem + C::kOffQ);
    for (int c = tid; c < C::kHeads * (kKvDim / 8); c += kThreads) {
      const int h = c / (kKvDim / 8), j = c % (kKvDim / 8);
      CpAsync16(q_dst + h * kKbStride + j * 16, q_src + static_cast<int64_t>(c) * 16, true);
    }
  }
  if (warp < kAddrSlots && warp < n) locate_tile(warp);  // tiles 0..3
  __syncthreads();
  if (n > 0) load_tile(0);
  CpAsyncCommit();
  if (n > 1) load_tile(1);
  CpAsyncCommit();
  if (n > 2) load_tile(2);
  CpAsyncCommit();
  CpAsyncWait<2>();  // Q and tile 0
  __syncthreads();
  {
    const uint32_t q_lane =
        SmemAddr(smem + C::kOffQ) + (16 * qm + ld_row) * kKbStride + (qd * C::kQkDims + ld_col) * 2;
#pragma unroll
    for (int ks = 0; ks < C::kQkKSteps; ++ks) Ldsm4(q_lane + ks * 32, qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3]);
  }
  if (n > 0) dequant_tile(0);
  __syncthreads();
  if (n > 3) load_tile(3);
  CpAsyncCommit();
  CpAsyncWait<2>();  // tile 1
  __syncthreads();

  // ---- main loop: cp.async group k holds raw tile k (group 0 also Q), so wait_group 2 after committing
  // tile t+5 means tile t+3 has landed (it is dequantised in the next X phase) ----
  for (int t = -1; t < n; ++t) {
    if (t >= 0) pv_tile(t);
    if (t + 1 < n) qk_tile(t + 1);
    if (t + 2 < n) dequant_tile(t + 2);
    if (locator && t + 5 < n) locate_tile(t + 5);  // slot (t + 5) % 4 was last read in Y(t - 3)
    __syncthreads();
    if (t + 1 < n) softmax_tile(t + 1);
    if (t + 5 < n) load_tile(t + 5);  // into tile t+2's stage, dequantised above
    CpAsyncCommit();
    CpAsyncWait<2>();
    __syncthreads();
  }

  // ---- epilogue: per-head max / sums to every warp, then normalise and store ----
  LaunchDependents();
  float* stat_m = reinterpret_cast<float*>(smem + C::kOffStatM);
  float* stat_l = reinterpret_cast<float*>(smem + C::kOffStatL);
  float* stat_lq = reinterpret_cast<float*>(smem + C::kOffStatLq);
  if (sm_sub == 0) {
    stat_m[sm_head] = run_max;
    stat_l[sm_head] = run_sum;
    stat_lq[sm_head] = run_sum_q;
  }
  __syncthreads();
  if (num_splits > 1 && ClusterBlocks() == num_splits) {  // the splits are one cluster: merge in place
    ClusterMergeOutput<kMTiles, kPvDims, C::kHeads, kThreads>(p, o, stat_m, stat_l, stat_lq, b, head0, tid,
                                                              /*mtile_head0=*/0, /*dim0=*/warp * kPvDims, smem);
  } else {
    StoreBlockOutput<kMTiles, kPvDims, C::kHeads>(p, o, stat_m, stat_l, stat_lq, b, head0, split, num_splits, tid,
                                                  /*mtile_head0=*/0, /*dim0=*/warp * kPvDims);
  }
}

template <int kMTiles>
cudaError_t LaunchWide(const SparseMlaParams& p, int num_splits, bool cluster_merge, cudaStream_t stream) {
  using C = WideConfig<kMTiles>;
  const dim3 grid(p.num_heads / C::kHeads, num_splits, p.batch);
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  return LaunchSplitKernel(SparseMlaMmaWideKernel<kMTiles>, grid, kThreads, C::kSmemBytes,
                           cluster_merge ? num_splits : 1, stream, p, scale_log2);
}

template <int kMTiles>
cudaError_t PrepareWide() {
  return PrepareSplitKernel(SparseMlaMmaWideKernel<kMTiles>, WideConfig<kMTiles>::kSmemBytes);
}

template <int kMTiles>
int WideClusterCapacity(int num_splits) {
  return SplitClusterCapacity(SparseMlaMmaWideKernel<kMTiles>, kThreads, WideConfig<kMTiles>::kSmemBytes, num_splits);
}

}  // namespace

namespace internal {

int MmaWideSmemBytes(int m_tiles) {
  switch (m_tiles) {
    case 4: return WideConfig<4>::kSmemBytes;
    case 2: return WideConfig<2>::kSmemBytes;
    case 1: return WideConfig<1>::kSmemBytes;
    default: return 0;
  }
}

cudaError_t PrepareMmaWideKernel(int m_tiles) {
  switch (m_tiles) {
    case 4: return PrepareWide<4>();
    case 2: return PrepareWide<2>();
    case 1: return PrepareWide<1>();
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchMmaWideMain(const SparseMlaParams& p, int m_tiles, int num_splits, bool cluster_merge,
                              cudaStream_t stream) {
  switch (m_tiles) {
    case 4: return LaunchWide<4>(p, num_splits, cluster_merge, stream);
    case 2: return LaunchWide<2>(p, num_splits, cluster_merge, stream);
    case 1: return LaunchWide<1>(p, num_splits, cluster_merge, stream);
    default: return cudaErrorInvalidValue;
  }
}

int MmaWideClusterCapacity(int m_tiles, int num_splits) {
  switch (m_tiles) {
    case 4: return WideClusterCapacity<4>(num_splits);
    case 2: return WideClusterCapacity<2>(num_splits);
    case 1: return WideClusterCapacity<1>(num_splits);
    default: return 0;
  }
}

}  // namespace internal
}  // namespace dsv4::kernels::sparse_mla
