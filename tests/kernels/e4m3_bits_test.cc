// The FP8 linear's bit-move e4m3 -> bf16 dequantisation (kernels/cuda/e4m3_bits.h), on the host through its
// emulation of the device's PRMT: for every one of the 256 codes in every byte position of a word (the other
// bytes random), the bf16 it yields is exactly the code's value times 2^-120 (subnormals included, zero signs
// kept), and the two NaN codes give the documented finite +-480 * 2^-120. Also PRMT's emulation on known words.
// The device path is the same function with the real instruction; the GPU test compares the two dequantisations
// bit for bit (tests/cuda/fused_linear_ops_test.cc).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "common/float_formats.h"
#include "gtest/gtest.h"
#include "kernels/cuda/e4m3_bits.h"

namespace dsv4::kernels::cuda {
namespace {

// The value of a bf16 bit pattern in double (subnormals as such).
double Bf16Value(uint16_t h) { return static_cast<double>(Bf16ToF32(h)); }

TEST(E4m3BitsTest, PrmtEmulationSelectsAndReplicatesSigns) {
  // Identity, a byte reversal and the second source.
  EXPECT_EQ(PrmtEmulated(0x44332211u, 0x88776655u, 0x3210u), 0x44332211u);
  EXPECT_EQ(PrmtEmulated(0x44332211u, 0x88776655u, 0x0123u), 0x11223344u);
  EXPECT_EQ(PrmtEmulated(0x44332211u, 0x88776655u, 0x7654u), 0x88776655u);
  // Sign replication: byte 0x81 -> 0xff, 0x7f -> 0x00.
  EXPECT_EQ(PrmtEmulated(0x00007f81u, 0u, 0x9180u), 0x007fff81u);
  EXPECT_EQ(PrmtEmulated(0x817f0000u, 0u, 0xB3A2u), 0xff81007fu);
}

TEST(E4m3BitsTest, EveryCodeInEveryPositionIsExactTimesTwoToTheMinus120) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> any;
  int checked = 0;
  for (int code = 0; code < 256; ++code) {
    for (int position = 0; position < 4; ++position) {
      for (int trial = 0; trial < 8; ++trial) {
        uint32_t v = any(rng);
        v = (v & ~(0xffu << (8 * position))) | (static_cast<uint32_t>(code) << (8 * position));
        uint32_t lo = 0, hi = 0;
        E4m3x4ToBf16Bits(v, lo, hi);
        const uint32_t word = position < 2 ? lo : hi;
        const uint16_t half = static_cast<uint16_t>(position % 2 == 0 ? word & 0xffffu : word >> 16);
        const uint8_t b = static_cast<uint8_t>(code);
        const double got = Bf16Value(half);
        const bool neg = (b & 0x80) != 0;
        EXPECT_EQ((half >> 15) != 0, neg) << "code " << code << ": sign";
        if ((b & 0x7f) == 0x7f) {
          EXPECT_EQ(got, std::ldexp(neg ? -480.0 : 480.0, -120)) << "NaN code " << code;
        } else {
          const double want = std::ldexp(static_cast<double>(E4m3ToF32(b)), -120);
          EXPECT_EQ(got, want) << "code " << code << " position " << position << " word " << std::hex << v;
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 256 * 4 * 8);
}

// The scale bookkeeping of the kernel: x staged times 2^kBitsXShift, partial sums times 2^kBitsPartShift, so a
// product comes back to w * x exactly.
TEST(E4m3BitsTest, ShiftsUndoTheScaling) { EXPECT_EQ(kBitsXShift + kBitsPartShift, 120); }

}  // namespace
}  // namespace dsv4::kernels::cuda
