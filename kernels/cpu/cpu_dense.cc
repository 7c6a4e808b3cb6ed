// CPU backend, dense ops: scratch planning, embedding, the blocked linear (grouped, strided, fp32 or bf16
// activations), RMSNorm, RoPE, scale, fill and the Hadamard + FP4 simulation.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_rows.h"
#include "kernels/cpu/cpu_weights.h"
#include "kernels/sparse_mla/kv_row_format.h"

namespace dsv4::kernels::cpu {
namespace {

template <typename T>
void GrowTo(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}
template <typename T>
int64_t Bytes(const std::vector<T>& v) {
  return static_cast<int64_t>(v.capacity() * sizeof(T));
}

}  // namespace

CpuOps::CpuOps(int num_threads) : pool_(num_threads), threads_(pool_.size()) {}

void CpuOps::Fail(absl::Status s) {
  if (error_.ok()) error_ = std::move(s);
}

absl::Status CpuOps::TakeError() {
  absl::Status s = std::move(error_);
  error_ = absl::OkStatus();
  return s;
}

void CpuOps::Reserve(const StepLimits& l) {
  const int64_t compressed = std::max(l.index_topk, l.max_context / 128 + 1);
  Grow({.key_slots = l.window + compressed,
        .index_rows = l.max_context / 4 + 1,
        .head_dim = l.head_dim,
        .row_dim = std::max({l.head_dim, l.index_dim, int64_t{sparse_mla::kKvDim}}),
        .moe_tokens = l.max_tokens,
        .experts = l.experts,
        .topk = l.experts_per_token,
        .hidden = l.hidden,
        .inter = std::max(l.moe_inter, l.shared_inter),
        .vocab = l.vocab});
}

void CpuOps::Grow(const Sizes& s) {
  Sizes& z = sizes_;
  if (s.key_slots <= z.key_slots && s.index_rows <= z.index_rows && s.head_dim <= z.head_dim &&
      s.row_dim <= z.row_dim && s.moe_tokens <= z.moe_tokens && s.experts <= z.experts && s.topk <= z.topk &&
      s.hidden <= z.hidden && s.inter <= z.inter && s.vocab <= z.vocab) {
    return;  // the common case after Reserve: nothing to do, nothing allocated
  }
  z = {.key_slots = std::max(z.key_slots, s.key_slots),
       .index_rows = std::max(z.index_rows, s.index_rows),
       .head_dim = std::max(z.head_dim, s.head_dim),
       .row_dim = std::max(z.row_dim, s.row_dim),
       .moe_tokens = std::max(z.moe_tokens, s.moe_tokens),
       .experts = std::max(z.experts, s.experts),
       .topk = std::max(z.topk, s.topk),
       .hidden = std::max(z.hidden, s.hidden),
       .inter = std::max(z.inter, s.inter),
       .vocab = std::max(z.vocab, s.vocab)};
  int64_t bytes = 0;
  for (ThreadScratch& t : threads_) {
    GrowTo(t.key_ptr, z.key_slots);
    GrowTo(t.keys, z.key_slots * sparse_mla::kKvDim);
    GrowTo(t.scores, std::max(z.key_slots, z.index_rows));
    GrowTo(t.order, z.index_rows);
    GrowTo(t.acc, z.head_dim);
    GrowTo(t.row, z.row_dim);
    GrowTo(t.sample, z.vocab);
    bytes += Bytes(t.key_ptr) + Bytes(t.keys) + Bytes(t.scores) + Bytes(t.order) + Bytes(t.acc) + Bytes(t.row) +
             Bytes(t.sample);
  }
  const int64_t tk = z.moe_tokens * z.topk;
  MoeScratch& m = moe_;
  GrowTo(m.logits, z.moe_tokens * z.experts);
  GrowTo(m.weight, tk);
  GrowTo(m.chosen, tk);
  GrowTo(m.score, z.experts);
  GrowTo(m.key, z.experts);
  GrowTo(m.order, z.experts);
  GrowTo(m.user_t, z.moe_tokens);
  GrowTo(m.user_i, z.moe_tokens);
  GrowTo(m.x, z.moe_tokens * z.hidden);
  GrowTo(m.g, z.moe_tokens * z.inter);
  GrowTo(m.h, z.moe_tokens * z.inter);
  GrowTo(m.out, z.moe_tokens * z.hidden);
  GrowTo(m.acc, z.moe_tokens * z.hidden);
  for (const auto* v : {&m.logits, &m.weight, &m.score, &m.key, &m.x, &m.g, &m.h, &m.out, &m.acc}) bytes += Bytes(*v);
  for (const auto* v : {&m.chosen, &m.order, &m.user_t, &m.user_i}) bytes += Bytes(*v);
  scratch_bytes_ = bytes;
}

void CpuOps::Embed(const EmbedArgs& a) {
  const auto* table = static_cast<const CpuLinearWeight*>(a.table);
  if (table == nullptr || a.tokens == nullptr || a.pos == nullptr || a.x == nullptr) {
    return Fail(absl::InvalidArgumentError("Embed: table, tokens, pos and x are required"));
  }
  const int64_t d = table->k(), v = table->n();
  for (int64_t t = 0; t < a.t; ++t) {
    const int32_t tok = a.tokens[t];
    const bool real = a.pos[t] >= 0;
    if (real && (tok < 0 || tok >= v)) Fail(absl::OutOfRangeError(absl::StrCat("Embed: token ", tok, " out of [0, ", v, ")")));
    const bool ok = real && tok >= 0 && tok < v;
    for (int64_t s = 0; s < a.s; ++s) {
      float* x = a.x + (t * a.s + s) * d;
      if (ok) {
        std::memcpy(x, table->data() + int64_t{tok} * d, static_cast<size_t>(d) * 4);
      } else {
        std::fill_n(x, d, 0.f);
      }
    }
  }
}

void CpuOps::GemmF32(const float* x, int64_t xs, const float* w, int64_t n, int64_t k, float* y, int64_t ys,
                     int64_t t, int groups) {
  // Split over output features: each thread streams its slice of W once per block of rows, for all T rows.
  pool_.ParallelFor(n * groups, 32, [&](int64_t m0, int64_t m1, int) {
    for (int64_t g = m0 / n; g * n < m1; ++g) {
      const int64_t lo = std::max(m0, g * n) - g * n, hi = std::min(m1, (g + 1) * n) - g * n;
      GemmRange(x + g * k, xs, w + g * n * k, k, y + g * n + lo, ys, t, lo, hi);
    }
  });
}

void CpuOps::Linear(const LinearArgs& a) {
  const auto* w = static_cast<const CpuLinearWeight*>(a.w);
  if (w == nullptr || a.x.data == nullptr || a.y == nullptr || a.groups < 1 || w->n() % a.groups != 0) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("Linear: needs w, x, y and groups >= 1 dividing N (groups ", a.groups, ")")));
  }
  if (a.t <= 0) return;
  const int64_t n = w->n() / a.groups, k = w->k();
  const int64_t xs = a.x_stride ? a.x_stride : a.groups * k;
  const int64_t ys = a.y_stride ? a.y_stride : a.groups * n;
  if (a.x.dtype == DType::kF32) {
    return GemmF32(static_cast<const float*>(a.x.data), xs, w->data(), n, k, a.y, ys, a.t, a.groups);
  }
  // bf16 activations (not produced by the CPU forward; kept so any Ops caller works): one Dot per element.
  const auto* xb = static_cast<const uint16_t*>(a.x.data);
  pool_.ParallelFor(n * a.groups, 32, [&](int64_t m0, int64_t m1, int) {
    for (int64_t m = m0; m < m1; ++m) {
      const int64_t g = m / n;
      for (int64_t t = 0; t < a.t; ++t) a.y[t * ys + m] = DotBf16(xb + t * xs + g * k, w->data() + m * k, k);
    }
  });
}

// The reference of the fused op is the loop of single linears it stands for (ops.h), so each output is the same
// bits as its own Linear call.
void CpuOps::FusedLinear(const FusedLinearArgs& a) {
  if (a.count < 0 || a.count > kMaxFusedLinears || a.x.data == nullptr) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("FusedLinear: needs x and 0..", kMaxFusedLinears, " outputs, got ", a.count)));
  }
  for (int i = 0; i < a.count; ++i) {
    const LinearWeight* w = a.out[i].w;
    if (w == nullptr || a.out[i].y == nullptr || w->k() != a.out[0].w->k()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("FusedLinear: output ", i, " needs a weight and y, and every weight the same Kin")));
    }
  }
  for (int i = 0; i < a.count; ++i) {
    Linear({.w = a.out[i].w, .x = a.x, .y = a.out[i].y, .t = a.t, .x_stride = a.x_stride,
            .y_stride = a.out[i].y_stride});
  }
}

void CpuOps::RmsNorm(const RmsNormArgs& a) {
  pool_.ParallelFor(a.rows, 64, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) RmsNormRow(a.x + r * a.dim, a.w, a.out + r * a.dim, a.dim, a.eps);
  });
}

void CpuOps::Rope(const RopeArgs& a) {
  for (int64_t t = 0; t < a.t; ++t) {
    if (a.pos[t] < 0) continue;  // padding
    RopeToken(a.x + t * a.heads * a.row_dim, a.pos[t], a.inv_freq, a.heads, a.row_dim, a.pairs, a.inverse);
  }
}

void CpuOps::Scale(const ScaleArgs& a) {
  const int64_t n = a.rows * a.dim;
  for (int64_t i = 0; i < n; ++i) a.x[i] *= a.scale;
}

void CpuOps::Fill(const FillArgs& a) { std::fill_n(a.x, std::max<int64_t>(0, a.n), a.value); }

void CpuOps::HadamardFp4(const HadamardFp4Args& a) {
  if (a.dim < 32 || a.dim % 32 != 0 || (a.dim & (a.dim - 1)) != 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("HadamardFp4: dim ", a.dim, " must be a power of two >= 32")));
  }
  pool_.ParallelFor(a.rows, 64, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) HadamardFp4Row(a.x + r * a.dim, a.dim);
  });
}

}  // namespace dsv4::kernels::cpu
