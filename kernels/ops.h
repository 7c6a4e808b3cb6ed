// The ops interface: every computation of the DeepSeek-V4 forward, as plain views (pointer + shape).
//
// model/dsv4 writes the forward once against this interface; kernels/cpu is the readable fp32 reference
// backend and a CUDA backend implements the same calls. Rules that keep the interface implementable on a GPU
// under CUDA graphs: arguments are raw pointers into buffers the caller owns (no allocation in an op), sizes
// and positions are host values known when the step is planned, and data-dependent choices (top-k selection,
// expert routing, which rows a query attends) happen inside ops, never on the host between them.
//
// Shape letters: T tokens (rows of a batched op), D model dims, H heads, Dh head dims, N/K linear out/in,
// E experts, K top-k, R compress ratio. All activations are fp32, row-major, dense unless a stride is given.
#pragma once

#include <cstdint>

namespace dsv4::kernels {

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

// y[T, N] = x[T, K] . W[N, K]^T (+ y when accumulate). Strides in elements between rows of x and y.
struct LinearArgs {
  const float* x = nullptr;  // [T, K], row stride x_stride
  const float* w = nullptr;  // [N, K], dense
  float* y = nullptr;        // [T, N], row stride y_stride
  int64_t t = 0, n = 0, k = 0;
  int64_t x_stride = 0, y_stride = 0;  // 0 means dense (k and n)
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
struct RopeArgs {
  float* x = nullptr;           // [T, heads, row_dim]
  const int32_t* pos = nullptr; // [T] position of each token
  const float* inv_freq = nullptr;  // [pairs]
  int64_t t = 0, heads = 0, row_dim = 0;
  int pairs = 32;
  bool inverse = false;
};

// mHC pre: from the residual streams X[T, S, D] (S = hc_mult) computes mix weights and Sinkhorn comb,
// and the sublayer input u[t] = sum_i pre_i X_i (before the sublayer's RMSNorm).
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

// mHC post: X'[t, j] = post[t, j] * y[t] + sum_i comb[t, i, j] * X[t, i]. x_out must not alias x.
struct HcPostArgs {
  const float* x = nullptr;     // [T, S, D]
  const float* y = nullptr;     // [T, D]
  const float* post = nullptr;  // [T, S]
  const float* comb = nullptr;  // [T, S, S]
  float* x_out = nullptr;       // [T, S, D]
  int64_t t = 0, s = 4, d = 0;
};

// HC head: h[t] = sum_i (sigmoid(scale * m_i + base_i) + eps) X_i with m = rms(x) * fn . vec(X).
struct HcHeadArgs {
  const float* x = nullptr;     // [T, S, D]
  const float* fn = nullptr;    // [S, S * D]
  const float* base = nullptr;  // [S]
  const float* scale = nullptr; // [1]
  float* h = nullptr;           // [T, D]
  int64_t t = 0, s = 4, d = 0;
  float norm_eps = 1e-6f, hc_eps = 1e-6f;
};

// One token's step of a softmax-pooling compressor (ratio R; C = 2 overlapping halves when R = 4, else 1).
// State rows: kv/score [C*R, C*d], initialised 0 / -inf. Writes the pooled (un-normalised) row to `pooled`
// and sets *emitted = 1 when (pos + 1) % R == 0, else *emitted = 0.
struct CompressorArgs {
  float* state_kv = nullptr;     // [C*R, C*d]
  float* state_score = nullptr;  // [C*R, C*d]
  const float* kv = nullptr;     // [C*d] this token's W_kv a
  const float* gate = nullptr;   // [C*d] this token's W_gate a (ape is added here)
  const float* ape = nullptr;    // [R, C*d]
  float* pooled = nullptr;       // [d]
  int32_t* emitted = nullptr;    // [1]
  int ratio = 4, d = 512;
  int32_t pos = 0;
};

// Lightning indexer for B queries: score rows t < count[b] by sum_h w[b,h] * relu(q[b,h] . K_t) and select
// the top min(k, count[b]) (ties: lower row first). Outputs the selected rows' ids in the compressed pool.
struct IndexerArgs {
  const float* q = nullptr;           // [B, H, Di]
  const float* w = nullptr;           // [B, H] (scaling already applied)
  KvCacheView cache;                  // indexer pool (kF32 rows of Di)
  const int32_t* index_rows = nullptr;   // [B, max_rows] physical ids of the sequence's indexer rows 0..count-1
  const int32_t* target_rows = nullptr;  // [B, max_rows] physical ids of the same rows in the compressed pool
  const int32_t* count = nullptr;        // [B]
  int32_t* out_rows = nullptr;           // [B, k] selected target ids, -1 past out_count
  int32_t* out_count = nullptr;          // [B]
  float* scratch = nullptr;              // [B, max_rows]
  int64_t b = 0, heads = 0, dim = 128, max_rows = 0, k = 0;
};

// Sparse attention with a per-head sink over window rows plus selected compressed rows (value = key):
// o_h = sum_j e^{s_j} k_j / (e^{sink_h} + sum_j e^{s_j}), s_j = scale * q_h . k_j, one softmax over both sets.
struct AttentionArgs {
  const float* q = nullptr;              // [B, H, Dh]
  KvCacheView window;                    // window pool of this layer
  const int32_t* window_rows = nullptr;  // [B, max_window] physical ids
  const int32_t* window_count = nullptr; // [B]
  KvCacheView compressed;                // compressed pool (base may be null when max_compressed == 0)
  const int32_t* compressed_rows = nullptr;   // [B, max_compressed]
  const int32_t* compressed_count = nullptr;  // [B]
  const float* sink = nullptr;           // [H]
  float* out = nullptr;                  // [B, H, Dh]
  int64_t b = 0, heads = 0, dim = 512, max_window = 0, max_compressed = 0;
  float scale = 0.f;
};

// Mixture of experts with sqrt-softplus router: hash routing (tid2eid) or top-k of score + bias, weights
// normalised over the chosen experts times routed_scale, SwiGLU with clamp, plus one shared expert.
struct MoeArgs {
  const float* x = nullptr;          // [T, D] normed input
  const int32_t* tokens = nullptr;   // [T] token ids (hash routing)
  const float* gate = nullptr;       // [E, D]
  const float* bias = nullptr;       // [E] or null (hash layers)
  const int32_t* tid2eid = nullptr;  // [vocab, K] or null (score layers)
  const float* const* w1 = nullptr;  // [E] pointers to [I, D]
  const float* const* w3 = nullptr;  // [E] pointers to [I, D]
  const float* const* w2 = nullptr;  // [E] pointers to [D, I]
  const float* shared_w1 = nullptr;  // [Is, D]
  const float* shared_w3 = nullptr;  // [Is, D]
  const float* shared_w2 = nullptr;  // [D, Is]
  float* y = nullptr;                // [T, D]
  int64_t t = 0, d = 0, experts = 0, inter = 0, shared_inter = 0, vocab = 0;
  int topk = 0;
  float routed_scale = 1.f, swiglu_limit = 10.f;
};

// Writes T rows of `dim` floats into a pool at the given physical row ids (quantising for kFp8Row584).
struct KvWriteArgs {
  const float* rows = nullptr;        // [T, dim]
  KvCacheView cache;
  const int32_t* row_ids = nullptr;   // [T]
  int64_t t = 0;
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual void Linear(const LinearArgs& a) = 0;
  virtual void RmsNorm(const RmsNormArgs& a) = 0;
  virtual void Rope(const RopeArgs& a) = 0;
  virtual void HcPre(const HcPreArgs& a) = 0;
  virtual void HcPost(const HcPostArgs& a) = 0;
  virtual void HcHead(const HcHeadArgs& a) = 0;
  virtual void Compressor(const CompressorArgs& a) = 0;
  virtual void Indexer(const IndexerArgs& a) = 0;
  virtual void Attention(const AttentionArgs& a) = 0;
  virtual void Moe(const MoeArgs& a) = 0;
  virtual void KvWrite(const KvWriteArgs& a) = 0;
  // Production-mode simulations of DeepSeek's reference, in place on [rows, dim] fp32 rows:
  // FP8 e4m3 round trip of the first `dims` dims with one ue8m0 scale per 64 dims;
  virtual void Fp8RoundTrip(float* x, int64_t rows, int64_t dim, int64_t dims) = 0;
  // Hadamard (H / sqrt(dim)) then FP4 e2m1 round trip with one ue8m0 scale per 32 dims.
  virtual void HadamardFp4RoundTrip(float* x, int64_t rows, int64_t dim) = 0;
};

}  // namespace dsv4::kernels
