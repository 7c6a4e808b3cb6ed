// Scalar conversions for every low-precision format the checkpoint and the KV cache use:
// bf16, float8 e4m3 (fn: no inf, max 448), ue8m0 (power-of-two scales), e2m1 (fp4).
// One definition for the checkpoint generator, the loaders, the CPU references and the
// host side of the CUDA kernels. Pure bit manipulation with IEEE round-to-nearest-even, so
// results are identical on every machine (the generator's determinism depends on that).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DSV4_HD __host__ __device__ inline
#else
#define DSV4_HD inline
#endif

namespace dsv4 {

DSV4_HD uint32_t F32Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
DSV4_HD float F32FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- bf16: the top 16 bits of an f32 ----
DSV4_HD float Bf16ToF32(uint16_t h) { return F32FromBits(static_cast<uint32_t>(h) << 16); }
DSV4_HD uint16_t F32ToBf16(float f) {
  uint32_t u = F32Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// ---- float8 e4m3fn: s.eeee.mmm, bias 7, subnormals, 0x7f/0xff = NaN, max finite 448 ----
DSV4_HD float E4m3ToF32(uint8_t b) {
  const uint32_t sign = (b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
  if (e == 0xf && m == 7) return F32FromBits(sign | 0x7fc00000u);
  float mag;
  if (e == 0) {
    mag = static_cast<float>(m) * 0.001953125f;  // m * 2^-9
  } else {
    mag = F32FromBits(((e + 120u) << 23) | (m << 20));  // (1 + m/8) * 2^(e-7)
  }
  return F32FromBits(F32Bits(mag) | sign);
}

// Round-to-nearest-even onto the e4m3 grid, saturating at +-448 (as torch's float8_e4m3fn
// cast does for the finite range used here). NaN maps to 0x7f.
DSV4_HD uint8_t F32ToE4m3(float f) {
  const uint32_t u = F32Bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;
  if (a >= 0x43e00000u) return sign | 0x7e;  // >= 448 (and inf): saturate
  const int exp = static_cast<int>(a >> 23) - 127;
  if (exp < -6) {
    // Subnormal range: q = |f| / 2^-9 rounded to even; q == 8 is the smallest normal (code 8).
    const float q = F32FromBits(a) * 512.0f;
    const float r = std::nearbyint(q);
    return sign | static_cast<uint8_t>(r);
  }
  // Normal: keep 3 mantissa bits with round-to-nearest-even on the f32 bit pattern.
  uint32_t mant = a & 0x7fffffu;
  uint32_t e = static_cast<uint32_t>(exp + 7);
  const uint32_t lsb = (mant >> 20) & 1u;
  mant += 0x7ffffu + lsb;
  if (mant & 0x800000u) {  // mantissa overflow: next binade
    mant = 0;
    e += 1;
  }
  const uint32_t code = (e << 3) | (mant >> 20);
  if (code >= 0x7f) return sign | 0x7e;  // rounded past 448
  return sign | static_cast<uint8_t>(code);
}

// ---- ue8m0: unsigned power-of-two scale 2^(b-127); 0xff = NaN ----
DSV4_HD float Ue8m0ToF32(uint8_t b) {
  if (b == 0xff) return F32FromBits(0x7fc00000u);
  if (b == 0) return F32FromBits(0x00400000u);  // 2^-127 (f32 subnormal)
  return F32FromBits(static_cast<uint32_t>(b) << 23);
}
// Smallest power of two >= s (s > 0, finite), as the ue8m0 byte: the "scale = 2^ceil(log2(x))"
// rule of DeepSeek's act_quant. Clamped to the representable range [2^-127, 2^127].
DSV4_HD uint8_t Ue8m0CeilFromF32(float s) {
  uint32_t a = F32Bits(s) & 0x7fffffffu;
  if (a == 0 || a >= 0x7f800000u) return a == 0 ? 0 : 254;
  if (a < 0x00800000u) return 0;  // f32 subnormal: below 2^-126, clamp to the smallest scale
  uint32_t e = a >> 23;  // biased exponent == ue8m0 byte for an exact power of two
  if (a & 0x7fffffu) e += 1;
  return static_cast<uint8_t>(e > 254 ? 254 : e);
}

// ---- e2m1 (fp4): codes 0..7 = {0, .5, 1, 1.5, 2, 3, 4, 6}; bit 3 is the sign ----
DSV4_HD float E2m1ToF32(uint8_t code) {
  constexpr float kMag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  const float m = kMag[code & 7u];
  return (code & 8u) ? -m : m;
}
// Round to nearest on the e2m1 grid, ties to the even code, saturating at 6. -0 keeps its sign.
DSV4_HD uint8_t F32ToE2m1(float f) {
  const uint8_t sign = (F32Bits(f) >> 31) ? 8 : 0;
  const float a = std::fabs(f);
  uint8_t c;
  if (!(a > 0.25f)) c = 0;  // also NaN -> 0
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return sign | c;
}

}  // namespace dsv4
