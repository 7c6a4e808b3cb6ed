// Random problem generation, parallel reference and error metrics for the sparse-MLA tests.
#include "tests/sparse_mla/sparse_mla_test_util.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/float_formats.h"
#include "common/status_macros.h"
#include "kernels/sparse_mla/sparse_mla_validate.h"

namespace dsv4::kernels::sparse_mla::testing {

std::string ProblemSpec::Name() const {
  return absl::StrCat("B", batch, "_H", heads, "_K", topk_window, "p", topk_extra, "_P", page_rows_window, "x",
                      page_rows_extra, lengths ? "_len" : "", holes > 0 ? "_holes" : "",
                      empty_every > 0 ? "_empty" : "", extreme ? "_extreme" : "", sink ? "" : "_nosink");
}

namespace {

// Fills a pool of `rows` rows (rounded up to whole pages) with random keys; `extreme` scales 5% of the
// rows by 2^20 or 2^-20.
void FillPool(std::mt19937_64& rng, int64_t rows, int page_rows, bool extreme, std::vector<uint8_t>& bytes,
              int64_t& pages) {
  pages = (rows + page_rows - 1) / page_rows;
  const KvPoolView pool{nullptr, pages, page_rows};
  bytes.assign(pool.size_bytes(), 0xa5);  // footer pad bytes and page padding keep a visible pattern
  const KvPoolView view{bytes.data(), pages, page_rows};
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  std::array<float, kKvDim> k;
  for (int64_t r = 0; r < pool.num_rows(); ++r) {
    float scale = 1.f;
    if (extreme) {
      const float u = unit(rng);
      if (u < 0.025f) scale = std::ldexp(1.f, 20);
      else if (u < 0.05f) scale = std::ldexp(1.f, -20);
    }
    for (float& x : k) x = normal(rng) * scale;
    WriteKvRow(view, r, k);
  }
}

void FillIndices(std::mt19937_64& rng, const ProblemSpec& s, int topk, int64_t pool_rows, std::vector<int32_t>& idx) {
  idx.assign(static_cast<size_t>(s.batch) * topk, -1);
  std::uniform_int_distribution<int64_t> row(0, pool_rows - 1);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int b = 0; b < s.batch; ++b) {
    const bool empty = s.empty_every > 0 && b % s.empty_every == s.empty_every - 1;
    for (int j = 0; j < topk; ++j) {
      int32_t& id = idx[static_cast<size_t>(b) * topk + j];
      const double u = unit(rng);
      if (empty || u < s.holes) {
        id = -1;
      } else if (u < s.holes * 1.1) {
        id = static_cast<int32_t>(pool_rows + row(rng) % 1000);  // past the pool: skipped like -1
      } else {
        id = static_cast<int32_t>(row(rng));
      }
    }
  }
}

}  // namespace

HostProblem MakeProblem(const ProblemSpec& s) {
  HostProblem p;
  p.spec = s;
  std::mt19937_64 rng(s.seed * 0x9e3779b97f4a7c15ull + 17);
  std::normal_distribution<float> normal(0.f, 1.f);
  p.q.resize(static_cast<size_t>(s.batch) * s.heads * kKvDim);
  for (int b = 0; b < s.batch; ++b) {
    const float qs = (s.extreme && b % 3 == 1) ? 64.f : 1.f;
    for (size_t i = 0; i < static_cast<size_t>(s.heads) * kKvDim; ++i) {
      p.q[static_cast<size_t>(b) * s.heads * kKvDim + i] = F32ToBf16(normal(rng) * qs);
    }
  }
  const int64_t rows_w = std::clamp<int64_t>(int64_t{s.batch} * s.topk_window, 1, 32768);
  const int64_t rows_e = std::clamp<int64_t>(int64_t{s.batch} * s.topk_extra, 1, 32768);
  if (s.topk_window > 0) {
    FillPool(rng, rows_w, s.page_rows_window, s.extreme, p.cache_window, p.pages_window);
    FillIndices(rng, s, s.topk_window, p.pages_window * s.page_rows_window, p.idx_window);
  }
  if (s.topk_extra > 0) {
    FillPool(rng, rows_e, s.page_rows_extra, s.extreme, p.cache_extra, p.pages_extra);
    FillIndices(rng, s, s.topk_extra, p.pages_extra * s.page_rows_extra, p.idx_extra);
  }
  if (s.lengths) {
    std::uniform_int_distribution<int> lw(0, s.topk_window), le(0, s.topk_extra);
    p.len_window.resize(s.batch);
    p.len_extra.resize(s.batch);
    for (int b = 0; b < s.batch; ++b) {
      p.len_window[b] = b == 0 ? 0 : lw(rng);
      p.len_extra[b] = b == 0 ? 0 : le(rng);
    }
  }
  if (s.sink) {
    p.sink.resize(s.heads);
    for (float& x : p.sink) x = 2.f * normal(rng);
  }
  return p;
}

SparseMlaParams HostProblem::Params(uint16_t* out, float* lse) const {
  const ProblemSpec& s = spec;
  return SparseMlaParams{
      .batch = s.batch,
      .num_heads = s.heads,
      .q = q.data(),
      .window = {.cache = s.topk_window ? cache_window.data() : nullptr,
                 .num_pages = pages_window,
                 .page_rows = s.page_rows_window,
                 .indices = s.topk_window ? idx_window.data() : nullptr,
                 .topk = s.topk_window,
                 .index_stride = s.topk_window,
                 .lengths = s.lengths ? len_window.data() : nullptr},
      .extra = {.cache = s.topk_extra ? cache_extra.data() : nullptr,
                .num_pages = pages_extra,
                .page_rows = s.page_rows_extra,
                .indices = s.topk_extra ? idx_extra.data() : nullptr,
                .topk = s.topk_extra,
                .index_stride = s.topk_extra,
                .lengths = s.lengths ? len_extra.data() : nullptr},
      .attn_sink = s.sink ? sink.data() : nullptr,
      .softmax_scale = 1.0f / std::sqrt(static_cast<float>(kKvDim)),
      .out = out,
      .lse = lse,
  };
}

absl::StatusOr<SparseMlaReferenceResult> ParallelReference(const SparseMlaParams& params) {
  DSV4_RETURN_IF_ERROR(ValidateSparseMlaParams(params, /*cuda_head_counts=*/false));
  const int B = params.batch, H = params.num_heads;
  const int threads = std::clamp<int>(static_cast<int>(std::thread::hardware_concurrency()), 1, B);
  SparseMlaReferenceResult all;
  all.out.resize(static_cast<size_t>(B) * H * kKvDim);
  all.lse.resize(static_cast<size_t>(B) * H);
  std::vector<absl::Status> status(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const int b0 = B * t / threads, b1 = B * (t + 1) / threads;
      if (b0 == b1) return;
      SparseMlaParams sub = params;
      sub.batch = b1 - b0;
      sub.q += static_cast<size_t>(b0) * H * kKvDim;
      for (SparseMlaKvInput* in : {&sub.window, &sub.extra}) {
        if (in->indices) in->indices += static_cast<size_t>(b0) * in->index_stride;
        if (in->lengths) in->lengths += b0;
      }
      auto r = SparseMlaDecodeReferenceF64(sub);
      if (!r.ok()) {
        status[t] = r.status();
        return;
      }
      std::copy(r->out.begin(), r->out.end(), all.out.begin() + static_cast<size_t>(b0) * H * kKvDim);
      std::copy(r->lse.begin(), r->lse.end(), all.lse.begin() + static_cast<size_t>(b0) * H);
    });
  }
  for (std::thread& th : pool) th.join();
  for (const absl::Status& st : status) DSV4_RETURN_IF_ERROR(st);
  return all;
}

std::string ErrorReport::ToString() const {
  return absl::StrFormat(
      "rel_err(global)=%.3e rel_err(worst seq)=%.3e max_abs=%.3e at %d nan=%d empty_bad=%d lse_err=%.3e", rel_global,
      rel_worst_seq, max_abs, worst_index, nan_count, empty_bad, lse_max_abs);
}

ErrorReport Compare(const std::vector<uint16_t>& out, const std::vector<float>& lse,
                    const SparseMlaReferenceResult& ref, int batch, int heads, bool round_ref) {
  ErrorReport r;
  double num_all = 0, den_all = 0;
  for (int b = 0; b < batch; ++b) {
    double num = 0, den = 0;
    for (int h = 0; h < heads; ++h) {
      const size_t bh = static_cast<size_t>(b) * heads + h;
      const bool empty = std::isinf(ref.lse[bh]) && ref.lse[bh] > 0;
      if (std::isnan(lse[bh])) ++r.nan_count;
      if (empty && !(std::isinf(lse[bh]) && lse[bh] > 0)) ++r.empty_bad;
      if (!empty) {
        r.lse_max_abs = std::max(r.lse_max_abs, std::fabs(lse[bh] - ref.lse[bh]) / std::max(1.0, std::fabs(ref.lse[bh])));
      }
      for (int d = 0; d < kKvDim; ++d) {
        const size_t i = bh * kKvDim + d;
        const double got = Bf16ToF32(out[i]);
        if (!std::isfinite(got)) ++r.nan_count;
        if (empty) {
          if (got != 0.0) ++r.empty_bad;
          continue;
        }
        const double want = round_ref ? Bf16ToF32(F32ToBf16(static_cast<float>(ref.out[i]))) : ref.out[i];
        const double e = got - want;
        num += e * e;
        den += want * want;
        if (std::fabs(e) > r.max_abs || !std::isfinite(e)) {
          r.max_abs = std::isfinite(e) ? std::fabs(e) : std::numeric_limits<double>::infinity();
          r.worst_index = static_cast<int64_t>(i);
        }
      }
    }
    if (den > 0) r.rel_worst_seq = std::max(r.rel_worst_seq, std::sqrt(num / den));
    if (!std::isfinite(num)) r.rel_worst_seq = std::numeric_limits<double>::infinity();
    num_all += num;
    den_all += den;
  }
  r.rel_global = den_all > 0 ? std::sqrt(num_all / den_all) : (num_all > 0 ? 1.0 : 0.0);
  if (!std::isfinite(num_all)) r.rel_global = std::numeric_limits<double>::infinity();
  return r;
}

}  // namespace dsv4::kernels::sparse_mla::testing
