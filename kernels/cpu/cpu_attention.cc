// CPU backend, the attention side of a step (dsv4-decode.md §2.3): the lightning indexer's top-k over each
// token's visible indexer rows, and sparse attention with the per-head sink over each token's window keys
// (ring rows before the step, staging rows of the step) and compressed keys (all rows, or the indexer's).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_rows.h"

namespace dsv4::kernels::cpu {
namespace {

// Token t's keys in attention order: its window by position (ring rows before its sequence's first token of
// the step, staging rows from it on), then its compressed rows (ratio 128: all visible rows in order; ratio 4:
// the indexer's). key_ptr[j] points into the pool (fp32 rows) or into buf (FP8 rows decoded, dim floats per
// key). Returns the count; sets `over` when a token has more than max_c compressed keys (the rest dropped).
int64_t GatherKeys(const AttentionArgs& a, int64_t t, int64_t max_c, const float** key_ptr, float* buf,
                   std::atomic<bool>& over) {
  const StepIndex& st = a.step;
  const int32_t p = st.pos[t];
  const int64_t b = st.seq[t], first = st.seq_first[b];
  const int32_t p0 = st.pos[first];  // the sequence's first position of this step
  int64_t nk = 0;
  auto add = [&](const KvCacheView& c, int64_t row) {
    key_ptr[nk] = KvRowFloats(c, row, buf + nk * a.dim);
    ++nk;
  };
  for (int32_t q = std::max(0, p - a.window_size + 1); q <= p; ++q) {
    add(a.window, q < p0 ? PhysicalRow(a.window_tables, b, q % a.window_size, a.window.page_rows)
                         : a.staging_row0 + first + (q - p0));
  }
  int64_t nc = 0;
  if (a.compressed_ratio == 128) nc = (int64_t{p} + 1) / 128;
  if (a.compressed_ratio == 4) nc = std::min<int64_t>(a.selected_count[t], a.ksel);
  if (nc > max_c) {
    over.store(true, std::memory_order_relaxed);
    nc = max_c;
  }
  for (int64_t j = 0; j < nc; ++j) {
    add(a.compressed, a.compressed_ratio == 128 ? PhysicalRow(a.compressed_tables, b, j, a.compressed.page_rows)
                                                : int64_t{a.selected[t * a.ksel + j]});
  }
  return nk;
}

}  // namespace

void CpuOps::Indexer(const IndexerArgs& a) {
  if (a.cache.base == nullptr || a.cache.dim != a.dim || a.k < 0 || a.selected == nullptr ||
      a.selected_count == nullptr) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("Indexer: cache dim ", a.cache.dim, " vs ID ", a.dim,
                                                        ", Ksel ", a.k, ", outputs required")));
  }
  Grow({.index_rows = a.max_rows, .row_dim = a.dim});
  const StepIndex& st = a.step;
  const int P = a.cache.page_rows;
  std::atomic<bool> over{false};  // a token saw more rows than max_rows
  pool_.ParallelFor(st.t, 1, [&](int64_t t0, int64_t t1, int thread) {
    ThreadScratch& s = threads_[thread];
    for (int64_t t = t0; t < t1; ++t) {
      int32_t* sel = a.selected + t * a.k;
      const int32_t p = st.pos[t];
      int64_t n = p < 0 ? 0 : (int64_t{p} + 1) / 4;  // visible indexer rows, this step's emissions included
      if (n > a.max_rows) {
        over.store(true, std::memory_order_relaxed);
        n = a.max_rows;
      }
      const int64_t b = p < 0 ? 0 : st.seq[t];
      const float* q = a.q + t * a.heads * a.dim;
      const float* w = a.w + t * a.heads;
      float* score = s.scores.data();
      for (int64_t i = 0; i < n; ++i) {
        const float* krow = KvRowFloats(a.cache, PhysicalRow(a.index_tables, b, i, P), s.row.data());
        float acc = 0;
        for (int64_t h = 0; h < a.heads; ++h) {
          acc += (w[h] * a.weight_scale) * std::max(0.f, Dot(q + h * a.dim, krow, a.dim));
        }
        score[i] = acc;
      }
      const int64_t k = std::min<int64_t>(a.k, n);
      int32_t* order = s.order.data();
      std::iota(order, order + n, 0);
      // Ties at the k-th place are common (rows whose head products are all <= 0 score exactly 0): keep the
      // lowest rows, as torch.topk on CUDA does for the goldens.
      std::partial_sort(order, order + k, order + n, [&](int32_t x, int32_t y) {
        return score[x] != score[y] ? score[x] > score[y] : x < y;
      });
      std::sort(order, order + k);
      for (int64_t i = 0; i < a.k; ++i) {
        sel[i] = i < k ? static_cast<int32_t>(PhysicalRow(a.target_tables, b, order[i], P)) : -1;
      }
      a.selected_count[t] = static_cast<int32_t>(k);
    }
  });
  if (over.load()) Fail(absl::OutOfRangeError(absl::StrCat("Indexer: a token sees more than max_rows = ", a.max_rows, " rows")));
}

void CpuOps::Attention(const AttentionArgs& a) {
  const bool compressed = a.compressed_ratio != 0;
  if ((a.compressed_ratio != 0 && a.compressed_ratio != 4 && a.compressed_ratio != 128) || a.window.base == nullptr ||
      a.window.dim != a.dim || (compressed && a.compressed.dim != a.dim) || a.window_size <= 0 ||
      (a.compressed_ratio == 4 && (a.selected == nullptr || a.selected_count == nullptr))) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("Attention: ratio ", a.compressed_ratio, ", dims ", a.dim,
                                                        "/", a.window.dim, "/", a.compressed.dim, ", W ",
                                                        a.window_size, " do not fit")));
  }
  const int64_t max_c = compressed ? a.max_compressed : 0;
  Grow({.key_slots = a.window_size + max_c, .head_dim = a.dim});
  const StepIndex& st = a.step;
  std::atomic<bool> over{false};  // a token had more compressed keys than max_compressed
  // Items are (token, head) pairs; a thread's range is contiguous, so it gathers each token's key list once.
  pool_.ParallelFor(st.t * a.heads, 1, [&](int64_t i0, int64_t i1, int thread) {
    ThreadScratch& s = threads_[thread];
    int64_t keys_of = -1;  // token whose keys s.key_ptr holds
    int64_t nk = 0;
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t t = item / a.heads, h = item % a.heads;
      float* o = a.out + (t * a.heads + h) * a.dim;
      const int32_t p = st.pos[t];
      if (p < 0) {
        std::fill_n(o, a.dim, 0.f);
        continue;
      }
      if (keys_of != t) {
        keys_of = t;
        nk = GatherKeys(a, t, max_c, s.key_ptr.data(), s.keys.data(), over);
      }
      // One softmax over window and compressed keys with the sink in the denominator; value = key.
      const float* q = a.q + (t * a.heads + h) * a.dim;
      float* sc = s.scores.data();
      float mx = a.sink[h];
      for (int64_t j = 0; j < nk; ++j) {
        sc[j] = a.scale * Dot(q, s.key_ptr[j], a.dim);
        mx = std::max(mx, sc[j]);
      }
      double den = std::exp(static_cast<double>(a.sink[h]) - mx);
      double* acc = s.acc.data();
      std::fill_n(acc, a.dim, 0.0);
      for (int64_t j = 0; j < nk; ++j) {
        const double e = std::exp(static_cast<double>(sc[j]) - mx);
        den += e;
        AxpyF64(acc, e, s.key_ptr[j], a.dim);
      }
      for (int64_t d = 0; d < a.dim; ++d) o[d] = static_cast<float>(acc[d] / den);
    }
  });
  if (over.load()) {
    Fail(absl::OutOfRangeError(absl::StrCat("Attention: a token has more than max_compressed = ", a.max_compressed,
                                            " compressed keys")));
  }
}

}  // namespace dsv4::kernels::cpu
