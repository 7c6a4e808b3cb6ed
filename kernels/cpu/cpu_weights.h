// The CPU backend's prepared weights: every checkpoint format (kernels/weights.h) dequantised once, at load,
// to a dense fp32 [N, Kin] matrix in backend memory (MemoryKind::kWeights). The CPU backend is the fp32
// reference, so it computes with exactly the values the checkpoint encodes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/weights.h"

namespace dsv4::kernels::cpu {

class ThreadPool;

class CpuLinearWeight final : public LinearWeight {
 public:
  CpuLinearWeight(int64_t n, int64_t k, WeightFormat format, Buffer data)
      : LinearWeight(n, k, format, data.bytes()), data_(std::move(data)) {}
  const float* data() const { return data_.as<const float>(); }  // [N, Kin] fp32, row-major

 private:
  Buffer data_;
};

// E experts; expert e is held when its three matrices are (w1/w3 [I, D], w2 [D, I]).
class CpuExpertWeights final : public ExpertWeights {
 public:
  CpuExpertWeights(int64_t experts, int64_t inter, int64_t dim, int64_t bytes,
                   std::vector<std::unique_ptr<CpuLinearWeight>> w1, std::vector<std::unique_ptr<CpuLinearWeight>> w3,
                   std::vector<std::unique_ptr<CpuLinearWeight>> w2)
      : ExpertWeights(experts, inter, dim, bytes), w1_(std::move(w1)), w3_(std::move(w3)), w2_(std::move(w2)) {}
  bool Holds(int64_t e) const override { return e >= 0 && e < experts() && w1_[e] != nullptr; }
  const float* w1(int64_t e) const { return w1_[e]->data(); }  // [I, D]
  const float* w3(int64_t e) const { return w3_[e]->data(); }  // [I, D]
  const float* w2(int64_t e) const { return w2_[e]->data(); }  // [D, I]

 private:
  std::vector<std::unique_ptr<CpuLinearWeight>> w1_, w3_, w2_;
};

// Checks a view's shape and pointers for its format (InvalidArgument naming view.name).
absl::Status ValidateWeightView(const WeightView& w);

// Dequantises a valid view into out[N * Kin] (rows split over `pool`). DataLoss naming view.name when a
// value is NaN or infinite (a corrupt scale or weight byte).
absl::Status DequantizeWeightView(const WeightView& w, float* out, ThreadPool& pool);

// The backend's PrepareLinear / PrepareExperts.
absl::StatusOr<std::unique_ptr<CpuLinearWeight>> PrepareCpuLinear(const WeightView& w, Backend& backend,
                                                                   ThreadPool& pool);
absl::StatusOr<ExpertsHandle> PrepareCpuExperts(std::span<const WeightView> w1, std::span<const WeightView> w3,
                                                std::span<const WeightView> w2, Backend& backend,
                                                ThreadPool& pool);

}  // namespace dsv4::kernels::cpu
