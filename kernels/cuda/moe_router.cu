// The MoE router on the device, in fp32 (dsv4-decode.md §2.4): logits = W_gate . x from the bf16 gate,
// s = sqrt(softplus(logits)), top-Ek of s + bias (ties: lower expert id) or tid2eid[token], weights
// s_e / (sum + 1e-20) * routed_scale; then the per-expert entry lists the grouped expert GEMMs read.
//
// Two launches: the logits (a GEMV spread over many blocks, which also writes x as bf16 for the experts),
// then one block that selects every token's experts and builds the lists (counts in shared memory, one scan,
// a scatter), so nothing is read back to the host and one CUDA graph serves any routing.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/moe_internal.h"

namespace dsv4::kernels::cuda::moe {
namespace {

constexpr int kLogitWarps = 4;     // experts per logits block (one per warp)
constexpr int kSelectThreads = 1024;
constexpr int kNone = 0x7fffffff;  // "no expert" in the arg-max

__device__ __forceinline__ float Bf16Lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float Bf16Hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// sqrt(softplus(l)) with torch's threshold 20 (the CPU reference's expression).
__device__ __forceinline__ float Score(float l) { return sqrtf(l > 20.f ? l : log1pf(expf(l))); }

// logits[t, e] for the TB tokens of blockIdx.y and the 4 experts of blockIdx.x (one per warp). Lane l owns
// columns 8l + 256i; each row's dot product is the lane sums in order, then a fixed butterfly, so the result
// does not depend on T. Warp 0 of column block 0 also writes x as bf16.
template <int TB>
__global__ void __launch_bounds__(kLogitWarps * 32) RouterLogitsKernel(MoeRouteParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int e = blockIdx.x * kLogitWarps + warp;
  const bool write_x = blockIdx.x == 0 && warp == 0;
  if (e >= p.experts && !write_x) return;
  const int64_t t0 = int64_t{blockIdx.y} * TB;
  const uint16_t* wrow = p.gate + int64_t{e < p.experts ? e : 0} * p.d;
  float acc[TB];
#pragma unroll
  for (int t = 0; t < TB; ++t) acc[t] = 0.f;
#pragma unroll 4
  for (int64_t k = lane * 8; k < p.d; k += 256) {
    const uint4 wv = __ldg(reinterpret_cast<const uint4*>(wrow + k));
    const float w[8] = {Bf16Lo(wv.x), Bf16Hi(wv.x), Bf16Lo(wv.y), Bf16Hi(wv.y),
                        Bf16Lo(wv.z), Bf16Hi(wv.z), Bf16Lo(wv.w), Bf16Hi(wv.w)};
#pragma unroll
    for (int t = 0; t < TB; ++t) {
      if (t0 + t >= p.t) break;
      const float4* xp = reinterpret_cast<const float4*>(p.x + (t0 + t) * p.d + k);
      const float4 a = __ldg(xp), b = __ldg(xp + 1);
      const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[t] = fmaf(w[i], x[i], acc[t]);
      if (write_x) {
        *reinterpret_cast<uint4*>(p.x_bf16 + (t0 + t) * p.d + k) =
            make_uint4(PackBf16(a.x, a.y), PackBf16(a.z, a.w), PackBf16(b.x, b.y), PackBf16(b.z, b.w));
      }
    }
  }
  if (e >= p.experts) return;
#pragma unroll
  for (int t = 0; t < TB; ++t) {
    float v = acc[t];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0 && t0 + t < p.t) p.logits[(t0 + t) * p.experts + e] = v;
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

// One block: every token's experts and weights (a warp per token), then counts, offsets, the active list
// and the entry lists.
__global__ void __launch_bounds__(kSelectThreads) RouterSelectKernel(MoeRouteParams p) {
  __shared__ int count[kMaxExperts];
  __shared__ int warp_sums[33];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int E = p.experts, K = p.topk;
  for (int e = threadIdx.x; e < E; e += kSelectThreads) count[e] = 0;
  __syncthreads();

  for (int64_t t = warp; t < p.t; t += kSelectThreads / 32) {
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
      if (held) atomicAdd(&count[sel], 1);
    }
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
  for (int64_t i = threadIdx.x; i < p.t * K; i += kSelectThreads) {
    const int ex = p.entry_expert[i];
    if (ex >= 0) p.expert_entries[atomicAdd(&count[ex], 1)] = static_cast<int32_t>(i);
  }
}

template <int TB>
cudaError_t LaunchLogits(const MoeRouteParams& p, cudaStream_t stream) {
  const dim3 grid((p.experts + kLogitWarps - 1) / kLogitWarps, static_cast<unsigned>((p.t + TB - 1) / TB));
  RouterLogitsKernel<TB><<<grid, kLogitWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
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
    err = LaunchLogits<8>(p, stream);
  }
  DSV4_RETURN_IF_ERROR(CudaStatus(err, "MoE router logits launch"));
  RouterSelectKernel<<<1, kSelectThreads, 0, stream>>>(p);
  return CudaStatus(cudaGetLastError(), "MoE router select launch");
}

}  // namespace dsv4::kernels::cuda::moe
