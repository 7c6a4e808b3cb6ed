// Device helpers shared by the linear kernels (linear.cu: tiled and split-K; linear_ring.cu: the FP8 weight
// ring): the bf16 MMA, the exact e4m3 -> bf16 conversion, the x slice's shared-memory swizzle, x staging, the
// cluster barrier and distributed-shared-memory loads, cp.async. Included by .cu files only (internal linkage).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <atomic>
#include <cstdint>

#include "kernels/cuda/linear_params.h"

namespace dsv4::kernels::cuda {
namespace {

constexpr int kStepK = 64;       // K elements per MMA step of a thread group (4 threads x 16)
constexpr int kScaleBlock = 128;

// Raw 32-bit words one thread loads per weight row and 16 K elements: 16 e4m3 bytes or 16 bf16 values.
template <LinearKernelFormat F>
constexpr int kRawWords = F == LinearKernelFormat::kFp8 ? 4 : 8;

// Loads weight elements [k, k + 16) of one row of Kin = kin elements (zeros past Kin or for a row that does not
// exist); vec: the row may be read in 16-byte units. Shared by the split-K / tiled kernels and the multi-weight one.
template <LinearKernelFormat F>
__device__ __forceinline__ void LoadWeightRow(const void* row, bool row_ok, bool vec, int64_t k, int64_t kin,
                                              uint32_t (&raw)[kRawWords<F>]) {
  if (row_ok && vec && k + 16 <= kin) {
    if constexpr (F == LinearKernelFormat::kFp8) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(row) + k));
      raw[0] = v.x, raw[1] = v.y, raw[2] = v.z, raw[3] = v.w;
    } else {
      const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(row) + k);
      const uint4 v0 = __ldg(src), v1 = __ldg(src + 1);
      raw[0] = v0.x, raw[1] = v0.y, raw[2] = v0.z, raw[3] = v0.w;
      raw[4] = v1.x, raw[5] = v1.y, raw[6] = v1.z, raw[7] = v1.w;
    }
    return;
  }
#pragma unroll
  for (int w = 0; w < kRawWords<F>; ++w) raw[w] = 0;
  if (!row_ok) return;
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    if (k + e >= kin) break;
    if constexpr (F == LinearKernelFormat::kFp8) {
      raw[e / 4] |= static_cast<uint32_t>(static_cast<const uint8_t*>(row)[k + e]) << (8 * (e % 4));
    } else {
      raw[e / 2] |= static_cast<uint32_t>(static_cast<const uint16_t*>(row)[k + e]) << (16 * (e % 2));
    }
  }
}

__device__ __forceinline__ void Mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Four e4m3 bytes (little-endian) -> two bf16x2 words, exactly (subnormals included).
__device__ __forceinline__ void E4m3x4ToBf16(uint32_t v, uint32_t& lo, uint32_t& hi) {
  const __half2_raw h0 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  const __half2_raw h1 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v >> 16), __NV_E4M3);
  const float2 f0 = __half22float2(__half2(h0));
  const float2 f1 = __half22float2(__half2(h1));
  lo = PackBf16x2(f0.x, f0.y);
  hi = PackBf16x2(f1.x, f1.y);
}

// Shared-memory position of x element e of a block's slice row (the unit swizzle above).
__device__ __forceinline__ int64_t XPos(int64_t e) {
  const int64_t w = (e >> 4) & 7;
  return (e & ~int64_t{127}) | ((w ^ ((w >> 2) & 1)) << 4) | (e & 15);
}

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Barrier over every thread of the cluster; the arrive releases and the wait acquires the blocks' shared memory.
__device__ __forceinline__ void ClusterSync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive;\n\tbarrier.cluster.wait;\n" ::: "memory");
#else
  __trap();
#endif
}

// The float at `local`'s offset in the shared memory of cluster block `rank`.
__device__ __forceinline__ float LoadClusterShared(const float* local, uint32_t rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(SharedAddress(local)), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
#else
  (void)rank;
  __trap();
  return *local;
#endif
}

// Four x elements [k, k + 4) of row `off` (element offset of the row's group start) as two bf16x2 words; zeros
// past Kin.
__device__ __forceinline__ uint2 LoadX4(const LinearParams& p, int64_t off, int64_t k) {
  uint2 out{0u, 0u};
  if (p.vec && k + 4 <= p.k) {
    if (p.x_bf16) {
      out = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.x) + off + k));
    } else {
      const float4 v = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + off + k));
      out.x = PackBf16x2(v.x, v.y);
      out.y = PackBf16x2(v.z, v.w);
    }
    return out;
  }
  float v[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    v[e] = 0.f;
    if (k + e < p.k) {
      v[e] = p.x_bf16 ? __bfloat162float(__ushort_as_bfloat16(static_cast<const uint16_t*>(p.x)[off + k + e]))
                      : static_cast<const float*>(p.x)[off + k + e];
    }
  }
  out.x = PackBf16x2(v[0], v[1]);
  out.y = PackBf16x2(v[2], v[3]);
  return out;
}

// Stages a block's x slice into shared memory: `rows` token rows x `quads` 4-element columns, each quad from
// load(r, cq) (two bf16x2 words, zeros where the caller wants them) stored at xs[r * pitch + XPos(4 cq)].
// Threads are laid out as row groups of `quads` threads (one pass of columns when quads < blockDim), and each
// thread issues kBatch rows' loads before their stores: a T = 32 slice costs 2 L2 round trips a thread, not 16 (the
// split-K kernel's former one-quad-at-a-time loop with a 64-bit index division was most of its instructions at
// T >= 16: ncu, bench/RESULTS.md "Fifth session"). 32-bit index arithmetic only: rows * quads < 2^31.
template <int kBatch, class Load>
__device__ __forceinline__ void StageXSlice(uint16_t* xs, int pitch, int rows, int quads, Load&& load) {
  const int nthreads = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  const int row_groups = quads >= nthreads ? 1 : nthreads / quads;
  const int rg = tid / quads;
  if (rg >= row_groups) return;
  const int col_step = quads >= nthreads ? nthreads : quads;
  for (int cq = tid - rg * quads; cq < quads; cq += col_step) {
    const int pos = static_cast<int>(XPos(4 * cq));
    for (int r0 = rg; r0 < rows; r0 += kBatch * row_groups) {
      uint2 v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int r = r0 + b * row_groups;
        v[b] = r < rows ? load(r, cq) : uint2{0u, 0u};
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int r = r0 + b * row_groups;
        if (r < rows) *reinterpret_cast<uint2*>(xs + r * pitch + pos) = v[b];
      }
    }
  }
}

// cp.async of 16 bytes (the first src_bytes of them read, the rest zero-filled; L1 bypassed) and of 4 bytes, the
// commit of a group and the wait until at most N of this thread's groups are pending.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void CpAsync4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}


// A launch config's thread-block cluster of `cluster` blocks along grid x (no attribute for 1, an ordinary launch);
// `attr` must outlive the launch.
inline void SetClusterX(cudaLaunchConfig_t& config, cudaLaunchAttribute& attr, int cluster) {
  attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cluster);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = cluster > 1 ? 1 : 0;
}

// Raises kKernel's dynamic shared-memory limit to `bytes` once per kernel and device (the split-K, multi-weight and
// weight-ring launchers; a launch above the default 48 KB needs it).
template <auto kKernel>
cudaError_t RaiseSharedLimitOnce(int64_t bytes) {
  static std::atomic<uint64_t> raised{0};
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const uint64_t bit = uint64_t{1} << (device & 63);
  if ((raised.load(std::memory_order_relaxed) & bit) == 0) {
    const cudaError_t e =
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (e != cudaSuccess) return e;
    raised.fetch_or(bit, std::memory_order_relaxed);
  }
  return cudaSuccess;
}

// The end of a split-K kernel (linear.cu LinearSplitKernel, linear_ring.cu LinearRingKernel): stores this warp's
// sums, or with K split (warps_k * cluster > 1) adds the partial sums in a fixed order. c0, c1 = (row g, tokens
// 2q, 2q+1); c2, c3 = (row g+8, same tokens). `red`: the block's [warps][MW*NW*4][32] f32 area; block_row0 / row0:
// the block's / warp's first row in the group; rank: the block's rank in its cluster (its K slice).
//
// SplitEpilogueTo is the same over an explicit output: y [T, y_stride] with n rows starting at column 0 (the
// multi-weight kernel, linear_fused.cu, passes each weight's own output); SplitEpilogue passes the group's columns.
template <int MW, int NW>
__device__ __forceinline__ void SplitEpilogueTo(const LinearPlan& plan, float* y, int64_t y_stride, int64_t n,
                                                int64_t tokens, const float (&acc)[MW][NW][4], float* red,
                                                int64_t block_row0, int64_t row0, int64_t tok0, int wm, int wk,
                                                int lane, int rank) {
  constexpr int kAcc = MW * NW * 4;
  const int warps_k = plan.warps_k, warps_m = plan.warps_m, cluster = plan.cluster;
  const int g = lane >> 2, q = lane & 3;
  // Split: the warps wk > 0 park their partial sums ([warp][v][lane], v = (i * NW + jn) * 4 + c) and warp (wm, 0)
  // adds them to its own in order wk = 1, 2, ... in registers (the same lane, the same v: no index arithmetic - the
  // former element-wise loop over the block's tile was a quarter of the split-K kernel's instructions at T = 32,
  // ncu). With a cluster, warp (wm, 0) then parks the block's sums and after a cluster barrier the cluster's threads
  // add the blocks' sums in rank order (distributed shared memory). All loads of a sum are issued before its adds,
  // so a sum costs one load latency, not one per term. The order is fixed: results are deterministic.
  auto park = [&](int slot, const float (&v)[MW][NW][4]) {
    float* dst = red + static_cast<int64_t>(slot) * kAcc * 32 + lane;
#pragma unroll
    for (int i = 0; i < MW; ++i)
#pragma unroll
      for (int jn = 0; jn < NW; ++jn)
#pragma unroll
        for (int c = 0; c < 4; ++c) dst[32 * ((i * NW + jn) * 4 + c)] = v[i][jn][c];
  };
  float sum[MW][NW][4];
#pragma unroll
  for (int i = 0; i < MW; ++i)
#pragma unroll
    for (int jn = 0; jn < NW; ++jn)
#pragma unroll
      for (int c = 0; c < 4; ++c) sum[i][jn][c] = acc[i][jn][c];
  if (warps_k > 1) {
    if (wk > 0) park(wm * warps_k + wk, acc);
    __syncthreads();
    if (wk == 0) {
      for (int w = 1; w < warps_k; ++w) {
        const float* src = red + static_cast<int64_t>(wm * warps_k + w) * kAcc * 32 + lane;
#pragma unroll
        for (int i = 0; i < MW; ++i)
#pragma unroll
          for (int jn = 0; jn < NW; ++jn)
#pragma unroll
            for (int c = 0; c < 4; ++c) sum[i][jn][c] += src[32 * ((i * NW + jn) * 4 + c)];
      }
    }
  }
  if (cluster == 1) {  // also K not split at all: warp (wm, 0) stores; c0, c1 = (row g, tokens 2q, 2q+1), c2, c3 = row g+8
    if (wk != 0) return;
#pragma unroll
    for (int i = 0; i < MW; ++i)
#pragma unroll
      for (int jn = 0; jn < NW; ++jn)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int64_t r = row0 + 16 * i + g + 8 * (c / 2);
          const int64_t t = tok0 + 8 * jn + 2 * q + (c % 2);
          if (r < n && t < tokens) y[t * y_stride + r] = sum[i][jn][c];
        }
    return;
  }
  if (wk == 0) park(wm * warps_k, sum);
  const int total = warps_m * kAcc * 32;
  // Element e of the block's tile: warp row em, accumulator v, lane el -> output (row r, token t), or false.
  auto element = [&](int e, int& em, int& v, int& el, int64_t& r, int64_t& t) {
    em = e / (kAcc * 32), v = (e / 32) % kAcc, el = e % 32;
    const int i = v / (NW * 4), jn = (v / 4) % NW, c = v % 4;
    r = block_row0 + int64_t{16} * MW * em + 16 * i + (el >> 2) + 8 * (c / 2);
    t = tok0 + 8 * jn + 2 * (el & 3) + (c % 2);
    return r < n && t < tokens;
  };
  ClusterSync();
  for (int e = rank * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x); e < total;
       e += cluster * static_cast<int>(blockDim.x)) {
    int em, v, el;
    int64_t r, t;
    if (!element(e, em, v, el, r, t)) continue;
    const float* src = red + (static_cast<int64_t>(em * warps_k) * kAcc + v) * 32 + el;
    float part[8];
#pragma unroll
    for (int b = 0; b < 8; ++b) part[b] = b < cluster ? LoadClusterShared(src, static_cast<uint32_t>(b)) : 0.f;
    float total_sum = 0.f;
#pragma unroll
    for (int b = 0; b < 8; ++b) {
      if (b < cluster) total_sum += part[b];
    }
    y[t * y_stride + r] = total_sum;
  }
  // No block may leave while another still reads its shared memory.
  ClusterSync();
}

template <int MW, int NW>
__device__ __forceinline__ void SplitEpilogue(const LinearParams& p, const float (&acc)[MW][NW][4], float* red,
                                              int64_t block_row0, int64_t row0, int64_t tok0, int64_t grp, int wm,
                                              int wk, int lane, int rank) {
  SplitEpilogueTo<MW, NW>(p.plan, p.y + grp * p.n, p.y_stride, p.n, p.t, acc, red, block_row0, row0, tok0, wm, wk,
                          lane, rank);
}

}  // namespace
}  // namespace dsv4::kernels::cuda
