// RoutingProbe: see routing_probe.h.
#include "bench/decode/routing_probe.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/moe_internal.h"

namespace dsv4::bench {

void RoutingProbe::Begin(model::Phase p) {
  // A collective inside the MoE phase (tensor parallel: the all-reduce of its output): the phase resumes after it.
  if (p == model::Phase::kComm) return;
  if (in_moe_ && p != model::Phase::kMoe) Read();
  in_moe_ = p == model::Phase::kMoe;
}

void RoutingProbe::End() {
  if (in_moe_) Read();
  in_moe_ = false;
}

void RoutingProbe::Read() {
  if (!status_.ok()) return;
  auto* cuda = dynamic_cast<kernels::cuda::CudaBackend*>(&backend_);
  if (cuda == nullptr) {
    status_ = absl::FailedPreconditionError("routing probe: not the CUDA backend");
    return;
  }
  namespace moe = kernels::cuda::moe;
  const ProbeShape& s = shape_;
  absl::StatusOr<moe::ScratchPointers> ptr = moe::CarveScratch(
      cuda->scratch().moe, moe::MakeScratchPlan(s.tokens, s.experts, s.topk, s.dim, s.inter, s.shared_inter));
  if (!ptr.ok()) {
    status_ = ptr.status();
    return;
  }
  std::vector<int32_t> count(static_cast<size_t>(s.experts));
  if (cudaStreamSynchronize(cuda->stream()) != cudaSuccess ||
      cudaMemcpy(count.data(), ptr->expert_count, count.size() * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
    status_ = absl::InternalError("routing probe: reading the MoE scratch failed");
    return;
  }
  LayerRouting r;
  for (int64_t e = 0; e < s.experts; ++e) {
    const int32_t c = count[e];
    if (c < 0 || c > s.tokens || (c > 0 && (e < s.held_begin || e >= s.held_end))) {
      status_ = absl::DataLossError(absl::StrCat("routing probe: expert ", e, " has count ", c,
                                                 " (the MoE scratch layout changed?)"));
      return;
    }
    r.touched += c > 0;
    r.pairs += c;
    const size_t layer = layers_.size();
    if (layer < s.hot.size() && std::binary_search(s.hot[layer].begin(), s.hot[layer].end(), static_cast<int32_t>(e))) {
      r.hot_pairs += c;
    }
  }
  if (r.pairs > s.tokens * s.topk) {
    status_ = absl::DataLossError(absl::StrCat("routing probe: ", r.pairs, " token-expert pairs for ", s.tokens,
                                               " tokens of top-", s.topk, " (the MoE scratch layout changed?)"));
    return;
  }
  layers_.push_back(r);
}

}  // namespace dsv4::bench
