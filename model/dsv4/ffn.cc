// The FFN sublayer of one layer (dsv4-decode.md §2.4, §6.8): mHC pre, RMSNorm, the mixture of experts
// (sqrt-softplus router with bias for selection only or hash routing on the first layers, routed scaling,
// SwiGLU with the clamp, shared expert), mHC post.
#include "model/dsv4/forward.h"

namespace dsv4::model {

void FfnSublayer(Dsv4Model::Impl& m, int layer, const StepBatch& batch, std::vector<float>& x) {
  const Config& c = m.config;
  const LayerWeights& w = m.weights->layers[layer];
  kernels::Ops& ops = *m.ops;
  const int64_t T = batch.size(), D = c.hidden_size, S = c.hc_mult, E = c.n_routed_experts;
  const float eps = static_cast<float>(c.rms_norm_eps);

  m.BeginPhase(metrics::Phase::kDense);  // mHC pre and the norm
  std::vector<float> a(T * D), post(T * S), comb(T * S * S), y(T * D);
  ops.HcPre({.x = x.data(), .fn = w.hc_ffn_fn.ptr(), .base = w.hc_ffn_base.ptr(), .scale = w.hc_ffn_scale.ptr(),
             .u = a.data(), .post = post.data(), .comb = comb.data(), .t = T, .s = S, .d = D,
             .sinkhorn_iters = static_cast<int>(c.hc_sinkhorn_iters), .norm_eps = eps,
             .hc_eps = static_cast<float>(c.hc_eps)});
  ops.RmsNorm({.x = a.data(), .w = w.ffn_norm.ptr(), .out = a.data(), .rows = T, .dim = D, .eps = eps});

  std::vector<const float*> w1(E), w2(E), w3(E);
  for (int64_t e = 0; e < E; ++e) {
    // Null for an expert held by another rank (expert parallel): the MoE op skips it.
    w1[e] = w.w1[e].data.empty() ? nullptr : w.w1[e].ptr();
    w2[e] = w.w2[e].data.empty() ? nullptr : w.w2[e].ptr();
    w3[e] = w.w3[e].data.empty() ? nullptr : w.w3[e].ptr();
  }
  m.BeginPhase(metrics::Phase::kMoe);  // router, routed experts and the shared expert
  ops.Moe({.x = a.data(), .tokens = batch.tokens.data(), .gate = w.gate.ptr(),
           .bias = w.hash ? nullptr : w.gate_bias.ptr(), .tid2eid = w.hash ? w.tid2eid.data() : nullptr,
           .w1 = w1.data(), .w3 = w3.data(), .w2 = w2.data(), .shared_w1 = w.shared_w1.ptr(),
           .shared_w3 = w.shared_w3.ptr(), .shared_w2 = w.shared_w2.ptr(), .y = y.data(), .t = T, .d = D,
           .experts = E, .inter = c.moe_intermediate_size, .shared_inter = w.shared_w1.shape[0],
           .vocab = c.vocab_size, .topk = static_cast<int>(c.num_experts_per_tok),
           .routed_scale = static_cast<float>(c.routed_scaling_factor),
           .swiglu_limit = static_cast<float>(c.swiglu_limit)});
  m.AllReduce(y.data(), T * D);  // tensor parallel: local experts + this rank's slice of the shared expert

  m.BeginPhase(metrics::Phase::kDense);  // mHC post
  std::vector<float> x_out(x.size());
  ops.HcPost({.x = x.data(), .y = y.data(), .post = post.data(), .comb = comb.data(), .x_out = x_out.data(), .t = T,
              .s = S, .d = D});
  x.swap(x_out);
}

}  // namespace dsv4::model
