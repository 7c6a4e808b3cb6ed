// The ops interface: every computation of the DeepSeek-V4 forward, as plain argument structs over buffers
// the caller owns. model/dsv4 writes the forward once against it; kernels/cpu is the readable fp32 reference
// backend and kernels/cuda the device one. docs/backend.md draws the seam.
//
// Rules that keep every op implementable on a GPU under CUDA graphs:
//  - Pointers are backend memory (Backend::Allocate): host memory for the CPU backend, device memory for CUDA.
//    An op never allocates after warm-up and never returns data to the host; the host sees results only
//    through Backend::CopyToHost.
//  - Sizes a launch depends on (T, B, N, ...) are host values fixed when the step is planned (a graph bucket's
//    sizes). Everything else - positions, block tables, counts, which rows exist - is read from backend
//    memory inside the op. A token with pos < 0 is padding: ops skip it (write nothing for it, or zeros).
//  - Data-dependent choices (compressor emission, indexer top-k, expert routing, which rows a query attends)
//    happen inside ops, never on the host between them.
//  - Ops return void and are enqueued in order on the backend's stream; a launch failure is kept by the
//    backend and surfaces as an absl::Status from Backend::Synchronize / CopyToHost.
//
// Shape letters (one vocabulary, used in every comment below):
//   T tokens of the step (rows of a batched op)   B sequences (chunks) of the step
//   D model dims       S mHC streams            H attention heads        Dh head dims (512)
//   G output groups    N / Kin out / in features of a linear              E experts   Ek experts per token
//   IH / ID indexer heads / dims                Ksel indexer top-k (rows a query keeps)
//   P rows per KV page R compress ratio          W sliding window          V vocabulary
// Residual streams, norms, mHC, softmax, router scores and compressor state are fp32 in every backend.
#pragma once

#include <cstdint>

#include "kernels/weights.h"

namespace dsv4::kernels {

// Element type of an activation buffer.
enum class DType { kF32, kBF16 };

// A dense [rows, cols] activation with a row stride in elements (0 = cols).
struct ActView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
};

// How KV rows are stored in a pool. kF32: `dim` floats per row (exact mode). kFp8Row584: the 584-byte
// V4 record of dsv4-decode.md §3.1 (448 e4m3 nope dims + 64 bf16 rope dims, ue8m0 scales in a page footer).
enum class KvFormat { kF32, kFp8Row584 };

// One layer's slice of a paged KV pool. A physical row id is page * page_rows + row_in_page.
struct KvCacheView {
  uint8_t* base = nullptr;   // first byte of page 0 of this layer
  KvFormat format = KvFormat::kF32;
  int dim = 0;               // logical dims per row (512 main, 128 indexer)
  int page_rows = 0;         // P
  int64_t page_bytes = 0;    // stride between pages
};

// Bytes of one page of page_rows rows (kFp8Row584: [P x 576 data][P x 8 scales], rounded up to 576 B).
int64_t KvPageBytes(KvFormat format, int dim, int page_rows);

// The step's token -> sequence map, as a device holds it (filled once a step from the plan).
// Sequence b's tokens are the flat range [seq_first[b], seq_first[b] + seq_len[b]) at consecutive positions
// starting with pos[seq_first[b]]. A padding sequence has seq_len 0; a padding token has pos < 0.
struct StepIndex {
  const int32_t* pos = nullptr;         // [T]
  const int32_t* seq = nullptr;         // [T] sequence b of each token
  const int32_t* seq_first = nullptr;   // [B]
  const int32_t* seq_len = nullptr;     // [B]
  const int32_t* state_slot = nullptr;  // [B] compressor/indexer state slot of each sequence
  int64_t t = 0;                        // T
  int64_t b = 0;                        // B
  int max_seq_len = 1;                  // host bound on seq_len (1 for decode-only steps)
};

// One pool's block tables: row b lists sequence b's physical page ids in logical order.
struct BlockTables {
  const int32_t* pages = nullptr;  // [B, stride]
  int64_t stride = 0;              // max pages per sequence
};

// ---- dense ops ----

// x[t, s, :] = embed[token[t]] for every stream s (padding tokens: zeros).
struct EmbedArgs {
  const LinearWeight* table = nullptr;  // [V, D] (BF16 or F32)
  const int32_t* tokens = nullptr;      // [T]
  const int32_t* pos = nullptr;         // [T] (pos < 0: padding)
  float* x = nullptr;                   // [T, S, D]
  int64_t t = 0, s = 4;
};

// y[t, g*N + n] = sum_k x[t, g*Kin + k] * W[g*N + n, k] for g < groups (the grouped output projection:
// W holds the groups' [N, Kin] blocks stacked, [groups*N, Kin]). Backends may round x to bf16 (tensor-core
// GEMMs); accumulation is fp32.
struct LinearArgs {
  const LinearWeight* w = nullptr;  // [groups*N, Kin]
  ActView x;                        // [T, groups*Kin], row stride x_stride
  float* y = nullptr;               // [T, groups*N], row stride y_stride
  int64_t t = 0;
  int groups = 1;
  int64_t x_stride = 0, y_stride = 0;  // elements; 0 = dense
};

// Several linears over one input, as one op (the projections a layer computes from the same x: wq_a, wkv and the
// compressor and indexer projections from the normed hidden state; wq_b and the indexer's wq_b from c_q). For
// i < count:  out[i].y[t, n] = sum_k x[t, k] * out[i].w[n, k]. Every weight has the same Kin (N and format may
// differ); groups are 1. Each output equals what
//   Linear({.w = out[i].w, .x = x, .y = out[i].y, .t = t, .x_stride = x_stride, .y_stride = out[i].y_stride})
// gives on the same backend up to the summation order of its fp32 sums: the CPU backend runs exactly those calls
// (bit for bit), a device backend may run all of them in one launch. The outputs must not overlap x or each other.
inline constexpr int kMaxFusedLinears = 8;
struct FusedLinearOut {
  const LinearWeight* w = nullptr;  // [N_i, Kin]
  float* y = nullptr;               // [T, N_i], row stride y_stride
  int64_t y_stride = 0;             // elements; 0 = N_i
};
struct FusedLinearArgs {
  ActView x;                        // [T, Kin], row stride x_stride
  int64_t t = 0;
  int64_t x_stride = 0;             // elements; 0 = Kin
  int count = 0;                    // 0..kMaxFusedLinears
  FusedLinearOut out[kMaxFusedLinears] = {};
};

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * (w or 1) for r < rows; out may alias x.
struct RmsNormArgs {
  const float* x = nullptr;  // [rows, dim]
  const float* w = nullptr;  // [dim] or null for the unweighted norm
  float* out = nullptr;      // [rows, dim]
  int64_t rows = 0, dim = 0;
  float eps = 1e-6f;
};

// Interleaved-pair rotation of the last 2*pairs dims of each row, in place:
// (x[2i], x[2i+1]) -> (x cos - y sin, x sin + y cos), angle = pos * inv_freq[i] (negated when inverse).
// Rows of padding tokens are left as they are.
struct RopeArgs {
  float* x = nullptr;               // [T, heads, row_dim]
  const int32_t* pos = nullptr;     // [T]
  const float* inv_freq = nullptr;  // [pairs]
  int64_t t = 0, heads = 0, row_dim = 0;
  int pairs = 32;
  bool inverse = false;
};

// RmsNorm then Rope of the normed rows: norm.out == rope.x, norm.rows == rope.t * rope.heads, norm.dim ==
// rope.row_dim (the per-head q norm and the kv norm, both in place; norm.x may differ from norm.out).
// Ops::NormRope runs the two ops; a backend may fuse them into one pass (the CUDA backend: one kernel, the same
// bits as the two; other arguments run the two ops there too).
struct NormRopeArgs {
  RmsNormArgs norm;
  RopeArgs rope;
};

// mHC pre: from the residual streams X[T, S, D] computes the mix weights and the Sinkhorn comb, and the
// sublayer input u[t] = sum_i pre_i X_i (before the sublayer's RMSNorm).
struct HcPreArgs {
  const float* x = nullptr;     // [T, S, D]
  const float* fn = nullptr;    // [(2 + S) * S, S * D]
  const float* base = nullptr;  // [(2 + S) * S]
  const float* scale = nullptr; // [3]
  float* u = nullptr;           // [T, D]
  float* post = nullptr;        // [T, S]
  float* comb = nullptr;        // [T, S, S]   comb[i][j]: weight of input stream i in output stream j
  int64_t t = 0, s = 4, d = 0;
  int sinkhorn_iters = 20;
  float norm_eps = 1e-6f, hc_eps = 1e-6f;
};

// mHC pre then the sublayer's RMSNorm of its output u, in place: norm.x == norm.out == pre.u, norm.rows == pre.t,
// norm.dim == pre.d. Ops::HcPreNorm runs the two ops; the CUDA backend normalises u in the finish kernel of the
// mHC pre (the same bits as the two; other arguments run the two ops there too).
struct HcPreNormArgs {
  HcPreArgs pre;
  RmsNormArgs norm;
};

// mHC post: X'[t, j] = post[t, j] * y[t] + sum_i comb[t, i, j] * X[t, i]. x_out must not alias x.
struct HcPostArgs {
  const float* x = nullptr;     // [T, S, D]
  const float* y = nullptr;     // [T, D]
  const float* post = nullptr;  // [T, S]
  const float* comb = nullptr;  // [T, S, S]
  float* x_out = nullptr;       // [T, S, D]
  int64_t t = 0, s = 4, d = 0;
};

// HC head: h[t] = sum_i (sigmoid(scale * m_i + base_i) + eps) X_i with m = rms(x) * fn . vec(X), for the
// rows named by `rows` (the tokens whose logits are wanted).
struct HcHeadArgs {
  const float* x = nullptr;       // [T, S, D]
  const int32_t* rows = nullptr;  // [R] token indices into x
  const float* fn = nullptr;      // [S, S * D]
  const float* base = nullptr;    // [S]
  const float* scale = nullptr;   // [1]
  float* h = nullptr;             // [R, D]
  int64_t r = 0, s = 4, d = 0;
  float norm_eps = 1e-6f, hc_eps = 1e-6f;
};

// Per-row scale: x[r, i] *= scale for r < rows, i < dim.
struct ScaleArgs {
  float* x = nullptr;
  int64_t rows = 0, dim = 0;
  float scale = 1.f;
};

// ---- KV cache and attention ----

// The window pool of a layer is a ring of W rows per sequence (position p in logical row p mod W) plus a
// staging area of T rows after the pages (physical rows staging_row0 + t), which holds this step's keys so
// that a prefill chunk's tokens can attend keys that later tokens of the same chunk overwrite in the ring.
// Two phases:
//   commit = false (before attention): every token's key -> its staging row; a sequence's FIRST token of
//            the step -> also its ring row (no other token of the step needs what that ring row held).
//   commit = true (after attention; only needed when max_seq_len > 1): the other tokens whose position is
//            among their sequence's last W of the step -> their ring rows.
struct KvWindowWriteArgs {
  const float* rows = nullptr;  // [T, dim] the keys
  KvCacheView cache;            // window pool of this layer
  StepIndex step;
  BlockTables tables;           // window pool
  int32_t staging_row0 = 0;
  int window = 128;             // W
  bool commit = false;
};

// One softmax-pooling compressor (ratio R; C = 2 overlapping halves when R = 4, else 1) stepped over every
// token of the step in order within each sequence (dsv4-decode.md §2.3). State of slot s: kv/score rows
// [C*R, C*d] at state_kv + s * state_stride (initialised 0 / -inf). When token p closes a window
// ((p + 1) % R == 0) the pooled row is RMS-normalised with norm_w, rotated at position p + 1 - R,
// Hadamard + FP4-simulated when hadamard_fp4, and written to compressed row n = p / R of the sequence
// (physical row through `tables`).
struct CompressorArgs {
  float* state_kv = nullptr;     // [slots, C*R, C*d]
  float* state_score = nullptr;  // [slots, C*R, C*d]
  int64_t state_stride = 0;      // floats between slots
  const float* kv = nullptr;     // [T, C*d] W_kv a
  const float* gate = nullptr;   // [T, C*d] W_gate a (ape is added here)
  const float* ape = nullptr;    // [R, C*d]
  const float* norm_w = nullptr; // [d]
  const float* inv_freq = nullptr;  // [pairs]
  KvCacheView cache;             // the compressed (or indexer) pool of this layer
  BlockTables tables;            // that pool's block tables
  StepIndex step;
  int ratio = 4, d = 512, pairs = 32;
  float eps = 1e-6f;
  bool hadamard_fp4 = false;     // the indexer's rows in production mode
};

// Lightning indexer: for each token t at position p, scores the sequence's visible indexer rows
// n < (p + 1) / 4 by sum_h w[t,h] * weight_scale * relu(q[t,h] . K_n), keeps the top min(Ksel, rows)
// (ties: lower row first) and writes their PHYSICAL ids in the compressed pool to selected[t, :] (ascending
// logical order, -1 past selected_count[t]). Work is proportional to the rows that exist, not to the pool.
struct IndexerArgs {
  const float* q = nullptr;       // [T, IH, ID]
  const float* w = nullptr;       // [T, IH]
  float weight_scale = 1.f;
  KvCacheView cache;              // indexer pool of this layer
  BlockTables index_tables;       // indexer pool
  BlockTables target_tables;      // compressed pool (ratio 4)
  StepIndex step;
  int32_t* selected = nullptr;        // [T, Ksel]
  int32_t* selected_count = nullptr;  // [T]
  int64_t heads = 0, dim = 128, k = 0;  // IH, ID, Ksel
  int64_t max_rows = 0;               // host bound on visible rows (the planned max context / 4)
};

// Sparse attention with a per-head sink (value = key): for token t at position p,
//   o_h = sum_j e^{s_j} k_j / (e^{sink_h} + sum_j e^{s_j}),  s_j = scale * q_h . k_j,
// one softmax over the window keys (positions max(0, p-W+1) .. p: ring rows for positions before the
// sequence's first token of the step, staging rows for this step's) and the compressed keys: all visible
// rows n < (p + 1) / R through compressed_tables (compressed_ratio 128), or selected[t, :] (ratio 4), or none
// (ratio 0). Padding tokens get zeros.
struct AttentionArgs {
  const float* q = nullptr;               // [T, H, Dh]
  KvCacheView window;
  BlockTables window_tables;
  int32_t staging_row0 = 0;
  int window_size = 128;                  // W
  KvCacheView compressed;                 // unused when compressed_ratio == 0
  BlockTables compressed_tables;          // ratio 128
  int compressed_ratio = 0;               // 0, 4 or 128
  const int32_t* selected = nullptr;      // ratio 4: [T, Ksel] physical ids
  const int32_t* selected_count = nullptr;  // ratio 4: [T]
  int64_t ksel = 0;                       // ratio 4: Ksel
  int64_t max_compressed = 0;             // host bound on compressed keys of one token
  StepIndex step;
  const float* sink = nullptr;            // [H]
  float* out = nullptr;                   // [T, H, Dh]
  int64_t heads = 0, dim = 512;
  float scale = 0.f;
};

// ---- mixture of experts ----

// Mixture of experts with sqrt-softplus router (fp32): hash routing (tid2eid) or top-Ek of score + bias,
// weights normalised over the chosen experts times routed_scale, SwiGLU with the clamp, plus the shared
// expert. Experts not held by this rank (experts->Holds(e) false) are skipped (expert parallel). Padding
// tokens give zeros.
struct MoeArgs {
  const float* x = nullptr;            // [T, D] normed input
  const int32_t* tokens = nullptr;     // [T] token ids (hash routing)
  const int32_t* pos = nullptr;        // [T] (pos < 0: padding)
  const LinearWeight* gate = nullptr;  // [E, D]
  const float* bias = nullptr;         // [E] or null (hash layers)
  const int32_t* tid2eid = nullptr;    // [V, Ek] or null (score layers)
  const ExpertWeights* experts = nullptr;
  const LinearWeight* shared_w1 = nullptr;  // [Is, D]
  const LinearWeight* shared_w3 = nullptr;  // [Is, D]
  const LinearWeight* shared_w2 = nullptr;  // [D, Is]
  float* y = nullptr;                  // [T, D]
  int64_t t = 0;
  int topk = 0;                        // Ek
  float routed_scale = 1.f, swiglu_limit = 10.f;
};

// ---- production-mode simulations (DeepSeek's reference) ----

// Hadamard (H / sqrt(dim)) then FP4 e2m1 round trip with one ue8m0 scale per 32 dims, in place on
// [rows, dim] fp32 rows.
struct HadamardFp4Args {
  float* x = nullptr;
  int64_t rows = 0, dim = 0;
};

// Fills n floats with `value` (state resets: 0 and -inf).
struct FillArgs {
  float* x = nullptr;
  int64_t n = 0;
  float value = 0.f;
};

// ---- sampling ----

// One row's sampling parameters (32 bytes, an array of them in backend memory, filled by the host each step).
struct SampleParams {
  float temperature = 0.f;  // 0 = greedy; < 0 or NaN: a padding row (its token is -1)
  int32_t top_k = 0;        // keep the k first tokens of the rank order; 0 (or >= V) = off, 1 = greedy
  float top_p = 1.f;        // keep the shortest rank-order prefix whose weight reaches top_p of the total; >= 1 = off
  float min_p = 0.f;        // drop tokens whose probability is below min_p times the top token's; <= 0 = off
  uint64_t seed = 0;        // the request's seed (Philox key)
  uint64_t index = 0;       // the generation index of the token drawn (Philox counter)
};
static_assert(sizeof(SampleParams) == 32);

// Draws one token per row (worker/sampler.h's policy; the arithmetic is kernels/sample_math.h, shared by every
// backend, so identical logits and parameters give the identical token on the CPU and the GPU):
//  - greedy (temperature 0, top_k 1, or a row with a NaN, a +inf or only -inf logits): the lowest id among the
//    largest logits (NaNs ignored, except that a NaN at id 0 gives 0, as a plain `>` scan does);
//  - else x_i = (l_i - max) / temperature, p_i = e^{x_i} (relative to the top token; 0 below x = -30), weight
//    w_i = floor(p_i * 2^44). Rank order: larger logit first, then lower id. Filters in vLLM's order:
//    top-k keeps the first k ranks; top-p keeps the shortest rank prefix (of the top-k set) whose weight sum
//    reaches top_p * (the top-k set's weight sum), compared in double; min-p drops p_i < min_p. The survivors'
//    weights sum to S (S = 0: greedy); the 53 bits of Philox4x32-10(key = seed, counter = index) give
//    target = floor(bits * S / 2^53), and the token is the first survivor in id order whose running weight sum
//    exceeds the target.
// All sums are exact integers, so the result does not depend on summation order.
struct SampleArgs {
  const float* logits = nullptr;         // [R, V] row stride logits_stride
  const SampleParams* params = nullptr;  // [R]
  int32_t* tokens = nullptr;             // [R] the drawn token ids (-1 for padding rows)
  int64_t r = 0;                         // R rows (a host value: the launch depends on it)
  int64_t v = 0;                         // V tokens per row, 1 <= V <= 2^19 (a vocabulary or a shard of it)
  int64_t logits_stride = 0;             // elements between rows; 0 = V
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual void Embed(const EmbedArgs& a) = 0;
  virtual void Linear(const LinearArgs& a) = 0;
  virtual void FusedLinear(const FusedLinearArgs& a) = 0;
  virtual void RmsNorm(const RmsNormArgs& a) = 0;
  virtual void Rope(const RopeArgs& a) = 0;
  // The composition (the reference); CudaOps overrides it with one kernel.
  virtual void NormRope(const NormRopeArgs& a) {
    RmsNorm(a.norm);
    Rope(a.rope);
  }
  virtual void HcPre(const HcPreArgs& a) = 0;
  // The composition (the reference); CudaOps overrides it with one kernel fewer.
  virtual void HcPreNorm(const HcPreNormArgs& a) {
    HcPre(a.pre);
    RmsNorm(a.norm);
  }
  virtual void HcPost(const HcPostArgs& a) = 0;
  virtual void HcHead(const HcHeadArgs& a) = 0;
  virtual void Scale(const ScaleArgs& a) = 0;
  virtual void KvWindowWrite(const KvWindowWriteArgs& a) = 0;
  virtual void Compressor(const CompressorArgs& a) = 0;
  virtual void Indexer(const IndexerArgs& a) = 0;
  virtual void Attention(const AttentionArgs& a) = 0;
  virtual void Moe(const MoeArgs& a) = 0;
  virtual void HadamardFp4(const HadamardFp4Args& a) = 0;
  virtual void Fill(const FillArgs& a) = 0;
  virtual void Sample(const SampleArgs& a) = 0;
};

}  // namespace dsv4::kernels
