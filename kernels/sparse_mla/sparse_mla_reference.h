// Float64 CPU reference of the sparse-MLA decode (the contract of sparse_mla_params.h), over host buffers.
// The ground truth for the CUDA kernels' tests and the model's CPU backend in production mode (FP8 rows).
// A plain loop: decode each selected row exactly, then per head a max-subtracted softmax in double.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/sparse_mla/sparse_mla_params.h"

namespace dsv4::kernels::sparse_mla {

struct SparseMlaReferenceResult {
  std::vector<double> out;  // [B, H, 512], sink factor applied; 0 where no key is valid
  std::vector<double> lse;  // [B, H] natural log over real keys; +inf where no key is valid
};

// All pointers in `params` are host pointers; out, lse and workspace are not touched.
absl::StatusOr<SparseMlaReferenceResult> SparseMlaDecodeReferenceF64(const SparseMlaParams& params);

// Same computation, written like the kernels write it: params.out as bf16 (round to nearest even) and
// params.lse as fp32.
absl::Status SparseMlaDecodeReference(const SparseMlaParams& params);

// The physical row ids sequence b attends to, in softmax order (window entries then extra entries), with
// skipped entries (index -1, out of the pool, at or past the length) left out. Shared with tests.
struct SelectedRow {
  bool extra;      // false: window cache, true: compressed cache
  int64_t row_id;  // physical row id in that cache
};
std::vector<SelectedRow> SelectedRows(const SparseMlaParams& params, int b);

}  // namespace dsv4::kernels::sparse_mla
