// The DeepSeek-V4 FP8 KV row ("MODEL1" record, dsv4-decode.md §3.1) and its paged layout: the one place
// that knows where a row's bytes live. Used by the model (writing window and compressed rows), the float64
// reference and the CUDA kernels (which recompute the same offsets on the device).
//
// One row = 512 logical dims = 448 e4m3 "nope" bytes (7 tiles of 64 dims) + 64 bf16 rope dims
// (576 data bytes) + 7 ue8m0 tile scales and 1 pad byte (8 scale bytes) = 584 bytes.
// A page of P rows stores [P x 576 data bytes][P x 8 scale bytes] (scales in a page footer) and its
// stride is P * 584 rounded up to a multiple of 576 (P = 64 -> 37,440 B; P = 256 -> 149,760 B).
// Row id = page * P + row in page.
#pragma once

#include <cstdint>
#include <span>

namespace dsv4::kernels::sparse_mla {

inline constexpr int kKvDim = 512;        // D: logical dims of a key (= value)
inline constexpr int kNopeDim = 448;      // dims 0..447 stored as e4m3
inline constexpr int kRopeDim = 64;       // dims 448..511 stored as bf16
inline constexpr int kTileDim = 64;       // one ue8m0 scale per 64 nope dims
inline constexpr int kNumTiles = 7;       // kNopeDim / kTileDim
inline constexpr int kRowDataBytes = 576;  // 448 e4m3 + 64 * 2 bf16
inline constexpr int kRowScaleBytes = 8;   // 7 ue8m0 + 1 pad
inline constexpr int kRowBytes = kRowDataBytes + kRowScaleBytes;  // 584
inline constexpr float kE4m3Max = 448.0f;
// Quantisation floor on a tile's amax, as FlashMLA tests/quant.py and DeepSeek's act_quant use.
inline constexpr float kAmaxFloor = 1e-4f;

static_assert(kNopeDim + kRopeDim == kKvDim && kNumTiles * kTileDim == kNopeDim);

// Bytes between the starts of two pages of `page_rows` rows (P * 584 rounded up to a multiple of 576).
constexpr int64_t KvPageStrideBytes(int page_rows) {
  const int64_t raw = static_cast<int64_t>(page_rows) * kRowBytes;
  return (raw + kRowDataBytes - 1) / kRowDataBytes * kRowDataBytes;
}
// Byte offset of row `row_id`'s 576 data bytes from the pool's start.
constexpr int64_t KvRowDataOffset(int64_t row_id, int page_rows) {
  return (row_id / page_rows) * KvPageStrideBytes(page_rows) + (row_id % page_rows) * kRowDataBytes;
}
// Byte offset of row `row_id`'s 8 scale bytes (in its page's footer) from the pool's start.
constexpr int64_t KvRowScaleOffset(int64_t row_id, int page_rows) {
  return (row_id / page_rows) * KvPageStrideBytes(page_rows) +
         static_cast<int64_t>(page_rows) * kRowDataBytes + (row_id % page_rows) * kRowScaleBytes;
}

// Quantises one 512-dim key into its 576 data bytes and 8 scale bytes: per 64-dim tile
// amax = max(max|x|, 1e-4), scale = 2^ceil(log2(amax / 448)), byte = e4m3(x / scale) (round to nearest
// even, saturating); dims 448..511 are rounded to bf16. The pad byte is written as 0.
void EncodeKvRow(std::span<const float, kKvDim> k, uint8_t* data, uint8_t* scales);

// Dequantises a row: k[d] = e4m3(byte_d) * 2^(scale[d / 64] - 127) for d < 448, bf16 for the rest.
// Exact in float (every e4m3 value times a power of two is a float unless it leaves float's range).
void DecodeKvRow(const uint8_t* data, const uint8_t* scales, std::span<float, kKvDim> k);

// A paged pool of 584-byte rows in host or device memory (non-owning).
struct KvPoolView {
  uint8_t* data = nullptr;  // [num_pages, stride] bytes, stride = KvPageStrideBytes(page_rows)
  int64_t num_pages = 0;
  int page_rows = 0;  // P
  int64_t num_rows() const { return num_pages * page_rows; }
  int64_t size_bytes() const { return num_pages * KvPageStrideBytes(page_rows); }
};

// Encodes `k` into row `row_id` of a host pool (row_id < num_rows, checked by the caller).
void WriteKvRow(const KvPoolView& pool, int64_t row_id, std::span<const float, kKvDim> k);
// Decodes row `row_id` of a host pool.
void ReadKvRow(const KvPoolView& pool, int64_t row_id, std::span<float, kKvDim> k);

}  // namespace dsv4::kernels::sparse_mla
