// The head (dsv4-decode.md §2.5, §6.3): HC head mix of the streams (pre weights only, no Sinkhorn), final
// RMSNorm, LM head, for the tokens whose logits are wanted. Under tensor parallelism each rank holds a block
// of vocabulary rows and the group gathers the whole row.
#include "model/dsv4/forward.h"

namespace dsv4::model {

void Head(Dsv4Model::Impl& m, const StepContext& s, const float* x, const int32_t* rows, int64_t r, float* logits) {
  const Config& c = s.config;
  const ModelWeights& w = *m.weights;
  const int64_t D = c.hidden_size, S = c.hc_mult;
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* h = s.ws.h.as<float>();
  m.BeginPhase(Phase::kDense);
  s.ops.HcHead({.x = x, .rows = rows, .fn = w.hc_head_fn.ptr(), .base = w.hc_head_base.ptr(),
                .scale = w.hc_head_scale.ptr(), .h = h, .r = r, .s = S, .d = D, .norm_eps = eps,
                .hc_eps = static_cast<float>(c.hc_eps)});
  s.ops.RmsNorm({.x = h, .w = w.norm.ptr(), .out = h, .rows = r, .dim = D, .eps = eps});
  if (m.options.collectives == nullptr || m.options.collectives->world() == 1) {
    s.ops.Linear({.w = w.head.get(), .x = {.data = h}, .y = logits, .t = r});
    return;
  }
  // Tensor parallel: this rank's vocabulary rows, then every rank gets the whole row (the leader samples).
  float* local = s.ws.logits.as<float>();
  s.ops.Linear({.w = w.head.get(), .x = {.data = h}, .y = local, .t = r});
  m.BeginPhase(Phase::kComm);
  const absl::Status st = m.options.collectives->GatherVocab(local, r, c.vocab_size, logits);
  if (!st.ok() && m.tp_status.ok()) m.tp_status = st;
  m.BeginPhase(Phase::kDense);
}

}  // namespace dsv4::model
