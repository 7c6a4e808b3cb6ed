// Device helpers shared by the sparse-MLA CUDA kernels: PTX wrappers (cp.async, ldmatrix, bf16 mma.sync),
// FP8 row dequantisation and the index-to-row-address decode. Plain sm_80+ PTX plus the sm_89+ e4m3
// conversion, so the same code serves sm_90 (H100/H200) and sm_120 (consumer Blackwell).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/float_formats.h"
#include "kernels/sparse_mla/kv_row_format.h"
#include "kernels/sparse_mla/sparse_mla_params.h"

namespace dsv4::kernels::sparse_mla::device {

constexpr float kLn2 = 0.6931471805599453f;  // natural-log LSE from log2-domain softmax statistics

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async of 16 bytes through L2 only (rows are read once per block); zero-fills when !valid.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
// cp.async of 8 bytes (the scale footer of a row); zero-fills when !valid.
__device__ __forceinline__ void CpAsync8(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 bf16 matrices from shared memory (lanes 8i..8i+7 give matrix i's row addresses).
__device__ __forceinline__ void Ldsm4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}
// Same, each matrix transposed on the way (row-major [k][n] data -> B fragments of a row.col mma).
__device__ __forceinline__ void Ldsm4T(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

// c += a * b for one m16n8k16 tile, bf16 inputs, f32 accumulators (fragment layouts of the PTX ISA:
// a: rows g / g+8, k 2t..2t+1 / 2t+8..2t+9; b: k 2t.. / 2t+8.., column g; c: rows g / g+8, cols 2t, 2t+1,
// with g = lane / 4 and t = lane % 4).
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Four e4m3 bytes (little-endian in `v`) times a power-of-two scale -> two bf16x2 words. The hardware
// e4m3x2 -> f16x2 conversion is exact (subnormals included), the f32 product by 2^k is exact inside f32's
// range, and the result has 4 significant bits, so the bf16 rounding is exact too.
__device__ __forceinline__ void DequantE4m3x4(uint32_t v, float scale, uint32_t& lo, uint32_t& hi) {
  const __half2_raw h0 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  const __half2_raw h1 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v >> 16), __NV_E4M3);
  const float2 f0 = __half22float2(__half2(h0));
  const float2 f1 = __half22float2(__half2(h1));
  lo = PackBf16x2(f0.x * scale, f0.y * scale);
  hi = PackBf16x2(f1.x * scale, f1.y * scale);
}

// ue8m0 byte -> 2^(b - 127) as float, as common/float_formats.h's Ue8m0ToF32 (0 -> 2^-127, 255 -> NaN),
// without its branches.
__device__ __forceinline__ float ScaleFromUe8m0(uint32_t b) {
  const float v = __uint_as_float(b == 0 ? 0x00400000u : b << 23);
  return b == 0xff ? __uint_as_float(0x7fc00000u) : v;
}

// Where sequence b's selected position `pos` (window entries first, then extra entries, both already cut at
// their lengths: `ew` window entries) lives. Returns false for skipped entries (-1, outside the pool).
struct RowAddress {
  const uint8_t* data;
  const uint8_t* scales;
};
// Fields are selected one by one (not through a reference to p.window / p.extra) so the kernel parameters
// stay in the parameter space instead of being copied to local memory.
__device__ __forceinline__ bool LocateRow(const SparseMlaParams& p, int b, int pos, int ew, RowAddress& addr) {
  const bool is_extra = pos >= ew;
  const int32_t* indices = is_extra ? p.extra.indices : p.window.indices;
  const int index_stride = is_extra ? p.extra.index_stride : p.window.index_stride;
  const int page_rows = is_extra ? p.extra.page_rows : p.window.page_rows;
  const int64_t num_pages = is_extra ? p.extra.num_pages : p.window.num_pages;
  const uint8_t* cache = is_extra ? p.extra.cache : p.window.cache;
  const int j = is_extra ? pos - ew : pos;
  const int32_t id = __ldg(indices + static_cast<int64_t>(b) * index_stride + j);
  if (id < 0 || id >= num_pages * page_rows) return false;
  const int page = id / page_rows;
  const int r = id - page * page_rows;
  const int64_t stride =
      (static_cast<int64_t>(page_rows) * kRowBytes + kRowDataBytes - 1) / kRowDataBytes * kRowDataBytes;
  const uint8_t* base = cache + page * stride;
  addr.data = base + static_cast<int64_t>(r) * kRowDataBytes;
  addr.scales = base + static_cast<int64_t>(page_rows) * kRowDataBytes + r * kRowScaleBytes;
  return true;
}
// LocateRow in two steps (the wgmma kernels), so the index of a later tile can be loaded early: LoadRowId
// reads the physical row id of position pos, RowFromId turns it into addresses (false for skipped ids).
__device__ __forceinline__ int32_t LoadRowId(const SparseMlaParams& p, int b, int pos, int ew) {
  const bool is_extra = pos >= ew;
  const int32_t* indices = is_extra ? p.extra.indices : p.window.indices;
  const int index_stride = is_extra ? p.extra.index_stride : p.window.index_stride;
  const int j = is_extra ? pos - ew : pos;
  return __ldg(indices + static_cast<int64_t>(b) * index_stride + j);
}
__device__ __forceinline__ bool RowFromId(const SparseMlaParams& p, bool is_extra, int32_t id, RowAddress& addr) {
  const int page_rows = is_extra ? p.extra.page_rows : p.window.page_rows;
  const int64_t num_pages = is_extra ? p.extra.num_pages : p.window.num_pages;
  const uint8_t* cache = is_extra ? p.extra.cache : p.window.cache;
  if (id < 0 || id >= num_pages * page_rows) return false;
  const int page = id / page_rows;
  const int r = id - page * page_rows;
  const int64_t stride =
      (static_cast<int64_t>(page_rows) * kRowBytes + kRowDataBytes - 1) / kRowDataBytes * kRowDataBytes;
  const uint8_t* base = cache + page * stride;
  addr.data = base + static_cast<int64_t>(r) * kRowDataBytes;
  addr.scales = base + static_cast<int64_t>(page_rows) * kRowDataBytes + r * kRowScaleBytes;
  return true;
}

// Programmatic dependent launch (sm_90+; no-ops where the launch did not ask for it): the main kernels let
// the split combine start launching once their blocks reach the epilogue, and the combine waits for the whole
// main grid (and its memory) before reading the partials.
__device__ __forceinline__ void LaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void WaitForPrimaryGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Entries of one cache that sequence b uses: min(length, topk), or topk without lengths.
__device__ __forceinline__ int UsedEntries(int topk, const int32_t* lengths, int b) {
  if (topk == 0) return 0;
  if (lengths == nullptr) return topk;
  return min(max(__ldg(lengths + b), 0), topk);
}

// Per-block work range: the sequence's used entries (window then extra) cut into tiles, split evenly.
struct BlockRange {
  int ew;          // used window entries (positions [0, ew) are window, [ew, n) extra)
  int n;           // used entries in all
  int tile_begin;  // first tile of this split
  int num_tiles;   // tiles of this split (may be 0)
};
template <int kTileRows>
__device__ __forceinline__ BlockRange MakeRange(const SparseMlaParams& p, int b, int split, int num_splits) {
  BlockRange r;
  r.ew = UsedEntries(p.window.topk, p.window.lengths, b);
  r.n = r.ew + UsedEntries(p.extra.topk, p.extra.lengths, b);
  const int total = (r.n + kTileRows - 1) / kTileRows;
  const int per_split = (total + num_splits - 1) / num_splits;
  r.tile_begin = split * per_split;
  r.num_tiles = max(0, min(total, r.tile_begin + per_split) - r.tile_begin);
  return r;
}


// Epilogue shared by both MMA kernels: normalises each head's output row by its sum (folding in the sink when
// the block saw every key) and stores bf16 output + natural-log LSE, or, for a split, the f32 partial row and
// the (max in log2 units, sum) pair the combine kernel weighs it by. `o` is the warp's accumulator for its
// kDimsPerWarp output dims [dim0, dim0 + kDimsPerWarp) of kMTiles 16-head m-tiles starting at block head
// mtile_head0 (the mma.sync / wgmma accumulator layout: rows g and g + 8, columns 2 t4, 2 t4 + 1 of each 8-dim
// block); stat_* are per-head block statistics in shared memory.
template <int kMTiles, int kDimsPerWarp, int kHeadsPerBlock>
__device__ __forceinline__ void StoreBlockOutput(const SparseMlaParams& p, const float (&o)[kMTiles][kDimsPerWarp / 8][4],
                                                 const float* stat_m, const float* stat_l, const float* stat_lq,
                                                 int b, int head0, int split, int num_splits, int tid,
                                                 int mtile_head0, int dim0) {
  const int lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int H = p.num_heads;
  const bool direct = num_splits == 1;
  // Split partials: o / l per split, then the running max (log2 units) and sum, so the combine weighs the
  // splits from the same f32 scores as one block would (a natural-log LSE of ~1e6 keeps only 0.25 of it).
  float* ws_o = static_cast<float*>(p.workspace);
  float* ws_max = ws_o + static_cast<int64_t>(p.batch) * H * num_splits * kKvDim;
  float* ws_sum = ws_max + static_cast<int64_t>(p.batch) * H * num_splits;
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int hl = mtile_head0 + 16 * mi + g + 8 * half, h = head0 + hl;
      const float l = stat_l[hl];
      float factor = 0.f;  // no valid key: zeros
      if (l != 0.f) {
        factor = 1.f / stat_lq[hl];
        if (direct && p.attn_sink != nullptr) {
          const float lse = (stat_m[hl] + log2f(l)) * kLn2;
          factor /= 1.f + expf(__ldg(p.attn_sink + h) - lse);
        }
      }
      const int64_t bh = static_cast<int64_t>(b) * H + h;
      if (direct) {
        uint32_t* dst = reinterpret_cast<uint32_t*>(p.out) + (bh * kKvDim + dim0 + 2 * t4) / 2;
#pragma unroll
        for (int nj = 0; nj < kDimsPerWarp / 8; ++nj) {
          dst[nj * 4] = PackBf16x2(o[mi][nj][2 * half] * factor, o[mi][nj][2 * half + 1] * factor);
        }
      } else {
        float* dst = ws_o + (bh * num_splits + split) * kKvDim + dim0 + 2 * t4;
#pragma unroll
        for (int nj = 0; nj < kDimsPerWarp / 8; ++nj) {
          *reinterpret_cast<float2*>(dst + nj * 8) =
              make_float2(o[mi][nj][2 * half] * factor, o[mi][nj][2 * half + 1] * factor);
        }
      }
    }
  }
  if (tid < kHeadsPerBlock) {
    const float l = stat_l[tid];
    const int64_t bh = static_cast<int64_t>(b) * H + head0 + tid;
    if (direct) {
      p.lse[bh] = l == 0.f ? INFINITY : (stat_m[tid] + log2f(l)) * kLn2;
    } else {
      ws_max[bh * num_splits + split] = stat_m[tid];
      ws_sum[bh * num_splits + split] = l;
    }
  }
}

}  // namespace dsv4::kernels::sparse_mla::device
