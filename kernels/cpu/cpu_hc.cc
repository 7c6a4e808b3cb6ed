// CPU backend, the mHC mixes (dsv4-decode.md §2.2, §2.5): pre (mix weights + Sinkhorn comb + the sublayer
// input), post, and the head's pre-only mix. Per-token work, split over tokens; per-token scratch lives on
// the stack (S <= kMaxStreams).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_ops.h"

namespace dsv4::kernels::cpu {
namespace {

constexpr int64_t kMaxStreams = 16;

float Sigmoid(float v) { return 1.f / (1.f + std::exp(-v)); }

// m = fn . (x / rms(x)) for the flattened streams of one token.
void HcMix(const float* x, const float* fn, int64_t rows, int64_t width, float eps, float* m) {
  double ss = 0;
  for (int64_t i = 0; i < width; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float rho = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(width) + eps));
  for (int64_t r = 0; r < rows; ++r) m[r] = Dot(fn + r * width, x, width) * rho;
}

// The Sinkhorn comb of one token from its mix logits: row softmax (+eps), one column normalisation, then
// (iters - 1) x (row, column).
void Sinkhorn(const HcPreArgs& a, const float* m, float* c) {
  const int64_t s = a.s;
  for (int64_t i = 0; i < s; ++i) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < s; ++j) {
      c[i * s + j] = a.scale[2] * m[2 * s + i * s + j] + a.base[2 * s + i * s + j];
      mx = std::max(mx, c[i * s + j]);
    }
    float sum = 0;
    for (int64_t j = 0; j < s; ++j) sum += (c[i * s + j] = std::exp(c[i * s + j] - mx));
    for (int64_t j = 0; j < s; ++j) c[i * s + j] = c[i * s + j] / sum + a.hc_eps;
  }
  auto normalise_columns = [&] {
    for (int64_t j = 0; j < s; ++j) {
      float sum = 0;
      for (int64_t i = 0; i < s; ++i) sum += c[i * s + j];
      for (int64_t i = 0; i < s; ++i) c[i * s + j] /= (sum + a.hc_eps);
    }
  };
  normalise_columns();
  for (int it = 1; it < a.sinkhorn_iters; ++it) {
    for (int64_t i = 0; i < s; ++i) {
      float sum = 0;
      for (int64_t j = 0; j < s; ++j) sum += c[i * s + j];
      for (int64_t j = 0; j < s; ++j) c[i * s + j] /= (sum + a.hc_eps);
    }
    normalise_columns();
  }
}

// out[k] = sum_i pre[i] * x[i * d + k] (streams in order).
void MixStreams(const float* pre, const float* x, int64_t s, int64_t d, float* out) {
  for (int64_t k = 0; k < d; ++k) {
    float acc = 0;
    for (int64_t i = 0; i < s; ++i) acc += pre[i] * x[i * d + k];
    out[k] = acc;
  }
}

}  // namespace

void CpuOps::HcPre(const HcPreArgs& a) {
  if (a.s < 1 || a.s > kMaxStreams) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("HcPre: S = ", a.s, " outside [1, ", kMaxStreams, "]")));
  }
  const int64_t s = a.s, width = a.s * a.d, mixes = (2 + a.s) * a.s;
  pool_.ParallelFor(a.t, 4, [&](int64_t t0, int64_t t1, int) {
    float m[(2 + kMaxStreams) * kMaxStreams], pre[kMaxStreams];
    for (int64_t t = t0; t < t1; ++t) {
      const float* x = a.x + t * width;
      HcMix(x, a.fn, mixes, width, a.norm_eps, m);
      for (int64_t i = 0; i < s; ++i) {
        pre[i] = Sigmoid(a.scale[0] * m[i] + a.base[i]) + a.hc_eps;
        a.post[t * s + i] = 2.f * Sigmoid(a.scale[1] * m[s + i] + a.base[s + i]);
      }
      Sinkhorn(a, m, a.comb + t * s * s);
      MixStreams(pre, x, s, a.d, a.u + t * a.d);
    }
  });
}

void CpuOps::HcPost(const HcPostArgs& a) {
  const int64_t s = a.s;
  pool_.ParallelFor(a.t, 4, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* x = a.x + t * s * a.d;
      const float* y = a.y + t * a.d;
      const float* comb = a.comb + t * s * s;
      for (int64_t j = 0; j < s; ++j) {
        float* o = a.x_out + (t * s + j) * a.d;
        const float pj = a.post[t * s + j];
        for (int64_t k = 0; k < a.d; ++k) {
          float acc = pj * y[k];
          for (int64_t i = 0; i < s; ++i) acc += comb[i * s + j] * x[i * a.d + k];
          o[k] = acc;
        }
      }
    }
  });
}

void CpuOps::HcHead(const HcHeadArgs& a) {
  if (a.s < 1 || a.s > kMaxStreams || (a.r > 0 && a.rows == nullptr)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("HcHead: S = ", a.s, " outside [1, ", kMaxStreams, "] or no rows for R = ", a.r)));
  }
  const int64_t s = a.s, width = a.s * a.d;
  pool_.ParallelFor(a.r, 4, [&](int64_t r0, int64_t r1, int) {
    float m[kMaxStreams], pre[kMaxStreams];
    for (int64_t r = r0; r < r1; ++r) {
      float* h = a.h + r * a.d;
      if (a.rows[r] < 0) {  // no token: zeros
        std::fill_n(h, a.d, 0.f);
        continue;
      }
      const float* x = a.x + int64_t{a.rows[r]} * width;
      HcMix(x, a.fn, s, width, a.norm_eps, m);
      for (int64_t i = 0; i < s; ++i) pre[i] = Sigmoid(a.scale[0] * m[i] + a.base[i]) + a.hc_eps;
      MixStreams(pre, x, s, a.d, h);
    }
  });
}

}  // namespace dsv4::kernels::cpu
