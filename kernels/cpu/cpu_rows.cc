// Row-level helpers of the CPU ops: see cpu_rows.h.
#include "kernels/cpu/cpu_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "common/float_formats.h"
#include "kernels/sparse_mla/kv_row_format.h"

namespace dsv4::kernels::cpu {
namespace {

namespace mla = sparse_mla;

uint8_t* RowData(const KvCacheView& c, int64_t row) {
  return c.base + (row / c.page_rows) * c.page_bytes + (row % c.page_rows) * int64_t{mla::kRowDataBytes};
}
uint8_t* RowScales(const KvCacheView& c, int64_t row) {
  return c.base + (row / c.page_rows) * c.page_bytes + int64_t{c.page_rows} * mla::kRowDataBytes +
         (row % c.page_rows) * int64_t{mla::kRowScaleBytes};
}
float* RowF32(const KvCacheView& c, int64_t row) {
  return reinterpret_cast<float*>(c.base + (row / c.page_rows) * c.page_bytes + (row % c.page_rows) * c.dim * 4);
}

// Scale of one quantisation block as DeepSeek's act_quant picks it: 2^ceil(log2(amax / qmax)), amax >= 1e-4.
uint8_t BlockScale(const float* x, int n, float qmax) {
  float amax = 1e-4f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return Ue8m0CeilFromF32(amax / qmax);
}

}  // namespace

void ReadKvRow(const KvCacheView& c, int64_t row, float* out) {
  if (c.format == KvFormat::kF32) {
    std::memcpy(out, RowF32(c, row), static_cast<size_t>(c.dim) * 4);
    return;
  }
  mla::DecodeKvRow(RowData(c, row), RowScales(c, row), std::span<float, mla::kKvDim>(out, mla::kKvDim));
}

void WriteKvRow(const KvCacheView& c, int64_t row, const float* in) {
  if (c.format == KvFormat::kF32) {
    std::memcpy(RowF32(c, row), in, static_cast<size_t>(c.dim) * 4);
    return;
  }
  mla::EncodeKvRow(std::span<const float, mla::kKvDim>(in, mla::kKvDim), RowData(c, row), RowScales(c, row));
}

const float* KvRowFloats(const KvCacheView& c, int64_t row, float* buf) {
  if (c.format == KvFormat::kF32) return RowF32(c, row);
  ReadKvRow(c, row, buf);
  return buf;
}

void RmsNormRow(const float* x, const float* w, float* o, int64_t dim, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
  for (int64_t i = 0; i < dim; ++i) o[i] = w ? (x[i] * inv) * w[i] : x[i] * inv;
}

void RopeToken(float* x, int32_t pos, const float* inv_freq, int64_t heads, int64_t row_dim, int pairs,
               bool inverse) {
  const float p = static_cast<float>(pos);
  for (int i = 0; i < pairs; ++i) {
    // Angle in fp32 as transformers forms it (pos * inv_freq), then cos/sin in double.
    const float angle = p * inv_freq[i];
    const float c = static_cast<float>(std::cos(static_cast<double>(angle)));
    const float s = static_cast<float>(std::sin(static_cast<double>(angle))) * (inverse ? -1.f : 1.f);
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + h * row_dim + (row_dim - 2 * pairs) + 2 * i;
      const float x0 = v[0], x1 = v[1];
      v[0] = x0 * c - x1 * s;
      v[1] = x0 * s + x1 * c;
    }
  }
}

void HadamardFp4Row(float* v, int64_t dim) {
  const float norm = 1.f / std::sqrt(static_cast<float>(dim));
  for (int64_t h = 1; h < dim; h *= 2) {  // fast Walsh-Hadamard, Sylvester order
    for (int64_t i = 0; i < dim; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float p = v[j], q = v[j + h];
        v[j] = p + q;
        v[j + h] = p - q;
      }
    }
  }
  for (int64_t i = 0; i < dim; ++i) v[i] *= norm;
  for (int64_t b0 = 0; b0 < dim; b0 += 32) {
    const float scale = Ue8m0ToF32(BlockScale(v + b0, 32, 6.f));
    for (int i = 0; i < 32; ++i) v[b0 + i] = E2m1ToF32(F32ToE2m1(v[b0 + i] / scale)) * scale;
  }
}

}  // namespace dsv4::kernels::cpu
