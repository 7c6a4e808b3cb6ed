// Fixed-order dot products and the register-blocked GEMM (see cpu_gemm.h for the reduction order).
#include "kernels/cpu/cpu_gemm.h"

#include <algorithm>
#include <cstring>

#include "common/float_formats.h"

namespace dsv4::kernels::cpu {
namespace {

// Eight fp32 lanes: one AVX register, two SSE registers on the baseline target.
typedef float V8 __attribute__((vector_size(32)));

[[gnu::always_inline]] inline void Load8(V8& v, const float* p) { std::memcpy(&v, p, sizeof(v)); }  // unaligned

[[gnu::always_inline]] inline float Combine(float l0, float l1, float l2, float l3, float l4, float l5, float l6,
                                            float l7) {
  return ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7));
}

// RB activation rows x WB weight rows: RB * WB lane accumulators, each exactly Dot's.
template <int RB, int WB>
[[gnu::always_inline]] inline void Micro(const float* x, int64_t xs, const float* w, int64_t k, float* y,
                                         int64_t ys) {
  V8 acc[RB][WB];
  for (int r = 0; r < RB; ++r)
    for (int j = 0; j < WB; ++j) acc[r][j] = V8{0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    V8 wv[WB];
    for (int j = 0; j < WB; ++j) Load8(wv[j], w + j * k + i);
    for (int r = 0; r < RB; ++r) {
      V8 xv;
      Load8(xv, x + r * xs + i);
      for (int j = 0; j < WB; ++j) acc[r][j] += xv * wv[j];
    }
  }
  for (int r = 0; r < RB; ++r) {
    for (int j = 0; j < WB; ++j) {
      float l0 = acc[r][j][0];
      for (int64_t t = i; t < k; ++t) l0 += x[r * xs + t] * w[j * k + t];
      const V8& a = acc[r][j];
      y[r * ys + j] = Combine(l0, a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
    }
  }
}

// One block of RB rows over weight rows [n0, n1): WB at a time, then the tail one by one.
template <int RB, int WB>
[[gnu::always_inline]] inline void RowBlock(const float* x, int64_t xs, const float* w, int64_t k, float* y,
                                            int64_t ys, int64_t n0, int64_t n1, int64_t y0) {
  int64_t j = n0;
  for (; j + WB <= n1; j += WB) Micro<RB, WB>(x, xs, w + j * k, k, y + (j - y0), ys);
  for (; j < n1; ++j) Micro<RB, 1>(x, xs, w + j * k, k, y + (j - y0), ys);
}

}  // namespace

float DotBf16(const uint16_t* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += Bf16ToF32(a[i + l]) * b[i + l];
  }
  for (; i < n; ++i) acc[0] += Bf16ToF32(a[i]) * b[i];
  return Combine(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]);
}

namespace {

// The whole range with RB x WB blocks (RB rows at a time, then the leftover rows in blocks of 4, 2, 1).
template <int RB, int WB>
[[gnu::always_inline]] inline void GemmBody(const float* x, int64_t xs, const float* w, int64_t k, float* y,
                                            int64_t ys, int64_t rows, int64_t n0, int64_t n1) {
  // Weight rows are taken in chunks of ~128 KiB: they stay in L2 while every row block passes over them, and
  // the activation rows of a block stay in L1.
  const int64_t chunk = std::max<int64_t>(8, (int64_t{128} << 10) / std::max<int64_t>(1, k * 4));
  for (int64_t c0 = n0; c0 < n1; c0 += chunk) {
    const int64_t c1 = std::min(n1, c0 + chunk);
    int64_t t = 0;
    for (; t + RB <= rows; t += RB) RowBlock<RB, WB>(x + t * xs, xs, w, k, y + t * ys, ys, c0, c1, n0);
    if (RB > 4 && t + 4 <= rows) {
      RowBlock<4, WB>(x + t * xs, xs, w, k, y + t * ys, ys, c0, c1, n0);
      t += 4;
    }
    if (RB > 2 && t + 2 <= rows) {
      RowBlock<2, WB>(x + t * xs, xs, w, k, y + t * ys, ys, c0, c1, n0);
      t += 2;
    }
    if (t < rows) RowBlock<1, 4>(x + t * xs, xs, w, k, y + t * ys, ys, c0, c1, n0);
  }
}

// One build per register file: 32 vector registers (AVX-512VL, 256-bit lanes) hold 6 x 3 accumulators, 16
// (AVX2) 4 x 3, the SSE baseline (two registers per 8 lanes) 2 x 2. Multiplies and adds stay separate in
// every build (-ffp-contract=off), so all three compute the same bits and the machine only changes speed.
__attribute__((target("avx512f,avx512vl"))) void GemmAvx512(const float* x, int64_t xs, const float* w,
                                                             int64_t k, float* y, int64_t ys, int64_t rows,
                                                             int64_t n0, int64_t n1) {
  GemmBody<6, 3>(x, xs, w, k, y, ys, rows, n0, n1);
}
__attribute__((target("avx2"))) void GemmAvx2(const float* x, int64_t xs, const float* w, int64_t k, float* y,
                                              int64_t ys, int64_t rows, int64_t n0, int64_t n1) {
  GemmBody<4, 3>(x, xs, w, k, y, ys, rows, n0, n1);
}
void GemmBase(const float* x, int64_t xs, const float* w, int64_t k, float* y, int64_t ys, int64_t rows,
              int64_t n0, int64_t n1) {
  GemmBody<2, 2>(x, xs, w, k, y, ys, rows, n0, n1);
}

// Dot: one row by one row, the same lanes as the GEMM's.
__attribute__((target("avx512f,avx512vl"))) float DotAvx512(const float* a, const float* b, int64_t n) {
  float y;
  Micro<1, 1>(a, 0, b, n, &y, 0);
  return y;
}
__attribute__((target("avx2"))) float DotAvx2(const float* a, const float* b, int64_t n) {
  float y;
  Micro<1, 1>(a, 0, b, n, &y, 0);
  return y;
}
float DotBase(const float* a, const float* b, int64_t n) {
  float y;
  Micro<1, 1>(a, 0, b, n, &y, 0);
  return y;
}

// acc += e * x in double, element by element.
[[gnu::always_inline]] inline void AxpyBody(double* acc, double e, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += e * x[i];
}
__attribute__((target("avx512f,avx512vl"))) void AxpyAvx512(double* acc, double e, const float* x, int64_t n) {
  AxpyBody(acc, e, x, n);
}
__attribute__((target("avx2"))) void AxpyAvx2(double* acc, double e, const float* x, int64_t n) {
  AxpyBody(acc, e, x, n);
}
void AxpyBase(double* acc, double e, const float* x, int64_t n) { AxpyBody(acc, e, x, n); }

using DotFn = float (*)(const float*, const float*, int64_t);
using AxpyFn = void (*)(double*, double, const float*, int64_t);
using GemmFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t, int64_t, int64_t);

// The widest build this machine runs, picked once.
enum class Isa { kAvx512, kAvx2, kBase };

Isa MachineIsa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2")) return Isa::kAvx2;
    return Isa::kBase;
  }();
  return isa;
}

template <typename Fn>
Fn Pick(Fn avx512, Fn avx2, Fn base) {
  const Isa isa = MachineIsa();
  return isa == Isa::kAvx512 ? avx512 : isa == Isa::kAvx2 ? avx2 : base;
}

}  // namespace

void GemmRange(const float* x, int64_t xs, const float* w, int64_t k, float* y, int64_t ys, int64_t rows,
               int64_t n0, int64_t n1) {
  static const GemmFn gemm = Pick<GemmFn>(GemmAvx512, GemmAvx2, GemmBase);
  gemm(x, xs, w, k, y, ys, rows, n0, n1);
}

float Dot(const float* a, const float* b, int64_t n) {
  static const DotFn dot = Pick<DotFn>(DotAvx512, DotAvx2, DotBase);
  return dot(a, b, n);
}

void AxpyF64(double* acc, double e, const float* x, int64_t n) {
  static const AxpyFn axpy = Pick<AxpyFn>(AxpyAvx512, AxpyAvx2, AxpyBase);
  axpy(acc, e, x, n);
}

}  // namespace dsv4::kernels::cpu
