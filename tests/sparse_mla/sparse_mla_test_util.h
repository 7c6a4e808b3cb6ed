// Random sparse-MLA problems on the host, a multi-threaded float64 reference, and error metrics, shared by
// the CPU and GPU tests (and usable by the benchmark). Every problem is drawn from a seed: fresh inputs per
// test, reproducible on failure.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/sparse_mla/sparse_mla_params.h"
#include "kernels/sparse_mla/sparse_mla_reference.h"

namespace dsv4::kernels::sparse_mla::testing {

struct ProblemSpec {
  int batch = 1;
  int heads = 64;
  int topk_window = 128;
  int topk_extra = 512;
  int page_rows_window = 64;
  int page_rows_extra = 64;
  bool lengths = false;        // random per-sequence lengths (sequence 0 gets 0 for both caches)
  double holes = 0.0;          // fraction of entries set to -1 (and a few ids past the pool)
  int empty_every = 0;         // every n-th sequence selects no valid row (0: none)
  bool extreme = false;        // 5% of rows scaled by 2^+-20, every 3rd sequence's q by 64
  bool sink = true;            // per-head sink logits (else null)
  uint64_t seed = 1;
  std::string Name() const;
};
inline void PrintTo(const ProblemSpec& s, std::ostream* os) { *os << s.Name(); }

struct HostProblem {
  ProblemSpec spec;
  std::vector<uint16_t> q;  // [B, H, 512] bf16
  std::vector<uint8_t> cache_window, cache_extra;
  int64_t pages_window = 0, pages_extra = 0;
  std::vector<int32_t> idx_window, idx_extra;  // [B, topk]
  std::vector<int32_t> len_window, len_extra;  // [B] (empty when !lengths)
  std::vector<float> sink;                      // [H] (empty when !sink)
  // Params over these host buffers, writing to out / lse (host or device, caller's choice).
  SparseMlaParams Params(uint16_t* out, float* lse) const;
};

HostProblem MakeProblem(const ProblemSpec& spec);

// SparseMlaDecodeReferenceF64 over batch slices on all hardware threads.
absl::StatusOr<SparseMlaReferenceResult> ParallelReference(const SparseMlaParams& params);

struct ErrorReport {
  double rel_global = 0;     // ||out - ref|| / ||ref|| over all non-empty sequences
  double rel_worst_seq = 0;  // the same per sequence, worst sequence
  double max_abs = 0;
  int64_t worst_index = -1;  // flat index of the largest absolute error
  int64_t nan_count = 0;     // NaN / inf in out, or NaN in lse
  int64_t empty_bad = 0;     // (b, h) with no valid key whose out is not 0 or lse not +inf
  double lse_max_abs = 0;    // over (b, h) with valid keys, |lse - ref| / max(1, |ref|)
  std::string ToString() const;
};
// Compares kernel outputs with the reference. `round_ref`: compare with the reference rounded to bf16 (the
// kernels' final rounding), which isolates the kernels' own error from the output format's.
ErrorReport Compare(const std::vector<uint16_t>& out, const std::vector<float>& lse,
                    const SparseMlaReferenceResult& ref, int batch, int heads, bool round_ref);

}  // namespace dsv4::kernels::sparse_mla::testing
