// CPU backend, dense ops: linear, RMSNorm, RoPE and the mHC pre / post / head mixes.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace dsv4::kernels::cpu {

CpuOps::CpuOps(int num_threads) : pool_(num_threads) {}

float Dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  }
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void CpuOps::Linear(const LinearArgs& a) {
  const int64_t xs = a.x_stride ? a.x_stride : a.k;
  const int64_t ys = a.y_stride ? a.y_stride : a.n;
  // Split over output rows so each thread streams its slice of W once for all T tokens.
  pool_.ParallelFor(a.n, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* w = a.w + n * a.k;
      for (int64_t t = 0; t < a.t; ++t) a.y[t * ys + n] = Dot(a.x + t * xs, w, a.k);
    }
  });
}

void CpuOps::RmsNorm(const RmsNormArgs& a) {
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* x = a.x + r * a.dim;
    float* o = a.out + r * a.dim;
    double ss = 0;
    for (int64_t i = 0; i < a.dim; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(a.dim) + a.eps));
    for (int64_t i = 0; i < a.dim; ++i) o[i] = a.w ? (x[i] * inv) * a.w[i] : x[i] * inv;
  }
}

void CpuOps::Rope(const RopeArgs& a) {
  for (int64_t t = 0; t < a.t; ++t) {
    const float pos = static_cast<float>(a.pos[t]);
    for (int i = 0; i < a.pairs; ++i) {
      // Angle in fp32 as transformers forms it (pos * inv_freq), then cos/sin in double.
      const float angle = pos * a.inv_freq[i];
      const float c = static_cast<float>(std::cos(static_cast<double>(angle)));
      const float s = static_cast<float>(std::sin(static_cast<double>(angle))) * (a.inverse ? -1.f : 1.f);
      for (int64_t h = 0; h < a.heads; ++h) {
        float* x = a.x + (t * a.heads + h) * a.row_dim + (a.row_dim - 2 * a.pairs) + 2 * i;
        const float x0 = x[0], x1 = x[1];
        x[0] = x0 * c - x1 * s;
        x[1] = x0 * s + x1 * c;
      }
    }
  }
}

namespace {

float Sigmoid(float v) { return 1.f / (1.f + std::exp(-v)); }

// m = fn . (x / rms(x)) for the flattened streams of one token.
void HcMix(const float* x, const float* fn, int64_t rows, int64_t width, float eps, float* m) {
  double ss = 0;
  for (int64_t i = 0; i < width; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float rho = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(width) + eps));
  for (int64_t r = 0; r < rows; ++r) m[r] = Dot(fn + r * width, x, width) * rho;
}

}  // namespace

void CpuOps::HcPre(const HcPreArgs& a) {
  const int64_t s = a.s, width = a.s * a.d, mixes = (2 + a.s) * a.s;
  std::vector<float> m(mixes), pre(s), c(s * s);
  for (int64_t t = 0; t < a.t; ++t) {
    const float* x = a.x + t * width;
    HcMix(x, a.fn, mixes, width, a.norm_eps, m.data());
    for (int64_t i = 0; i < s; ++i) {
      pre[i] = Sigmoid(a.scale[0] * m[i] + a.base[i]) + a.hc_eps;
      a.post[t * s + i] = 2.f * Sigmoid(a.scale[1] * m[s + i] + a.base[s + i]);
    }
    // Sinkhorn: row softmax (+eps), one column normalisation, then (iters - 1) x (row, column).
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
    std::copy(c.begin(), c.end(), a.comb + t * s * s);
    float* u = a.u + t * a.d;
    for (int64_t k = 0; k < a.d; ++k) {
      float acc = 0;
      for (int64_t i = 0; i < s; ++i) acc += pre[i] * x[i * a.d + k];
      u[k] = acc;
    }
  }
}

void CpuOps::HcPost(const HcPostArgs& a) {
  const int64_t s = a.s;
  for (int64_t t = 0; t < a.t; ++t) {
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
}

void CpuOps::HcHead(const HcHeadArgs& a) {
  const int64_t s = a.s, width = a.s * a.d;
  std::vector<float> m(s), pre(s);
  for (int64_t t = 0; t < a.t; ++t) {
    const float* x = a.x + t * width;
    HcMix(x, a.fn, s, width, a.norm_eps, m.data());
    for (int64_t i = 0; i < s; ++i) pre[i] = Sigmoid(a.scale[0] * m[i] + a.base[i]) + a.hc_eps;
    for (int64_t k = 0; k < a.d; ++k) {
      float acc = 0;
      for (int64_t i = 0; i < s; ++i) acc += pre[i] * x[i * a.d + k];
      a.h[t * a.d + k] = acc;
    }
  }
}

}  // namespace dsv4::kernels::cpu
