// Validation of SparseMlaParams at the edge (reference and CUDA launcher both call it): sizes, pointers and
// ranges that can be checked without reading device memory. Index values and lengths are not read here;
// every implementation skips out-of-range ones, so bad device data cannot fault the kernels.
#pragma once

#include "absl/status/status.h"
#include "kernels/sparse_mla/sparse_mla_params.h"

namespace dsv4::kernels::sparse_mla {

// `cuda_head_counts` restricts H to the CUDA kernels' set {16, 32, 64, 128}; the reference takes any H >= 1.
absl::Status ValidateSparseMlaParams(const SparseMlaParams& params, bool cuda_head_counts);

}  // namespace dsv4::kernels::sparse_mla
