// Lightning indexer on the device (ops.h; dsv4-decode.md §2.3): for each token, the scores of its sequence's
// visible indexer rows and the top-k of them, written as physical compressed-pool ids in ascending row order.
//
// Two kernels per group of up to kMaxGroup tokens (the group bounds the score scratch):
//  - the scores, grid (blocks per token, G): each block strides over 64-row tiles of the visible rows
//    n < (p + 1) / 4 only (rows past them are never read, so the work follows the context, not the pool or
//    max_rows), and writes scores to scratch [G, max_rows]. Tokens that keep all their rows (n <= k) skip it.
//    At the model's shape (IH = 64, ID = 128) IndexerScoreMmaKernel: q . K on tensor cores (bf16 mma.sync,
//    fp32 accumulation), one warp per 16 heads, then relu, the weights and the head sum in the reference's
//    order (h = 0, 1, ...; a multiply then an add, as the CPU op does), so the scores are bit-identical to the
//    CPU's wherever the dot products are exact in both. In production q and the rows are FP4-simulated
//    (e2m1 x power-of-two scale): exactly bf16, every product exact in fp32, and their sums exact. Values that
//    are not exactly bf16 (exact mode, arbitrary inputs) are seen from the fp32 bits a warp loads anyway (low
//    16 bits non-zero); that warp then scores its tile in fp32 on CUDA cores instead, so no input is ever
//    rounded. Other shapes: IndexerScoreKernel (fp32 on CUDA cores; thread (r, h) accumulates 8 rows x 4 heads).
//  - IndexerTopkKernel, one block per token: a 4-pass radix select (8 bits per pass, warp-aggregated shared
//    histograms) finds the k-th largest score key and how many rows equal to it are kept, then one ordered
//    pass with a block scan writes the kept rows in ascending order: every row above the threshold, and the
//    lowest-numbered rows at it (the reference's tie order: score desc, row asc).
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention_launch_util.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/kv_rows.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/pdl.h"

namespace dsv4::kernels::cuda {
namespace {

constexpr int kTileRows = 64;       // rows per score tile
constexpr int kScoreThreads = 128;  // 8 row lanes x 16 head lanes
constexpr int kRowLanes = 8;        // thread rows: rl + 8 i, i < 8
constexpr int kHeadLanes = 16;      // thread heads: hb + hl + 16 i, i < 4 (per 64-head block)
constexpr int kTopkThreads = 512;
constexpr int kMaxGroup = 128;      // tokens per score / top-k launch pair
constexpr int kPad = 4;             // floats of padding per shared row: conflict-free float4 reads

// The kernels' contract (IndexerArgs plus the scratch and the token group of this launch).
struct IndexerParams {
  const float* q = nullptr;          // [T, IH, ID]
  const float* w = nullptr;          // [T, IH]
  float weight_scale = 1.f;
  KvCacheView cache;                 // indexer pool, kF32 rows of ID floats
  BlockTables index_tables;          // indexer pool
  BlockTables target_tables;         // compressed pool (same page rows as the indexer pool)
  StepIndex step;
  int32_t* selected = nullptr;       // [T, Ksel]
  int32_t* selected_count = nullptr; // [T]
  int heads = 0, dim = 0, k = 0;     // IH, ID, Ksel
  int64_t max_rows = 0;              // visible rows are clamped to it (the scratch row length)
  float* scores = nullptr;           // scratch [G, max_rows]
  int64_t topk_keys = 0;             // top-k: tokens with at most this many rows stage their keys in shared memory
  int64_t t0 = 0;                    // first token of the group
};

// Visible rows of token t (-1 for padding), clamped to max_rows.
__device__ __forceinline__ int64_t VisibleRows(const IndexerParams& p, int64_t t) {
  const int32_t pos = p.step.pos[t];
  if (pos < 0) return -1;
  return min(static_cast<int64_t>(pos + 1) / 4, p.max_rows);
}

// Score -> unsigned key with the same order (larger score, larger key); -0 counts as +0, as in a float compare.
__device__ __forceinline__ uint32_t ScoreKey(float s) {
  const uint32_t u = __float_as_uint(s == 0.f ? 0.f : s);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ void Fma4(float& acc, const float4& a, const float4& b) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  acc = fmaf(a.w, b.w, acc);
}

// Shared memory of the score kernel: q [IH][ID + pad], one K tile [64][ID + pad], head weights [IH],
// per-(row, head lane) partial scores [64][17].
int ScoreSmemBytes(int heads, int dim) {
  return 4 * ((heads + kTileRows) * (dim + kPad) + heads + kTileRows * (kHeadLanes + 1));
}

__global__ void __launch_bounds__(kScoreThreads) IndexerScoreKernel(const IndexerParams p) {
  PdlEnter();
  extern __shared__ float4 smem4[];
  const int ld = p.dim + kPad, c4 = p.dim / 4;
  float* qs = reinterpret_cast<float*>(smem4);
  float* ks = qs + p.heads * ld;
  float* ws = ks + kTileRows * ld;
  float* part = ws + p.heads;
  const int64_t g = blockIdx.y, t = p.t0 + g;
  const int64_t n = VisibleRows(p, t);
  if (n <= p.k) return;  // padding, or every row is kept: no scores needed
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  if (blockIdx.x >= tiles) return;
  const int tid = threadIdx.x;
  const int64_t b = p.step.seq[t];

  const float* q = p.q + t * p.heads * p.dim;
  for (int i = tid; i < p.heads * c4; i += kScoreThreads) {
    const int h = i / c4, c = i % c4;
    *reinterpret_cast<float4*>(qs + h * ld + 4 * c) = reinterpret_cast<const float4*>(q + h * p.dim)[c];
  }
  for (int h = tid; h < p.heads; h += kScoreThreads) ws[h] = p.w[t * p.heads + h] * p.weight_scale;

  float* out = p.scores + g * p.max_rows;
  const int rl = tid % kRowLanes, hl = tid / kRowLanes;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t row0 = tile * kTileRows;
    __syncthreads();  // q / weights stored (first tile); ks and part free again (later tiles)
    for (int i = tid; i < kTileRows * c4; i += kScoreThreads) {
      const int r = i / c4, c = i % c4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (row0 + r < n) {
        const int64_t phys = attn::PhysicalRow(p.index_tables, b, row0 + r, p.cache.page_rows);
        if (phys >= 0) v = reinterpret_cast<const float4*>(attn::F32Row(p.cache, phys))[c];
      }
      *reinterpret_cast<float4*>(ks + r * ld + 4 * c) = v;
    }
    __syncthreads();

    float sum[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int hb = 0; hb < p.heads; hb += 4 * kHeadLanes) {
      float acc[8][4] = {};
      bool valid[4];
      const float* qrow[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int h = hb + hl + kHeadLanes * i;
        valid[i] = h < p.heads;
        qrow[i] = qs + (valid[i] ? h : 0) * ld;
      }
      for (int c = 0; c < p.dim; c += 4) {
        float4 kv[8], qv[4];
#pragma unroll
        for (int r = 0; r < 8; ++r) kv[r] = *reinterpret_cast<const float4*>(ks + (rl + kRowLanes * r) * ld + c);
#pragma unroll
        for (int i = 0; i < 4; ++i) qv[i] = *reinterpret_cast<const float4*>(qrow[i] + c);
#pragma unroll
        for (int r = 0; r < 8; ++r) {
#pragma unroll
          for (int i = 0; i < 4; ++i) Fma4(acc[r][i], kv[r], qv[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (!valid[i]) continue;
        const float wh = ws[hb + hl + kHeadLanes * i];
#pragma unroll
        for (int r = 0; r < 8; ++r) sum[r] = fmaf(wh, fmaxf(acc[r][i], 0.f), sum[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) part[(rl + kRowLanes * r) * (kHeadLanes + 1) + hl] = sum[r];
    __syncthreads();
    if (tid < kTileRows && row0 + tid < n) {
      float s = 0.f;
      for (int h = 0; h < kHeadLanes; ++h) s += part[tid * (kHeadLanes + 1) + h];
      out[row0 + tid] = s;
    }
  }
}

// ---- tensor-core scores at IH = 64, ID = 128 ----

constexpr int kMmaHeads = 64, kMmaDim = 128;
constexpr int kMmaThreads = 128;              // 4 warps x 16 heads
constexpr int kMmaLd = kMmaDim + 8;           // fp32 K tile row stride (= 8 mod 32 banks): the float2 fragment
                                              // reads of a half-warp (rows g < 4, columns 2 t4) hit 16 bank pairs
constexpr int kPartLd = kTileRows + 8;        // relu(q . k) [head][row]
constexpr int kLoadsPerThread = kTileRows * kMmaDim / 4 / kMmaThreads;  // float4s of a tile per thread

int ScoreMmaSmemBytes() { return 4 * (kTileRows * kMmaLd + kMmaHeads * kPartLd + kMmaHeads) + 2 * kTileRows * 8; }

// 16 bytes global -> shared without registers (sm_80+); zeros when !valid (src is then not read).
__device__ __forceinline__ void CpAsync16(float* dst, const float* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
#endif
}
__device__ __forceinline__ void CpAsyncWaitAll() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// Two fp32 values that are exactly bf16 (low 16 bits zero) as a bf16x2 word, the first in the low half.
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}
__device__ __forceinline__ uint32_t LowBits(float2 v) { return __float_as_uint(v.x) | __float_as_uint(v.y); }

__device__ __forceinline__ void MmaBf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// The reference's relu (std::max(0.f, x): +0 for x <= 0 and NaN).
__device__ __forceinline__ float Relu(float x) { return x > 0.f ? x : 0.f; }

__global__ void __launch_bounds__(kMmaThreads, 4) IndexerScoreMmaKernel(const IndexerParams p) {
  PdlEnter();
  extern __shared__ float4 smem4[];
  float* ks = reinterpret_cast<float*>(smem4);  // [64 rows][kMmaLd]
  float* part = ks + kTileRows * kMmaLd;        // [64 heads][kPartLd]
  float* ws = part + kMmaHeads * kPartLd;       // [64] w * weight_scale
  const float** rows_s = reinterpret_cast<const float**>(ws + kMmaHeads);  // [2][64] row pointers, two tiles
  const int64_t g = blockIdx.y, t = p.t0 + g;
  const int64_t n = VisibleRows(p, t);
  if (n <= p.k) return;  // padding, or every row is kept: no scores needed
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  if (blockIdx.x >= tiles) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, t4 = lane & 3;
  const int64_t b = p.step.seq[t];
  const int page_rows = p.cache.page_rows;

  // This warp's 16 heads of q as mma A fragments (rows = heads, columns = dims), for the whole kernel.
  const float* q = p.q + t * kMmaHeads * kMmaDim;
  const float* q0 = q + (16 * warp + gq) * kMmaDim + 2 * t4;
  const float* q8 = q0 + 8 * kMmaDim;
  uint32_t qa[kMmaDim / 16][4];
  uint32_t bad = 0;
#pragma unroll
  for (int s = 0; s < kMmaDim / 16; ++s) {
    const float2 x0 = *reinterpret_cast<const float2*>(q0 + 16 * s), x1 = *reinterpret_cast<const float2*>(q8 + 16 * s);
    const float2 x2 = *reinterpret_cast<const float2*>(q0 + 16 * s + 8),
                 x3 = *reinterpret_cast<const float2*>(q8 + 16 * s + 8);
    bad |= LowBits(x0) | LowBits(x1) | LowBits(x2) | LowBits(x3);
    qa[s][0] = PackBf16(x0.x, x0.y);
    qa[s][1] = PackBf16(x1.x, x1.y);
    qa[s][2] = PackBf16(x2.x, x2.y);
    qa[s][3] = PackBf16(x3.x, x3.y);
  }
  if (tid < kMmaHeads) ws[tid] = __fmul_rn(p.w[t * kMmaHeads + tid], p.weight_scale);
  const bool q_exact = !__syncthreads_or((bad & 0xffffu) != 0);

  float* out = p.scores + g * p.max_rows;
  // Row pointer of visible row `row` (null past n or for a missing page).
  const auto row_ptr = [&](int64_t row) -> const float* {
    if (row >= n) return nullptr;
    const int32_t page = p.index_tables.pages[b * p.index_tables.stride + static_cast<int32_t>(row) / page_rows];
    if (page < 0) return nullptr;
    return reinterpret_cast<const float*>(p.cache.base + page * p.cache.page_bytes) +
           (static_cast<int32_t>(row) % page_rows) * kMmaDim;
  };
  if (tid < kTileRows) rows_s[tid] = row_ptr(blockIdx.x * int64_t{kTileRows} + tid);
  for (int64_t tile = blockIdx.x, it = 0; tile < tiles; tile += gridDim.x, ++it) {
    const int64_t row0 = tile * kTileRows;
    const float** rows = rows_s + (it & 1) * kTileRows;
    __syncthreads();  // ks and part free again (the previous tile's head sums are done); `rows` written
    // The tile by 16-byte cp.async copies: a warp copies whole 512-byte rows (coalesced; conflict-free shared
    // stores), zeros for null rows; then the next tile's row pointers (their table reads overlap the copies).
#pragma unroll
    for (int j = 0; j < kLoadsPerThread; ++j) {
      const int i = tid + kMmaThreads * j, r = i / (kMmaDim / 4), c = i % (kMmaDim / 4);
      const float* src = rows[r];
      CpAsync16(ks + r * kMmaLd + 4 * c, src != nullptr ? src + 4 * c : p.q, src != nullptr);
    }
    if (tid < kTileRows) rows_s[((it + 1) & 1) * kTileRows + tid] = row_ptr(row0 + gridDim.x * kTileRows + tid);
    CpAsyncWaitAll();
    __syncthreads();

    // acc[nt] = q[16 heads] . K[rows 8 nt .. 8 nt + 7]^T; the rows' fp32 bits say whether they are exactly bf16.
    float acc[kTileRows / 8][4];
    uint32_t kbad = 0;
#pragma unroll
    for (int nt = 0; nt < kTileRows / 8; ++nt) {
      acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
      const float* kr = ks + (8 * nt + gq) * kMmaLd + 2 * t4;
#pragma unroll
      for (int s = 0; s < kMmaDim / 16; ++s) {
        const float2 y0 = *reinterpret_cast<const float2*>(kr + 16 * s),
                     y1 = *reinterpret_cast<const float2*>(kr + 16 * s + 8);
        kbad |= LowBits(y0) | LowBits(y1);
        MmaBf16(acc[nt], qa[s], PackBf16(y0.x, y0.y), PackBf16(y1.x, y1.y));
      }
    }
    const bool exact = q_exact && !__any_sync(attn::kFullMask, (kbad & 0xffffu) != 0);
    if (exact) {
      float* p0 = part + (16 * warp + gq) * kPartLd + 2 * t4;
      float* p8 = p0 + 8 * kPartLd;
#pragma unroll
      for (int nt = 0; nt < kTileRows / 8; ++nt) {
        *reinterpret_cast<float2*>(p0 + 8 * nt) = make_float2(Relu(acc[nt][0]), Relu(acc[nt][1]));
        *reinterpret_cast<float2*>(p8 + 8 * nt) = make_float2(Relu(acc[nt][2]), Relu(acc[nt][3]));
      }
    } else {  // not exactly bf16: this warp's 16 heads in fp32 (lane: rows lane and lane + 32)
#pragma unroll 1
      for (int i = 0; i < 32; ++i) {
        const int h = 16 * warp + i / 2, r = lane + 32 * (i % 2);
        const float4* qh = reinterpret_cast<const float4*>(q + h * kMmaDim);
        const float4* kr = reinterpret_cast<const float4*>(ks + r * kMmaLd);
        float dot = 0.f;
#pragma unroll 4
        for (int c = 0; c < kMmaDim / 4; ++c) Fma4(dot, kr[c], __ldg(qh + c));
        part[h * kPartLd + r] = Relu(dot);
      }
    }
    __syncthreads();
    // sum_h (w_h * weight_scale) * relu(q_h . k): h ascending, a rounded multiply then a rounded add, as the CPU.
    if (tid < kTileRows && row0 + tid < n) {
      float s = 0.f;
#pragma unroll 16
      for (int h = 0; h < kMmaHeads; ++h) s = __fadd_rn(s, __fmul_rn(ws[h], part[h * kPartLd + tid]));
      out[row0 + tid] = s;
    }
  }
}

__device__ __forceinline__ int32_t TargetRow(const IndexerParams& p, int64_t b, int64_t row) {
  return static_cast<int32_t>(attn::PhysicalRow(p.target_tables, b, row, p.cache.page_rows));
}

__global__ void __launch_bounds__(kTopkThreads) IndexerTopkKernel(const IndexerParams p) {
  PdlEnter();
  using Scan = cub::BlockScan<uint32_t, kTopkThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ uint32_t hist[256];
  __shared__ uint32_t found_bin, found_need;
  extern __shared__ uint32_t keys_s[];  // [topk_keys] order keys of the scores
  const int64_t g = blockIdx.x, t = p.t0 + g;
  const int tid = threadIdx.x, lane = tid & 31;
  int32_t* out = p.selected + t * p.k;
  const int64_t n = VisibleRows(p, t);
  const int64_t b = n >= 0 ? p.step.seq[t] : 0;
  if (n <= p.k) {  // padding (n = -1) or every visible row kept
    for (int64_t i = tid; i < p.k; i += kTopkThreads) out[i] = i < n ? TargetRow(p, b, i) : -1;
    if (tid == 0) p.selected_count[t] = static_cast<int32_t>(n < 0 ? 0 : n);
    return;
  }
  const float* score = p.scores + g * p.max_rows;
  // The keys once into shared memory (four independent loads in flight per thread), so the five passes below
  // read shared memory instead of waiting on L2 once per 512 rows each.
  const bool staged = n <= p.topk_keys;
  if (staged) {
    for (int64_t i0 = tid; i0 < n; i0 += 4 * kTopkThreads) {
      float v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = i0 + u * kTopkThreads < n ? score[i0 + u * kTopkThreads] : 0.f;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (i0 + u * kTopkThreads < n) keys_s[i0 + u * kTopkThreads] = ScoreKey(v[u]);
      }
    }
  }
  const auto key_of = [&](int64_t i) { return staged ? keys_s[i] : ScoreKey(score[i]); };

  // Radix select of the k-th largest key, 8 bits at a time from the top.
  uint32_t prefix = 0, mask = 0, need = static_cast<uint32_t>(p.k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kTopkThreads) hist[i] = 0;
    __syncthreads();
    for (int64_t base = 0; base < n; base += kTopkThreads) {
      const int64_t i = base + tid;
      uint32_t bin = 256;  // none
      if (i < n) {
        const uint32_t key = key_of(i);
        if ((key & mask) == prefix) bin = (key >> shift) & 255u;
      }
      const unsigned peers = __match_any_sync(attn::kFullMask, bin);
      if (bin < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
    }
    __syncthreads();
    if (tid < 32) {
      // Lane l holds bins 255 - 8l - j, j < 8 (descending); find the bin where the count from the top reaches need.
      uint32_t c[8], total = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) total += (c[j] = hist[255 - 8 * lane - j]);
      uint32_t incl = total;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t v = __shfl_up_sync(attn::kFullMask, incl, o);
        if (lane >= o) incl += v;
      }
      uint32_t before = incl - total;
      if (before < need && need <= incl) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (before + c[j] >= need) {
            found_bin = 255 - 8 * lane - j;
            found_need = need - before;
            break;
          }
          before += c[j];
        }
      }
    }
    __syncthreads();
    prefix |= found_bin << shift;
    mask |= 255u << shift;
    need = found_need;
  }

  // Keys above `prefix` are all kept (k - need of them); of the keys equal to it, the first `need` rows.
  uint32_t gt_base = 0, eq_base = 0;
  for (int64_t base = 0; base < n; base += kTopkThreads) {
    const int64_t i = base + tid;
    uint32_t gt = 0, eq = 0;
    if (i < n) {
      const uint32_t key = key_of(i);
      gt = key > prefix;
      eq = key == prefix;
    }
    uint32_t before, total;
    Scan(scan_tmp).ExclusiveSum((gt << 16) | eq, before, total);
    const uint32_t gt_before = gt_base + (before >> 16), eq_before = eq_base + (before & 0xffffu);
    if (gt || (eq && eq_before < need)) out[gt_before + min(eq_before, need)] = TargetRow(p, b, i);
    gt_base += total >> 16;
    eq_base += total & 0xffffu;
    __syncthreads();  // scan_tmp is reused
  }
  if (tid == 0) p.selected_count[t] = p.k;
}

absl::Status Check(const IndexerArgs& a) {
  DSV4_RETURN_IF_ERROR(attn::CheckStepIndex(a.step, "Indexer"));
  DSV4_RETURN_IF_ERROR(attn::CheckPool(a.cache, "Indexer pool"));
  DSV4_RETURN_IF_ERROR(attn::CheckTables(a.index_tables, "Indexer index_tables"));
  DSV4_RETURN_IF_ERROR(attn::CheckTables(a.target_tables, "Indexer target_tables"));
  if (a.cache.format != KvFormat::kF32 || a.cache.dim != a.dim) {
    return absl::InvalidArgumentError(absl::StrCat("Indexer: the indexer pool must hold kF32 rows of dim ", a.dim,
                                                   " (pool dim ", a.cache.dim, ")"));
  }
  if (a.q == nullptr || a.w == nullptr || a.selected == nullptr || a.selected_count == nullptr) {
    return absl::InvalidArgumentError("Indexer: q, w, selected or selected_count is null");
  }
  if (a.heads < 1 || a.heads > 256 || a.dim < 4 || a.dim > 512 || a.dim % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Indexer: ", a.heads, " heads of ", a.dim,
                                                   " dims (1..256 heads, dims a multiple of 4 up to 512)"));
  }
  if (a.k < 1 || a.k > 65535 || a.max_rows < 0 || a.max_rows > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("Indexer: k is ", a.k, ", max_rows ", a.max_rows,
                                                   " (1 <= k <= 65535, 0 <= max_rows < 2^31)"));
  }
  return absl::OkStatus();
}

int64_t ScoreRowFloats(int64_t max_rows) { return (std::max<int64_t>(max_rows, 1) + 3) / 4 * 4; }

}  // namespace

int64_t IndexerScratchBytes(const StepLimits& limits) {
  const int64_t group = std::clamp<int64_t>(limits.max_tokens, 1, kMaxGroup);
  return group * ScoreRowFloats((limits.max_context + 3) / 4) * 4;
}

absl::Status LaunchIndexer(const IndexerArgs& a, const CudaScratch& scratch, cudaStream_t stream) {
  DSV4_RETURN_IF_ERROR(Check(a));
  if (a.step.t == 0) return absl::OkStatus();
  const int64_t row_floats = ScoreRowFloats(a.max_rows);
  const int64_t group = std::min<int64_t>({a.step.t, kMaxGroup, scratch.bytes / (row_floats * 4)});
  if (group < 1 || scratch.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("Indexer: scratch of ", scratch.bytes, " bytes holds no row of ",
                                                   row_floats, " scores (IndexerScratchBytes sizes it)"));
  }
  const bool mma = a.heads == kMmaHeads && a.dim == kMmaDim;
  const int smem = mma ? ScoreMmaSmemBytes() : ScoreSmemBytes(static_cast<int>(a.heads), static_cast<int>(a.dim));
  int device = 0, smem_optin = 0;
  DSV4_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  DSV4_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int sms = CurrentDeviceSms();
  if (smem > smem_optin) {
    return absl::InvalidArgumentError(absl::StrCat("Indexer: ", a.heads, " x ", a.dim, " needs ", smem,
                                                   " bytes of shared memory; this GPU allows ", smem_optin));
  }
  if (smem > 48 * 1024) {
    DSV4_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(mma ? IndexerScoreMmaKernel : IndexerScoreKernel,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  // One wave: as many blocks per token as fit on the GPU at once for this group (a second, partial wave of
  // blocks that each stride over many tiles would double the time); each block strides over tiles.
  int resident = 0;
  DSV4_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &resident, mma ? IndexerScoreMmaKernel : IndexerScoreKernel, mma ? kMmaThreads : kScoreThreads, smem));
  const int64_t tiles = std::max<int64_t>(1, (a.max_rows + kTileRows - 1) / kTileRows);
  const int64_t per_token = std::clamp<int64_t>(std::max(resident, 1) * int64_t{sms} / group, 1, tiles);
  // Top-k keys staged in shared memory up to the opt-in limit (less the kernel's static shared memory).
  const int64_t topk_keys = std::min<int64_t>(row_floats, (smem_optin - 8192) / 4);
  const int topk_smem = static_cast<int>(std::max<int64_t>(topk_keys, 0) * 4);
  if (topk_smem > 48 * 1024) {
    DSV4_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(IndexerTopkKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, topk_smem));
  }
  IndexerParams p{.q = a.q, .w = a.w, .weight_scale = a.weight_scale, .cache = a.cache,
                  .index_tables = a.index_tables, .target_tables = a.target_tables, .step = a.step,
                  .selected = a.selected, .selected_count = a.selected_count, .heads = static_cast<int>(a.heads),
                  .dim = static_cast<int>(a.dim), .k = static_cast<int>(a.k), .max_rows = a.max_rows,
                  .scores = static_cast<float*>(scratch.data), .topk_keys = topk_keys};
  for (int64_t t0 = 0; t0 < a.step.t; t0 += group) {
    const int64_t g = std::min(group, a.step.t - t0);
    p.t0 = t0;
    const dim3 grid(static_cast<unsigned>(per_token), static_cast<unsigned>(g));
    DSV4_RETURN_IF_ERROR(CudaStatus(mma ? LaunchPdl(IndexerScoreMmaKernel, grid, dim3(kMmaThreads), smem, stream, p)
                                        : LaunchPdl(IndexerScoreKernel, grid, dim3(kScoreThreads), smem, stream, p),
                                    "Indexer scores"));
    DSV4_RETURN_IF_ERROR(CudaStatus(
        LaunchPdl(IndexerTopkKernel, dim3(static_cast<unsigned>(g)), dim3(kTopkThreads), topk_smem, stream, p),
        "Indexer top-k"));
  }
  return absl::OkStatus();
}

}  // namespace dsv4::kernels::cuda
