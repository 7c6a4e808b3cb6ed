// The CPU backend's one reduction: a fixed-order fp32 dot product, and a blocked GEMM built from it.
//
// Every output element of every CPU op that multiplies a row by a weight row is Dot(x, w, n): 8 independent
// partial sums (lane l takes the elements i = l mod 8 below the last multiple of 8, lane 0 the tail in order),
// combined as ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)). GemmRange computes many of them at once,
// register-blocked (a few activation rows x a few weight rows per inner loop, so each weight row is read once
// per row block), with the same lanes and the same final combination, so a result never depends on how many
// rows share a call, on the blocking or on the thread count: prefill and token-by-token decode agree bit for
// bit. Multiplies and adds stay separate (no FMA: the library builds with -ffp-contract=off).
#pragma once

#include <cstdint>

namespace dsv4::kernels::cpu {

// Fixed-order fp32 dot product of a[0, n) and b[0, n) (see above).
float Dot(const float* a, const float* b, int64_t n);
// The same with a bf16 left operand (bf16 widens to f32 exactly).
float DotBf16(const uint16_t* a, const float* b, int64_t n);

// acc[i] += e * x[i] for i < n, in double (attention's weighted sum of keys; each element on its own).
void AxpyF64(double* acc, double e, const float* x, int64_t n);

// y[t * ys + (j - n0)] = Dot(x + t * xs, w + j * k, k) for t < rows and j in [n0, n1), on the calling thread.
// w is a dense [*, k] fp32 matrix.
void GemmRange(const float* x, int64_t xs, const float* w, int64_t k, float* y, int64_t ys, int64_t rows,
               int64_t n0, int64_t n1);

}  // namespace dsv4::kernels::cpu
