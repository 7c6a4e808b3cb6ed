// The golden logits of transformers (tests/data/golden) and the per-row comparison the model tests share: the CPU
// model_test and the GPU cuda_model_test hold their backends to the same goldens the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace dsv4::model::testing {

struct GoldenSeq {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [rows, V]
  std::vector<float> margin;  // [rows] golden top-2 margin
  std::vector<int32_t> argmax;
};

// The golden sequences (dequantised from int16 + per-row scale).
std::vector<GoldenSeq> LoadGoldens(int64_t vocab);

// Per-row comparison of logits with a golden sequence: max |diff| / max |golden| per row (NaN counts as
// infinite), argmax agreement on rows whose golden top-2 margin is > 1e-3.
struct RowErrors {
  std::vector<double> rel;  // per row
  int64_t argmax_checked = 0, argmax_bad = 0;
  double worst() const { return rel.empty() ? 0 : *std::max_element(rel.begin(), rel.end()); }
  double median() const;
  double agreement() const {
    return argmax_checked == 0 ? 1.0 : 1.0 - static_cast<double>(argmax_bad) / static_cast<double>(argmax_checked);
  }
};
RowErrors Compare(const std::vector<float>& ours, const GoldenSeq& g, int64_t vocab);

}  // namespace dsv4::model::testing
