// Host-side validation of SparseMlaParams (see sparse_mla_validate.h).
#include "kernels/sparse_mla/sparse_mla_validate.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dsv4::kernels::sparse_mla {
namespace {

absl::Status ValidateKvInput(const SparseMlaKvInput& in, const char* name) {
  if (in.topk < 0) return absl::InvalidArgumentError(absl::StrCat(name, ".topk is ", in.topk, ", must be >= 0"));
  if (in.topk == 0) return absl::OkStatus();
  if (in.cache == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, ".cache is null with topk ", in.topk));
  if (in.indices == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".indices is null with topk ", in.topk));
  }
  if (in.page_rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".page_rows is ", in.page_rows, ", must be >= 1"));
  }
  if (in.num_pages < 1) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".num_pages is ", in.num_pages, ", must be >= 1"));
  }
  if (in.num_pages > (int64_t{1} << 31) / in.page_rows) {
    return absl::InvalidArgumentError(absl::StrCat(name, " has ", in.num_pages, " pages of ", in.page_rows,
                                                   " rows: more rows than int32 row ids can address"));
  }
  if (in.index_stride < in.topk) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ".index_stride is ", in.index_stride, ", must be >= topk ", in.topk));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSparseMlaParams(const SparseMlaParams& p, bool cuda_head_counts) {
  if (p.batch < 1) return absl::InvalidArgumentError(absl::StrCat("batch is ", p.batch, ", must be >= 1"));
  if (cuda_head_counts) {
    if (p.num_heads != 16 && p.num_heads != 32 && p.num_heads != 64 && p.num_heads != 128) {
      return absl::InvalidArgumentError(
          absl::StrCat("num_heads is ", p.num_heads, "; the CUDA kernels take 16, 32, 64 or 128 (pad heads)"));
    }
  } else if (p.num_heads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads is ", p.num_heads, ", must be >= 1"));
  }
  if (p.q == nullptr) return absl::InvalidArgumentError("q is null");
  if (p.out == nullptr) return absl::InvalidArgumentError("out is null");
  if (p.lse == nullptr) return absl::InvalidArgumentError("lse is null");
  if (!std::isfinite(p.softmax_scale) || !(p.softmax_scale > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("softmax_scale is ", p.softmax_scale, ", must be finite and > 0"));
  }
  DSV4_RETURN_IF_ERROR(ValidateKvInput(p.window, "window"));
  DSV4_RETURN_IF_ERROR(ValidateKvInput(p.extra, "extra"));
  constexpr int kMaxTopk = 1 << 20;
  if (int64_t{p.window.topk} + p.extra.topk > kMaxTopk) {
    return absl::InvalidArgumentError(absl::StrCat("window.topk + extra.topk is ",
                                                   int64_t{p.window.topk} + p.extra.topk, ", at most ", kMaxTopk));
  }
  return absl::OkStatus();
}

}  // namespace dsv4::kernels::sparse_mla
