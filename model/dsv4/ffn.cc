// The FFN sublayer of one layer (dsv4-decode.md §2.4, §6.8), batched over the step's tokens: mHC pre, RMSNorm,
// the mixture of experts (sqrt-softplus router with bias for selection only or hash routing on the first
// layers, routed scaling, SwiGLU with the clamp, shared expert; routing happens inside the op), mHC post.
#include "model/dsv4/forward.h"

namespace dsv4::model {

void FfnSublayer(Dsv4Model::Impl& m, const StepContext& s, int layer, const float* x, float* x_out) {
  const Config& c = s.config;
  const LayerWeights& w = m.weights->layers[layer];
  const Workspace& ws = s.ws;
  kernels::Ops& ops = s.ops;
  const int64_t T = s.step.t, D = c.hidden_size, S = c.hc_mult;
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* a = ws.a.as<float>();
  float* y = ws.y.as<float>();

  m.BeginPhase(Phase::kDense);  // mHC pre and the norm
  ops.HcPreNorm({.pre = {.x = x, .fn = w.hc_ffn_fn.ptr(), .base = w.hc_ffn_base.ptr(), .scale = w.hc_ffn_scale.ptr(),
                         .u = a, .post = ws.post.as<float>(), .comb = ws.comb.as<float>(), .t = T, .s = S, .d = D,
                         .sinkhorn_iters = static_cast<int>(c.hc_sinkhorn_iters), .norm_eps = eps,
                         .hc_eps = static_cast<float>(c.hc_eps)},
                 .norm = {.x = a, .w = w.ffn_norm.ptr(), .out = a, .rows = T, .dim = D, .eps = eps}});

  m.BeginPhase(Phase::kMoe);  // router, routed experts and the shared expert
  ops.Moe({.x = a, .tokens = s.tokens, .pos = s.step.pos, .gate = w.gate.get(),
           .bias = w.hash ? nullptr : w.gate_bias.ptr(), .tid2eid = w.hash ? w.tid2eid.as<const int32_t>() : nullptr,
           .experts = w.experts.get(), .shared_w1 = w.shared_w1.get(), .shared_w3 = w.shared_w3.get(),
           .shared_w2 = w.shared_w2.get(), .y = y, .t = T, .topk = static_cast<int>(c.num_experts_per_tok),
           .routed_scale = static_cast<float>(c.routed_scaling_factor),
           .swiglu_limit = static_cast<float>(c.swiglu_limit)});
  m.AllReduce(y, T * D);  // tensor parallel: local experts + this rank's slice of the shared expert

  m.BeginPhase(Phase::kDense);  // mHC post
  ops.HcPost({.x = x, .y = y, .post = ws.post.as<float>(), .comb = ws.comb.as<float>(), .x_out = x_out, .t = T, .s = S,
              .d = D});
}

}  // namespace dsv4::model
