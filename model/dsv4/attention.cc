// The attention sublayer of one layer (dsv4-decode.md §2.2-2.3, §6), batched over every token of the step:
// mHC pre, the q path (low-rank q, per-head RMS, RoPE), the kv path (one shared latent key, RoPE, written to the
// window ring and this step's staging rows), the compressor(s) and the indexer (their state steps, row emission
// and top-k all inside ops), sparse attention with the per-head sink over window + compressed rows, inverse RoPE
// of the output, the grouped output projection, mHC post.
#include <cmath>

#include "model/dsv4/forward.h"

namespace dsv4::model {
namespace {

kernels::ActView F32(const kernels::Buffer& b) { return {.data = b.data(), .dtype = kernels::DType::kF32}; }

}  // namespace

void AttentionSublayer(Dsv4Model::Impl& m, const StepContext& s, int layer, const float* x, float* x_out) {
  const Config& c = s.config;
  const LayerWeights& w = m.weights->layers[layer];
  const Workspace& ws = s.ws;
  kernels::Ops& ops = s.ops;
  const int64_t T = s.step.t, D = c.hidden_size, S = c.hc_mult, H = c.num_attention_heads, Dh = c.head_dim;
  const int64_t QL = c.q_lora_rank, IH = c.index_n_heads, ID = c.index_head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int pairs = static_cast<int>(c.qk_rope_head_dim / 2);
  const float* inv_freq = m.inv_freq[layer].as<const float>();
  const int32_t* pos = s.step.pos;
  float* a = ws.a.as<float>();
  float* cq = ws.cq.as<float>();
  float* q = ws.q.as<float>();
  float* kv = ws.kv.as<float>();

  m.BeginPhase(Phase::kDense);  // mHC, norms and projections; the attention proper is timed below
  ops.HcPreNorm({.pre = {.x = x, .fn = w.hc_attn_fn.ptr(), .base = w.hc_attn_base.ptr(),
                         .scale = w.hc_attn_scale.ptr(), .u = a, .post = ws.post.as<float>(),
                         .comb = ws.comb.as<float>(), .t = T, .s = S, .d = D,
                         .sinkhorn_iters = static_cast<int>(c.hc_sinkhorn_iters), .norm_eps = eps,
                         .hc_eps = static_cast<float>(c.hc_eps)},
                 .norm = {.x = a, .w = w.attn_norm.ptr(), .out = a, .rows = T, .dim = D, .eps = eps}});

  const bool production = s.mode == NumericMode::kProduction;
  float* idx_q = ws.idx_q.as<float>();
  if (m.options.fuse_projections) {
    // The same projections as below, each input's in one op: every projection of the normed a, then (after the
    // q norm) wq_b and the indexer's wq_b of c_q.
    kernels::FusedLinearArgs from_a{.x = F32(ws.a), .t = T};
    auto add = [](kernels::FusedLinearArgs& f, const kernels::LinearWeight* wt, float* y) {
      f.out[f.count++] = {.w = wt, .y = y};
    };
    add(from_a, w.wq_a.get(), cq);
    add(from_a, w.wkv.get(), kv);
    if (w.ratio > 0) {
      add(from_a, w.compressor.wkv.get(), ws.comp_kv.as<float>());
      add(from_a, w.compressor.wgate.get(), ws.comp_gate.as<float>());
    }
    if (w.ratio == 4) {
      add(from_a, w.idx_weights_proj.get(), ws.idx_w.as<float>());
      add(from_a, w.idx_compressor.wkv.get(), ws.idx_kv.as<float>());
      add(from_a, w.idx_compressor.wgate.get(), ws.idx_gate.as<float>());
    }
    ops.FusedLinear(from_a);
    ops.RmsNorm({.x = cq, .w = w.q_norm.ptr(), .out = cq, .rows = T, .dim = QL, .eps = eps});
    kernels::FusedLinearArgs from_cq{.x = F32(ws.cq), .t = T};
    add(from_cq, w.wq_b.get(), q);
    if (w.ratio == 4) add(from_cq, w.idx_wq_b.get(), idx_q);
    ops.FusedLinear(from_cq);
    ops.NormRope({.norm = {.x = q, .w = nullptr, .out = q, .rows = T * H, .dim = Dh, .eps = eps},
                  .rope = {.x = q, .pos = pos, .inv_freq = inv_freq, .t = T, .heads = H, .row_dim = Dh, .pairs = pairs}});
    ops.NormRope({.norm = {.x = kv, .w = w.kv_norm.ptr(), .out = kv, .rows = T, .dim = Dh, .eps = eps},
                  .rope = {.x = kv, .pos = pos, .inv_freq = inv_freq, .t = T, .heads = 1, .row_dim = Dh, .pairs = pairs}});
    if (w.ratio == 4) {
      ops.Rope({.x = idx_q, .pos = pos, .inv_freq = inv_freq, .t = T, .heads = IH, .row_dim = ID, .pairs = pairs});
      if (production) ops.HadamardFp4({.x = idx_q, .rows = T * IH, .dim = ID});
    }
  } else {
    // q path: c_q = norm(W_qa a); q = W_qb c_q; per-head unweighted RMS; RoPE on the last rope dims (one op:
    // NormRope, which a backend may run as one kernel).
    ops.Linear({.w = w.wq_a.get(), .x = F32(ws.a), .y = cq, .t = T});
    ops.RmsNorm({.x = cq, .w = w.q_norm.ptr(), .out = cq, .rows = T, .dim = QL, .eps = eps});
    ops.Linear({.w = w.wq_b.get(), .x = F32(ws.cq), .y = q, .t = T});
    ops.NormRope({.norm = {.x = q, .w = nullptr, .out = q, .rows = T * H, .dim = Dh, .eps = eps},
                  .rope = {.x = q, .pos = pos, .inv_freq = inv_freq, .t = T, .heads = H, .row_dim = Dh, .pairs = pairs}});

    // kv path: one latent key per token (value = key).
    ops.Linear({.w = w.wkv.get(), .x = F32(ws.a), .y = kv, .t = T});
    ops.NormRope({.norm = {.x = kv, .w = w.kv_norm.ptr(), .out = kv, .rows = T, .dim = Dh, .eps = eps},
                  .rope = {.x = kv, .pos = pos, .inv_freq = inv_freq, .t = T, .heads = 1, .row_dim = Dh, .pairs = pairs}});

    // Compressor and indexer projections.
    if (w.ratio > 0) {
      ops.Linear({.w = w.compressor.wkv.get(), .x = F32(ws.a), .y = ws.comp_kv.as<float>(), .t = T});
      ops.Linear({.w = w.compressor.wgate.get(), .x = F32(ws.a), .y = ws.comp_gate.as<float>(), .t = T});
    }
    if (w.ratio == 4) {
      ops.Linear({.w = w.idx_wq_b.get(), .x = F32(ws.cq), .y = idx_q, .t = T});
      ops.Rope({.x = idx_q, .pos = pos, .inv_freq = inv_freq, .t = T, .heads = IH, .row_dim = ID, .pairs = pairs});
      if (production) ops.HadamardFp4({.x = idx_q, .rows = T * IH, .dim = ID});
      ops.Linear({.w = w.idx_weights_proj.get(), .x = F32(ws.a), .y = ws.idx_w.as<float>(), .t = T});
      ops.Linear({.w = w.idx_compressor.wkv.get(), .x = F32(ws.a), .y = ws.idx_kv.as<float>(), .t = T});
      ops.Linear({.w = w.idx_compressor.wgate.get(), .x = F32(ws.a), .y = ws.idx_gate.as<float>(), .t = T});
    }
  }

  // Cache updates and key selection (timed as attention): this step's keys into their staging rows (and the ring
  // rows no other token of the step needs), the compressors' state steps and row emission, the indexer's top-k.
  m.BeginPhase(Phase::kAttention);
  const kernels::KvCacheView window = s.cache.View(KvPool::kWindow, layer);
  const kernels::BlockTables& wtab = s.tables[static_cast<int>(KvPool::kWindow)];
  const int W = static_cast<int>(c.sliding_window);
  ops.KvWindowWrite({.rows = kv, .cache = window, .step = s.step, .tables = wtab,
                     .staging_row0 = s.cache.staging_row0(), .window = W, .commit = false});
  const KvPool cpool = w.ratio == 4 ? KvPool::kCompressed4 : KvPool::kCompressed128;
  if (w.ratio > 0) {
    ops.Compressor({.state_kv = s.cache.StateKv(layer, false), .state_score = s.cache.StateScore(layer, false),
                    .state_stride = s.cache.StateStride(), .kv = ws.comp_kv.as<float>(),
                    .gate = ws.comp_gate.as<float>(), .ape = w.compressor.ape.ptr(), .norm_w = w.compressor.norm.ptr(),
                    .inv_freq = inv_freq, .cache = s.cache.View(cpool, layer), .tables = s.tables[static_cast<int>(cpool)],
                    .step = s.step, .ratio = w.ratio, .d = static_cast<int>(Dh), .pairs = pairs, .eps = eps});
  }
  if (w.ratio == 4) {
    // The indexer's own compressor runs before scoring, so a row emitted this step is scoreable now.
    m.BeginPhase(Phase::kIndexer);
    ops.Compressor({.state_kv = s.cache.StateKv(layer, true), .state_score = s.cache.StateScore(layer, true),
                    .state_stride = s.cache.StateStride(), .kv = ws.idx_kv.as<float>(),
                    .gate = ws.idx_gate.as<float>(), .ape = w.idx_compressor.ape.ptr(),
                    .norm_w = w.idx_compressor.norm.ptr(), .inv_freq = inv_freq,
                    .cache = s.cache.View(KvPool::kIndexer, layer),
                    .tables = s.tables[static_cast<int>(KvPool::kIndexer)], .step = s.step, .ratio = 4,
                    .d = static_cast<int>(ID), .pairs = pairs, .eps = eps, .hadamard_fp4 = production});
    const double weight_scale = 1.0 / std::sqrt(static_cast<double>(ID)) / std::sqrt(static_cast<double>(IH));
    ops.Indexer({.q = idx_q, .w = ws.idx_w.as<float>(), .weight_scale = static_cast<float>(weight_scale),
                 .cache = s.cache.View(KvPool::kIndexer, layer),
                 .index_tables = s.tables[static_cast<int>(KvPool::kIndexer)],
                 .target_tables = s.tables[static_cast<int>(KvPool::kCompressed4)], .step = s.step,
                 .selected = ws.selected.as<int32_t>(), .selected_count = ws.selected_count.as<int32_t>(),
                 .heads = IH, .dim = ID, .k = c.index_topk, .max_rows = m.options.max_context / 4});
    m.BeginPhase(Phase::kAttention);
  }

  // Sparse attention over window + compressed rows.
  float* o = ws.o.as<float>();
  const int64_t max_compressed = w.ratio == 128 ? m.options.max_context / 128 : (w.ratio == 4 ? c.index_topk : 0);
  ops.Attention({.q = q, .window = window, .window_tables = wtab, .staging_row0 = s.cache.staging_row0(),
                 .window_size = W, .compressed = w.ratio > 0 ? s.cache.View(cpool, layer) : kernels::KvCacheView{},
                 .compressed_tables = w.ratio == 128 ? s.tables[static_cast<int>(cpool)] : kernels::BlockTables{},
                 .compressed_ratio = w.ratio, .selected = w.ratio == 4 ? ws.selected.as<int32_t>() : nullptr,
                 .selected_count = w.ratio == 4 ? ws.selected_count.as<int32_t>() : nullptr,
                 .ksel = w.ratio == 4 ? c.index_topk : 0, .max_compressed = max_compressed, .step = s.step,
                 .sink = w.attn_sink.ptr(), .out = o, .heads = H, .dim = Dh,
                 .scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)))});
  if (s.step.max_seq_len > 1) {  // a prefill chunk: its later keys go to their ring rows now that all attended
    ops.KvWindowWrite({.rows = kv, .cache = window, .step = s.step, .tables = wtab,
                       .staging_row0 = s.cache.staging_row0(), .window = W, .commit = true});
  }

  // Undo the rotation the values carried, then the grouped output projection: group g (heads g*H/G ..) -> o_lora
  // dims through its own block of W_oa, then W_ob over all groups.
  ops.Rope({.x = o, .pos = pos, .inv_freq = inv_freq, .t = T, .heads = H, .row_dim = Dh, .pairs = pairs,
            .inverse = true});
  m.BeginPhase(Phase::kDense);  // the grouped output projection and mHC post
  float* y = ws.y.as<float>();
  ops.Linear({.w = w.wo_a.get(), .x = F32(ws.o), .y = ws.z.as<float>(), .t = T, .groups = static_cast<int>(c.o_groups)});
  ops.Linear({.w = w.wo_b.get(), .x = F32(ws.z), .y = y, .t = T});
  m.AllReduce(y, T * D);  // tensor parallel: each rank projected only its heads
  ops.HcPost({.x = x, .y = y, .post = ws.post.as<float>(), .comb = ws.comb.as<float>(), .x_out = x_out, .t = T, .s = S,
              .d = D});
}

}  // namespace dsv4::model
