// The head (dsv4-decode.md §2.5, §6.3): HC head mix of the streams (pre weights only, no Sinkhorn), final
// RMSNorm, LM head. Computed only for the tokens whose logits are wanted.
#include "model/dsv4/forward.h"

namespace dsv4::model {

void Head(Dsv4Model::Impl& m, const std::vector<float>& x, const std::vector<int64_t>& rows, float* logits) {
  const Config& c = m.config;
  const ModelWeights& w = *m.weights;
  const int64_t D = c.hidden_size, S = c.hc_mult, R = static_cast<int64_t>(rows.size());
  std::vector<float> xs(R * S * D), h(R * D);
  for (int64_t i = 0; i < R; ++i) std::copy_n(x.data() + rows[i] * S * D, S * D, xs.data() + i * S * D);
  m.ops->HcHead({.x = xs.data(), .fn = w.hc_head_fn.ptr(), .base = w.hc_head_base.ptr(),
                 .scale = w.hc_head_scale.ptr(), .h = h.data(), .t = R, .s = S, .d = D,
                 .norm_eps = static_cast<float>(c.rms_norm_eps), .hc_eps = static_cast<float>(c.hc_eps)});
  m.ops->RmsNorm({.x = h.data(), .w = w.norm.ptr(), .out = h.data(), .rows = R, .dim = D,
                  .eps = static_cast<float>(c.rms_norm_eps)});
  if (m.shard == nullptr) {
    m.ops->Linear({.x = h.data(), .w = w.head.ptr(), .y = logits, .t = R, .n = c.vocab_size, .k = D});
    return;
  }
  // Tensor parallel: this rank's vocabulary rows, then every rank gets the whole row (the leader samples).
  const comm::Range v = m.shard->vocab;
  std::vector<float> local(R * v.size);
  m.ops->Linear({.x = h.data(), .w = w.head.ptr(), .y = local.data(), .t = R, .n = v.size, .k = D});
  m.BeginPhase(metrics::Phase::kComm);
  const absl::Status s = comm::GatherVocabLogits(*m.tp, *m.shard, local.data(), R, c.vocab_size, logits);
  if (!s.ok() && m.tp_status.ok()) m.tp_status = s;
  m.BeginPhase(metrics::Phase::kDense);
}

}  // namespace dsv4::model
