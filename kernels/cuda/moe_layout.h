// The device layout of the routed experts (PrepareCudaExperts writes it, the W4A16 MoE GEMMs of moe.cu read
// it): FP4 codes in MMA-fragment order and block scales re-encoded so that one shift-and-add gives the bf16
// factor that dequantises a code exactly. Plain C++ (host and device) so the packer and a host test share
// the bit map with the kernels. docs/cuda-moe.md draws the layout.
//
// Tiles. A weight W [N, K] is cut into 16-row groups (rg) and 64-wide K chunks (kc); one (rg, kc) tile is
// 512 bytes: lane L = 4g + c of a warp owns bytes [16L, 16L + 16), four u32 words, one per MMA k-step s.
// Word s of lane (g, c) holds the A fragment of mma.m16n8k16 for k-step s, with the k order permuted so
// that lane c reads the 16 contiguous columns 16c..16c+15 of the chunk (its activations too, and exactly
// one NVFP4 scale block per row):
//   fragment register j (a0a1 / a2a3 / a4a5 / a6a7), half h:  row = g + 8 (j & 1),
//   column = kc*64 + 16c + 4s + 2 (j >> 1) + h.
// The B (activation) fragment uses the same permutation: lane (g, c) passes x[token g][16c + 4s + {0,1}]
// and x[...][16c + 4s + {2,3}] for k-step s, i.e. words 2s and 2s+1 of its 32 contiguous bytes.
//
// Codes. A code (e2m1: bit 3 sign, bits 2..1 exponent, bit 0 mantissa) becomes a bf16 "trick" value by
// moving its magnitude bits to bf16 bits 8..6 and its sign to bit 15: that bf16 equals e2m1 * 2^-126 for
// every code (0.5 lands on the subnormal 2^-127). Multiplying by a bf16 factor C of the block gives the
// weight exactly (bf16 multiplies keep subnormal inputs). The 32 bits of a word are placed so that the
// four registers come out with few shifts: register j, half h, code bit b sits at Fp4WordBit(j, h, b).
//
// Scales. One byte per (row, block) in the tile's lane order: NVFP4 64 bytes per tile (lane L: row g then
// row g + 8 of block c), MXFP4 32 bytes (u16 entry (c / 2) * 8 + g: row g then row g + 8 of block c / 2).
//   NVFP4: the e4m3 scale re-encoded as ue5m3 (2^(E-9) * 1.mmm, byte E<<3 | mmm; exact for every finite
//          e4m3, subnormals included); negative scales flip the codes' signs, zero scales zero the codes.
//          C = bf16 bits (byte << 4) + (236 << 7) = scale * 2^118, so code * C = e2m1 * scale * 2^-8; the
//          epilogue multiplies by global_scale * 2^8.
//   MXFP4: byte = ue8m0 - j with j = max(0, max ue8m0 of the matrix - 128); C = bf16 bits (byte + 126) << 7,
//          so code * C = e2m1 * 2^(ue8m0 - 127 - j); the epilogue multiplies by 2^j. (A block whose scale is
//          below 2^j, i.e. 2^128 below the matrix's largest, is flushed to zero: only absurd scales do that.)
//
// An expert's bytes: [w13 codes][w2 codes][w13 scales][w2 scales]. w13 interleaves w1 and w3 tiles of the
// same rows, [I/16][D/64][2][512] (tile pair = gate rows, up rows); w2 pairs adjacent row groups,
// [D/32][I/64][2][512]. Scales follow the same order with 64 or 32 bytes per tile.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DSV4_MOE_HD __host__ __device__ inline
#else
#define DSV4_MOE_HD inline
#endif

namespace dsv4::kernels::cuda::moe {

enum class Fp4Kind : int { kNvfp4 = 0, kMxfp4 = 1 };

inline constexpr int kTileRows = 16;    // rows of one MMA A tile
inline constexpr int kChunkK = 64;      // K columns of one tile
inline constexpr int kTileBytes = 512;  // 16 x 64 codes
inline constexpr int kNvfp4ScaleTileBytes = 64;
inline constexpr int kMxfp4ScaleTileBytes = 32;
// Exponent shift folded out of NVFP4 factors so that scale * 2^118 stays a finite bf16 (scale <= 448).
inline constexpr float kNvfp4EpilogueShift = 256.f;

DSV4_MOE_HD int ScaleTileBytes(Fp4Kind kind) {
  return kind == Fp4Kind::kNvfp4 ? kNvfp4ScaleTileBytes : kMxfp4ScaleTileBytes;
}

// Bit of a word holding code bit b (0..3, 3 = sign) of fragment register j (0..3), half h (0..1).
// Registers 0..2 take the bf16 positions {6, 7, 8, 15} (+16 for the high half) shifted down by 0, 3 and 6;
// register 3 takes the 8 bits left over.
DSV4_MOE_HD int Fp4WordBit(int j, int h, int b) {
  if (j < 3) {
    const int target = (b == 3 ? 15 : 6 + b) + 16 * h;
    return target - 3 * j;
  }
  const int rest[4] = {10, 11, 13, 14};
  return rest[b] + 16 * h;
}

// The four bf16x2 "trick" registers of one word (each half = e2m1 * 2^-126, see above).
DSV4_MOE_HD void Fp4WordToTrick(uint32_t w, uint32_t r[4]) {
  constexpr uint32_t kMask = 0x81C081C0u;  // bf16 bits 15, 8..6 of both halves
  r[0] = w & kMask;
  r[1] = (w << 3) & kMask;
  r[2] = (w << 6) & kMask;
  r[3] = ((w >> 4) & 0x00C000C0u) | ((w >> 5) & 0x01000100u) | ((w << 1) & 0x80008000u);
}

// bf16 bits of e2m1 * 2^-126 for one code (what a register half holds).
DSV4_MOE_HD uint16_t Fp4CodeTrickBits(uint32_t code) {
  return static_cast<uint16_t>(((code & 7u) << 6) | ((code & 8u) << 12));
}

// bf16 bits of the block factor C from a re-encoded scale byte.
DSV4_MOE_HD uint32_t ScaleFactorBits(Fp4Kind kind, uint32_t byte) {
  return kind == Fp4Kind::kNvfp4 ? (byte << 4) + (236u << 7) : (byte + 126u) << 7;
}

// NVFP4 scale byte (e4m3) -> ue5m3 byte of its magnitude (0 for a zero scale); NaN is refused before this.
DSV4_MOE_HD uint8_t EncodeNvfp4Scale(uint8_t b) {
  const uint32_t e = (b >> 3) & 15u, m = b & 7u;
  if (e != 0) return static_cast<uint8_t>(((e + 2u) << 3) | m);
  if (m == 0) return 0;
  const uint32_t lz = m >= 4 ? 2u : (m >= 2 ? 1u : 0u);  // m * 2^-9 = 2^(lz - 9) * 1.xxx
  return static_cast<uint8_t>((lz << 3) | ((m << (3 - lz)) & 7u));
}

// Offsets inside one expert's bytes.
struct ExpertLayout {
  int64_t w13_codes = 0, w2_codes = 0, w13_scales = 0, w2_scales = 0;  // byte offsets
  int64_t bytes = 0;                                                  // whole expert, 256-byte aligned
};

DSV4_MOE_HD ExpertLayout MakeExpertLayout(Fp4Kind kind, int64_t dim, int64_t inter) {
  const int64_t tiles = inter / kTileRows * (dim / kChunkK);  // tiles of one [I, D] matrix
  const int64_t stb = ScaleTileBytes(kind);
  ExpertLayout l;
  l.w13_codes = 0;
  l.w2_codes = 2 * tiles * kTileBytes;
  l.w13_scales = 3 * tiles * kTileBytes;
  l.w2_scales = l.w13_scales + 2 * tiles * stb;
  l.bytes = (l.w2_scales + tiles * stb + 255) / 256 * 256;
  return l;
}

}  // namespace dsv4::kernels::cuda::moe
