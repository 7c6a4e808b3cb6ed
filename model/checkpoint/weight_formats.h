// Linear-layer weight formats of the DeepSeek-V4 checkpoints (docs: dsv4-decode.md section 4),
// as views over checkpoint tensors, with a dequantize-to-fp32 reference for each.
//
// A linear "X" has logical weight W [N, K] (N = out features, K = in features, row-major) and,
// depending on its format, companion tensors named after it:
//   kBF16 / kF32   X.weight BF16|F32 [N, K]
//   kFp8Block128   X.weight F8_E4M3 [N, K], X.scale F8_E8M0 [ceil(N/128), ceil(K/128)]
//                  W[n,k] = e4m3(w[n,k]) * 2^(s[n/128, k/128] - 127)
//   kNvfp4         X.weight U8 [N, K/2] (byte j: low nibble = element 2j), X.weight_scale F8_E4M3
//                  [N, K/16], X.weight_scale_2 F32 [] (or [1]), X.input_scale F32 [] (optional;
//                  absent for weight-only quantisation)
//                  W[n,k] = e2m1(code[n,k]) * e4m3(ws[n, k/16]) * weight_scale_2
//   kMxfp4         X.weight I8 [N, K/2] (same nibble order), X.scale F8_E8M0 [N, K/32]
//                  W[n,k] = e2m1(code[n,k]) * 2^(s[n, k/32] - 127)
// The block scales run along K (the input dimension): one per input block of each output row.
// The scalar conversions are common/float_formats.h's; nothing here re-derives a format.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/safetensors.h"

namespace dsv4::ckpt {

enum class WeightFormat { kBF16, kF32, kFp8Block128, kNvfp4, kMxfp4 };

// "BF16", "F32", "FP8_BLOCK128", "NVFP4", "MXFP4".
absl::string_view WeightFormatName(WeightFormat format);

inline constexpr int64_t kFp8BlockSize = 128;  // square blocks, both axes
inline constexpr int64_t kNvfp4BlockSize = 16;  // along K
inline constexpr int64_t kMxfp4BlockSize = 32;  // along K

struct LinearWeight {
  std::string base;  // "layers.3.ffn.experts.7.w1"
  WeightFormat format = WeightFormat::kBF16;
  int64_t n = 0;  // out features (rows of W)
  int64_t k = 0;  // in features (columns of W)
  TensorView weight;  // see the table above
  TensorView scale;   // block scales; empty (data == nullptr) for kBF16 / kF32
  float scale_2 = 1.0f;       // kNvfp4: weight_scale_2 (> 0); 1 otherwise
  float input_scale = 1.0f;   // kNvfp4: input_scale when has_input_scale; 1 otherwise
  bool has_input_scale = false;
};

// Finds `base`.weight and its companions in `ckpt`, detects the format from the weight's dtype and
// which companions exist, and validates every dtype and shape. Errors name the offending tensor.
absl::StatusOr<LinearWeight> LoadLinearWeight(const Checkpoint& ckpt, absl::string_view base);

// Checks that the views are consistent with format/n/k (dtypes, shapes, byte counts, scalars).
absl::Status ValidateLinearWeight(const LinearWeight& w);

// out[r * cols + c] = W[row0 + r, col0 + c] for r < rows, c < cols, in fp32. `out` must hold
// rows * cols floats. A NaN or infinite result (a NaN code in the weight or a scale, an Inf in a
// BF16/F32 weight) is refused with DataLoss naming the tensor and the element.
absl::Status DequantizeBlock(const LinearWeight& w, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                             std::span<float> out);
// Rows [row0, row0 + rows), all K columns: out is rows x k.
absl::Status DequantizeRows(const LinearWeight& w, int64_t row0, int64_t rows, std::span<float> out);
absl::Status DequantizeRows(const LinearWeight& w, int64_t row0, int64_t rows, float* out);
// The whole matrix, N x K.
absl::StatusOr<std::vector<float>> Dequantize(const LinearWeight& w);

}  // namespace dsv4::ckpt
