// Weight preparation for the CPU backend: validation and dequantisation of every WeightView format to fp32.
// The per-format rules are those of kernels/weights.h (the same values model/checkpoint/weight_formats.cc
// produces; NVFP4 multiplies (e2m1 * e4m3 scale) first, then the global scale).
#include "kernels/cpu/cpu_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/float_formats.h"
#include "common/status_macros.h"
#include "kernels/cpu/thread_pool.h"

namespace dsv4::kernels::cpu {
namespace {

constexpr int64_t kFp8Block = 128, kNvfp4Block = 16, kMxfp4Block = 32;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// e2m1 code of column k of a packed row: the low nibble holds the even column.
inline uint8_t E2m1Code(const uint8_t* row, int64_t k) { return (row[k >> 1] >> (4 * (k & 1))) & 0xf; }

float ScaleF32(const uint8_t* p) {
  float s;
  std::memcpy(&s, p, 4);  // the view's bytes need not be aligned
  return s;
}

void DequantRow(const WeightView& w, int64_t n, float* out) {
  const int64_t k = w.k;
  switch (w.format) {
    case WeightFormat::kF32:
      std::memcpy(out, w.data + 4 * n * k, static_cast<size_t>(k) * 4);
      return;
    case WeightFormat::kBF16:
      for (int64_t c = 0; c < k; ++c) {
        uint16_t h;
        std::memcpy(&h, w.data + 2 * (n * k + c), 2);
        out[c] = Bf16ToF32(h);
      }
      return;
    case WeightFormat::kFp8Block128: {
      const uint8_t* row = w.data + n * k;
      const int64_t sblocks = CeilDiv(k, kFp8Block);
      for (int64_t b = 0; b < sblocks; ++b) {
        const int64_t si = (n / kFp8Block) * sblocks + b;
        const float s = w.scale_f32 ? ScaleF32(w.scale + 4 * si) : Ue8m0ToF32(w.scale[si]);
        for (int64_t c = b * kFp8Block; c < std::min(k, (b + 1) * kFp8Block); ++c) out[c] = E4m3ToF32(row[c]) * s;
      }
      return;
    }
    case WeightFormat::kNvfp4: {
      const uint8_t* row = w.data + n * (k / 2);
      const uint8_t* s = w.scale + n * (k / kNvfp4Block);
      for (int64_t c = 0; c < k; ++c) out[c] = E2m1ToF32(E2m1Code(row, c)) * E4m3ToF32(s[c / kNvfp4Block]) * w.global_scale;
      return;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* row = w.data + n * (k / 2);
      const uint8_t* s = w.scale + n * (k / kMxfp4Block);
      for (int64_t c = 0; c < k; ++c) out[c] = E2m1ToF32(E2m1Code(row, c)) * Ue8m0ToF32(s[c / kMxfp4Block]);
      return;
    }
  }
}

}  // namespace

absl::Status ValidateWeightView(const WeightView& w) {
  const std::string fmt = WeightFormatName(w.format);
  if (w.n <= 0 || w.k <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(w.name, ": ", fmt, " weight needs N, Kin > 0, got [", w.n, ", ", w.k, "]"));
  }
  if (w.data == nullptr) return absl::InvalidArgumentError(absl::StrCat(w.name, ": ", fmt, " weight has no data"));
  switch (w.format) {
    case WeightFormat::kF32:
    case WeightFormat::kBF16:
      return absl::OkStatus();
    case WeightFormat::kFp8Block128:
      if (w.scale == nullptr) return absl::InvalidArgumentError(absl::StrCat(w.name, ": FP8_BLOCK128 weight has no scale"));
      return absl::OkStatus();
    case WeightFormat::kNvfp4:
    case WeightFormat::kMxfp4: {
      const int64_t block = w.format == WeightFormat::kNvfp4 ? kNvfp4Block : kMxfp4Block;
      if (w.k % block != 0) {
        return absl::InvalidArgumentError(absl::StrCat(w.name, ": ", fmt, " needs Kin (", w.k, ") to be a multiple of ", block));
      }
      if (w.scale == nullptr) return absl::InvalidArgumentError(absl::StrCat(w.name, ": ", fmt, " weight has no scale"));
      if (w.format == WeightFormat::kNvfp4 && !(std::isfinite(w.global_scale) && w.global_scale > 0.f)) {
        return absl::InvalidArgumentError(absl::StrCat(w.name, ": NVFP4 global scale must be finite and > 0, got ", w.global_scale));
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(w.name, ": unknown weight format ", static_cast<int>(w.format)));
}

absl::Status DequantizeWeightView(const WeightView& w, float* out, ThreadPool& pool) {
  DSV4_RETURN_IF_ERROR(ValidateWeightView(w));
  // Each thread remembers its first non-finite element; the lowest one over all threads is reported.
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> first_bad(pool.size(), kNone);
  pool.ParallelFor(w.n, 64, [&](int64_t n0, int64_t n1, int thread) {
    int64_t& bad = first_bad[thread];
    for (int64_t n = n0; n < n1; ++n) {
      float* row = out + n * w.k;
      DequantRow(w, n, row);
      if (bad != kNone) continue;
      for (int64_t c = 0; c < w.k; ++c) {
        if (!std::isfinite(row[c])) {
          bad = n * w.k + c;
          break;
        }
      }
    }
  });
  const int64_t bad = *std::min_element(first_bad.begin(), first_bad.end());
  if (bad != kNone) {
    return absl::DataLossError(absl::StrCat(w.name, ": ", WeightFormatName(w.format), " value [", bad / w.k, ", ",
                                            bad % w.k, "] dequantises to ", out[bad], " (corrupt weight or scale)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CpuLinearWeight>> PrepareCpuLinear(const WeightView& w, Backend& backend,
                                                                   ThreadPool& pool) {
  DSV4_RETURN_IF_ERROR(ValidateWeightView(w));
  DSV4_ASSIGN_OR_RETURN(Buffer buf, backend.Allocate(w.n * w.k * int64_t{sizeof(float)}, MemoryKind::kWeights));
  DSV4_RETURN_IF_ERROR(DequantizeWeightView(w, buf.as<float>(), pool));
  return std::make_unique<CpuLinearWeight>(w.n, w.k, w.format, std::move(buf));
}

absl::StatusOr<ExpertsHandle> PrepareCpuExperts(std::span<const WeightView> w1, std::span<const WeightView> w3,
                                                std::span<const WeightView> w2, Backend& backend,
                                                ThreadPool& pool) {
  const int64_t e_count = static_cast<int64_t>(w1.size());
  if (e_count == 0 || w3.size() != w1.size() || w2.size() != w1.size()) {
    return absl::InvalidArgumentError(absl::StrCat("experts: w1/w3/w2 must list the same E > 0 views, got ", w1.size(),
                                                   "/", w3.size(), "/", w2.size()));
  }
  int64_t inter = -1, dim = -1, bytes = 0;
  std::vector<std::unique_ptr<CpuLinearWeight>> p1(e_count), p3(e_count), p2(e_count);
  for (int64_t e = 0; e < e_count; ++e) {
    const int held = (w1[e].data != nullptr) + (w3[e].data != nullptr) + (w2[e].data != nullptr);
    if (held == 0) continue;  // another rank's expert (expert parallel)
    if (held != 3) {
      return absl::InvalidArgumentError(absl::StrCat(w1[e].name, ": expert ", e, " has ", held,
                                                     " of its 3 matrices (all or none)"));
    }
    if (inter < 0) inter = w1[e].n, dim = w1[e].k;
    if (w1[e].n != inter || w1[e].k != dim || w3[e].n != inter || w3[e].k != dim || w2[e].n != dim || w2[e].k != inter) {
      return absl::InvalidArgumentError(absl::StrCat(w1[e].name, ": expert ", e, " shapes w1 [", w1[e].n, ", ", w1[e].k,
                                                     "] w3 [", w3[e].n, ", ", w3[e].k, "] w2 [", w2[e].n, ", ", w2[e].k,
                                                     "], expected [I, D] [I, D] [D, I] with I = ", inter, ", D = ", dim));
    }
    DSV4_ASSIGN_OR_RETURN(p1[e], PrepareCpuLinear(w1[e], backend, pool));
    DSV4_ASSIGN_OR_RETURN(p3[e], PrepareCpuLinear(w3[e], backend, pool));
    DSV4_ASSIGN_OR_RETURN(p2[e], PrepareCpuLinear(w2[e], backend, pool));
    bytes += p1[e]->device_bytes() + p3[e]->device_bytes() + p2[e]->device_bytes();
  }
  if (inter < 0) {
    // No expert held here: the shapes still come from the views (they name the model's sizes).
    inter = w1[0].n;
    dim = w1[0].k;
  }
  return std::make_unique<CpuExpertWeights>(e_count, inter, dim, bytes, std::move(p1), std::move(p3), std::move(p2));
}

}  // namespace dsv4::kernels::cpu
