// CPU backend, attention side: KV row storage (fp32 or the 584-byte FP8 record), the softmax-pooling
// compressor, the lightning indexer's top-k, sparse attention with the per-head sink, and the
// production-mode quantisation simulations (FP8 KV, Hadamard + FP4 indexer).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/float_formats.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/sparse_mla/kv_row_format.h"

namespace dsv4::kernels::cpu {
namespace {

constexpr int kTile = 64;

// Scale of one quantisation block as DeepSeek's act_quant picks it: 2^ceil(log2(amax / qmax)), amax >= 1e-4.
uint8_t BlockScale(const float* x, int n, float qmax) {
  float amax = 1e-4f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return Ue8m0CeilFromF32(amax / qmax);
}

}  // namespace

// The 584-byte record is kernels/sparse_mla's definition (kv_row_format.h), so the CPU production path and the
// GPU kernel share one encoding.
int64_t KvPageBytes(KvFormat format, int dim, int page_rows) {
  if (format == KvFormat::kF32) return int64_t{page_rows} * dim * 4;
  return sparse_mla::KvPageStrideBytes(page_rows);
}

void ReadKvRow(const KvCacheView& c, int32_t row, float* out) {
  const int64_t page = row / c.page_rows, r = row % c.page_rows;
  const uint8_t* p = c.base + page * c.page_bytes;
  if (c.format == KvFormat::kF32) {
    std::memcpy(out, p + r * c.dim * 4, c.dim * 4);
    return;
  }
  sparse_mla::DecodeKvRow(p + r * sparse_mla::kRowDataBytes,
                          p + int64_t{c.page_rows} * sparse_mla::kRowDataBytes + r * sparse_mla::kRowScaleBytes,
                          std::span<float, sparse_mla::kKvDim>(out, sparse_mla::kKvDim));
}

void WriteKvRow(const KvCacheView& c, int32_t row, const float* in) {
  const int64_t page = row / c.page_rows, r = row % c.page_rows;
  uint8_t* p = c.base + page * c.page_bytes;
  if (c.format == KvFormat::kF32) {
    std::memcpy(p + r * c.dim * 4, in, c.dim * 4);
    return;
  }
  sparse_mla::EncodeKvRow(std::span<const float, sparse_mla::kKvDim>(in, sparse_mla::kKvDim),
                          p + r * sparse_mla::kRowDataBytes,
                          p + int64_t{c.page_rows} * sparse_mla::kRowDataBytes + r * sparse_mla::kRowScaleBytes);
}

void CpuOps::KvWrite(const KvWriteArgs& a) {
  for (int64_t t = 0; t < a.t; ++t) WriteKvRow(a.cache, a.row_ids[t], a.rows + t * a.cache.dim);
}

void CpuOps::Compressor(const CompressorArgs& a) {
  const int c = a.ratio == 4 ? 2 : 1;
  const int64_t cd = int64_t{c} * a.d;
  const int phase = a.pos % a.ratio;
  const int slot = a.ratio == 4 ? 4 + phase : phase;
  for (int64_t j = 0; j < cd; ++j) {
    a.state_kv[slot * cd + j] = a.kv[j];
    a.state_score[slot * cd + j] = a.gate[j] + a.ape[phase * cd + j];
  }
  *a.emitted = (a.pos + 1) % a.ratio == 0 ? 1 : 0;
  if (!*a.emitted) return;
  // Per-dimension softmax pooling. Ratio 4 pools 8 candidates: columns [0,d) of the previous window's slots
  // 0..3 (its "Ca" half) and columns [d,2d) of this window's slots 4..7 ("Cb").
  const int rows = a.ratio == 4 ? 8 : a.ratio;
  for (int j = 0; j < a.d; ++j) {
    auto col = [&](int t) { return a.ratio == 4 && t >= 4 ? a.d + j : j; };
    float mx = -INFINITY;
    for (int t = 0; t < rows; ++t) mx = std::max(mx, a.state_score[t * cd + col(t)]);
    double num = 0, den = 0;
    for (int t = 0; t < rows; ++t) {
      const double e = std::exp(static_cast<double>(a.state_score[t * cd + col(t)]) - mx);
      den += e;
      num += e * a.state_kv[t * cd + col(t)];
    }
    a.pooled[j] = static_cast<float>(num / den);
  }
  if (a.ratio == 4) {  // this window becomes the previous one
    std::memcpy(a.state_kv, a.state_kv + 4 * cd, 4 * cd * sizeof(float));
    std::memcpy(a.state_score, a.state_score + 4 * cd, 4 * cd * sizeof(float));
  }
}

void CpuOps::Indexer(const IndexerArgs& a) {
  std::vector<float> krow(a.dim);
  std::vector<int32_t> order;
  for (int64_t b = 0; b < a.b; ++b) {
    const int32_t n = a.count[b];
    float* score = a.scratch + b * a.max_rows;
    const float* q = a.q + b * a.heads * a.dim;
    for (int32_t t = 0; t < n; ++t) {
      ReadKvRow(a.cache, a.index_rows[b * a.max_rows + t], krow.data());
      float s = 0;
      for (int64_t h = 0; h < a.heads; ++h) s += a.w[b * a.heads + h] * std::max(0.f, Dot(q + h * a.dim, krow.data(), a.dim));
      score[t] = s;
    }
    const int32_t k = static_cast<int32_t>(std::min<int64_t>(a.k, n));
    order.resize(n);
    std::iota(order.begin(), order.end(), 0);
    // Ties at the k-th place are common (rows whose head products are all <= 0 score exactly 0): keep the
    // lowest rows, as torch.topk on CUDA does for the goldens.
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t x, int32_t y) {
      return score[x] != score[y] ? score[x] > score[y] : x < y;
    });
    std::sort(order.begin(), order.begin() + k);
    for (int64_t i = 0; i < a.k; ++i) a.out_rows[b * a.k + i] = i < k ? a.target_rows[b * a.max_rows + order[i]] : -1;
    a.out_count[b] = k;
  }
}

void CpuOps::Attention(const AttentionArgs& a) {
  std::vector<float> keys;
  for (int64_t b = 0; b < a.b; ++b) {
    const int32_t nw = a.window_count[b];
    const int32_t nc = a.max_compressed > 0 ? a.compressed_count[b] : 0;
    keys.resize(static_cast<size_t>(nw + nc) * a.dim);
    for (int32_t j = 0; j < nw; ++j) ReadKvRow(a.window, a.window_rows[b * a.max_window + j], &keys[j * a.dim]);
    for (int32_t j = 0; j < nc; ++j)
      ReadKvRow(a.compressed, a.compressed_rows[b * a.max_compressed + j], &keys[(nw + j) * a.dim]);
    const int32_t nk = nw + nc;
    pool_.ParallelFor(a.heads, 1, [&](int64_t h0, int64_t h1) {
      std::vector<float> s(nk);
      std::vector<double> acc(a.dim);
      for (int64_t h = h0; h < h1; ++h) {
        const float* q = a.q + (b * a.heads + h) * a.dim;
        float mx = a.sink[h];
        for (int32_t j = 0; j < nk; ++j) {
          s[j] = a.scale * Dot(q, &keys[j * a.dim], a.dim);
          mx = std::max(mx, s[j]);
        }
        double den = std::exp(static_cast<double>(a.sink[h]) - mx);  // the sink: denominator only
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int32_t j = 0; j < nk; ++j) {
          const double e = std::exp(static_cast<double>(s[j]) - mx);
          den += e;
          const float* k = &keys[j * a.dim];
          for (int64_t d = 0; d < a.dim; ++d) acc[d] += e * k[d];
        }
        float* o = a.out + (b * a.heads + h) * a.dim;
        for (int64_t d = 0; d < a.dim; ++d) o[d] = static_cast<float>(acc[d] / den);
      }
    });
  }
}

void CpuOps::Fp8RoundTrip(float* x, int64_t rows, int64_t dim, int64_t dims) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t0 = 0; t0 < dims; t0 += kTile) {
      float* v = x + r * dim + t0;
      const int n = static_cast<int>(std::min<int64_t>(kTile, dims - t0));
      const float scale = Ue8m0ToF32(BlockScale(v, n, 448.f));
      for (int i = 0; i < n; ++i) v[i] = E4m3ToF32(F32ToE4m3(v[i] / scale)) * scale;
    }
  }
}

void CpuOps::HadamardFp4RoundTrip(float* x, int64_t rows, int64_t dim) {
  const float norm = 1.f / std::sqrt(static_cast<float>(dim));
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * dim;
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
}

}  // namespace dsv4::kernels::cpu
