// Quantizers for the checkpoint weight formats (see quantize.h).
#include "model/checkpoint/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/float_formats.h"
#include "common/status_macros.h"

namespace dsv4::ckpt {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Largest |x| over rows [r0, r1) x cols [c0, c1) of the N x K matrix.
float BlockAmax(std::span<const float> w, int64_t k, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  float amax = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * k + c]));
  }
  return amax;
}

void QuantizeFp8(std::span<const float> w, QuantizedLinear& q) {
  const int64_t nb = CeilDiv(q.n, kFp8BlockSize), kb = CeilDiv(q.k, kFp8BlockSize);
  q.weight.resize(static_cast<size_t>(q.n * q.k));
  q.scale.resize(static_cast<size_t>(nb * kb));
  for (int64_t bi = 0; bi < nb; ++bi) {
    for (int64_t bj = 0; bj < kb; ++bj) {
      const int64_t r0 = bi * kFp8BlockSize, r1 = std::min(q.n, r0 + kFp8BlockSize);
      const int64_t c0 = bj * kFp8BlockSize, c1 = std::min(q.k, c0 + kFp8BlockSize);
      const uint8_t s = Ue8m0CeilFromF32(BlockAmax(w, q.k, r0, r1, c0, c1) / 448.0f);
      q.scale[bi * kb + bj] = s;
      const float inv = 1.0f / Ue8m0ToF32(s);  // exact: a power of two
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) q.weight[r * q.k + c] = F32ToE4m3(w[r * q.k + c] * inv);
      }
    }
  }
}

// Packs e2m1 codes two per byte, low nibble = even k; block_scale(r, b) is the full scale of the
// `block`-wide run b of row r (0 -> code 0). Divides (not multiplies by the inverse) as ModelOpt does.
template <typename BlockScale>
void PackE2m1(std::span<const float> w, QuantizedLinear& q, int64_t block, BlockScale block_scale) {
  q.weight.assign(static_cast<size_t>(q.n * q.k / 2), 0);
  for (int64_t r = 0; r < q.n; ++r) {
    for (int64_t b = 0; b < q.k / block; ++b) {
      const float s = block_scale(r, b);
      for (int64_t c = b * block; c < (b + 1) * block; ++c) {
        const uint8_t code = s > 0.0f ? F32ToE2m1(w[r * q.k + c] / s) : 0;
        q.weight[r * (q.k / 2) + c / 2] |= static_cast<uint8_t>(code << (4 * (c & 1)));
      }
    }
  }
}

void QuantizeNvfp4(std::span<const float> w, QuantizedLinear& q) {
  const int64_t kb = q.k / kNvfp4BlockSize;
  const float amax = BlockAmax(w, q.k, 0, q.n, 0, q.k);
  q.scale_2 = amax > 0.0f ? amax / (6.0f * 448.0f) : 1.0f;
  q.scale.resize(static_cast<size_t>(q.n * kb));
  for (int64_t r = 0; r < q.n; ++r) {
    for (int64_t b = 0; b < kb; ++b) {
      const float block_amax = BlockAmax(w, q.k, r, r + 1, b * kNvfp4BlockSize, (b + 1) * kNvfp4BlockSize);
      uint8_t s = F32ToE4m3(block_amax / 6.0f / q.scale_2);
      if (E4m3ToF32(s) == 0.0f) s = F32ToE4m3(1.0f);  // ModelOpt: a zero block scale becomes 1
      q.scale[r * kb + b] = s;
    }
  }
  PackE2m1(w, q, kNvfp4BlockSize, [&](int64_t r, int64_t b) { return E4m3ToF32(q.scale[r * kb + b]) * q.scale_2; });
}

void QuantizeMxfp4(std::span<const float> w, QuantizedLinear& q) {
  const int64_t kb = q.k / kMxfp4BlockSize;
  q.scale.resize(static_cast<size_t>(q.n * kb));
  for (int64_t r = 0; r < q.n; ++r) {
    for (int64_t b = 0; b < kb; ++b) {
      const float block_amax = BlockAmax(w, q.k, r, r + 1, b * kMxfp4BlockSize, (b + 1) * kMxfp4BlockSize);
      q.scale[r * kb + b] = Ue8m0CeilFromF32(block_amax / 6.0f);
    }
  }
  PackE2m1(w, q, kMxfp4BlockSize, [&](int64_t r, int64_t b) { return Ue8m0ToF32(q.scale[r * kb + b]); });
}

absl::Status AddScalar(CheckpointWriter& writer, const std::string& name, float x) {
  uint8_t bytes[4];
  std::memcpy(bytes, &x, 4);
  return writer.Add(name, DType::kF32, {}, bytes);
}

}  // namespace

absl::StatusOr<QuantizedLinear> QuantizeLinear(WeightFormat format, std::span<const float> w, int64_t n, int64_t k) {
  const std::string what = absl::StrCat("quantize to ", WeightFormatName(format), ": ");
  if (n <= 0 || k <= 0 || w.size() != static_cast<size_t>(n * k)) {
    return absl::InvalidArgumentError(absl::StrCat(what, "need N, K > 0 and N*K values; got N=", n, " K=", k, ", ",
                                                   w.size(), " values"));
  }
  const int64_t block = format == WeightFormat::kNvfp4 ? kNvfp4BlockSize
                        : format == WeightFormat::kMxfp4 ? kMxfp4BlockSize : 1;
  if (k % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, "K (", k, ") must be a multiple of ", block));
  }
  for (size_t i = 0; i < w.size(); ++i) {
    if (!std::isfinite(w[i])) {
      return absl::InvalidArgumentError(absl::StrCat(what, "element [", i / k, ",", i % k, "] is ", w[i]));
    }
  }
  QuantizedLinear q;
  q.format = format;
  q.n = n;
  q.k = k;
  switch (format) {
    case WeightFormat::kBF16:
      q.weight_dtype = DType::kBF16;
      q.weight.resize(w.size() * 2);
      for (size_t i = 0; i < w.size(); ++i) {
        const uint16_t h = F32ToBf16(w[i]);
        std::memcpy(&q.weight[2 * i], &h, 2);
      }
      break;
    case WeightFormat::kF32:
      q.weight_dtype = DType::kF32;
      q.weight.resize(w.size() * 4);
      std::memcpy(q.weight.data(), w.data(), w.size() * 4);
      break;
    case WeightFormat::kFp8Block128:
      q.weight_dtype = DType::kF8E4M3;
      q.scale_dtype = DType::kF8E8M0;
      q.scale_shape = {CeilDiv(n, kFp8BlockSize), CeilDiv(k, kFp8BlockSize)};
      QuantizeFp8(w, q);
      break;
    case WeightFormat::kNvfp4:
      q.weight_dtype = DType::kU8;
      q.scale_dtype = DType::kF8E4M3;
      q.scale_shape = {n, k / kNvfp4BlockSize};
      QuantizeNvfp4(w, q);
      break;
    case WeightFormat::kMxfp4:
      q.weight_dtype = DType::kI8;
      q.scale_dtype = DType::kF8E8M0;
      q.scale_shape = {n, k / kMxfp4BlockSize};
      QuantizeMxfp4(w, q);
      break;
  }
  const bool packed = format == WeightFormat::kNvfp4 || format == WeightFormat::kMxfp4;
  q.weight_shape = {n, packed ? k / 2 : k};
  return q;
}

LinearWeight QuantizedLinear::View(std::string base) const {
  LinearWeight w;
  w.base = std::move(base);
  w.format = format;
  w.n = n;
  w.k = k;
  w.weight = TensorView{.name = w.base + ".weight", .dtype = weight_dtype, .shape = weight_shape,
                        .data = weight.data(), .nbytes = weight.size()};
  if (!scale_shape.empty()) {
    w.scale = TensorView{.name = w.base + (format == WeightFormat::kNvfp4 ? ".weight_scale" : ".scale"),
                         .dtype = scale_dtype, .shape = scale_shape, .data = scale.data(), .nbytes = scale.size()};
  }
  if (format == WeightFormat::kNvfp4) {
    w.scale_2 = scale_2;
    w.input_scale = input_scale;
    w.has_input_scale = true;
  }
  return w;
}

absl::Status AddLinear(CheckpointWriter& writer, const std::string& base, const QuantizedLinear& q) {
  DSV4_RETURN_IF_ERROR(ValidateLinearWeight(q.View(base)));
  DSV4_RETURN_IF_ERROR(writer.Add(base + ".weight", q.weight_dtype, q.weight_shape, q.weight));
  switch (q.format) {
    case WeightFormat::kBF16:
    case WeightFormat::kF32:
      return absl::OkStatus();
    case WeightFormat::kFp8Block128:
    case WeightFormat::kMxfp4:
      return writer.Add(base + ".scale", q.scale_dtype, q.scale_shape, q.scale);
    case WeightFormat::kNvfp4:
      DSV4_RETURN_IF_ERROR(writer.Add(base + ".weight_scale", q.scale_dtype, q.scale_shape, q.scale));
      DSV4_RETURN_IF_ERROR(AddScalar(writer, base + ".weight_scale_2", q.scale_2));
      return AddScalar(writer, base + ".input_scale", q.input_scale);
  }
  return absl::OkStatus();
}

}  // namespace dsv4::ckpt
