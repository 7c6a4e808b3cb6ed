// Row-level helpers shared by the CPU ops (kernels/cpu only): KV row storage (fp32 or the 584-byte FP8
// record of kernels/sparse_mla/kv_row_format.h), logical -> physical rows through block tables, and the
// one-row forms of RMSNorm, RoPE and the Hadamard + FP4 simulation that the batched ops and the compressor's
// emission both use (one definition, so both give the same bits).
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace dsv4::kernels::cpu {

// Physical row of logical row `logical` of sequence b: pages[b][logical / P] * P + logical % P.
inline int64_t PhysicalRow(const BlockTables& tables, int64_t b, int64_t logical, int page_rows) {
  return int64_t{tables.pages[b * tables.stride + logical / page_rows]} * page_rows + logical % page_rows;
}

// Reads physical row `row` as cache.dim floats into out (dequantising kFp8Row584).
void ReadKvRow(const KvCacheView& cache, int64_t row, float* out);
// Writes cache.dim floats to physical row `row` (kFp8Row584: the production encode of kv_row_format.h).
void WriteKvRow(const KvCacheView& cache, int64_t row, const float* in);
// The row's floats: a pointer into the pool for kF32, else decoded into buf (cache.dim floats).
const float* KvRowFloats(const KvCacheView& cache, int64_t row, float* buf);

// o = x / sqrt(mean(x^2) + eps) * (w or 1); the sum of squares in double. o may alias x.
void RmsNormRow(const float* x, const float* w, float* o, int64_t dim, float eps);
// Rotates the last 2 * pairs dims of `heads` rows of row_dim floats at position pos (RopeArgs).
void RopeToken(float* x, int32_t pos, const float* inv_freq, int64_t heads, int64_t row_dim, int pairs,
               bool inverse);
// Hadamard (H / sqrt(dim)) then the FP4 e2m1 round trip with one ue8m0 scale per 32 dims, in place.
void HadamardFp4Row(float* v, int64_t dim);

}  // namespace dsv4::kernels::cpu
