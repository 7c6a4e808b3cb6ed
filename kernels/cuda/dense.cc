// Host side of the dense element-wise ops: argument checks, then the kernels of dense.cu (dense_params.h).
// Zero-sized work enqueues nothing.
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/dense_params.h"
#include "kernels/cuda/env_flag.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/linear.h"

namespace dsv4::kernels::cuda {
namespace {

constexpr int64_t kMaxGrid = (int64_t{1} << 31) - 1;

}  // namespace

absl::Status LaunchEmbed(const EmbedArgs& a, cudaStream_t stream) {
  if (a.t < 0 || a.s < 1) return absl::InvalidArgumentError(absl::StrCat("embed: bad sizes t=", a.t, " s=", a.s));
  if (a.t == 0) return absl::OkStatus();
  const auto* table = dynamic_cast<const CudaLinearWeight*>(a.table);
  if (table == nullptr) return absl::InvalidArgumentError("embed: no table prepared by the CUDA backend");
  if (table->format() != WeightFormat::kBF16 && table->format() != WeightFormat::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("embed: table is ", WeightFormatName(table->format()), "; BF16 or F32 expected"));
  }
  if (a.tokens == nullptr || a.pos == nullptr || a.x == nullptr) {
    return absl::InvalidArgumentError("embed: null tokens, pos or x");
  }
  if (a.t > kMaxGrid) return absl::InvalidArgumentError(absl::StrCat("embed: too many tokens ", a.t));
  const EmbedParams p{.table = table->data(), .table_bf16 = table->format() == WeightFormat::kBF16,
                      .v = table->n(), .d = table->k(), .tokens = a.tokens, .pos = a.pos, .x = a.x, .t = a.t,
                      .s = a.s};
  return CudaStatus(internal::LaunchEmbedKernel(p, stream), "embed launch");
}

absl::Status LaunchRmsNorm(const RmsNormArgs& a, cudaStream_t stream) {
  if (a.rows < 0 || a.dim < 0 || (a.rows > 0 && a.dim == 0) || a.rows > kMaxGrid) {
    return absl::InvalidArgumentError(absl::StrCat("rmsnorm: bad sizes rows=", a.rows, " dim=", a.dim));
  }
  if (a.rows == 0) return absl::OkStatus();
  if (a.x == nullptr || a.out == nullptr) return absl::InvalidArgumentError("rmsnorm: null x or out");
  const RmsNormParams p{.x = a.x, .w = a.w, .out = a.out, .rows = a.rows, .dim = a.dim, .eps = a.eps};
  return CudaStatus(internal::LaunchRmsNormKernel(p, stream), "rmsnorm launch");
}

absl::Status LaunchRope(const RopeArgs& a, cudaStream_t stream) {
  if (a.t < 0 || a.heads < 0 || a.pairs < 0 || 2 * int64_t{a.pairs} > a.row_dim || a.t > kMaxGrid ||
      a.pairs > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("rope: bad sizes t=", a.t, " heads=", a.heads, " row_dim=",
                                                   a.row_dim, " pairs=", a.pairs));
  }
  if (a.t == 0 || a.heads == 0 || a.pairs == 0) return absl::OkStatus();
  if (a.x == nullptr || a.pos == nullptr || a.inv_freq == nullptr) {
    return absl::InvalidArgumentError("rope: null x, pos or inv_freq");
  }
  const RopeParams p{.x = a.x, .pos = a.pos, .inv_freq = a.inv_freq, .t = a.t, .heads = a.heads,
                     .row_dim = a.row_dim, .pairs = a.pairs, .inverse = a.inverse};
  return CudaStatus(internal::LaunchRopeKernel(p, stream), "rope launch");
}

absl::Status LaunchNormRope(const NormRopeArgs& a, cudaStream_t stream) {
  const RmsNormArgs& n = a.norm;
  const RopeArgs& r = a.rope;
  // One kernel where the rope rotates exactly the normed rows (the model's q and kv norms); else the two ops.
  // DSV4_NORM_ROPE=0 runs the two ops everywhere (A/B from one binary; read once per process).
  static const bool enabled = EnvFlagOn("DSV4_NORM_ROPE");
  const bool fused =
      enabled && n.out == r.x && n.rows == r.t * r.heads && n.dim == r.row_dim && r.heads > 0 && r.pairs > 0;
  if (!fused) {
    DSV4_RETURN_IF_ERROR(LaunchRmsNorm(n, stream));
    return LaunchRope(r, stream);
  }
  if (n.rows < 0 || n.dim < 1 || n.rows > kMaxGrid || 2 * int64_t{r.pairs} > n.dim || r.pairs > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("norm+rope: bad sizes rows=", n.rows, " (t=", r.t, " heads=",
                                                   r.heads, ") dim=", n.dim, " pairs=", r.pairs));
  }
  if (n.rows == 0) return absl::OkStatus();
  if (n.x == nullptr || n.out == nullptr || r.pos == nullptr || r.inv_freq == nullptr) {
    return absl::InvalidArgumentError("norm+rope: null x, out, pos or inv_freq");
  }
  const NormRopeParams p{.x = n.x, .w = n.w, .out = n.out, .rows = n.rows, .dim = n.dim, .eps = n.eps, .pos = r.pos,
                         .inv_freq = r.inv_freq, .heads = r.heads, .pairs = r.pairs, .inverse = r.inverse};
  return CudaStatus(internal::LaunchNormRopeKernel(p, stream), "norm+rope launch");
}

absl::Status LaunchScale(const ScaleArgs& a, cudaStream_t stream) {
  if (a.rows < 0 || a.dim < 0) {
    return absl::InvalidArgumentError(absl::StrCat("scale: bad sizes rows=", a.rows, " dim=", a.dim));
  }
  if (a.rows == 0 || a.dim == 0) return absl::OkStatus();
  if (a.x == nullptr) return absl::InvalidArgumentError("scale: null x");
  const ScaleParams p{.x = a.x, .rows = a.rows, .dim = a.dim, .scale = a.scale};
  return CudaStatus(internal::LaunchScaleKernel(p, stream), "scale launch");
}

absl::Status LaunchFill(const FillArgs& a, cudaStream_t stream) {
  if (a.n < 0) return absl::InvalidArgumentError(absl::StrCat("fill: negative size ", a.n));
  if (a.n == 0) return absl::OkStatus();
  if (a.x == nullptr) return absl::InvalidArgumentError("fill: null x");
  const FillParams p{.x = a.x, .n = a.n, .value = a.value};
  return CudaStatus(internal::LaunchFillKernel(p, stream), "fill launch");
}

absl::Status LaunchHadamardFp4(const HadamardFp4Args& a, cudaStream_t stream) {
  const bool pow2 = a.dim > 0 && (a.dim & (a.dim - 1)) == 0;
  if (a.rows < 0 || !pow2 || a.dim < 32 || a.dim > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("hadamard_fp4: rows=", a.rows, " dim=", a.dim,
                                                   "; dim must be a power of two in [32, 1024]"));
  }
  if (a.rows == 0) return absl::OkStatus();
  if (a.x == nullptr) return absl::InvalidArgumentError("hadamard_fp4: null x");
  // The CPU reference's normalisation, bit for bit: 1 / sqrt(dim) in float.
  const float norm = 1.f / std::sqrt(static_cast<float>(a.dim));
  const HadamardFp4Params p{.x = a.x, .rows = a.rows, .dim = static_cast<int>(a.dim), .norm = norm};
  return CudaStatus(internal::LaunchHadamardFp4Kernel(p, stream), "hadamard_fp4 launch");
}

}  // namespace dsv4::kernels::cuda
