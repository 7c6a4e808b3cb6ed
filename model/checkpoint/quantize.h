// Quantize an fp32 matrix W [N, K] into each checkpoint weight format (the inverse of
// weight_formats.h), for the checkpoint generator and the round-trip tests.
//
// Scale rules (the ones the published checkpoints were made with):
//   FP8 block-128  s = ue8m0 ceil(amax(block) / 448): the smallest power of two with amax/s <= 448;
//                  w = e4m3(W / s). An all-zero block gets s = 2^-127 (code 0).
//   NVFP4          scale_2 = amax(W) / (6 * 448) (1 for an all-zero W); per 16 along K
//                  ws = e4m3(amax(block) / 6 / scale_2) (1.0 where that is 0, as ModelOpt does);
//                  code = e2m1(W / (e4m3(ws) * scale_2)); input_scale = 1 unless the caller sets it.
//   MXFP4          s = ue8m0 ceil(amax(block of 32 along K) / 6); code = e2m1(W / s).
// All rounding is round-to-nearest-even through common/float_formats.h, so output is bit-identical
// on every machine.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/checkpoint/safetensors_writer.h"
#include "model/checkpoint/weight_formats.h"

namespace dsv4::ckpt {

// Owned bytes of one quantized linear, in checkpoint layout.
struct QuantizedLinear {
  WeightFormat format = WeightFormat::kBF16;
  int64_t n = 0, k = 0;
  DType weight_dtype = DType::kBF16;
  std::vector<int64_t> weight_shape;
  std::vector<uint8_t> weight;
  DType scale_dtype = DType::kF8E8M0;  // unused for kBF16 / kF32
  std::vector<int64_t> scale_shape;    // empty for kBF16 / kF32
  std::vector<uint8_t> scale;
  float scale_2 = 1.0f;      // kNvfp4
  float input_scale = 1.0f;  // kNvfp4, written as X.input_scale

  // Views into this object (valid while it lives), e.g. to dequantize without a checkpoint.
  LinearWeight View(std::string base) const;
};

// `w` is N x K row-major and must be finite; K must be a multiple of 16 (NVFP4) or 32 (MXFP4).
absl::StatusOr<QuantizedLinear> QuantizeLinear(WeightFormat format, std::span<const float> w, int64_t n, int64_t k);

// Adds `base`.weight and its companions (names as in weight_formats.h) to `writer`.
absl::Status AddLinear(CheckpointWriter& writer, const std::string& base, const QuantizedLinear& q);

}  // namespace dsv4::ckpt
