// LaunchMoe, the CUDA MoE op (ops.h MoeArgs): validation on the host, the shared expert through the dense
// family's linear (w1 and w3 into the scratch, the SwiGLU in place, w2 straight into y), then the routed half
// (moe_routed.cc: router, expert GEMMs, combine adding the routed sum onto y). The router reads the BF16
// gate's device rows as CudaLinearWeight (linear.h) keeps them: row-major [E, D] bf16.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/moe_internal.h"

namespace dsv4::kernels::cuda {
namespace {

absl::Status CheckShape(const LinearWeight* w, const char* what, int64_t n, int64_t k) {
  if (w == nullptr) return absl::InvalidArgumentError(absl::StrCat("MoE: ", what, " is required"));
  if (w->n() != n || w->k() != k) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE: ", what, " is [", w->n(), ", ", w->k(), "], expected [", n, ", ", k, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchMoe(const MoeArgs& a, const CudaScratch& scratch, cudaStream_t stream) {
  const auto* ex = dynamic_cast<const moe::CudaExperts*>(a.experts);
  if (ex == nullptr) return absl::InvalidArgumentError("MoE: the experts were not prepared by the CUDA backend");
  const auto* gate = dynamic_cast<const CudaLinearWeight*>(a.gate);
  if (gate == nullptr) return absl::InvalidArgumentError("MoE: the gate was not prepared by the CUDA backend");
  const int64_t E = ex->experts(), D = ex->dim(), I = ex->inter();
  if (gate->format() != WeightFormat::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE: the router gate must be BF16, got ", WeightFormatName(gate->format())));
  }
  DSV4_RETURN_IF_ERROR(CheckShape(gate, "gate", E, D));
  const int64_t Is = a.shared_w1 != nullptr ? a.shared_w1->n() : 0;
  DSV4_RETURN_IF_ERROR(CheckShape(a.shared_w1, "shared_w1", Is, D));
  DSV4_RETURN_IF_ERROR(CheckShape(a.shared_w3, "shared_w3", Is, D));
  DSV4_RETURN_IF_ERROR(CheckShape(a.shared_w2, "shared_w2", D, Is));
  if (a.t < 0) return absl::InvalidArgumentError(absl::StrCat("MoE: negative token count ", a.t));
  if (E > moe::kMaxExperts || a.topk < 1 || a.topk > std::min<int64_t>(E, moe::kMaxTopk)) {
    return absl::InvalidArgumentError(absl::StrCat("MoE: needs 1 <= Ek <= min(E, ", moe::kMaxTopk, ") and E <= ",
                                                   moe::kMaxExperts, ", got E = ", E, ", Ek = ", a.topk));
  }
  if (a.tid2eid == nullptr && a.bias == nullptr) {
    return absl::InvalidArgumentError("MoE: a score layer needs the bias, a hash layer tid2eid");
  }
  if (a.tid2eid != nullptr && a.tokens == nullptr) return absl::InvalidArgumentError("MoE: hash routing needs tokens");
  if (a.x == nullptr || a.pos == nullptr || a.y == nullptr) {
    return absl::InvalidArgumentError("MoE: x, pos and y are required");
  }
  if (a.t == 0) return absl::OkStatus();
  DSV4_ASSIGN_OR_RETURN(const moe::ScratchPointers s,
                        moe::CarveScratch(scratch, moe::MakeScratchPlan(a.t, E, a.topk, D, I, Is)));

  // Shared expert: y = W2 (silu(min(W1 x, L)) * clamp(W3 x, -L, L)). W1 and W3 read the same x: one multi-weight
  // launch (at T = 1 on the H200: 12.0 us for the flash pair against 15.3 as two linears; TP 4 shard 6.5 vs 10.9).
  FusedLinearArgs w13{.x = {.data = a.x, .dtype = DType::kF32}, .t = a.t, .count = 2};
  w13.out[0] = {.w = a.shared_w1, .y = s.shared_g};
  w13.out[1] = {.w = a.shared_w3, .y = s.shared_v};
  DSV4_RETURN_IF_ERROR(LaunchFusedLinear(w13, stream));
  DSV4_RETURN_IF_ERROR(
      moe::LaunchMoeSwiglu({.g = s.shared_g, .v = s.shared_v, .n = a.t * Is, .limit = a.swiglu_limit}, stream));
  DSV4_RETURN_IF_ERROR(
      LaunchLinear({.w = a.shared_w2, .x = {.data = s.shared_g, .dtype = DType::kF32}, .y = a.y, .t = a.t}, stream));

  // Routed experts, added onto the shared output.
  return moe::LaunchRouted(a, static_cast<const uint16_t*>(gate->data()), *ex, s, /*accumulate=*/true, stream);
}

}  // namespace dsv4::kernels::cuda
