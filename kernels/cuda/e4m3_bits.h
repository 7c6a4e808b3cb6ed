// e4m3 -> bf16 by bit moves, for the FP8 linear kernels' dequantisation (linear_fused.cu with
// LinearPlan::bit_dequant), with a host emulation of the one device instruction it uses so that a CPU test
// (tests/kernels/e4m3_bits_test.cc, in CI) checks the mapping for every one of the 256 codes.
//
// The hardware path (linear_device.cuh E4m3x4ToBf16: e4m3x2 -> f16x2, f16 -> f32, f32x2 -> bf16x2) costs 4
// instructions per 2 elements, 2 per weight byte (ncu on the H200: a third of the split-K kernel's instructions per
// weight step). This one costs 3: one PRMT spreads two e4m3 bytes into the low bytes of two 16-bit halves with
// the sign byte replicated above each, then a shift by 4 and a mask:
//   half = sign(b) << 15 | (b & 0x7f) << 4
// puts the 4 exponent bits of e4m3 in the low 4 bits of bf16's 8-bit exponent field and its 3 mantissa bits in the
// top of bf16's 7. Read as bf16 that is exactly e4m3(b) * 2^-120 for every finite code: a normal code (exponent
// e >= 1) becomes 2^(e - 127) (1 + m/8) = 2^(e - 7) (1 + m/8) * 2^-120, and a subnormal code (e = 0) becomes the
// bf16 subnormal (m/8) 2^-126 = (m/8) 2^-6 * 2^-120 - both formats' subnormals continue their lowest binade the
// same way, which is why the map is exact with no special case. The NaN codes 0x7f / 0xff become +-480 * 2^-120
// (finite; checkpoints hold no NaN weights). Zero stays (+-)0.
//
// The 2^-120 is undone outside the tensor cores: the kernel stages x scaled by 2^kBitsXShift (exact: a power of two,
// |x| < 2^64 assumed) so the products w * x * 2^-56 stay far inside fp32's normal range, and multiplies each
// step's partial sums by 2^kBitsPartShift in fp32 (exact) before the block scale. Products of magnitude below
// 2^-70 (|w x| with w the e4m3 value) could lose bits to fp32 underflow where the hardware path would not; the
// weights' smallest nonzero magnitude is 2^-9, so only activations below ~2^-61 are affected.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DSV4_E4M3_HD __host__ __device__ inline
#else
#define DSV4_E4M3_HD inline
#endif

namespace dsv4::kernels::cuda {

// x is staged as x * 2^kBitsXShift; a step's partial sums are multiplied by 2^kBitsPartShift (= 120 - 64).
inline constexpr int kBitsXShift = 64;
inline constexpr int kBitsPartShift = 56;
// PRMT selectors (one nibble per result byte, low byte first; bit 3 of a nibble replicates the selected byte's sign
// bit): bytes 0, 1 of v into the low bytes of the two halves of `lo`, their signs above them; bytes 2, 3 for `hi`.
inline constexpr uint32_t kBitsSelLo = 0x9180u;
inline constexpr uint32_t kBitsSelHi = 0xB3A2u;
inline constexpr uint32_t kBitsMask = 0x87F087F0u;

// prmt.b32 d, a, b, sel in its default mode, on the host: result byte i = byte (sel nibble i & 7) of the 8-byte
// value {b:a}, or that byte's bit 7 replicated when the nibble's bit 3 is set.
constexpr uint32_t PrmtEmulated(uint32_t a, uint32_t b, uint32_t sel) {
  const uint64_t bytes = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t nib = (sel >> (4 * i)) & 0xfu;
    uint32_t byte = static_cast<uint32_t>(bytes >> (8 * (nib & 7u))) & 0xffu;
    if (nib & 8u) byte = (byte & 0x80u) ? 0xffu : 0u;
    out |= byte << (8 * i);
  }
  return out;
}

// Four e4m3 bytes (little-endian in v) -> two bf16x2 words (lo: elements 0, 1; hi: 2, 3), each element's value
// exactly e4m3 * 2^-120 (see above).
DSV4_E4M3_HD void E4m3x4ToBf16Bits(uint32_t v, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__)
  uint32_t a, b;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(a) : "r"(v), "r"(0u), "n"(kBitsSelLo));
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(b) : "r"(v), "r"(0u), "n"(kBitsSelHi));
#else
  const uint32_t a = PrmtEmulated(v, 0u, kBitsSelLo);
  const uint32_t b = PrmtEmulated(v, 0u, kBitsSelHi);
#endif
  lo = (a << 4) & kBitsMask;
  hi = (b << 4) & kBitsMask;
}

}  // namespace dsv4::kernels::cuda
