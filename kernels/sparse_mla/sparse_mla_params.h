// The contract of the sparse-MLA decode kernels (dsv4-decode.md §3.3), shared by the float64 CPU reference,
// the SIMT and MMA CUDA kernels and their launcher. A plain struct (FlashMLA csrc/params.h style): fill it
// with designated initializers; ValidateSparseMlaParams (sparse_mla_validate.h) checks it at the edge.
// Plain C++ with no library types, so CUDA code includes it too.
//
// Shapes: B batch, H heads, K top-k (selected rows), D = 512 dims, P page rows.
// For each sequence b and head h the kernels compute, over the selected rows j of the window cache followed
// by the selected rows of the compressed ("extra") cache (one softmax over both; duplicates are not merged):
//   s_j = softmax_scale * (q[b,h,:] . k_j),  lse = ln(sum_j e^{s_j})   (real keys only, sink excluded),
//   out[b,h,:] = (sum_j e^{s_j} k_j / sum_j e^{s_j}) * e^lse / (e^lse + e^{sink_h})   (value = key).
// A selected entry is skipped when its index is -1 (or outside the pool) or when its position is at or
// past the sequence's length. No valid key: out = 0, lse = +inf.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/sparse_mla/kv_row_format.h"

namespace dsv4::kernels::sparse_mla {

// One cache and the rows each sequence selects from it.
struct SparseMlaKvInput {
  // Pool of 584-byte rows, layout of kv_row_format.h; [num_pages, page stride] bytes. May be null only
  // when topk == 0 (e.g. the compressed cache of a sliding-window-only layer).
  const uint8_t* cache = nullptr;
  int64_t num_pages = 0;  // pages in the pool; row ids >= num_pages * page_rows are skipped
  int page_rows = 0;      // P (run-time page size; FlashMLA reads it from the tensor)
  // [B, index_stride] int32 physical row ids (page * P + row); -1 = skip. Null only when topk == 0.
  const int32_t* indices = nullptr;
  int topk = 0;            // K of this cache: entries 0..topk-1 of each sequence's index row are read
  int index_stride = 0;    // elements between consecutive sequences' index rows (>= topk)
  // [B] int32 number of leading entries to use (clamped to [0, topk]); null = all topk entries.
  const int32_t* lengths = nullptr;
};

struct SparseMlaParams {
  int batch = 0;      // B
  int num_heads = 0;  // H (the heads of this rank); the CUDA kernels take 16, 32, 64 or 128
  // [B, H, 512] bf16 bits (already q-normed and rotated).
  const uint16_t* q = nullptr;
  SparseMlaKvInput window;  // the sliding-window cache (topk_w = min(p+1, 128) in the model)
  SparseMlaKvInput extra;   // the compressed cache of this layer (topk 0 for ratio-0 layers)
  // [H] fp32 per-head sink logit; null = no sink (-inf). Padded heads under TP use -inf.
  const float* attn_sink = nullptr;
  float softmax_scale = 0.0f;  // 512^-1/2 for DeepSeek-V4
  // [B, H, 512] bf16 bits, written for every (b, h) (zeros where no key is valid).
  uint16_t* out = nullptr;
  // [B, H] fp32 natural-log LSE over the real keys (sink excluded); +inf where no key is valid.
  float* lse = nullptr;
  // Scratch for split-KV partial results (CUDA MMA kernel only; size from SparseMlaWorkspaceBytes).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

}  // namespace dsv4::kernels::sparse_mla
