// Attention on the device (ops.h): each token's keys are its window (ring rows before the sequence's first token
// of the step, staging rows for this step's) plus its compressed rows (all visible ones for ratio 128, the
// indexer's selection for ratio 4), one softmax with the per-head sink.
//
// FP8 pools (production): the keys of each token are listed on the device into scratch and the sparse-MLA
// decode of kernels/sparse_mla runs with one "sequence" per token (q rounded to bf16, heads padded to 16, 32,
// 64 or 128 with -inf sinks), its bf16 output widened to the op's fp32. Per group of up to kMaxGroup tokens:
// AttentionPrepKernel (q -> bf16 over (token, 16 heads) blocks, and the key lists: only the entries the kernel
// reads, so the work follows the window and compressed rows that exist), the sparse-MLA launch (MMA or SIMT, as
// the plan of the step's batch bucket says; the ratio-4 selection is read in place from the indexer's output),
// AttentionOutKernel (bf16 -> fp32 over the same blocks). The plans (one per batch bucket and layer type) are made
// by MakeAttentionPlan at Reserve time, so a launch only looks one up.
//
// kF32 pools (exact mode, or any other mix of formats): DirectAttentionKernel, one block per (token, head),
// four warps each running an online softmax over every 4th key, lanes owning dims lane + 32 i; fp32 throughout.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention_launch_util.h"
#include "kernels/cuda/kv_rows.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/pdl.h"

namespace dsv4::kernels::cuda {

namespace sm = ::dsv4::kernels::sparse_mla;

// Plans of the FP8 path: per layer type (0: window only, 1: ratio 4, 2: ratio 128) one sparse-MLA plan per
// batch bucket 1, 2, 4, ... up to the largest token group.
struct AttentionPlan {
  sm::SparseMlaKernel kernel = sm::SparseMlaKernel::kMma;
  int padded_heads = 0;  // H rounded up to a head count the kernels take
  std::array<std::vector<sm::SparseMlaPlan>, 3> plans;
};

namespace {

constexpr int kMaxGroup = 256;      // tokens per sparse-MLA launch (bounds the scratch)
constexpr int kPrepThreads = 256;
constexpr int kPrepHeads = 4;        // heads per prep / output block (a divisor of every padded head count):
                                     // one or two 16-byte loads per thread, so a small step is one round trip
constexpr int kDirectWarps = 4;
constexpr int kMaxDimsPerLane = 16;  // DirectAttentionKernel: dim <= 512

int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// Heads the sparse-MLA kernels take (16, 32, 64, 128) for H heads; 0 when H > 128.
int PaddedHeads(int64_t heads) {
  for (int h : {16, 32, 64, 128}) {
    if (heads <= h) return h;
  }
  return 0;
}

int LayerType(int compressed_ratio) { return compressed_ratio == 0 ? 0 : compressed_ratio == 4 ? 1 : 2; }

// Scratch of one token group: offsets in bytes (each 256-byte aligned).
struct Layout {
  int64_t q16 = 0, out16 = 0, lse = 0, sink = 0, win_idx = 0, win_len = 0, comp_idx = 0, comp_len = 0;
  int64_t workspace = 0, total = 0;
};

Layout MakeLayout(int64_t group, int padded_heads, int64_t window, int64_t comp_cols, int64_t workspace) {
  Layout l;
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t off = at;
    at = RoundUp(at + bytes, 256);
    return off;
  };
  l.q16 = take(group * padded_heads * sm::kKvDim * 2);
  l.out16 = take(group * padded_heads * sm::kKvDim * 2);
  l.lse = take(group * padded_heads * 4);
  l.sink = take(int64_t{padded_heads} * 4);
  l.win_idx = take(group * window * 4);
  l.win_len = take(group * 4);
  l.comp_idx = take(group * comp_cols * 4);
  l.comp_len = take(group * 4);
  l.workspace = take(workspace);
  l.total = at;
  return l;
}

// ---- FP8 path: key lists and q for the sparse-MLA kernels, then the output back to fp32 ----

struct PrepParams {
  const float* q = nullptr;          // [T, H, 512]
  const float* sink = nullptr;       // [H]
  StepIndex step;
  KvCacheView window;                // window pool (page_rows)
  BlockTables window_tables;
  int32_t staging_row0 = 0;
  int window_size = 128;             // W
  int ratio = 0;                     // compressed ratio: 0, 4 or 128
  int page_rows_c = 1;               // compressed pool page rows
  BlockTables compressed_tables;     // ratio 128
  const int32_t* selected_count = nullptr;  // ratio 4: [T]
  int64_t ksel = 0;                  // ratio 4
  int64_t comp_cols = 0;             // ratio 128: entries per token of comp_idx (max_compressed)
  int heads = 0, padded_heads = 0;
  int64_t t0 = 0;                    // first token of the group
  uint16_t* q16 = nullptr;           // [G, Hp, 512] bf16 bits, zeros for padded heads / padding tokens
  float* sink_p = nullptr;           // [Hp], -inf for padded heads
  int32_t* win_idx = nullptr;        // [G, W] physical window-pool rows, -1 past win_len
  int32_t* win_len = nullptr;        // [G]
  int32_t* comp_idx = nullptr;       // [G, comp_cols] (ratio 128)
  int32_t* comp_len = nullptr;       // [G]
};

// Physical window-pool row of position `q_pos` of sequence b whose step starts at p0 with token `first`.
__device__ __forceinline__ int64_t WindowRow(const StepIndex& s, const KvCacheView& pool, const BlockTables& tab,
                                             int32_t staging_row0, int window, int64_t b, int64_t first,
                                             int32_t p0, int32_t q_pos) {
  if (q_pos >= p0) return staging_row0 + first + (q_pos - p0);
  // 32-bit division: positions, window slots and page rows are all below 2^31.
  const int32_t slot = q_pos % window, page = tab.pages[b * tab.stride + slot / pool.page_rows];
  return page < 0 ? -1 : int64_t{page} * pool.page_rows + slot % pool.page_rows;
}

// Grid (G, Hp / kPrepHeads + 1): block (g, y < Hp / kPrepHeads) rounds kPrepHeads heads of token t0 + g to bf16
// (zeros for padded heads and padding tokens); block (g, Hp / kPrepHeads), in parallel with them, lists the token's
// keys -- only the entries the sparse-MLA kernel reads (it stops at win_len / comp_len) -- and block (0, last) the
// padded sinks.
__global__ void __launch_bounds__(kPrepThreads) AttentionPrepKernel(const PrepParams p) {
  PdlEnter();
  const int64_t g = blockIdx.x, t = p.t0 + g;
  const int tid = threadIdx.x, h0 = kPrepHeads * blockIdx.y;
  const int32_t pos = p.step.pos[t];
  if (h0 < p.padded_heads) {
    // q rounded to bf16, four dims per 8-byte store.
    constexpr int kQuads = kPrepHeads * sm::kKvDim / 4;
    static_assert(kQuads % kPrepThreads == 0);
    uint2* q16 = reinterpret_cast<uint2*>(p.q16 + (g * p.padded_heads + h0) * sm::kKvDim);
    const float4* q = reinterpret_cast<const float4*>(p.q + (t * p.heads + h0) * sm::kKvDim);
    const int real = pos < 0 ? 0 : min(kPrepHeads, p.heads - h0) * (sm::kKvDim / 4);
    float4 x[kQuads / kPrepThreads];
#pragma unroll
    for (int j = 0; j < kQuads / kPrepThreads; ++j) {
      const int i = tid + kPrepThreads * j;
      x[j] = i < real ? q[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kQuads / kPrepThreads; ++j) {
      q16[tid + kPrepThreads * j] =
          make_uint2(F32ToBf16(x[j].x) | (static_cast<uint32_t>(F32ToBf16(x[j].y)) << 16),
                     F32ToBf16(x[j].z) | (static_cast<uint32_t>(F32ToBf16(x[j].w)) << 16));
    }
    return;
  }
  if (g == 0 && p.padded_heads != p.heads) {
    for (int h = tid; h < p.padded_heads; h += kPrepThreads) p.sink_p[h] = h < p.heads ? p.sink[h] : -INFINITY;
  }

  int32_t nw = 0, nc = 0, lo = 0, p0 = 0;
  int64_t b = 0, first = 0;
  if (pos >= 0) {
    b = p.step.seq[t];
    first = p.step.seq_first[b];
    p0 = p.step.pos[first];
    lo = max(0, pos - p.window_size + 1);
    nw = pos - lo + 1;
    if (p.ratio == 128) nc = static_cast<int32_t>(min(static_cast<int64_t>((pos + 1) / 128), p.comp_cols));
    if (p.ratio == 4) nc = static_cast<int32_t>(min(static_cast<int64_t>(max(p.selected_count[t], 0)), p.ksel));
  }
  for (int i = tid; i < nw; i += kPrepThreads) {
    p.win_idx[g * p.window_size + i] = static_cast<int32_t>(
        WindowRow(p.step, p.window, p.window_tables, p.staging_row0, p.window_size, b, first, p0, lo + i));
  }
  if (p.ratio == 128) {
    for (int i = tid; i < nc; i += kPrepThreads) {
      p.comp_idx[g * p.comp_cols + i] =
          static_cast<int32_t>(attn::PhysicalRow(p.compressed_tables, b, i, p.page_rows_c));
    }
  }
  if (tid == 0) {
    p.win_len[g] = nw;
    p.comp_len[g] = nc;
  }
}

// out[t, h, :] = out16[g, h, :] for the real heads; grid (G, ceil(H / kPrepHeads)), eight dims per thread.
__global__ void __launch_bounds__(kPrepThreads)
    AttentionOutKernel(const uint16_t* out16, float* out, int heads, int padded_heads, int64_t t0) {
  PdlEnter();
  const int64_t g = blockIdx.x;
  const int h0 = kPrepHeads * blockIdx.y;
  const uint4* src = reinterpret_cast<const uint4*>(out16 + (g * padded_heads + h0) * sm::kKvDim);
  float4* dst = reinterpret_cast<float4*>(out + ((t0 + g) * heads + h0) * sm::kKvDim);
  const int n = min(kPrepHeads, heads - h0) * (sm::kKvDim / 8);
  for (int i = threadIdx.x; i < n; i += kPrepThreads) {
    const uint4 v = src[i];
    dst[2 * i] = make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                             __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
    dst[2 * i + 1] = make_float4(__uint_as_float(v.z << 16), __uint_as_float(v.z & 0xffff0000u),
                                 __uint_as_float(v.w << 16), __uint_as_float(v.w & 0xffff0000u));
  }
}

absl::Status LaunchFp8(const AttentionArgs& a, const CudaScratch& scratch, cudaStream_t stream) {
  const AttentionPlan* plan = scratch.attention_plan;
  if (plan == nullptr) {
    return absl::FailedPreconditionError(
        "Attention: no sparse-MLA plan (MakeAttentionPlan at Reserve sets CudaScratch::attention_plan)");
  }
  const int hp = PaddedHeads(a.heads);
  if (hp != plan->padded_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("Attention: ", a.heads, " heads, but the plan was made for ", plan->padded_heads));
  }
  const std::vector<sm::SparseMlaPlan>& buckets = plan->plans[LayerType(a.compressed_ratio)];
  const int64_t group = std::min<int64_t>(a.step.t, buckets.back().max_batch);
  const auto bucket = std::find_if(buckets.begin(), buckets.end(),
                                   [&](const sm::SparseMlaPlan& b) { return b.max_batch >= group; });
  const int64_t comp_cols = a.compressed_ratio == 128 ? a.max_compressed : 0;
  const Layout l = MakeLayout(group, hp, a.window_size, comp_cols, static_cast<int64_t>(bucket->workspace_bytes));
  if (scratch.data == nullptr || l.total > scratch.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("Attention: the step needs ", l.total, " bytes of scratch, ",
                                                   scratch.bytes, " reserved (AttentionScratchBytes sizes it)"));
  }
  if (reinterpret_cast<uintptr_t>(a.q) % 16 != 0 || reinterpret_cast<uintptr_t>(a.out) % 16 != 0) {
    return absl::InvalidArgumentError("Attention: q and out must be 16-byte aligned");
  }
  uint8_t* base = static_cast<uint8_t*>(scratch.data);
  PrepParams pp{.q = a.q, .sink = a.sink, .step = a.step, .window = a.window, .window_tables = a.window_tables,
                .staging_row0 = a.staging_row0, .window_size = a.window_size, .ratio = a.compressed_ratio,
                .page_rows_c = std::max(1, a.compressed.page_rows), .compressed_tables = a.compressed_tables,
                .selected_count = a.selected_count, .ksel = a.ksel, .comp_cols = comp_cols,
                .heads = static_cast<int>(a.heads), .padded_heads = hp,
                .q16 = reinterpret_cast<uint16_t*>(base + l.q16), .sink_p = reinterpret_cast<float*>(base + l.sink),
                .win_idx = reinterpret_cast<int32_t*>(base + l.win_idx),
                .win_len = reinterpret_cast<int32_t*>(base + l.win_len),
                .comp_idx = reinterpret_cast<int32_t*>(base + l.comp_idx),
                .comp_len = reinterpret_cast<int32_t*>(base + l.comp_len)};
  // Row ids past the pool are the caller's bug; the kernels' own bound is int32 row ids.
  const auto pool_pages = [](int page_rows) { return (int64_t{1} << 31) / page_rows; };
  for (int64_t t0 = 0; t0 < a.step.t; t0 += group) {
    const int64_t g = std::min(group, a.step.t - t0);
    pp.t0 = t0;
    DSV4_RETURN_IF_ERROR(CudaStatus(
        LaunchPdl(AttentionPrepKernel, dim3(static_cast<unsigned>(g), static_cast<unsigned>(hp / kPrepHeads + 1)),
                  dim3(kPrepThreads), 0, stream, pp),
        "Attention key lists"));
    sm::SparseMlaKvInput extra;
    if (a.compressed_ratio == 4 && a.ksel > 0) {
      extra = {.cache = a.compressed.base, .num_pages = pool_pages(a.compressed.page_rows),
               .page_rows = a.compressed.page_rows, .indices = a.selected + t0 * a.ksel,
               .topk = static_cast<int>(a.ksel), .index_stride = static_cast<int>(a.ksel), .lengths = pp.comp_len};
    } else if (a.compressed_ratio == 128 && comp_cols > 0) {
      extra = {.cache = a.compressed.base, .num_pages = pool_pages(a.compressed.page_rows),
               .page_rows = a.compressed.page_rows, .indices = pp.comp_idx, .topk = static_cast<int>(comp_cols),
               .index_stride = static_cast<int>(comp_cols), .lengths = pp.comp_len};
    }
    const sm::SparseMlaParams mp{
        .batch = static_cast<int>(g), .num_heads = hp, .q = pp.q16,
        .window = {.cache = a.window.base, .num_pages = pool_pages(a.window.page_rows),
                   .page_rows = a.window.page_rows, .indices = pp.win_idx, .topk = a.window_size,
                   .index_stride = a.window_size, .lengths = pp.win_len},
        .extra = extra, .attn_sink = hp == a.heads ? a.sink : pp.sink_p, .softmax_scale = a.scale,
        .out = reinterpret_cast<uint16_t*>(base + l.out16), .lse = reinterpret_cast<float*>(base + l.lse),
        .workspace = base + l.workspace, .workspace_bytes = bucket->workspace_bytes};
    DSV4_RETURN_IF_ERROR(sm::LaunchSparseMlaDecode(mp, *bucket, stream));
    const unsigned head_blocks = static_cast<unsigned>((a.heads + kPrepHeads - 1) / kPrepHeads);
    DSV4_RETURN_IF_ERROR(
        CudaStatus(LaunchPdl(AttentionOutKernel, dim3(static_cast<unsigned>(g), head_blocks), dim3(kPrepThreads), 0,
                             stream, mp.out, a.out, static_cast<int>(a.heads), hp, t0),
                   "Attention output"));
  }
  return absl::OkStatus();
}

// ---- Direct path (kF32 pools): one block per (token, head) ----

struct DirectParams {
  const float* q = nullptr;   // [T, H, dim]
  const float* sink = nullptr;  // [H]
  float* out = nullptr;       // [T, H, dim]
  StepIndex step;
  KvCacheView window;
  BlockTables window_tables;
  int32_t staging_row0 = 0;
  int window_size = 128;
  int ratio = 0;
  KvCacheView compressed;
  BlockTables compressed_tables;              // ratio 128
  const int32_t* selected = nullptr;          // ratio 4: [T, Ksel]
  const int32_t* selected_count = nullptr;    // ratio 4: [T]
  int64_t ksel = 0, max_compressed = 0;
  int heads = 0, dim = 512;
  float scale = 0.f;
};

__global__ void __launch_bounds__(kDirectWarps * 32) DirectAttentionKernel(const DirectParams p) {
  PdlEnter();
  __shared__ float acc_s[kDirectWarps][kMaxDimsPerLane * 32];
  __shared__ float max_s[kDirectWarps], sum_s[kDirectWarps];
  const int h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = blockIdx.x;
  const int per_lane = p.dim / 32;
  float* out = p.out + (t * p.heads + h) * p.dim;
  const int32_t pos = p.step.pos[t];
  if (pos < 0) {
    for (int d = threadIdx.x; d < p.dim; d += kDirectWarps * 32) out[d] = 0.f;
    return;
  }
  const int64_t b = p.step.seq[t], first = p.step.seq_first[b];
  const int32_t p0 = p.step.pos[first], lo = max(0, pos - p.window_size + 1), nw = pos - lo + 1;
  int64_t nc = 0;
  if (p.ratio == 128) nc = min(static_cast<int64_t>((pos + 1) / 128), p.max_compressed);
  if (p.ratio == 4) nc = min(static_cast<int64_t>(max(p.selected_count[t], 0)), p.ksel);

  float q[kMaxDimsPerLane], acc[kMaxDimsPerLane];
  const float* qh = p.q + (t * p.heads + h) * p.dim;
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    q[i] = i < per_lane ? qh[lane + 32 * i] : 0.f;
    acc[i] = 0.f;
  }
  float run_max = -INFINITY, run_sum = 0.f;
  for (int64_t j = warp; j < nw + nc; j += kDirectWarps) {
    const bool is_window = j < nw;
    const KvCacheView& pool = is_window ? p.window : p.compressed;
    int64_t row;
    if (is_window) {
      row = WindowRow(p.step, p.window, p.window_tables, p.staging_row0, p.window_size, b, first, p0,
                      lo + static_cast<int32_t>(j));
    } else if (p.ratio == 128) {
      row = attn::PhysicalRow(p.compressed_tables, b, j - nw, p.compressed.page_rows);
    } else {
      row = p.selected[t * p.ksel + (j - nw)];
    }
    if (row < 0) continue;  // warp-uniform
    float k[kMaxDimsPerLane], dot = 0.f;
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      k[i] = i < per_lane ? attn::ReadKvDim(pool, row, lane + 32 * i) : 0.f;
      dot = fmaf(q[i], k[i], dot);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(attn::kFullMask, dot, o);
    const float s = dot * p.scale;
    const float m = fmaxf(run_max, s);
    const float corr = expf(run_max - m), e = expf(s - m);
    run_sum = run_sum * corr + e;
    for (int i = 0; i < kMaxDimsPerLane; ++i) acc[i] = acc[i] * corr + e * k[i];
    run_max = m;
  }
  for (int i = 0; i < per_lane; ++i) acc_s[warp][lane + 32 * i] = acc[i];
  if (lane == 0) {
    max_s[warp] = run_max;
    sum_s[warp] = run_sum;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < kDirectWarps; ++w) m = fmaxf(m, max_s[w]);
  if (m == -INFINITY) {  // no valid key: zeros (the sink alone carries no value)
    for (int d = threadIdx.x; d < p.dim; d += kDirectWarps * 32) out[d] = 0.f;
    return;
  }
  const float sink = p.sink[h];
  const float mf = fmaxf(m, sink);
  float den = expf(sink - mf), f[kDirectWarps];
  for (int w = 0; w < kDirectWarps; ++w) {
    f[w] = max_s[w] == -INFINITY ? 0.f : expf(max_s[w] - mf);
    den += sum_s[w] * f[w];
  }
  for (int d = threadIdx.x; d < p.dim; d += kDirectWarps * 32) {
    float o = 0.f;
    for (int w = 0; w < kDirectWarps; ++w) o += acc_s[w][d] * f[w];
    out[d] = o / den;
  }
}

absl::Status Check(const AttentionArgs& a) {
  DSV4_RETURN_IF_ERROR(attn::CheckStepIndex(a.step, "Attention"));
  DSV4_RETURN_IF_ERROR(attn::CheckPool(a.window, "Attention window pool"));
  DSV4_RETURN_IF_ERROR(attn::CheckTables(a.window_tables, "Attention window tables"));
  if (a.q == nullptr || a.out == nullptr || a.sink == nullptr) {
    return absl::InvalidArgumentError("Attention: q, out or sink is null");
  }
  if (a.heads < 1 || a.heads > 65535 || a.dim != a.window.dim || a.dim % 32 != 0 || a.dim > 32 * kMaxDimsPerLane) {
    return absl::InvalidArgumentError(absl::StrCat("Attention: ", a.heads, " heads of ", a.dim, " dims (pool dim ",
                                                   a.window.dim, "); dims a multiple of 32 up to 512"));
  }
  if (a.window_size < 1 || a.staging_row0 < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Attention: window ", a.window_size, ", staging_row0 ",
                                                   a.staging_row0));
  }
  if (a.compressed_ratio != 0 && a.compressed_ratio != 4 && a.compressed_ratio != 128) {
    return absl::InvalidArgumentError(absl::StrCat("Attention: compressed_ratio is ", a.compressed_ratio,
                                                   "; must be 0, 4 or 128"));
  }
  if (a.compressed_ratio != 0) {
    DSV4_RETURN_IF_ERROR(attn::CheckPool(a.compressed, "Attention compressed pool"));
    if (a.compressed.dim != a.dim) {
      return absl::InvalidArgumentError(absl::StrCat("Attention: compressed dim ", a.compressed.dim, " != ", a.dim));
    }
  }
  if (a.compressed_ratio == 4 && (a.selected == nullptr || a.selected_count == nullptr || a.ksel < 0 ||
                                  a.ksel > INT32_MAX)) {
    return absl::InvalidArgumentError("Attention: ratio 4 needs selected, selected_count and 0 <= ksel < 2^31");
  }
  if (a.compressed_ratio == 128) {
    DSV4_RETURN_IF_ERROR(attn::CheckTables(a.compressed_tables, "Attention compressed tables"));
    if (a.max_compressed < 0 || a.max_compressed > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("Attention: max_compressed is ", a.max_compressed));
    }
  }
  return absl::OkStatus();
}

// The per-bucket plans of one layer type whose selections reach max_topk rows.
absl::StatusOr<std::vector<sm::SparseMlaPlan>> PlanBuckets(sm::SparseMlaKernel kernel, int64_t group, int heads,
                                                           int64_t max_topk) {
  std::vector<sm::SparseMlaPlan> plans;
  for (int64_t batch = 1;; batch = std::min(2 * batch, group)) {
    DSV4_ASSIGN_OR_RETURN(sm::SparseMlaPlan plan,
                          sm::MakeSparseMlaPlan(kernel, static_cast<int>(batch), heads,
                                                static_cast<int>(std::min<int64_t>(max_topk, 1 << 20))));
    plans.push_back(plan);
    if (batch == group) break;
  }
  return plans;
}

// Compressed rows a token may attend per layer type, for the limits.
std::array<int64_t, 3> MaxCompressed(const StepLimits& limits) {
  return {0, limits.index_topk, limits.max_context / 128};
}

}  // namespace

absl::StatusOr<std::shared_ptr<const AttentionPlan>> MakeAttentionPlan(const StepLimits& limits,
                                                                       sm::SparseMlaKernel kernel) {
  auto plan = std::make_shared<AttentionPlan>();
  plan->kernel = kernel;
  plan->padded_heads = PaddedHeads(limits.heads);
  if (limits.heads < 1 || plan->padded_heads == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Attention: ", limits.heads, " heads; the sparse-MLA kernels take up to 128 per rank"));
  }
  const int64_t group = std::clamp<int64_t>(limits.max_tokens, 1, kMaxGroup);
  const std::array<int64_t, 3> comp = MaxCompressed(limits);
  for (int type = 0; type < 3; ++type) {
    DSV4_ASSIGN_OR_RETURN(plan->plans[type],
                          PlanBuckets(kernel, group, plan->padded_heads, limits.window + comp[type]));
  }
  return std::shared_ptr<const AttentionPlan>(std::move(plan));
}

int64_t AttentionScratchBytes(const StepLimits& limits) {
  const int hp = PaddedHeads(limits.heads);
  if (hp == 0) return 0;  // MakeAttentionPlan reports the head count
  const int64_t group = std::clamp<int64_t>(limits.max_tokens, 1, kMaxGroup);
  // The MMA kernel's split-KV workspace is the largest over its plans (the SIMT kernel needs none); without a
  // usable device there is no plan either and MakeAttentionPlan says why.
  int64_t workspace = 0;
  const std::array<int64_t, 3> comp = MaxCompressed(limits);
  for (int type = 0; type < 3; ++type) {
    absl::StatusOr<std::vector<sm::SparseMlaPlan>> plans =
        PlanBuckets(sm::SparseMlaKernel::kMma, group, hp, limits.window + comp[type]);
    if (!plans.ok()) continue;
    for (const sm::SparseMlaPlan& p : *plans) workspace = std::max<int64_t>(workspace, p.workspace_bytes);
  }
  return MakeLayout(group, hp, limits.window, comp[2], workspace).total;
}

absl::Status LaunchAttention(const AttentionArgs& a, const CudaScratch& scratch, cudaStream_t stream) {
  DSV4_RETURN_IF_ERROR(Check(a));
  if (a.step.t == 0) return absl::OkStatus();
  const bool fp8 = a.window.format == KvFormat::kFp8Row584 &&
                   (a.compressed_ratio == 0 || a.compressed.format == KvFormat::kFp8Row584);
  if (fp8) return LaunchFp8(a, scratch, stream);
  const DirectParams p{.q = a.q, .sink = a.sink, .out = a.out, .step = a.step, .window = a.window,
                       .window_tables = a.window_tables, .staging_row0 = a.staging_row0,
                       .window_size = a.window_size, .ratio = a.compressed_ratio, .compressed = a.compressed,
                       .compressed_tables = a.compressed_tables, .selected = a.selected,
                       .selected_count = a.selected_count, .ksel = a.ksel, .max_compressed = a.max_compressed,
                       .heads = static_cast<int>(a.heads), .dim = static_cast<int>(a.dim), .scale = a.scale};
  return CudaStatus(
      LaunchPdl(DirectAttentionKernel, dim3(static_cast<unsigned>(a.step.t), static_cast<unsigned>(a.heads)),
                dim3(kDirectWarps * 32), 0, stream, p),
      "Attention (direct)");
}

}  // namespace dsv4::kernels::cuda
