// Device helpers of the attention family (kv_window.cu, compressor.cu, indexer.cu, attention.cu): the step
// index and block-table lookups every op repeats, row addresses in both KV formats of ops.h, and the block-wide
// FP8 row encoder that writes kernels/sparse_mla's 584-byte record bit for bit as EncodeKvRow does (the
// scalar conversions are common/float_formats.h's, shared with the CPU).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/float_formats.h"
#include "kernels/ops.h"
#include "kernels/sparse_mla/kv_row_format.h"

namespace dsv4::kernels::cuda::attn {

namespace fmt = ::dsv4::kernels::sparse_mla;

constexpr unsigned kFullMask = 0xffffffffu;

// Physical row id of logical row `logical` of sequence b (page * P + row in page); -1 when the block table
// has no page there (a negative entry).
__device__ __forceinline__ int64_t PhysicalRow(const BlockTables& t, int64_t b, int64_t logical, int page_rows) {
  const int32_t page = t.pages[b * t.stride + logical / page_rows];
  if (page < 0) return -1;
  return static_cast<int64_t>(page) * page_rows + logical % page_rows;
}

// kF32 pools: the first float of physical row `row`.
__device__ __forceinline__ float* F32Row(const KvCacheView& c, int64_t row) {
  return reinterpret_cast<float*>(c.base + (row / c.page_rows) * c.page_bytes +
                                  (row % c.page_rows) * static_cast<int64_t>(c.dim) * 4);
}
// kFp8Row584 pools: the 576 data bytes and the 8 footer scale bytes of physical row `row`.
__device__ __forceinline__ uint8_t* Fp8RowData(const KvCacheView& c, int64_t row) {
  return c.base + (row / c.page_rows) * c.page_bytes + (row % c.page_rows) * fmt::kRowDataBytes;
}
__device__ __forceinline__ uint8_t* Fp8RowScales(const KvCacheView& c, int64_t row) {
  return c.base + (row / c.page_rows) * c.page_bytes + static_cast<int64_t>(c.page_rows) * fmt::kRowDataBytes +
         (row % c.page_rows) * fmt::kRowScaleBytes;
}

// Dim d of physical row `row` as a float, in either format (the FP8 decode is DecodeKvRow's).
__device__ __forceinline__ float ReadKvDim(const KvCacheView& c, int64_t row, int d) {
  if (c.format == KvFormat::kF32) return F32Row(c, row)[d];
  const uint8_t* data = Fp8RowData(c, row);
  if (d < fmt::kNopeDim) return E4m3ToF32(data[d]) * Ue8m0ToF32(Fp8RowScales(c, row)[d / fmt::kTileDim]);
  const int i = d - fmt::kNopeDim;
  return Bf16ToF32(static_cast<uint16_t>(data[fmt::kNopeDim + 2 * i] | (data[fmt::kNopeDim + 2 * i + 1] << 8)));
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Encodes the 512 floats at k (shared memory) into row `row` of a kFp8Row584 pool, exactly as
// sparse_mla::EncodeKvRow: warp w < 7 quantises tile w (amax floored at 1e-4, ue8m0 scale
// 2^ceil(log2(amax / 448)), e4m3 round-to-nearest-even, saturating), warp 7 the 64 bf16 rope dims and the pad
// byte. Called by threads 0..255 of a block (others must not call it); no barrier inside.
__device__ __forceinline__ void EncodeFp8Row(const float* k, const KvCacheView& c, int64_t row) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint8_t* data = Fp8RowData(c, row);
  if (warp < fmt::kNumTiles) {
    const int d0 = warp * fmt::kTileDim + lane, d1 = d0 + 32;
    const float x0 = k[d0], x1 = k[d1];
    const float amax = WarpMax(fmaxf(fmt::kAmaxFloor, fmaxf(fabsf(x0), fabsf(x1))));
    const uint8_t s = Ue8m0CeilFromF32(amax / fmt::kE4m3Max);
    const float scale = Ue8m0ToF32(s);
    data[d0] = F32ToE4m3(x0 / scale);  // division by a power of two: exact, as on the CPU
    data[d1] = F32ToE4m3(x1 / scale);
    if (lane == 0) Fp8RowScales(c, row)[warp] = s;
  } else if (warp == fmt::kNumTiles) {
    for (int i = lane; i < fmt::kRopeDim; i += 32) {
      const uint16_t h = F32ToBf16(k[fmt::kNopeDim + i]);
      data[fmt::kNopeDim + 2 * i] = static_cast<uint8_t>(h & 0xff);  // little-endian, as the kernels read it
      data[fmt::kNopeDim + 2 * i + 1] = static_cast<uint8_t>(h >> 8);
    }
    if (lane == 0) Fp8RowScales(c, row)[fmt::kNumTiles] = 0;
  }
}

}  // namespace dsv4::kernels::cuda::attn
