// The arithmetic of token sampling, defined once for the host and the device: the CPU reference sampler
// (kernels/cpu/cpu_sample.cc, which the worker's Sampler and CpuOps::Sample call) and the CUDA kernel
// (kernels/cuda/sample.cu) both compute with these functions, so identical logits and parameters give the
// identical token. The algorithm that uses them is documented at SampleArgs (kernels/ops.h).
//
// Why fixed point: a probability is turned into an integer weight (Weight), and every sum over tokens is a
// uint64 sum of weights. Integer sums are exact, so they do not depend on the order in which a CPU loop or a GPU
// reduction adds them; top-p's cut and the final draw are decisions on exact integers (plus one rounded double
// product, computed the same way on both sides). A weight is floor(p * 2^44) of the probability relative to the
// most likely token (p = 1 for it): a token below 2^-44 of the top token's probability (x < kMinX) weighs 0 and
// is never drawn, which no sampler could notice (a 53-bit uniform resolves 2^-53 of the mass).
//
// Bit-identical host and device: every float operation below is one IEEE operation, correctly rounded. On the
// device the _rn intrinsics are used, which nvcc never fuses into an FMA; on the host the callers are compiled
// with -ffp-contract=off (kernels/cpu is), so the compiler cannot fuse either. No library exp: ExpNeg is a fixed
// polynomial of adds and multiplies.
#pragma once

#include <cstdint>

#include "common/float_formats.h"

namespace dsv4::kernels::sample {

// ---- Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) ----

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

// Ten rounds of Philox4x32 on the counter `ctr` with the key (key0, key1), in place.
DSV4_HD void Philox4x32x10(uint32_t ctr[4], uint32_t key0, uint32_t key1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * ctr[0];
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * ctr[2];
    const uint32_t out0 = static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key0;
    const uint32_t out1 = static_cast<uint32_t>(p1);
    const uint32_t out2 = static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key1;
    const uint32_t out3 = static_cast<uint32_t>(p0);
    ctr[0] = out0;
    ctr[1] = out1;
    ctr[2] = out2;
    ctr[3] = out3;
    key0 += kPhiloxW0;
    key1 += kPhiloxW1;
  }
}

// 53 uniform random bits for a request's token `index` (key = seed, counter = index): no generator state, so the
// same (seed, index) gives the same bits in any batch, after preemption, and on another worker.
DSV4_HD uint64_t RandomBits53(uint64_t seed, uint64_t index) {
  uint32_t ctr[4] = {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0u};
  Philox4x32x10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return (static_cast<uint64_t>(ctr[0]) << 32 | ctr[1]) >> 11;
}

// ---- single correctly rounded IEEE operations ----

DSV4_HD float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
DSV4_HD float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
DSV4_HD float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DSV4_HD float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
DSV4_HD double ToDouble(uint64_t v) {
#if defined(__CUDA_ARCH__)
  return __ull2double_rn(v);
#else
  return static_cast<double>(v);
#endif
}
DSV4_HD double MulD(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// ---- probabilities as integer weights ----

inline constexpr float kMinX = -30.0f;  // e^-30 ~ 2^-43.3: the smallest scaled logit with a nonzero weight
inline constexpr int kWeightBits = 44;  // weight of the most likely token: 2^44
// Vocabulary bound that keeps a row's weight sum below 2^63.
inline constexpr int64_t kMaxVocab = int64_t{1} << 19;

// The scaled logit x = (logit - max_logit) / temperature, as (logit - max) * inv_t with inv_t = 1 / temperature
// (both rounded). The most likely tokens get exactly 0 (also when inv_t is infinite).
DSV4_HD float ScaledLogit(float logit, float max_logit, float inv_t) {
  return logit == max_logit ? 0.0f : Mul(Sub(logit, max_logit), inv_t);
}

// e^x for kMinX <= x <= 0 (ExpNeg(0) == 1 exactly); 0 below kMinX, for -inf and for NaN. Cody-Waite range
// reduction x = n ln2 + r (exact: n has at most 6 bits, ln2's high part 16), a degree-7 Taylor polynomial on
// |r| <= ln2/2 (truncation 5e-9), and an exact power-of-two scale: within a few ulp of e^x.
DSV4_HD float ExpNeg(float x) {
  if (!(x >= kMinX)) return 0.0f;
  // log2(e); 1.5 * 2^23 (adding it rounds to an integer); ln 2 = kLn2Hi (16 significant bits) + kLn2Lo.
  constexpr float kLog2e = 0x1.715476p+0f, kRound = 0x1.8p+23f;
  constexpr float kLn2Hi = 0x1.62e4p-1f, kLn2Lo = 0x1.7f7d1cp-20f;
  const float n = Sub(Add(Mul(x, kLog2e), kRound), kRound);
  float r = Sub(x, Mul(n, kLn2Hi));
  r = Sub(r, Mul(n, kLn2Lo));
  float q = 0x1.a01a02p-13f;           // 1/7!
  q = Add(Mul(q, r), 0x1.6c16c2p-10f);  // 1/6!
  q = Add(Mul(q, r), 0x1.111112p-7f);   // 1/5!
  q = Add(Mul(q, r), 0x1.555556p-5f);   // 1/4!
  q = Add(Mul(q, r), 0x1.555556p-3f);   // 1/3!
  q = Add(Mul(q, r), 0.5f);
  q = Add(Mul(q, r), 1.0f);
  q = Add(Mul(q, r), 1.0f);
  return Mul(q, F32FromBits(static_cast<uint32_t>(127 + static_cast<int>(n)) << 23));
}

// floor(p * 2^44) for a relative probability p in [0, 1] (the product is exact: a power-of-two scale).
DSV4_HD uint64_t Weight(float p) { return static_cast<uint64_t>(Mul(p, 0x1p+44f)); }

// ---- the rank order: larger logit first, then the lower token id ----

// A uint32 that orders like the logit (-0 and +0 are one value). Not for NaN (a NaN row is sampled greedily).
DSV4_HD uint32_t OrderKey(float logit) {
  const uint32_t b = logit == 0.0f ? 0u : F32Bits(logit);
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}
// The logit an OrderKey came from (+0 for a zero).
DSV4_HD float LogitOfKey(uint32_t key) {
  return F32FromBits((key & 0x80000000u) != 0 ? (key & 0x7fffffffu) : ~key);
}
// Total order of a row's tokens: a larger RankKey ranks first (larger logit, then lower id). Never 0 for a
// finite logit, so 0 means "no cut".
DSV4_HD uint64_t RankKey(uint32_t order_key, int32_t id) {
  return static_cast<uint64_t>(order_key) << 32 | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}
DSV4_HD int32_t IdOfRankKey(uint64_t rank_key) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(rank_key));
}

// ---- top-p and the draw ----

// The weight top-p's kept prefix must reach: top_p * total, rounded once.
DSV4_HD double TopPTarget(float top_p, uint64_t total) { return MulD(static_cast<double>(top_p), ToDouble(total)); }
DSV4_HD bool TopPReached(uint64_t cumulative, double target) { return ToDouble(cumulative) >= target; }

// floor(bits53 * total / 2^53) for bits53 < 2^53: the cumulative weight the draw lands in (always < total), exact
// (a 64 x 64 -> 128-bit product in 32-bit halves).
DSV4_HD uint64_t DrawTarget(uint64_t bits53, uint64_t total) {
  const uint64_t a_lo = bits53 & 0xFFFFFFFFu, a_hi = bits53 >> 32;
  const uint64_t b_lo = total & 0xFFFFFFFFu, b_hi = total >> 32;
  const uint64_t ll = a_lo * b_lo, lh = a_lo * b_hi, hl = a_hi * b_lo, hh = a_hi * b_hi;
  const uint64_t mid = (ll >> 32) + (lh & 0xFFFFFFFFu) + (hl & 0xFFFFFFFFu);
  const uint64_t hi = hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
  const uint64_t lo = (mid << 32) | (ll & 0xFFFFFFFFu);
  return (hi << 11) | (lo >> 53);
}

}  // namespace dsv4::kernels::sample
