// The MoE router on the device, in fp32 (dsv4-decode.md §2.4): logits = W_gate . x from the bf16 gate,
// s = sqrt(softplus(logits)), top-Ek of s + bias (ties: lower expert id) or tid2eid[token], weights
// s_e / (sum + 1e-20) * routed_scale; then the per-expert entry lists the grouped expert GEMMs read.
//
// Two launches for decode-sized steps: the logits (a GEMV spread over many blocks, which also writes x as bf16
// for the experts; up to 4 tokens one expert per warp with x read through L1, above that x staged in shared
// memory per block and 4 experts per warp - the same bits), then one block that selects every token's experts and
// builds the lists (counts in shared memory, one scan, a scatter), so nothing is read back to the host and one
// CUDA graph serves any routing.
// Above kFusedSelectTokens tokens the selection is spread over blocks of 8 tokens and one block builds the
// lists after it (three launches). All are launched with PDL (pdl.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/moe_internal.h"
#include "kernels/cuda/moe_pdl.h"

namespace dsv4::kernels::cuda::moe {
namespace {

constexpr int kLogitWarps = 8;     // experts per logits block (one per warp)
constexpr int kRowLoads = 16;      // 16-byte gate loads in flight per lane: 4096 columns of the row at once
constexpr int kSelectThreads = 1024;
constexpr int kTokenWarps = 8;           // tokens per block of the spread selection
constexpr int kFusedSelectTokens = 16;   // up to this T one block selects and builds the lists
constexpr int kNone = 0x7fffffff;  // "no expert" in the arg-max

__device__ __forceinline__ float Bf16Lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float Bf16Hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// sqrt(softplus(l)) with torch's threshold 20 (the CPU reference's expression).
__device__ __forceinline__ float Score(float l) { return sqrtf(l > 20.f ? l : log1pf(expf(l))); }

// This block's share of the columns of tokens [t0, t0 + tn) of x, written as bf16 (the experts' activations): the
// blocks of a token row split its columns evenly (multiples of 8).
__device__ __forceinline__ void WriteXBf16(const MoeRouteParams& p, int64_t t0, int tn) {
  const int64_t per = (p.d / 8 + gridDim.x - 1) / gridDim.x * 8;  // columns of this block, multiple of 8
  const int64_t c0 = int64_t{blockIdx.x} * per;
  const int64_t n8 = c0 < p.d ? (min(p.d, c0 + per) - c0) / 8 : 0;
  for (int64_t i = threadIdx.x; i < tn * n8; i += blockDim.x) {
    const int64_t t = t0 + i / n8, k = c0 + (i % n8) * 8;
    const float4* xp = reinterpret_cast<const float4*>(p.x + t * p.d + k);
    const float4 a = __ldg(xp), b = __ldg(xp + 1);
    *reinterpret_cast<uint4*>(p.x_bf16 + t * p.d + k) =
        make_uint4(PackBf16(a.x, a.y), PackBf16(a.z, a.w), PackBf16(b.x, b.y), PackBf16(b.z, b.w));
  }
}

// logits[t, e] for the TB tokens of blockIdx.y and the 8 experts of blockIdx.x (one per warp). Lane l owns
// columns 8l + 256i; each row's dot product is the lane sums in order, then a fixed butterfly, so the result
// does not depend on T. A warp puts up to 4096 columns of its gate row in flight before it multiplies (the
// row is the only DRAM stream; the tokens' x rows are shared by the block's warps through L1). Each block also
// writes its share of the columns of its tokens' x as bf16 (the experts' activations).
template <int TB>
__global__ void __launch_bounds__(kLogitWarps * 32) RouterLogitsKernel(MoeRouteParams p) {
  PdlEnter();  // x (when the kernel before wrote it); then the selection kernel may become resident
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t0 = int64_t{blockIdx.y} * TB;
  const int tn = static_cast<int>(min(static_cast<int64_t>(TB), p.t - t0));
  WriteXBf16(p, t0, tn);
  const int e = blockIdx.x * kLogitWarps + warp;
  if (e >= p.experts) return;
  const uint16_t* __restrict__ wrow = p.gate + int64_t{e} * p.d;
  float acc[TB];
#pragma unroll
  for (int t = 0; t < TB; ++t) acc[t] = 0.f;
  for (int64_t k0 = lane * 8; k0 < p.d; k0 += 256 * kRowLoads) {
    uint4 wv[kRowLoads];
#pragma unroll
    for (int i = 0; i < kRowLoads; ++i) {
      const int64_t k = k0 + 256 * i;
      wv[i] = k < p.d ? __ldg(reinterpret_cast<const uint4*>(wrow + k)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kRowLoads; ++i) {
      const int64_t k = k0 + 256 * i;
      if (k >= p.d) break;
      const float w[8] = {Bf16Lo(wv[i].x), Bf16Hi(wv[i].x), Bf16Lo(wv[i].y), Bf16Hi(wv[i].y),
                          Bf16Lo(wv[i].z), Bf16Hi(wv[i].z), Bf16Lo(wv[i].w), Bf16Hi(wv[i].w)};
#pragma unroll
      for (int t = 0; t < TB; ++t) {
        if (t >= tn) break;
        const float4* xp = reinterpret_cast<const float4*>(p.x + (t0 + t) * p.d + k);
        const float4 a = __ldg(xp), b = __ldg(xp + 1);
        const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[t] = fmaf(w[j], x[j], acc[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < TB; ++t) {
    float v = acc[t];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0 && t < tn) p.logits[(t0 + t) * p.experts + e] = v;
  }
}

// The same logits for more tokens (T > 4): the block's kSmemTokens token rows of x are staged in shared memory one
// kSmemChunk-column chunk at a time and each warp computes kExpertsPerWarp experts, so x is read from L2 once per
// block instead of once per warp and expert (the one-expert-per-warp kernel re-read each token's x through L1 for
// every expert: 34 us a layer at T = 64 on the H200, ncu, bench/RESULTS.md fourth session). Lane l still owns
// columns 8l + 256i and adds them in ascending order, then the same butterfly: the logits are bit for bit the
// one-expert-per-warp kernel's (and independent of T).
constexpr int kSmemTokens = 8;
constexpr int kExpertsPerWarp = 4;
constexpr int kSmemChunk = 1024;                                  // columns staged at a time (32 KB of f32 x)
constexpr int kSmemLoads = kSmemChunk / 256;                      // gate loads per lane, expert and chunk
constexpr int kSmemBlockExperts = kLogitWarps * kExpertsPerWarp;  // 32

__global__ void __launch_bounds__(kLogitWarps * 32) RouterLogitsSmemKernel(MoeRouteParams p) {
  __shared__ __align__(16) float xs[kSmemTokens][kSmemChunk];
  PdlEnter();  // x (when the kernel before wrote it); then the selection kernel may become resident
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t0 = int64_t{blockIdx.y} * kSmemTokens;
  const int tn = static_cast<int>(min(static_cast<int64_t>(kSmemTokens), p.t - t0));
  WriteXBf16(p, t0, tn);
  const int e0 = blockIdx.x * kSmemBlockExperts + warp * kExpertsPerWarp;
  const uint16_t* __restrict__ wrow[kExpertsPerWarp];
  bool e_ok[kExpertsPerWarp];
#pragma unroll
  for (int u = 0; u < kExpertsPerWarp; ++u) {
    e_ok[u] = e0 + u < p.experts;
    wrow[u] = p.gate + int64_t{e_ok[u] ? e0 + u : 0} * p.d;
  }
  float acc[kSmemTokens][kExpertsPerWarp];
#pragma unroll
  for (int t = 0; t < kSmemTokens; ++t)
#pragma unroll
    for (int u = 0; u < kExpertsPerWarp; ++u) acc[t][u] = 0.f;

  for (int64_t c0 = 0; c0 < p.d; c0 += kSmemChunk) {
    // This chunk's gate columns first (the DRAM stream), so they fly while x is staged.
    uint4 wv[kSmemLoads][kExpertsPerWarp];
#pragma unroll
    for (int i = 0; i < kSmemLoads; ++i) {
      const int64_t k = c0 + lane * 8 + 256 * i;
#pragma unroll
      for (int u = 0; u < kExpertsPerWarp; ++u) {
        wv[i][u] = (k < p.d && e_ok[u]) ? __ldg(reinterpret_cast<const uint4*>(wrow[u] + k)) : make_uint4(0, 0, 0, 0);
      }
    }
    __syncthreads();  // the previous chunk's x is no longer read
    const int cols = static_cast<int>(min(static_cast<int64_t>(kSmemChunk), p.d - c0));  // a multiple of 8
    {
      // All of a thread's loads before its stores: one L2 round trip a chunk.
      constexpr int kThreads = kLogitWarps * 32, kQuads = kSmemChunk / 4;
      constexpr int kIters = kSmemTokens * kQuads / kThreads;
      static_assert(kSmemTokens * kQuads % kThreads == 0, "whole passes");
      float4 v[kIters];
#pragma unroll
      for (int r = 0; r < kIters; ++r) {
        const int i = static_cast<int>(threadIdx.x) + r * kThreads;
        const int t = i / kQuads, c = (i % kQuads) * 4;
        v[r] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < tn && c < cols) v[r] = __ldg(reinterpret_cast<const float4*>(p.x + (t0 + t) * p.d + c0 + c));
      }
#pragma unroll
      for (int r = 0; r < kIters; ++r) {
        const int i = static_cast<int>(threadIdx.x) + r * kThreads;
        *reinterpret_cast<float4*>(&xs[i / kQuads][(i % kQuads) * 4]) = v[r];
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kSmemLoads; ++i) {
      const int c = lane * 8 + 256 * i;
      if (c >= cols) break;
      float w[kExpertsPerWarp][8];
#pragma unroll
      for (int u = 0; u < kExpertsPerWarp; ++u) {
        w[u][0] = Bf16Lo(wv[i][u].x), w[u][1] = Bf16Hi(wv[i][u].x), w[u][2] = Bf16Lo(wv[i][u].y);
        w[u][3] = Bf16Hi(wv[i][u].y), w[u][4] = Bf16Lo(wv[i][u].z), w[u][5] = Bf16Hi(wv[i][u].z);
        w[u][6] = Bf16Lo(wv[i][u].w), w[u][7] = Bf16Hi(wv[i][u].w);
      }
#pragma unroll
      for (int t = 0; t < kSmemTokens; ++t) {
        if (t >= tn) break;
        const float4 a = *reinterpret_cast<const float4*>(&xs[t][c]);
        const float4 b = *reinterpret_cast<const float4*>(&xs[t][c + 4]);
        const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int u = 0; u < kExpertsPerWarp; ++u)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[t][u] = fmaf(w[u][j], x[j], acc[t][u]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kSmemTokens; ++t)
#pragma unroll
    for (int u = 0; u < kExpertsPerWarp; ++u) {
      float v = acc[t][u];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0 && t < tn && e_ok[u]) p.logits[(t0 + t) * p.experts + e0 + u] = v;
    }
}

// Exclusive block-wide scan of one int per thread (kSelectThreads threads); returns the total too.
__device__ int BlockExclusiveScan(int v, int* total, int* warp_sums) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int inc = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int o = __shfl_up_sync(0xffffffffu, inc, off);
    if (lane >= off) inc += o;
  }
  if (lane == 31) warp_sums[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int w = warp_sums[lane];
    int winc = w;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, winc, off);
      if (lane >= off) winc += o;
    }
    warp_sums[lane] = winc - w;  // exclusive prefix of warp sums
    if (lane == 31) warp_sums[32] = winc;
  }
  __syncthreads();
  const int result = warp_sums[warp] + inc - v;
  *total = warp_sums[32];
  __syncthreads();  // warp_sums may be reused
  return result;
}

// One token's experts and weights (one warp, lane r < Ek: the r-th entry): entry_expert and entry_weight of
// the token's Ek entries, in ascending expert id.
__device__ void SelectToken(const MoeRouteParams& p, int64_t t, int lane) {
  const int E = p.experts, K = p.topk;
  int sel = -1;  // lane r < K: the r-th choice
  if (p.pos[t] >= 0) {
    if (p.tid2eid != nullptr) {
      if (lane < K) sel = p.tid2eid[int64_t{p.tokens[t]} * K + lane];
    } else {
      // Top-K of s + bias: K rounds of a warp arg-max over the lane-held keys (ties: lower id).
      const float* lt = p.logits + t * E;
      float key[kMaxExperts / 32];
#pragma unroll
      for (int i = 0; i < kMaxExperts / 32; ++i) {
        const int e = lane + 32 * i;
        key[i] = e < E ? Score(lt[e]) + p.bias[e] : -INFINITY;
      }
      uint32_t taken = 0;
      for (int r = 0; r < K; ++r) {
        float bv = -INFINITY;
        int bi = kNone;
#pragma unroll
        for (int i = 0; i < kMaxExperts / 32; ++i) {  // ids grow with i: strict > keeps the lower id
          const int e = lane + 32 * i;
          if (e < E && !((taken >> i) & 1u) && (bi == kNone || key[i] > bv)) {
            bv = key[i];
            bi = e;
          }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
          const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
          if (oi != kNone && (bi == kNone || ov > bv || (ov == bv && oi < bi))) {
            bv = ov;
            bi = oi;
          }
        }
        if (bi != kNone && (bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == r) sel = bi;
      }
    }
  }
  const bool valid = lane < K && sel >= 0 && sel < E;
  const float score = valid ? Score(p.logits[t * E + sel]) : 0.f;
  // The CPU reference's order: sum over the choices in selection order.
  float sum = 0.f;
  for (int r = 0; r < K; ++r) sum += __shfl_sync(0xffffffffu, score, r);
  const float weight = score / (sum + 1e-20f) * p.routed_scale;
  // Entries of a token in ascending expert id (invalid ones last).
  const int key = valid ? sel : kNone;
  int rank = 0;
  for (int r = 0; r < K; ++r) {
    const int o = __shfl_sync(0xffffffffu, key, r);
    rank += (o < key) || (o == key && r < lane);
  }
  if (lane < K) {
    const bool held = valid && p.expert_slot[sel] >= 0;
    p.entry_expert[t * K + rank] = held ? sel : -1;
    p.entry_weight[t * K + rank] = held ? weight : 0.f;
  }
}

// Counts, offsets, the active list and the entry lists from entry_expert (one block of kSelectThreads; the
// entries are complete and visible to the block).
__device__ void BuildLists(const MoeRouteParams& p, int* count, int* warp_sums) {
  const int E = p.experts;
  for (int e = threadIdx.x; e < E; e += kSelectThreads) count[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < p.t * p.topk; i += kSelectThreads) {
    const int ex = p.entry_expert[i];
    if (ex >= 0) atomicAdd(&count[ex], 1);
  }
  __syncthreads();

  // Offsets and the active list (E <= kMaxExperts <= kSelectThreads: one expert per thread).
  const int e = threadIdx.x;
  const int c = e < E ? count[e] : 0;
  int total = 0, active_total = 0;
  const int offset = BlockExclusiveScan(c, &total, warp_sums);
  const int apos = BlockExclusiveScan(c > 0 ? 1 : 0, &active_total, warp_sums);
  if (e < E) {
    p.expert_count[e] = c;
    p.expert_offset[e] = offset;
    if (c > 0) p.active[apos] = e;
    count[e] = offset;  // from here on: the next free position of expert e
  }
  if (threadIdx.x == 0) *p.num_active = active_total;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < p.t * p.topk; i += kSelectThreads) {
    const int ex = p.entry_expert[i];
    if (ex >= 0) p.expert_entries[atomicAdd(&count[ex], 1)] = static_cast<int32_t>(i);
  }
}

// Decode-sized steps (T <= kFusedSelectTokens): one block selects every token's experts (a warp per token),
// then builds the lists.
__global__ void __launch_bounds__(kSelectThreads) RouterSelectKernel(MoeRouteParams p) {
  __shared__ int count[kMaxExperts];
  __shared__ int warp_sums[33];
  PdlEnter();  // the logits; then the up GEMM's blocks may become resident (they wait for this block)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t t = warp; t < p.t; t += kSelectThreads / 32) SelectToken(p, t, lane);
  __syncthreads();  // the block's entry writes are visible to the block
  BuildLists(p, count, warp_sums);
}

// Larger steps: the per-token selection spread over blocks of kTokenWarps tokens (it is issue-bound: ~2000
// instructions a token), then one block for the lists.
__global__ void __launch_bounds__(kTokenWarps * 32) RouterTokensKernel(MoeRouteParams p) {
  PdlEnter();  // the logits
  const int64_t t = int64_t{blockIdx.x} * kTokenWarps + (threadIdx.x >> 5);
  if (t < p.t) SelectToken(p, t, threadIdx.x & 31);
}

__global__ void __launch_bounds__(kSelectThreads) RouterListsKernel(MoeRouteParams p) {
  __shared__ int count[kMaxExperts];
  __shared__ int warp_sums[33];
  PdlEnter();  // the entries
  BuildLists(p, count, warp_sums);
}

template <int TB>
cudaError_t LaunchLogits(const MoeRouteParams& p, cudaStream_t stream) {
  const dim3 grid((p.experts + kLogitWarps - 1) / kLogitWarps, static_cast<unsigned>((p.t + TB - 1) / TB));
  return LaunchPdl(RouterLogitsKernel<TB>, grid, dim3(kLogitWarps * 32), 0, stream, p);
}

}  // namespace

absl::Status LaunchMoeRoute(const MoeRouteParams& p, cudaStream_t stream) {
  if (p.experts < 1 || p.experts > kMaxExperts || p.topk < 1 || p.topk > kMaxTopk || p.topk > p.experts) {
    return absl::InvalidArgumentError(absl::StrCat("MoE router: needs 1 <= Ek <= min(E, ", kMaxTopk, ") and E <= ",
                                                   kMaxExperts, ", got E = ", p.experts, ", Ek = ", p.topk));
  }
  if (p.d <= 0 || p.d % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("MoE router: D must be a positive multiple of 8, got ", p.d));
  }
  if (p.x == nullptr || p.gate == nullptr || p.pos == nullptr || p.expert_slot == nullptr ||
      (p.tid2eid == nullptr && p.bias == nullptr) || (p.tid2eid != nullptr && p.tokens == nullptr)) {
    return absl::InvalidArgumentError("MoE router: x, gate, pos, expert_slot and bias or tid2eid + tokens are required");
  }
  if (p.t == 0) return absl::OkStatus();
  cudaError_t err;
  if (p.t == 1) {
    err = LaunchLogits<1>(p, stream);
  } else if (p.t == 2) {
    err = LaunchLogits<2>(p, stream);
  } else if (p.t <= 4) {
    err = LaunchLogits<4>(p, stream);
  } else {
    const dim3 grid((p.experts + kSmemBlockExperts - 1) / kSmemBlockExperts,
                    static_cast<unsigned>((p.t + kSmemTokens - 1) / kSmemTokens));
    err = LaunchPdl(RouterLogitsSmemKernel, grid, dim3(kLogitWarps * 32), 0, stream, p);
  }
  DSV4_RETURN_IF_ERROR(CudaStatus(err, "MoE router logits launch"));
  if (p.t <= kFusedSelectTokens) {
    return CudaStatus(LaunchPdl(RouterSelectKernel, dim3(1), dim3(kSelectThreads), 0, stream, p),
                      "MoE router select launch");
  }
  const dim3 token_grid(static_cast<unsigned>((p.t + kTokenWarps - 1) / kTokenWarps));
  DSV4_RETURN_IF_ERROR(CudaStatus(LaunchPdl(RouterTokensKernel, token_grid, dim3(kTokenWarps * 32), 0, stream, p),
                                  "MoE router token selection launch"));
  return CudaStatus(LaunchPdl(RouterListsKernel, dim3(1), dim3(kSelectThreads), 0, stream, p),
                    "MoE router lists launch");
}

}  // namespace dsv4::kernels::cuda::moe
