// The attention sublayer of one layer (dsv4-decode.md §2.2-2.3, §6): mHC pre, the q path (low-rank q,
// per-head RMS, RoPE), the kv path (one shared latent key, RoPE), the compressor and indexer projections,
// the per-token cache update and key selection (kv_update.cc), sparse attention with the per-head sink over
// window + compressed rows, inverse RoPE of the output, the grouped output projection, mHC post.
#include <cmath>

#include "model/dsv4/forward.h"

namespace dsv4::model {
namespace {

// y[T, n] = x[T, k] . W^T with W [n, k].
void Linear(kernels::Ops& ops, const float* x, const Tensor& w, float* y, int64_t t) {
  ops.Linear({.x = x, .w = w.ptr(), .y = y, .t = t, .n = w.shape[0], .k = w.shape[1]});
}

}  // namespace

void AttentionSublayer(Dsv4Model::Impl& m, int layer, const StepBatch& batch, std::vector<float>& x) {
  const Config& c = m.config;
  const LayerWeights& w = m.weights->layers[layer];
  kernels::Ops& ops = *m.ops;
  const int64_t T = batch.size(), D = c.hidden_size, S = c.hc_mult, H = c.num_attention_heads, Dh = c.head_dim;
  const int64_t G = c.o_groups, QL = c.q_lora_rank, IH = c.index_n_heads, ID = c.index_head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int pairs = static_cast<int>(c.qk_rope_head_dim / 2);
  const float* inv_freq = m.inv_freq[layer].data();

  m.BeginPhase(metrics::Phase::kDense);  // mHC, norms and projections; the attention proper is timed below
  // mHC pre and the sublayer's RMSNorm.
  std::vector<float> a(T * D), post(T * S), comb(T * S * S);
  ops.HcPre({.x = x.data(), .fn = w.hc_attn_fn.ptr(), .base = w.hc_attn_base.ptr(), .scale = w.hc_attn_scale.ptr(),
             .u = a.data(), .post = post.data(), .comb = comb.data(), .t = T, .s = S, .d = D,
             .sinkhorn_iters = static_cast<int>(c.hc_sinkhorn_iters), .norm_eps = eps,
             .hc_eps = static_cast<float>(c.hc_eps)});
  ops.RmsNorm({.x = a.data(), .w = w.attn_norm.ptr(), .out = a.data(), .rows = T, .dim = D, .eps = eps});

  // q path: c_q = norm(W_qa a); q = W_qb c_q; per-head unweighted RMS; RoPE on the last rope dims.
  std::vector<float> cq(T * QL), q(T * H * Dh);
  Linear(ops, a.data(), w.wq_a, cq.data(), T);
  ops.RmsNorm({.x = cq.data(), .w = w.q_norm.ptr(), .out = cq.data(), .rows = T, .dim = QL, .eps = eps});
  Linear(ops, cq.data(), w.wq_b, q.data(), T);
  ops.RmsNorm({.x = q.data(), .w = nullptr, .out = q.data(), .rows = T * H, .dim = Dh, .eps = eps});
  ops.Rope({.x = q.data(), .pos = batch.pos.data(), .inv_freq = inv_freq, .t = T, .heads = H, .row_dim = Dh,
            .pairs = pairs});

  // kv path: one latent key per token (value = key).
  std::vector<float> kv(T * Dh);
  Linear(ops, a.data(), w.wkv, kv.data(), T);
  ops.RmsNorm({.x = kv.data(), .w = w.kv_norm.ptr(), .out = kv.data(), .rows = T, .dim = Dh, .eps = eps});
  ops.Rope({.x = kv.data(), .pos = batch.pos.data(), .inv_freq = inv_freq, .t = T, .heads = 1, .row_dim = Dh,
            .pairs = pairs});

  // Compressor and indexer projections of all tokens (their state steps happen per token below).
  LayerActivations act{.a = a.data(), .kv = kv.data()};
  std::vector<float> comp_kv, comp_gate, idx_q, idx_w, idx_kv, idx_gate;
  if (w.ratio > 0) {
    comp_kv.resize(T * w.compressor.wkv.shape[0]);
    comp_gate.resize(T * w.compressor.wgate.shape[0]);
    Linear(ops, a.data(), w.compressor.wkv, comp_kv.data(), T);
    Linear(ops, a.data(), w.compressor.wgate, comp_gate.data(), T);
    act.comp_kv = comp_kv.data();
    act.comp_gate = comp_gate.data();
  }
  if (w.ratio == 4) {
    idx_q.resize(T * IH * ID);
    Linear(ops, cq.data(), w.idx_wq_b, idx_q.data(), T);
    ops.Rope({.x = idx_q.data(), .pos = batch.pos.data(), .inv_freq = inv_freq, .t = T, .heads = IH, .row_dim = ID,
              .pairs = pairs});
    if (m.options.mode == NumericMode::kProduction) ops.HadamardFp4RoundTrip(idx_q.data(), T * IH, ID);
    idx_w.resize(T * IH);
    Linear(ops, a.data(), w.idx_weights_proj, idx_w.data(), T);
    const float wscale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ID)) / std::sqrt(static_cast<double>(IH)));
    for (float& v : idx_w) v *= wscale;
    idx_kv.resize(T * 2 * ID);
    idx_gate.resize(T * 2 * ID);
    Linear(ops, a.data(), w.idx_compressor.wkv, idx_kv.data(), T);
    Linear(ops, a.data(), w.idx_compressor.wgate, idx_gate.data(), T);
    act.idx_q = idx_q.data();
    act.idx_w = idx_w.data();
    act.idx_kv = idx_kv.data();
    act.idx_gate = idx_gate.data();
  }

  // Token by token: update the caches, then attend (a prefill chunk longer than the window reuses ring rows,
  // so each token must attend before later tokens overwrite them).
  m.BeginPhase(metrics::Phase::kAttention);  // cache update, key selection, sparse attention
  TokenKeys keys;
  keys.window_rows.resize(c.sliding_window);
  std::vector<float> o(T * H * Dh);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));
  for (int64_t t = 0; t < T; ++t) {
    // Ratio 128 attends every compressed row so far; ratio 4 at most index_topk of them.
    keys.compressed_rows.resize(w.ratio == 128 ? (batch.pos[t] + 1) / 128 + 1 : (w.ratio == 4 ? c.index_topk : 0));
    UpdateCacheAndSelect(m, layer, batch, t, act, keys);
    const KvPool cpool = w.ratio == 4 ? KvPool::kCompressed4 : KvPool::kCompressed128;
    ops.Attention({.q = q.data() + t * H * Dh, .window = m.cache->View(KvPool::kWindow, layer),
                   .window_rows = keys.window_rows.data(), .window_count = &keys.window_count,
                   .compressed = w.ratio > 0 ? m.cache->View(cpool, layer) : kernels::KvCacheView{},
                   .compressed_rows = keys.compressed_rows.data(), .compressed_count = &keys.compressed_count,
                   .sink = w.attn_sink.ptr(), .out = o.data() + t * H * Dh, .b = 1, .heads = H, .dim = Dh,
                   .max_window = c.sliding_window, .max_compressed = static_cast<int64_t>(keys.compressed_rows.size()),
                   .scale = scale});
  }

  // Undo the rotation the values carried, then the grouped output projection: group g (heads g*H/G ..)
  // -> o_lora dims through its own slice of W_oa, then W_ob over all groups.
  ops.Rope({.x = o.data(), .pos = batch.pos.data(), .inv_freq = inv_freq, .t = T, .heads = H, .row_dim = Dh,
            .pairs = pairs, .inverse = true});
  m.BeginPhase(metrics::Phase::kDense);  // the grouped output projection and mHC post
  const int64_t OL = c.o_lora_rank, group_in = H * Dh / G;
  std::vector<float> z(T * G * OL), y(T * D);
  for (int64_t g = 0; g < G; ++g) {
    ops.Linear({.x = o.data() + g * group_in, .w = w.wo_a.ptr() + g * OL * group_in, .y = z.data() + g * OL, .t = T,
                .n = OL, .k = group_in, .x_stride = H * Dh, .y_stride = G * OL});
  }
  Linear(ops, z.data(), w.wo_b, y.data(), T);
  m.AllReduce(y.data(), T * D);  // tensor parallel: each rank projected only its heads

  std::vector<float> x_out(x.size());
  ops.HcPost({.x = x.data(), .y = y.data(), .post = post.data(), .comb = comb.data(), .x_out = x_out.data(), .t = T,
              .s = S, .d = D});
  x.swap(x_out);
}

}  // namespace dsv4::model
