// CPU backend, cache writers (dsv4-decode.md §2.3): the window ring with its per-step staging rows, and the
// softmax-pooling compressors that emit compressed (and indexer) rows. Both run over every token of the step;
// what is written where follows from positions and block tables alone.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_rows.h"
#include "kernels/sparse_mla/kv_row_format.h"

namespace dsv4::kernels::cpu {
namespace {

bool RowFormatOk(const KvCacheView& c) {
  return c.base != nullptr && c.page_rows > 0 && c.dim > 0 &&
         (c.format == KvFormat::kF32 ? c.page_bytes >= int64_t{c.page_rows} * c.dim * 4
                                     : c.dim == sparse_mla::kKvDim &&
                                           c.page_bytes >= int64_t{c.page_rows} * sparse_mla::kRowBytes);
}

// Ring row of position p of sequence b (logical row p mod W).
int64_t RingRow(const KvWindowWriteArgs& a, int64_t b, int32_t p) {
  return PhysicalRow(a.tables, b, p % a.window, a.cache.page_rows);
}

}  // namespace

void CpuOps::KvWindowWrite(const KvWindowWriteArgs& a) {
  if (!RowFormatOk(a.cache) || a.window <= 0 || a.rows == nullptr) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("KvWindowWrite: bad cache view (dim ", a.cache.dim,
                                                        ", page_rows ", a.cache.page_rows, ") or window ", a.window)));
  }
  const StepIndex& st = a.step;
  const int64_t dim = a.cache.dim;
  if (!a.commit) {
    // Every token -> its staging row; a sequence's first token -> also its ring row (the row it overwrites,
    // position p - W, is one no token of this step attends).
    pool_.ParallelFor(st.t, 16, [&](int64_t t0, int64_t t1, int) {
      for (int64_t t = t0; t < t1; ++t) {
        const int32_t p = st.pos[t];
        if (p < 0) continue;
        WriteKvRow(a.cache, a.staging_row0 + t, a.rows + t * dim);
        const int32_t b = st.seq[t];
        if (st.seq_first[b] == t) WriteKvRow(a.cache, RingRow(a, b, p), a.rows + t * dim);
      }
    });
    return;
  }
  if (st.max_seq_len <= 1) return;  // decode-only step: the first token was every token
  // Commit: the other tokens among their sequence's last W of the step -> their ring rows (earlier ones
  // would be overwritten by later ones anyway).
  pool_.ParallelFor(st.b, 1, [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t first = st.seq_first[b], len = st.seq_len[b];
      for (int64_t i = std::max<int64_t>(1, len - a.window); i < len; ++i) {
        const int32_t p = st.pos[first + i];
        if (p >= 0) WriteKvRow(a.cache, RingRow(a, b, p), a.rows + (first + i) * dim);
      }
    }
  });
}

void CpuOps::Compressor(const CompressorArgs& a) {
  if ((a.ratio != 4 && a.ratio != 128) || a.d <= 0 || !RowFormatOk(a.cache) || a.cache.dim != a.d ||
      (a.hadamard_fp4 && (a.d % 32 != 0 || (a.d & (a.d - 1)) != 0))) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("Compressor: ratio ", a.ratio, " (4 or 128), d ", a.d,
                                                        ", cache dim ", a.cache.dim, " do not fit")));
  }
  Grow({.row_dim = a.d});
  const StepIndex& st = a.step;
  const int r = a.ratio;
  const int64_t c = r == 4 ? 2 : 1, cd = c * a.d;
  // Sequences are independent (own state slot, own rows): one per range; tokens of a sequence in order.
  pool_.ParallelFor(st.b, 1, [&](int64_t b0, int64_t b1, int thread) {
    float* pooled = threads_[thread].row.data();
    for (int64_t b = b0; b < b1; ++b) {
      float* skv = a.state_kv + int64_t{st.state_slot[b]} * a.state_stride;
      float* ssc = a.state_score + int64_t{st.state_slot[b]} * a.state_stride;
      for (int64_t t = st.seq_first[b]; t < st.seq_first[b] + st.seq_len[b]; ++t) {
        const int32_t p = st.pos[t];
        if (p < 0) continue;
        const int phase = p % r;
        const int64_t slot = r == 4 ? 4 + phase : phase;
        const float* kv = a.kv + t * cd;
        const float* gate = a.gate + t * cd;
        for (int64_t j = 0; j < cd; ++j) {
          skv[slot * cd + j] = kv[j];
          ssc[slot * cd + j] = gate[j] + a.ape[phase * cd + j];
        }
        if ((p + 1) % r != 0) continue;
        // Per-dimension softmax pooling (double). Ratio 4 pools 8 candidates: columns [0, d) of the previous
        // window's slots 0..3 (its "Ca" half) and columns [d, 2d) of this window's slots 4..7 ("Cb").
        const int rows = r == 4 ? 8 : r;
        for (int64_t j = 0; j < a.d; ++j) {
          auto col = [&](int q) { return r == 4 && q >= 4 ? a.d + j : j; };
          float mx = -INFINITY;
          for (int q = 0; q < rows; ++q) mx = std::max(mx, ssc[q * cd + col(q)]);
          double num = 0, den = 0;
          for (int q = 0; q < rows; ++q) {
            const double e = std::exp(static_cast<double>(ssc[q * cd + col(q)]) - mx);
            den += e;
            num += e * skv[q * cd + col(q)];
          }
          pooled[j] = static_cast<float>(num / den);
        }
        if (r == 4) {  // this window becomes the previous one
          std::memcpy(skv, skv + 4 * cd, 4 * cd * sizeof(float));
          std::memcpy(ssc, ssc + 4 * cd, 4 * cd * sizeof(float));
        }
        // Emission: normalise, rotate at the window's first position, simulate FP4 (indexer, production),
        // store as compressed row p / R.
        RmsNormRow(pooled, a.norm_w, pooled, a.d, a.eps);
        RopeToken(pooled, p + 1 - r, a.inv_freq, 1, a.d, a.pairs, false);
        if (a.hadamard_fp4) HadamardFp4Row(pooled, a.d);
        WriteKvRow(a.cache, PhysicalRow(a.tables, b, p / r, a.cache.page_rows), pooled);
      }
    }
  });
}

}  // namespace dsv4::kernels::cpu
