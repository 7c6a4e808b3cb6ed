// Float64 reference of the sparse-MLA decode (a plain loop; see sparse_mla_reference.h).
#include "kernels/sparse_mla/sparse_mla_reference.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "common/float_formats.h"
#include "common/status_macros.h"
#include "kernels/sparse_mla/sparse_mla_validate.h"

namespace dsv4::kernels::sparse_mla {
std::vector<SelectedRow> SelectedRows(const SparseMlaParams& p, int b) {
  std::vector<SelectedRow> rows;
  for (const bool extra : {false, true}) {
    const SparseMlaKvInput& in = extra ? p.extra : p.window;
    if (in.topk == 0) continue;
    const int len = in.lengths == nullptr ? in.topk : std::clamp(in.lengths[b], 0, in.topk);
    const int64_t num_rows = in.num_pages * in.page_rows;
    for (int j = 0; j < len; ++j) {
      const int32_t id = in.indices[static_cast<int64_t>(b) * in.index_stride + j];
      if (id >= 0 && id < num_rows) rows.push_back({extra, id});
    }
  }
  return rows;
}

absl::StatusOr<SparseMlaReferenceResult> SparseMlaDecodeReferenceF64(const SparseMlaParams& p) {
  DSV4_RETURN_IF_ERROR(ValidateSparseMlaParams(p, /*cuda_head_counts=*/false));
  const int B = p.batch, H = p.num_heads;
  SparseMlaReferenceResult r;
  r.out.assign(static_cast<size_t>(B) * H * kKvDim, 0.0);
  r.lse.assign(static_cast<size_t>(B) * H, std::numeric_limits<double>::infinity());
  std::vector<double> keys;  // [rows, 512]
  std::vector<double> s;
  std::array<float, kKvDim> k;
  for (int b = 0; b < B; ++b) {
    const std::vector<SelectedRow> rows = SelectedRows(p, b);
    if (rows.empty()) continue;  // out 0, lse +inf
    keys.resize(rows.size() * kKvDim);
    for (size_t j = 0; j < rows.size(); ++j) {
      const SparseMlaKvInput& in = rows[j].extra ? p.extra : p.window;
      const KvPoolView pool{const_cast<uint8_t*>(in.cache), in.num_pages, in.page_rows};
      ReadKvRow(pool, rows[j].row_id, k);
      std::copy(k.begin(), k.end(), keys.begin() + j * kKvDim);
    }
    s.resize(rows.size());
    for (int h = 0; h < H; ++h) {
      const uint16_t* q = p.q + (static_cast<size_t>(b) * H + h) * kKvDim;
      double smax = -std::numeric_limits<double>::infinity();
      for (size_t j = 0; j < rows.size(); ++j) {
        double dot = 0.0;
        for (int d = 0; d < kKvDim; ++d) dot += static_cast<double>(Bf16ToF32(q[d])) * keys[j * kKvDim + d];
        s[j] = static_cast<double>(p.softmax_scale) * dot;
        smax = std::max(smax, s[j]);
      }
      double sum = 0.0;
      double* o = &r.out[(static_cast<size_t>(b) * H + h) * kKvDim];
      for (size_t j = 0; j < rows.size(); ++j) {
        const double w = std::exp(s[j] - smax);
        sum += w;
        for (int d = 0; d < kKvDim; ++d) o[d] += w * keys[j * kKvDim + d];
      }
      const double lse = smax + std::log(sum);
      const double sink = p.attn_sink ? static_cast<double>(p.attn_sink[h]) : -std::numeric_limits<double>::infinity();
      // e^lse / (e^lse + e^sink) written as a logistic function so huge logits do not overflow.
      const double factor = 1.0 / (1.0 + std::exp(sink - lse));
      for (int d = 0; d < kKvDim; ++d) o[d] = o[d] / sum * factor;
      r.lse[static_cast<size_t>(b) * H + h] = lse;
    }
  }
  return r;
}

absl::Status SparseMlaDecodeReference(const SparseMlaParams& p) {
  DSV4_ASSIGN_OR_RETURN(SparseMlaReferenceResult r, SparseMlaDecodeReferenceF64(p));
  for (size_t i = 0; i < r.out.size(); ++i) p.out[i] = F32ToBf16(static_cast<float>(r.out[i]));
  for (size_t i = 0; i < r.lse.size(); ++i) p.lse[i] = static_cast<float>(r.lse[i]);
  return absl::OkStatus();
}

}  // namespace dsv4::kernels::sparse_mla
