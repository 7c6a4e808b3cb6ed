// The routed experts on the device: two grouped W4A16 GEMMs over the router's per-expert lists, the shared
// expert's SwiGLU, and the combine (dsv4-decode.md §2.4).
//
// GEMM skeleton (both GEMMs). One block = (pair of 16-row weight tiles, active expert); the grid covers
// max_active experts and blocks past the device-side count exit at once. Tokens are the MMA's N side
// (mma.m16n8k16 with weights as A): a pass takes up to 32 of the expert's tokens (1, 2 or 4 n8 tiles, by the
// count) and the block's 4 warps split K in 64-column chunks, each warp streaming its chunks' tiles (512 code
// bytes per tile, one 16-byte load per lane) a few chunks ahead, dequantising in registers (moe_layout.h:
// code bits -> bf16 * block factor, exact) and accumulating in fp32; the warps' partial sums meet in shared
// memory for the epilogue. Weights are read once per pass (a second pass re-reads them from L2).
//   up (gate w1 + up w3 of the same 16 features): h = silu(min(g, L)) * clamp(v, -L, L) -> bf16 rows of h
//   down (w2, 32 output rows): weight[entry] * (W2 h) -> out[entry] in fp32
// The combine then sums each token's entries in ascending expert id onto the shared expert's output, so the
// result of a token does not depend on the batch or on the run. The GEMMs and the combine are launched with
// PDL after the router (pdl.h): each waits for its predecessor before touching memory.
// (A cp.async-ring variant of the GEMM, same bits, was measured slower at every shape: bench/RESULTS.md,
// 2026-12-01 "MoE grouped GEMM, issue 14 part 2".)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/moe_internal.h"
#include "kernels/cuda/moe_pdl.h"

namespace dsv4::kernels::cuda::moe {
namespace {

constexpr int kGemmWarps = 4;
constexpr int kMaxNt = 4;  // n8 token tiles per pass
constexpr int kPassTokens = 8 * kMaxNt;

// a * b on bf16x2 (fma with -0: exact products stay exact, subnormal inputs are kept).
__device__ __forceinline__ uint32_t MulBf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}

// c += a * b for one m16n8k16 tile, bf16 inputs, f32 accumulators.
__device__ __forceinline__ void Mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 LoadStreaming(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The bf16x2 block factor of both rows a lane dequantises (low byte: row g, high byte: row g + 8).
template <Fp4Kind kKind>
__device__ __forceinline__ void Factors(uint32_t scale_pair, uint32_t& fg, uint32_t& fg8) {
  fg = ScaleFactorBits(kKind, scale_pair & 0xffu) * 0x10001u;
  fg8 = ScaleFactorBits(kKind, (scale_pair >> 8) & 0xffu) * 0x10001u;
}

// Index of a lane's u16 scale pair inside a scale tile.
template <Fp4Kind kKind>
__device__ __forceinline__ int ScalePairIndex(int lane) {
  return kKind == Fp4Kind::kNvfp4 ? lane : ((lane & 3) >> 1) * 8 + (lane >> 2);
}

// One warp's K share of a tile pair: chunks kc = warp, warp + 4, ... of `nkc`, KB chunks in flight.
// codes/scales point at chunk 0 of the pair ([kc][2][tile]); brow[nt] is this lane's activation row of n8
// tile nt (token g of the tile), null for a row past the pass.
template <Fp4Kind kKind, int NT, int KB>
__device__ __forceinline__ void WarpPairGemm(const uint8_t* codes, const uint8_t* scales, int nkc,
                                             const uint16_t* const (&brow)[NT], float (&acc)[2][NT][4]) {
  constexpr int kStb = kKind == Fp4Kind::kNvfp4 ? kNvfp4ScaleTileBytes : kMxfp4ScaleTileBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int c = lane & 3;
  const int sidx = ScalePairIndex<kKind>(lane);
  for (int kc0 = warp; kc0 < nkc; kc0 += kGemmWarps * KB) {
    uint4 w[KB][2];
    uint32_t sp[KB][2];
    uint4 b[KB][NT][2];
    // Load stage: KB chunks of both tiles, their scales and the activations.
#pragma unroll
    for (int q = 0; q < KB; ++q) {
      const int kc = kc0 + q * kGemmWarps;
      const bool in = kc < nkc;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t tile = int64_t{kc} * 2 + r;
        w[q][r] = in ? LoadStreaming(codes + tile * kTileBytes + lane * 16) : make_uint4(0, 0, 0, 0);
        sp[q][r] = in ? __ldg(reinterpret_cast<const uint16_t*>(scales + tile * kStb) + sidx) : 0u;
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        b[q][nt][0] = b[q][nt][1] = make_uint4(0, 0, 0, 0);
        if (in && brow[nt] != nullptr) {
          const uint4* src = reinterpret_cast<const uint4*>(brow[nt] + kc * kChunkK + 16 * c);
          b[q][nt][0] = __ldg(src);
          b[q][nt][1] = __ldg(src + 1);
        }
      }
    }
    // Compute stage: dequantise each k-step's A fragment in registers, one MMA per token tile.
#pragma unroll
    for (int q = 0; q < KB; ++q) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        uint32_t fg, fg8;
        Factors<kKind>(sp[q][r], fg, fg8);
        const uint32_t words[4] = {w[q][r].x, w[q][r].y, w[q][r].z, w[q][r].w};
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          uint32_t t[4];
          Fp4WordToTrick(words[s], t);
          const uint32_t a[4] = {MulBf16x2(t[0], fg), MulBf16x2(t[1], fg8), MulBf16x2(t[2], fg),
                                 MulBf16x2(t[3], fg8)};
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const uint32_t b0 = s < 2 ? (s == 0 ? b[q][nt][0].x : b[q][nt][0].z) : (s == 2 ? b[q][nt][1].x : b[q][nt][1].z);
            const uint32_t b1 = s < 2 ? (s == 0 ? b[q][nt][0].y : b[q][nt][0].w) : (s == 2 ? b[q][nt][1].y : b[q][nt][1].w);
            Mma(acc[r][nt], a, b0, b1);
          }
        }
      }
    }
  }
}

// This lane's activation row of each n8 tile of a pass over list positions [list0, list0 + rows) (token g of
// the tile): x_bf16 of the entry's token (up) or the position's h row (down); null past the pass.
template <bool kUp, int NT>
__device__ __forceinline__ void ActivationRows(const MoeExpertParams& p, int list0, int rows,
                                               const uint16_t* (&brow)[NT]) {
  const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int r = nt * 8 + g;
    brow[nt] = nullptr;
    if (r < rows) {
      if constexpr (kUp) {
        const int entry = p.expert_entries[list0 + r];
        brow[nt] = p.x_bf16 + int64_t{entry / p.topk} * p.d;
      } else {
        brow[nt] = p.h + int64_t{list0 + r} * p.inter;
      }
    }
  }
}

// The warps' partial sums of a pass meet in `red` (kGemmWarps * 2 * NT * 128 floats, free for this use), then
// the epilogue: red[warp][tile][nt][reg][lane]: conflict-free stores, then each thread sums one
// (nt, reg, lane) of both tiles over the warps in a fixed order.
template <Fp4Kind kKind, bool kUp, int NT>
__device__ __forceinline__ void PassEpilogue(const MoeExpertParams& p, const float (&acc)[2][NT][4], float* red,
                                             int slot, int list0, int rows) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[(((warp * 2 + r) * NT + nt) * 4 + i) * 32 + lane] = acc[r][nt][i];
  __syncthreads();
  const float* es = p.expert_scale + slot * 4;
  for (int q = threadIdx.x; q < NT * 128; q += kGemmWarps * 32) {
    const int nt = q >> 7, i = (q >> 5) & 3, ln = q & 31;
    const int row = (ln >> 2) + 8 * (i >> 1);
    const int col = nt * 8 + 2 * (ln & 3) + (i & 1);
    if (col >= rows) continue;
    float v[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kGemmWarps; ++w) s += red[(((w * 2 + r) * NT + nt) * 4 + i) * 32 + ln];
      v[r] = s;
    }
    if constexpr (kUp) {
      const float L = p.swiglu_limit;
      const float gate = fminf(v[0] * es[0], L);
      const float up = fminf(fmaxf(v[1] * es[1], -L), L);
      const float h = gate / (1.f + expf(-gate)) * up;
      const __nv_bfloat16 hb = __float2bfloat16_rn(h);
      p.h[int64_t{list0 + col} * p.inter + blockIdx.x * kTileRows + row] = *reinterpret_cast<const uint16_t*>(&hb);
    } else {
      const int entry = p.expert_entries[list0 + col];
      const float wt = p.entry_weight[entry];
      float* out = p.out + int64_t{entry} * p.d + blockIdx.x * 2 * kTileRows + row;
      out[0] = v[0] * es[2] * wt;
      out[kTileRows] = v[1] * es[2] * wt;
    }
  }
  __syncthreads();  // red is reused by the next pass
}

// One pass of up to 32 list positions [m0, m0 + rows) of expert e: GEMM, cross-warp sum, epilogue.
template <Fp4Kind kKind, bool kUp, int NT>
__device__ void ExpertPass(const MoeExpertParams& p, const uint8_t* codes, const uint8_t* scales, int slot,
                           int list0, int rows, float* red) {
  // Chunks in flight per warp: 4 KB of codes for decode-sized passes; fewer where the activations need the
  // registers (120 registers at most, so 4 blocks fit an SM).
  constexpr int KB = NT == 1 ? 4 : (NT == 2 ? 2 : 1);
  const int64_t kdim = kUp ? p.d : p.inter;
  const uint16_t* brow[NT];
  ActivationRows<kUp, NT>(p, list0, rows, brow);
  float acc[2][NT][4];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][nt][i] = 0.f;
  WarpPairGemm<kKind, NT, KB>(codes, scales, static_cast<int>(kdim / kChunkK), brow, acc);
  PassEpilogue<kKind, kUp, NT>(p, acc, red, slot, list0, rows);
}

// Launched with PDL (pdl.h). blockIdx = (tile pair, active expert slot); blocks past the device-side
// count exit at once.
template <Fp4Kind kKind, bool kUp>
__global__ void __launch_bounds__(kGemmWarps * 32, 4) ExpertGemmKernel(MoeExpertParams p) {
  __shared__ float red[kGemmWarps * 2 * kMaxNt * 4 * 32];
  GridDepWait();    // the router's lists (up) or h (down)
  GridDepLaunch();  // the next kernel's blocks may become resident (they wait for this grid)
  if (static_cast<int>(blockIdx.y) >= *p.num_active) return;
  const int e = p.active[blockIdx.y];
  const int slot = p.expert_slot[e];
  const int count = p.expert_count[e];
  const int list0 = p.expert_offset[e];
  constexpr int kStb = kKind == Fp4Kind::kNvfp4 ? kNvfp4ScaleTileBytes : kMxfp4ScaleTileBytes;
  const int64_t nkc = (kUp ? p.d : p.inter) / kChunkK;
  const uint8_t* base = p.weights + int64_t{slot} * p.layout.bytes;
  const int64_t pair_tiles = int64_t{blockIdx.x} * nkc * 2;
  const uint8_t* codes = base + (kUp ? p.layout.w13_codes : p.layout.w2_codes) + pair_tiles * kTileBytes;
  const uint8_t* scales = base + (kUp ? p.layout.w13_scales : p.layout.w2_scales) + pair_tiles * kStb;
  for (int m0 = 0; m0 < count; m0 += kPassTokens) {
    const int rows = min(kPassTokens, count - m0);
    if (rows > 16) {
      ExpertPass<kKind, kUp, 4>(p, codes, scales, slot, list0 + m0, rows, red);
    } else if (rows > 8) {
      ExpertPass<kKind, kUp, 2>(p, codes, scales, slot, list0 + m0, rows, red);
    } else {
      ExpertPass<kKind, kUp, 1>(p, codes, scales, slot, list0 + m0, rows, red);
    }
  }
}

__global__ void CombineKernel(MoeCombineParams p) {
  GridDepWait();  // the down GEMM's outputs
  const int64_t t = blockIdx.y;
  const int64_t d = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * 4;
  if (d >= p.d) return;
  float4* y = reinterpret_cast<float4*>(p.y + t * p.d + d);
  if (p.pos[t] < 0) {
    *y = make_float4(0.f, 0.f, 0.f, 0.f);
    return;
  }
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int i = 0; i < p.topk; ++i) {
    if (p.entry_expert[t * p.topk + i] < 0) continue;
    const float4 o = *reinterpret_cast<const float4*>(p.out + (t * p.topk + i) * p.d + d);
    acc.x += o.x;
    acc.y += o.y;
    acc.z += o.z;
    acc.w += o.w;
  }
  if (p.accumulate) {
    const float4 s = *y;
    acc = make_float4(s.x + acc.x, s.y + acc.y, s.z + acc.z, s.w + acc.w);
  }
  *y = acc;
}

__global__ void SwigluKernel(MoeSwigluParams p) {
  PdlEnter();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= p.n) return;
  const float g = fminf(p.g[i], p.limit);
  const float v = fminf(fmaxf(p.v[i], -p.limit), p.limit);
  p.g[i] = g / (1.f + expf(-g)) * v;
}

template <Fp4Kind kKind>
cudaError_t LaunchGemms(const MoeExpertParams& p, cudaStream_t stream) {
  const dim3 up_grid(static_cast<unsigned>(p.inter / kTileRows), static_cast<unsigned>(p.max_active));
  const dim3 down_grid(static_cast<unsigned>(p.d / (2 * kTileRows)), static_cast<unsigned>(p.max_active));
  const dim3 block(kGemmWarps * 32);
  const cudaError_t err = LaunchPdl(ExpertGemmKernel<kKind, true>, up_grid, block, 0, stream, p);
  if (err != cudaSuccess) return err;
  return LaunchPdl(ExpertGemmKernel<kKind, false>, down_grid, block, 0, stream, p);
}

int64_t Align256(int64_t v) { return (v + 255) / 256 * 256; }

}  // namespace

ScratchPlan MakeScratchPlan(int64_t t, int64_t experts, int64_t topk, int64_t dim, int64_t inter,
                            int64_t shared_inter) {
  ScratchPlan s;
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t here = at;
    at += Align256(bytes);
    return here;
  };
  const int64_t entries = t * topk;
  s.logits = take(t * experts * 4);
  s.x_bf16 = take(t * dim * 2);
  s.entry_expert = take(entries * 4);
  s.entry_weight = take(entries * 4);
  s.expert_count = take(experts * 4);
  s.expert_offset = take(experts * 4);
  s.expert_entries = take(entries * 4);
  s.active = take(experts * 4);
  s.num_active = take(4);
  s.h = take(entries * inter * 2);
  s.out = take(entries * dim * 4);
  s.shared_g = take(t * shared_inter * 4);
  s.shared_v = take(t * shared_inter * 4);
  s.bytes = at;
  return s;
}

absl::Status LaunchMoeExperts(const MoeExpertParams& p, cudaStream_t stream) {
  if (p.d <= 0 || p.inter <= 0 || p.d % kChunkK != 0 || p.inter % kChunkK != 0 || p.topk < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE experts: D and I must be positive multiples of 64, got D = ", p.d, ", I = ", p.inter));
  }
  if (p.max_active <= 0) return absl::OkStatus();
  const cudaError_t err = p.kind == Fp4Kind::kNvfp4 ? LaunchGemms<Fp4Kind::kNvfp4>(p, stream)
                                                    : LaunchGemms<Fp4Kind::kMxfp4>(p, stream);
  return CudaStatus(err, "MoE expert GEMM launch");
}

absl::Status LaunchMoeCombine(const MoeCombineParams& p, cudaStream_t stream) {
  if (p.d % 4 != 0) return absl::InvalidArgumentError(absl::StrCat("MoE combine: D % 4 != 0 (D = ", p.d, ")"));
  if (p.t == 0) return absl::OkStatus();
  const dim3 grid(static_cast<unsigned>((p.d / 4 + 255) / 256), static_cast<unsigned>(p.t));
  return CudaStatus(LaunchPdl(CombineKernel, grid, dim3(256), 0, stream, p), "MoE combine launch");
}

absl::Status LaunchMoeSwiglu(const MoeSwigluParams& p, cudaStream_t stream) {
  if (p.n == 0) return absl::OkStatus();
  return CudaStatus(LaunchPdl(SwigluKernel, dim3(static_cast<unsigned>((p.n + 255) / 256)), dim3(256), 0, stream, p),
                    "MoE shared SwiGLU launch");
}

}  // namespace dsv4::kernels::cuda::moe
