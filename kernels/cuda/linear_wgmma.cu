// The FP8 block-128 linear on sm_90a tensor cores (wgmma), chosen from 33 tokens (contract: linear_params.h,
// LinearKernel::kWgmma; host side and plan: linear_wgmma.cc). Built only where the target list holds 90a
// (DSV4_LINEAR_SM90A); elsewhere the launch reports cudaErrorNotSupported and the plan never picks it.
//
// Why: from 33 tokens the mma.sync kernels (linear.cu, linear_fused.cu) spend their time on tensor-core issue and
// fragment traffic, not bytes (T = 128: 6-8x the byte floor, bench/RESULTS.md); wgmma runs a 64 x 64 x 16 product
// per instruction for the whole warpgroup with B read by the tensor cores straight from shared memory.
//
// One block = row_tiles tiles of 128 rows (two warpgroups of 64), in turn, x kTok tokens (64: wgmma m64n64k16; a
// 16-token build, m64n16k16, two blocks per SM, for 1-16 tokens) x one K slice (grid: x = the
// cluster's K slices, y = token blocks, z = groups of row_tiles consecutive tiles of the weights' tiles, which
// follow each other weight by weight as linear_fused.cu's row blocks):
//  - x: the block's [kTok tokens, k_slice] staged once as bf16 (rounded as every tensor-core linear rounds it) in
//    wgmma's no-swizzle "interleaved" K-major layout (8 tokens x 8 K = 128 contiguous bytes), the B operand, for
//    all its tiles (again only where a grouped linear's tile reads other x columns): x comes from L2 in f32, twice
//    a tile's weight bytes per token block, so staging it once per tile would cost more than the weights;
//  - weights: one continuous stream over the block's tiles (the ring runs across tile boundaries);
//    128 rows x 128 K e4m3 (16 KB, one block-scale column) per stage through a 4-stage cp.async ring, the
//    16-byte units XOR-swizzled by row so ldmatrix reads them without bank conflicts;
//  - A from registers: ldmatrix (b16) hands thread (g, t) of a warp bytes 4t..4t+3 of a 16-byte unit of rows g and
//    g + 8; exact e4m3 -> bf16 turns each 4 bytes into the fragment words of K positions (2t, 2t+1) and
//    (2t+8, 2t+9). The contraction does not care which physical K sits at which position as long as A and B agree,
//    so x is staged with the same permutation: within each 16-wide K group, positions 0..7 hold elements
//    {0,1,4,5,8,9,12,13} and 8..15 hold {2,3,6,7,10,11,14,15}. No shuffles, one ldmatrix per two k16 steps;
//  - per 128-wide step: 8 wgmmas into a partial sum, then acc += scale * partial in fp32 (the block scale
//    applied per step, as the other FP8 kernels do);
//  - K split over a cluster: after each tile every block parks its [kTok, 128] sums in shared memory and block q
//    adds tokens [q kTok / c, (q + 1) kTok / c) over the cluster in rank order through distributed shared memory
//    (deterministic); the cluster's blocks walk the same tiles.
// Summation differs from the mma.sync kernels only in order (fp32 sums of exact bf16 x bf16 products).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/cuda/linear_device.cuh"
#include "kernels/cuda/linear_params.h"
#include "kernels/cuda/pdl.h"
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "kernels/sparse_mla/sparse_mla_wgmma_ops.cuh"
#endif

namespace dsv4::kernels::cuda {
namespace {

constexpr int kThreads = 256;                       // two warpgroups
constexpr int kStageBytes = kWgmmaRows * 128;       // 128 rows x 128 e4m3
constexpr int kRingBytes = kWgmmaStages * kStageBytes;
constexpr int kRedStride = kWgmmaRows + 4;          // floats a token row of the cluster reduction's sums
static_assert((kWgmmaStages & (kWgmmaStages - 1)) == 0, "ring slots by mask");

// Shared memory of a block with kTok tokens (wgmma N: 16 or 64): the x slice [k_slice / 8 chunks][kTok][16 bytes],
// the ring, and for a cluster the reduction's [kTok][132] f32.
__host__ __device__ constexpr int64_t SharedBytesFor(int tokens, int64_t k_slice, int cluster) {
  return k_slice * tokens * 2 + kRingBytes + (cluster > 1 ? int64_t{tokens} * kRedStride * 4 : 0);
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
using sparse_mla::device::FenceProxyAsync;
using sparse_mla::device::SmemDesc;
using sparse_mla::device::WgmmaCommit;
using sparse_mla::device::WgmmaFence;
using sparse_mla::device::WgmmaWaitAll;

// d (+)= A B for m64n64k16, bf16 in, f32 accumulate; A from registers (the m16n8k16 A fragment of each warp's 16
// rows), B from shared memory, K-major; scale_d = 0 overwrites d.
__device__ __forceinline__ void WgmmaM64N64RsK(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                               int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

// The same for m64n16k16 (16 tokens).
__device__ __forceinline__ void WgmmaM64N16RsK(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

template <int kTok>
__device__ __forceinline__ void WgmmaRsK(float (&d)[kTok / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  if constexpr (kTok == 64) {
    WgmmaM64N64RsK(d, a, desc_b, scale_d);
  } else {
    static_assert(kTok == 16, "token tiles of 16 or 64");
    WgmmaM64N16RsK(d, a, desc_b, scale_d);
  }
}

// Four floats at `local`'s offset (16-byte aligned) in the shared memory of cluster block `rank`.
__device__ __forceinline__ float4 LoadClusterShared4(const float* local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(SharedAddress(local)), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}

__device__ __forceinline__ void LdMatrixX4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Sixteen x values (physical K order) as bf16, permuted for the A fragments (see the header): chunk 0 = elements
// {0,1,4,5,8,9,12,13}, chunk 1 = {2,3,6,7,10,11,14,15}.
__device__ __forceinline__ void PermuteX16(const float (&v)[16], uint4& c0, uint4& c1) {
  c0 = make_uint4(PackBf16x2(v[0], v[1]), PackBf16x2(v[4], v[5]), PackBf16x2(v[8], v[9]), PackBf16x2(v[12], v[13]));
  c1 = make_uint4(PackBf16x2(v[2], v[3]), PackBf16x2(v[6], v[7]), PackBf16x2(v[10], v[11]),
                  PackBf16x2(v[14], v[15]));
}
#endif

// kTok: tokens per block (wgmma N). 64 for 33+ tokens; 16 for few tokens, whose block (<= 105 KB of shared memory,
// 8 accumulators a thread) fits twice on an SM.
template <int kTok>
__global__ void __launch_bounds__(kThreads, kTok == 16 ? 2 : 1)
    LinearWgmmaKernel(const __grid_constant__ FusedLinearParams p) {
  PdlEnter();
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5, wg = tid >> 7, wg_warp = warp & 3;
  const int g = lane >> 2, t4 = lane & 3;
  const int rank = static_cast<int>(blockIdx.x);
  const int cluster = p.plan.cluster;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * kTok;
  const int tok_rows = static_cast<int>(p.t - tok0 < kTok ? p.t - tok0 : kTok);
  const int64_t kin = p.k;  // a multiple of 128 (host-checked)
  const int64_t k_slice = p.plan.k_slice;
  const int64_t k0 = rank * k_slice;
  const int chunks = k0 >= kin ? 0 : static_cast<int>(((kin - k0 < k_slice) ? kin - k0 : k_slice) / 128);
  // This block's row tiles: [tile0, tile0 + tiles) of all entries' tiles in order (the same for the whole cluster).
  const FusedLinearEntry& last = p.e[p.count - 1];
  const int64_t total_tiles = last.block0 + (last.n + kWgmmaRows - 1) / kWgmmaRows;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.z) * p.plan.row_tiles;
  const int tiles = static_cast<int>(total_tiles - tile0 < p.plan.row_tiles ? total_tiles - tile0 : p.plan.row_tiles);
  const int steps = tiles * chunks;
  unsigned char* xs = smem;
  unsigned char* ring = smem + k_slice * kTok * 2;
  float* red = reinterpret_cast<float*>(ring + kRingBytes);  // cluster > 1 only
  const uint32_t xs_addr = SharedAddress(xs), ring_addr = SharedAddress(ring);

  // The entry (weight) of row tile rt: the last whose first tile is <= rt (block0 ascends).
  auto entry_of = [&](int64_t rt) -> const FusedLinearEntry& {
    int idx = 0;
#pragma unroll
    for (int i = 1; i < kFusedMaxWeights; ++i) {
      if (i < p.count && rt >= p.e[i].block0) idx = i;
    }
    return p.e[idx];
  };

  // The weight stream: step q = (tile, 128-wide K chunk) into ring slot q % stages; 16-byte unit u of row r at
  // r * 128 + (u ^ (r & 7)) * 16, rows past the weight's n zero-filled. Thread tid copies unit tid & 7 of rows
  // tid / 8 + 32 i (i < 4): the same swizzled offset in every slot (plus 4096 i), the same source offsets per tile
  // (plus 128 a chunk), so the stream keeps its tile's row pointer and advances by additions (no division per step).
  const int ld_r0 = tid >> 3, ld_cu = tid & 7;
  const uint32_t ld_dst = static_cast<uint32_t>(ld_r0 * 128 + ((ld_cu ^ (ld_r0 & 7)) << 4));
  const uint8_t* ld_src = nullptr;  // unit ld_cu of row ld_r0 of the loading tile at chunk 0 of this block's slice
  const uint8_t* ld_w = nullptr;    // the loading tile's weight (a valid address for the zero-byte copies)
  int64_t ld_rstride = 0;           // 32 rows
  int ld_valid = 0;                 // bit i: row ld_r0 + 32 i < n
  int ld_c = 0;                     // the next load's chunk
  int64_t ld_rt = tile0;            // and tile
  auto ld_tile = [&]() {
    if (ld_rt >= tile0 + tiles) return;
    const FusedLinearEntry& e = entry_of(ld_rt);
    const int64_t row = (ld_rt - e.block0) * kWgmmaRows + ld_r0;
    ld_w = static_cast<const uint8_t*>(e.w);
    ld_src = ld_w + row * kin + k0 + 16 * ld_cu;
    ld_rstride = 32 * kin;
    ld_valid = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) ld_valid |= (row + 32 * i < e.n ? 1 : 0) << i;
  };
  int ld_q = 0;  // the next step to load
  auto load_next = [&]() {
    const uint32_t slot = ring_addr + static_cast<uint32_t>(ld_q & (kWgmmaStages - 1)) * kStageBytes + ld_dst;
    const uint8_t* src = ld_src + 128 * ld_c;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool ok = (ld_valid >> i) & 1;
      CpAsync16(slot + 4096 * i, ok ? src + i * ld_rstride : ld_w, ok ? 16 : 0);
    }
    ++ld_q;
    if (++ld_c == chunks) {
      ld_c = 0;
      ++ld_rt;
      ld_tile();
    }
  };
  if (steps > 0) ld_tile();
#pragma unroll
  for (int q = 0; q < kWgmmaStages - 1; ++q) {
    if (q < steps) load_next();
    CpAsyncCommit();
  }

  // x staging (columns [x_col + k0, + chunks * 128) of the block's tokens): warp-items of 8 tokens x 4 16-wide K
  // groups; lane -> token (lane & 7), group (lane >> 3), so the 8 lanes of a store phase write 8 consecutive
  // 16-byte rows of one chunk (no bank conflicts). Items go in batches of kXBatch per warp, all their loads issued
  // before the first conversion (x comes from L2: one item at a time would pay its latency per item).
  constexpr int kXBatch = 4;
  auto stage_x = [&](int64_t x_col) {
    constexpr int kTokBlocks = kTok / 8;
    const int items = kTokBlocks * (chunks * 2);  // chunks * 8 groups of 16, 4 per item
    for (int base = warp; base < items; base += kXBatch * (kThreads / 32)) {
      float4 raw[kXBatch][4];
#pragma unroll
      for (int b = 0; b < kXBatch; ++b) {
        const int it = base + b * (kThreads / 32);
        const int tok = (it % kTokBlocks) * 8 + (lane & 7);
        const int grp = (it / kTokBlocks) * 4 + (lane >> 3);
        if (it < items && tok < tok_rows) {
          const int64_t off = (tok0 + tok) * p.x_stride + x_col + k0 + 16 * grp;
          if (p.x_bf16) {
            const float4* src = reinterpret_cast<const float4*>(static_cast<const uint16_t*>(p.x) + off);
            raw[b][0] = __ldg(src), raw[b][1] = __ldg(src + 1);
          } else {
            const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + off);
#pragma unroll
            for (int h = 0; h < 4; ++h) raw[b][h] = __ldg(src + h);
          }
        } else {
#pragma unroll
          for (int h = 0; h < 4; ++h) raw[b][h] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
#pragma unroll
      for (int b = 0; b < kXBatch; ++b) {
        const int it = base + b * (kThreads / 32);
        if (it >= items) break;
        const int tok = (it % kTokBlocks) * 8 + (lane & 7);
        const int grp = (it / kTokBlocks) * 4 + (lane >> 3);
        float v[16];
        if (p.x_bf16) {  // 16 bf16 in raw[b][0..1]; zeros (padding tokens) stay zeros
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t words[4] = {__float_as_uint(raw[b][h].x), __float_as_uint(raw[b][h].y),
                                       __float_as_uint(raw[b][h].z), __float_as_uint(raw[b][h].w)};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              v[8 * h + 2 * j] = __uint_as_float(words[j] << 16);
              v[8 * h + 2 * j + 1] = __uint_as_float(words[j] & 0xffff0000u);
            }
          }
        } else {
#pragma unroll
          for (int h = 0; h < 4; ++h) {
            v[4 * h] = raw[b][h].x, v[4 * h + 1] = raw[b][h].y, v[4 * h + 2] = raw[b][h].z, v[4 * h + 3] = raw[b][h].w;
          }
        }
        uint4 c0, c1;
        PermuteX16(v, c0, c1);
        *reinterpret_cast<uint4*>(xs + ((2 * grp) * kTok + tok) * 16) = c0;
        *reinterpret_cast<uint4*>(xs + ((2 * grp + 1) * kTok + tok) * 16) = c1;
      }
    }
    FenceProxyAsync();  // the x stores -> wgmma (async proxy); the next step's __syncthreads publishes them
  };

  // ldmatrix row addresses: lane L reads matrix L / 8 (0: rows 0-7, 1: rows 8-15 of this warp's 16; 2, 3: the
  // same rows, the next 16-byte unit), row L % 8.
  const int lrow = 64 * wg + 16 * wg_warp + 8 * ((lane >> 3) & 1) + (lane & 7);
  const int lunit = lane >> 4;
  // acc[4j + h]: tile row 64 wg + 16 wg_warp + g (+ 8 for h >= 2), token 8j + 2 t4 + (h & 1).
  const int row_l = 64 * wg + 16 * wg_warp + g;
  constexpr int kAcc = kTok / 2;  // accumulators a thread: tokens 8j + 2 t4 + {0, 1}, rows g and g + 8
  float part[kAcc];  // a step's partial sums (overwritten by its first wgmma)
#pragma unroll
  for (int i = 0; i < kAcc; ++i) part[i] = 0.f;
  int64_t staged_col = -1;

  for (int ti = 0; ti < tiles; ++ti) {
    const int64_t rt = tile0 + ti;
    const FusedLinearEntry& e = entry_of(rt);
    const int64_t n = e.n;
    const int64_t blk_row0 = (rt - e.block0) * kWgmmaRows;
    if (e.x_col != staged_col) {  // the first tile, or a group of a grouped linear with its own x columns
      if (staged_col >= 0) __syncthreads();  // both warpgroups are done with the old slice (their wgmmas waited)
      stage_x(e.x_col);
      staged_col = e.x_col;
    }
    // This warpgroup's block-scale row (its 64 rows lie in one 128-row scale block: host-checked alignment).
    const int64_t wg_row = blk_row0 + 64 * wg < n ? blk_row0 + 64 * wg : n - 1;
    const float* scale = e.scale + ((e.scale_row0 + wg_row) / kScaleBlock) * e.scale_cols + k0 / 128;
    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;

    // One 128-wide step: 8 wgmmas into the partial sum, then acc += scale * partial. Each warpgroup waits for its
    // own step before folding (ptxas serialises every wgmma when the fold reads a second accumulator set while
    // another group is in flight: alternating two sets with wait_group 1 measured C7514 at compile time), so the
    // overlap comes from the block's other warpgroup. Measured slower on the H200 (bench/RESULTS.md, tenth session):
    // converting step q + 1 while step q's wgmmas run, with two fragment sets (2-7%), and staging the x slice a
    // chunk at a time beside the steps instead of before them (up to 15%: the loads' latency lands in the steps).
    for (int c = 0; c < chunks; ++c) {
      const int q = ti * chunks + c;
      CpAsyncWait<kWgmmaStages - 2>();
      __syncthreads();  // step q landed for every thread's copies; every warpgroup finished step q - 1's slot
      if (ld_q < steps) load_next();
      CpAsyncCommit();
      const float sc = __ldg(scale + c);
      const uint32_t slot = ring_addr + static_cast<uint32_t>(q & (kWgmmaStages - 1)) * kStageBytes + lrow * 128;
      uint32_t a[8][4];
#pragma unroll
      for (int pr = 0; pr < 4; ++pr) {
        uint32_t r[4];
        LdMatrixX4(slot + (((2 * pr + lunit) ^ (lrow & 7)) << 4), r);
        E4m3x4ToBf16(r[0], a[2 * pr][0], a[2 * pr][2]);
        E4m3x4ToBf16(r[1], a[2 * pr][1], a[2 * pr][3]);
        E4m3x4ToBf16(r[2], a[2 * pr + 1][0], a[2 * pr + 1][2]);
        E4m3x4ToBf16(r[3], a[2 * pr + 1][1], a[2 * pr + 1][3]);
      }
      WgmmaFence();
      // k16 step s reads x chunks 16 c + 2 s (+ 1): the descriptor's address field (bits 0-13, 16-byte units; the
      // x slice ends below 128 KB) advances by 2 kTok 16-byte rows per k16 step.
      const uint64_t db0 = SmemDesc(xs_addr + 16 * c * kTok * 16, kTok * 16, 128);
#pragma unroll
      for (int s = 0; s < 8; ++s) WgmmaRsK<kTok>(part, a[s], db0 + static_cast<uint64_t>(s * 2 * kTok), s > 0);
      WgmmaCommit();
      WgmmaWaitAll();
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] = fmaf(part[i], sc, acc[i]);
    }

    if (cluster == 1) {
#pragma unroll
      for (int j = 0; j < kTok / 8; ++j) {
#pragma unroll
        for (int h = 0; h < 4; ++h) {
          const int tok = 8 * j + 2 * t4 + (h & 1);
          const int64_t row = blk_row0 + row_l + 8 * (h >> 1);
          if (tok < tok_rows && row < n) e.y[(tok0 + tok) * e.y_stride + row] = acc[4 * j + h];
        }
      }
      continue;
    }
    // K split over the cluster: park the sums (rows padded to kRedStride: conflict-free stores), then block q adds
    // tokens [q kTok / c, (q + 1) kTok / c) of every block in rank order (fixed: deterministic), 4 rows a thread with
    // all the cluster's loads in flight before the sum.
#pragma unroll
    for (int j = 0; j < kTok / 8; ++j) {
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        red[(8 * j + 2 * t4 + (h & 1)) * kRedStride + row_l + 8 * (h >> 1)] = acc[4 * j + h];
      }
    }
    ClusterSync();
    const int per_rank = kTok / cluster;  // cluster in {2, 4, 8}: 2..32 tokens
    for (int i = tid; i < per_rank * (kWgmmaRows / 4); i += kThreads) {
      const int tok = rank * per_rank + i / (kWgmmaRows / 4), r = (i % (kWgmmaRows / 4)) * 4;
      float4 v[8];
#pragma unroll
      for (int qr = 0; qr < 8; ++qr) {
        if (qr < cluster) v[qr] = LoadClusterShared4(red + tok * kRedStride + r, static_cast<uint32_t>(qr));
      }
      float sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int qr = 0; qr < 8; ++qr) {
        if (qr < cluster) sum[0] += v[qr].x, sum[1] += v[qr].y, sum[2] += v[qr].z, sum[3] += v[qr].w;
      }
      if (tok < tok_rows) {
#pragma unroll
        for (int h = 0; h < 4; ++h) {
          const int64_t row = blk_row0 + r + h;
          if (row < n) e.y[(tok0 + tok) * e.y_stride + row] = sum[h];
        }
      }
    }
    ClusterSync();  // no block overwrites (or leaves) its sums while another still reads them
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // no wgmma on this architecture (the host launches it only on compute capability 9.0)
#endif
}

}  // namespace

namespace internal {

bool LinearWgmmaBuilt() {
#if defined(DSV4_LINEAR_SM90A)
  return true;
#else
  return false;
#endif
}

int64_t WgmmaSharedBytes(int64_t k_slice, int cluster, int tokens) { return SharedBytesFor(tokens, k_slice, cluster); }

namespace {

// The kernel's dynamic shared-memory limit raised to its largest block and its carveout set to the most shared
// memory, once per device (two 16-token blocks need 2 x 105 KB of an SM's 228 KB; the driver's default split
// could leave room for one).
template <int kTok>
cudaError_t PrepareOnce() {
  if (const cudaError_t e = RaiseSharedLimitOnce<LinearWgmmaKernel<kTok>>(SharedBytesFor(kTok, kWgmmaMaxKSlice, 2));
      e != cudaSuccess) {
    return e;
  }
  static std::atomic<uint64_t> done{0};
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const uint64_t bit = uint64_t{1} << (device & 63);
  if ((done.load(std::memory_order_relaxed) & bit) == 0) {
    const cudaError_t e = cudaFuncSetAttribute(LinearWgmmaKernel<kTok>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                               cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return e;
    done.fetch_or(bit, std::memory_order_relaxed);
  }
  return cudaSuccess;
}

template <int kTok>
int MaxActiveClusters(int cluster) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 0;
  static std::atomic<int> known[64][4] = {};  // value + 1; 0 = not asked yet
  const int slot = cluster == 1 ? 0 : cluster == 2 ? 1 : cluster == 4 ? 2 : 3;
  if (const int v = known[device][slot].load(std::memory_order_relaxed); v != 0) return v - 1;
  const int64_t smem = SharedBytesFor(kTok, kWgmmaMaxKSlice, 2);  // the largest block: a conservative count
  int count = 0;
  if (PrepareOnce<kTok>() == cudaSuccess) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(cluster), 1, 1);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = static_cast<size_t>(smem);
    cudaLaunchAttribute attr;
    SetClusterX(config, attr, cluster);
    config.numAttrs = 1;  // the query wants the cluster shape, 1 included
    if (cudaOccupancyMaxActiveClusters(&count, LinearWgmmaKernel<kTok>, &config) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      count = 0;
    }
  }
  known[device][slot].store(count + 1, std::memory_order_relaxed);
  return count;
}

template <int kTok>
cudaError_t Launch(const FusedLinearParams& p, cudaStream_t stream) {
  const LinearPlan& pl = p.plan;
  if (const cudaError_t err = PrepareOnce<kTok>(); err != cudaSuccess) return err;
  const FusedLinearEntry& last = p.e[p.count - 1];
  const int64_t tiles = last.block0 + (last.n + kWgmmaRows - 1) / kWgmmaRows;
  const int64_t blocks = (tiles + pl.row_tiles - 1) / pl.row_tiles;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(pl.cluster), static_cast<unsigned>((p.t + kTok - 1) / kTok),
                        static_cast<unsigned>(blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(SharedBytesFor(kTok, pl.k_slice, pl.cluster));
  config.stream = stream;
  cudaLaunchAttribute cluster_dim;
  SetClusterX(config, cluster_dim, pl.cluster);
  return LaunchPdlConfig(config, LinearWgmmaKernel<kTok>, p);
}

}  // namespace

int WgmmaMaxActiveClusters(int cluster, int tokens) {
  if (!LinearWgmmaBuilt() || (cluster != 1 && cluster != 2 && cluster != 4 && cluster != 8)) return 0;
  if (tokens == 16) return MaxActiveClusters<16>(cluster);
  return tokens == 64 ? MaxActiveClusters<64>(cluster) : 0;
}

cudaError_t LaunchLinearWgmmaKernel(const FusedLinearParams& p, cudaStream_t stream) {
  if (!LinearWgmmaBuilt()) return cudaErrorNotSupported;
  const LinearPlan& pl = p.plan;
  if (p.count < 1 || p.count > kFusedMaxWeights || pl.kernel != LinearKernel::kWgmma || pl.row_tiles < 1) {
    return cudaErrorInvalidValue;
  }
  switch (WgmmaPlanTokens(pl)) {
    case 16: return Launch<16>(p, stream);
    case 64: return Launch<64>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace internal
}  // namespace dsv4::kernels::cuda
