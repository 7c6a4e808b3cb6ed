// Host-side checks the attention family's launchers share (kv_window.cu, compressor.cu, indexer.cu,
// attention.cu): the step index, a KV pool view and a block table are validated the same way by every op, and a
// launch error becomes an absl::Status naming the op.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/ops.h"
#include "kernels/sparse_mla/kv_row_format.h"

namespace dsv4::kernels::cuda::attn {

// The status of the launch just enqueued.
inline absl::Status LaunchStatus(const char* what) { return CudaStatus(cudaGetLastError(), what); }

inline absl::Status CheckStepIndex(const StepIndex& s, const char* op) {
  if (s.t < 0 || s.b < 0 || s.t > INT32_MAX || s.b > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": step has T = ", s.t, ", B = ", s.b,
                                                   " (0 <= T < 2^31, 0 <= B <= 65535)"));
  }
  if (s.t > 0 && (s.pos == nullptr || s.seq == nullptr || s.seq_first == nullptr || s.seq_len == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": step index pos/seq/seq_first/seq_len is null"));
  }
  if (s.max_seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": max_seq_len is ", s.max_seq_len, ", must be >= 1"));
  }
  return absl::OkStatus();
}

inline absl::Status CheckPool(const KvCacheView& c, const char* what) {
  if (c.base == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": base is null"));
  if (c.page_rows < 1 || c.dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": page_rows ", c.page_rows, ", dim ", c.dim));
  }
  if (c.format == KvFormat::kFp8Row584) {
    if (c.dim != sparse_mla::kKvDim || c.page_bytes != sparse_mla::KvPageStrideBytes(c.page_rows)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": a kFp8Row584 pool holds 512-dim rows in pages of ",
                                                     sparse_mla::KvPageStrideBytes(c.page_rows),
                                                     " bytes; got dim ", c.dim, ", page_bytes ", c.page_bytes));
    }
  } else if (c.page_bytes < int64_t{c.page_rows} * c.dim * 4 || c.page_bytes % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": page_bytes ", c.page_bytes, " < ", c.page_rows, " rows of ", c.dim, " floats"));
  }
  if (reinterpret_cast<uintptr_t>(c.base) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": base must be 16-byte aligned"));
  }
  return absl::OkStatus();
}

inline absl::Status CheckTables(const BlockTables& t, const char* what) {
  if (t.pages == nullptr || t.stride < 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": pages is null or stride ", t.stride, " < 1"));
  }
  return absl::OkStatus();
}

}  // namespace dsv4::kernels::cuda::attn
