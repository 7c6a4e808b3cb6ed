// Host encode/decode of the 584-byte FP8 KV row (see kv_row_format.h for the layout).
#include "kernels/sparse_mla/kv_row_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/float_formats.h"

namespace dsv4::kernels::sparse_mla {

void EncodeKvRow(std::span<const float, kKvDim> k, uint8_t* data, uint8_t* scales) {
  for (int t = 0; t < kNumTiles; ++t) {
    float amax = kAmaxFloor;
    for (int i = 0; i < kTileDim; ++i) amax = std::max(amax, std::fabs(k[t * kTileDim + i]));
    const uint8_t s = Ue8m0CeilFromF32(amax / kE4m3Max);
    const float scale = Ue8m0ToF32(s);
    scales[t] = s;
    for (int i = 0; i < kTileDim; ++i) {
      // Division by a power of two is exact; F32ToE4m3 saturates at +-448 (the clamp of the spec).
      data[t * kTileDim + i] = F32ToE4m3(k[t * kTileDim + i] / scale);
    }
  }
  scales[kNumTiles] = 0;
  for (int i = 0; i < kRopeDim; ++i) {
    const uint16_t h = F32ToBf16(k[kNopeDim + i]);
    std::memcpy(data + kNopeDim + 2 * i, &h, 2);  // little-endian bf16, as the GPU reads it
  }
}

void DecodeKvRow(const uint8_t* data, const uint8_t* scales, std::span<float, kKvDim> k) {
  for (int d = 0; d < kNopeDim; ++d) {
    k[d] = E4m3ToF32(data[d]) * Ue8m0ToF32(scales[d / kTileDim]);
  }
  for (int i = 0; i < kRopeDim; ++i) {
    uint16_t h;
    std::memcpy(&h, data + kNopeDim + 2 * i, 2);
    k[kNopeDim + i] = Bf16ToF32(h);
  }
}

void WriteKvRow(const KvPoolView& pool, int64_t row_id, std::span<const float, kKvDim> k) {
  EncodeKvRow(k, pool.data + KvRowDataOffset(row_id, pool.page_rows),
              pool.data + KvRowScaleOffset(row_id, pool.page_rows));
}

void ReadKvRow(const KvPoolView& pool, int64_t row_id, std::span<float, kKvDim> k) {
  DecodeKvRow(pool.data + KvRowDataOffset(row_id, pool.page_rows),
              pool.data + KvRowScaleOffset(row_id, pool.page_rows), k);
}

}  // namespace dsv4::kernels::sparse_mla
