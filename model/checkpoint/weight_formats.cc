// Linear weight formats: detection, validation, dequantization (see weight_formats.h).
#include "model/checkpoint/weight_formats.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/float_formats.h"
#include "common/status_macros.h"

namespace dsv4::ckpt {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// 256-entry decode tables built once from common/float_formats.h: one load per element.
struct Tables {
  std::array<float, 256> e4m3, e8m0;
  std::array<float, 16> e2m1;
  Tables() {
    for (int i = 0; i < 256; ++i) {
      e4m3[i] = E4m3ToF32(static_cast<uint8_t>(i));
      e8m0[i] = Ue8m0ToF32(static_cast<uint8_t>(i));
    }
    for (int i = 0; i < 16; ++i) e2m1[i] = E2m1ToF32(static_cast<uint8_t>(i));
  }
};
const Tables& T() {
  static const Tables tables;
  return tables;
}

absl::Status CheckView(const LinearWeight& w, const TensorView& v, absl::string_view suffix, DType dtype,
                       const std::vector<int64_t>& shape) {
  if (v.dtype != dtype || v.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(w.base, suffix, ": expected ", DescribeTensor(dtype, shape),
                                                   " for ", WeightFormatName(w.format), ", found ",
                                                   DescribeTensor(v.dtype, v.shape)));
  }
  const int64_t numel = v.numel();
  if (v.nbytes != static_cast<size_t>(numel) * DTypeSize(dtype) || (v.nbytes > 0 && v.data == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(w.base, suffix, ": view holds ", v.nbytes, " bytes at ",
                                                   v.data == nullptr ? "null" : "a buffer", ", shape needs ",
                                                   numel * static_cast<int64_t>(DTypeSize(dtype))));
  }
  return absl::OkStatus();
}

// Reads a F32 scalar tensor ([] or [1]) that must be finite and > 0.
absl::StatusOr<float> PositiveScalar(const Checkpoint& ckpt, const std::string& name) {
  DSV4_ASSIGN_OR_RETURN(TensorView v, ckpt.Get(name));
  if (v.dtype != DType::kF32 || v.numel() != 1 || v.shape.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expected F32 [] (a scalar), found ", DescribeTensor(v.dtype, v.shape)));
  }
  float x;
  std::memcpy(&x, v.data, 4);
  if (!std::isfinite(x) || x <= 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": must be finite and > 0, found ", x));
  }
  return x;
}

// Which companion tensors a linear has; the format follows from these and the weight dtype.
struct Companions {
  bool scale, weight_scale, weight_scale_2, input_scale;
};

absl::StatusOr<WeightFormat> DetectFormat(const std::string& base, const TensorView& weight, const Companions& c) {
  const bool nvfp4_parts = c.weight_scale || c.weight_scale_2 || c.input_scale;
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(base, ".weight is ", DTypeName(weight.dtype), ": ", why));
  };
  switch (weight.dtype) {
    case DType::kBF16:
    case DType::kF32:
      if (c.scale || nvfp4_parts) return refuse("a plain weight has no scale tensors, but some exist");
      return weight.dtype == DType::kBF16 ? WeightFormat::kBF16 : WeightFormat::kF32;
    case DType::kF8E4M3:
      if (!c.scale) return refuse(absl::StrCat("FP8 block-128 needs ", base, ".scale, which is missing"));
      if (nvfp4_parts) return refuse("FP8 block-128 takes .scale only, but NVFP4 scale tensors exist");
      return WeightFormat::kFp8Block128;
    case DType::kU8:
      if (!c.weight_scale || !c.weight_scale_2) {
        return refuse(absl::StrCat("NVFP4 needs ", base, ".weight_scale and ", base, ".weight_scale_2"));
      }
      if (c.scale) return refuse("NVFP4 takes weight_scale*, but a .scale tensor exists too");
      return WeightFormat::kNvfp4;
    case DType::kI8:
      if (!c.scale) return refuse(absl::StrCat("MXFP4 needs ", base, ".scale, which is missing"));
      if (nvfp4_parts) return refuse("MXFP4 takes .scale only, but NVFP4 scale tensors exist");
      return WeightFormat::kMxfp4;
    default:
      return refuse("not a linear weight dtype (BF16, F32, F8_E4M3, U8 NVFP4, I8 MXFP4)");
  }
}

// Calls f(block, begin, end) for each run of columns [begin, end) of [c0, c0 + cols) that shares
// one block scale, so the scale is looked up once per run rather than once per element.
template <int64_t kBlock, typename F>
void ForEachBlockRun(int64_t c0, int64_t cols, F f) {
  for (int64_t k = c0; k < c0 + cols;) {
    const int64_t end = std::min(c0 + cols, (k / kBlock + 1) * kBlock);
    f(k / kBlock, k, end);
    k = end;
  }
}

// e2m1 code of column k in a packed row: low nibble = even k.
inline uint8_t E2m1Code(const uint8_t* row, int64_t k) { return (row[k >> 1] >> (4 * (k & 1))) & 0xf; }

void DequantRow(const LinearWeight& w, int64_t n, int64_t c0, int64_t cols, float* out) {
  const Tables& t = T();
  switch (w.format) {
    case WeightFormat::kBF16:
      for (int64_t c = 0; c < cols; ++c) {
        uint16_t h;
        std::memcpy(&h, w.weight.data + 2 * (n * w.k + c0 + c), 2);  // foreign files may be unaligned
        out[c] = Bf16ToF32(h);
      }
      return;
    case WeightFormat::kF32:
      std::memcpy(out, w.weight.data + 4 * (n * w.k + c0), static_cast<size_t>(cols) * 4);
      return;
    case WeightFormat::kFp8Block128: {
      const uint8_t* row = w.weight.data + n * w.k;
      const uint8_t* s = w.scale.data + (n / kFp8BlockSize) * CeilDiv(w.k, kFp8BlockSize);
      ForEachBlockRun<kFp8BlockSize>(c0, cols, [&](int64_t b, int64_t begin, int64_t end) {
        const float scale = t.e8m0[s[b]];
        for (int64_t k = begin; k < end; ++k) out[k - c0] = t.e4m3[row[k]] * scale;
      });
      return;
    }
    case WeightFormat::kNvfp4: {
      // (e2m1 * e4m3(ws)) * scale_2 in this order: the first product is exact, one rounding in all.
      const uint8_t* row = w.weight.data + n * (w.k / 2);
      const uint8_t* s = w.scale.data + n * (w.k / kNvfp4BlockSize);
      ForEachBlockRun<kNvfp4BlockSize>(c0, cols, [&](int64_t b, int64_t begin, int64_t end) {
        const float ws = t.e4m3[s[b]];
        for (int64_t k = begin; k < end; ++k) out[k - c0] = t.e2m1[E2m1Code(row, k)] * ws * w.scale_2;
      });
      return;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* row = w.weight.data + n * (w.k / 2);
      const uint8_t* s = w.scale.data + n * (w.k / kMxfp4BlockSize);
      ForEachBlockRun<kMxfp4BlockSize>(c0, cols, [&](int64_t b, int64_t begin, int64_t end) {
        const float scale = t.e8m0[s[b]];
        for (int64_t k = begin; k < end; ++k) out[k - c0] = t.e2m1[E2m1Code(row, k)] * scale;
      });
      return;
    }
  }
}

}  // namespace

absl::string_view WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kBF16: return "BF16";
    case WeightFormat::kF32: return "F32";
    case WeightFormat::kFp8Block128: return "FP8_BLOCK128";
    case WeightFormat::kNvfp4: return "NVFP4";
    case WeightFormat::kMxfp4: return "MXFP4";
  }
  return "?";
}

absl::Status ValidateLinearWeight(const LinearWeight& w) {
  if (w.n <= 0 || w.k <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(w.base, ": N and K must be positive, got [", w.n, ",", w.k, "]"));
  }
  const std::vector<int64_t> nk = {w.n, w.k};
  switch (w.format) {
    case WeightFormat::kBF16:
    case WeightFormat::kF32:
      DSV4_RETURN_IF_ERROR(CheckView(w, w.weight, ".weight", w.format == WeightFormat::kBF16 ? DType::kBF16 : DType::kF32, nk));
      if (w.scale.data != nullptr || w.scale.nbytes != 0) {
        return absl::InvalidArgumentError(absl::StrCat(w.base, ": a plain weight has no scale"));
      }
      return absl::OkStatus();
    case WeightFormat::kFp8Block128:
      DSV4_RETURN_IF_ERROR(CheckView(w, w.weight, ".weight", DType::kF8E4M3, nk));
      return CheckView(w, w.scale, ".scale", DType::kF8E8M0,
                       {CeilDiv(w.n, kFp8BlockSize), CeilDiv(w.k, kFp8BlockSize)});
    case WeightFormat::kNvfp4:
    case WeightFormat::kMxfp4: {
      const bool nv = w.format == WeightFormat::kNvfp4;
      const int64_t block = nv ? kNvfp4BlockSize : kMxfp4BlockSize;
      if (w.k % block != 0) {
        return absl::InvalidArgumentError(absl::StrCat(w.base, ": ", WeightFormatName(w.format), " needs K (", w.k,
                                                       ") to be a multiple of ", block));
      }
      DSV4_RETURN_IF_ERROR(CheckView(w, w.weight, ".weight", nv ? DType::kU8 : DType::kI8, {w.n, w.k / 2}));
      DSV4_RETURN_IF_ERROR(CheckView(w, w.scale, nv ? ".weight_scale" : ".scale",
                                     nv ? DType::kF8E4M3 : DType::kF8E8M0, {w.n, w.k / block}));
      if (!(std::isfinite(w.scale_2) && w.scale_2 > 0) || !(std::isfinite(w.input_scale) && w.input_scale > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(w.base, ": weight_scale_2 (", w.scale_2, ") and input_scale (",
                                                       w.input_scale, ") must be finite and > 0"));
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(w.base, ": unknown weight format"));
}

absl::StatusOr<LinearWeight> LoadLinearWeight(const Checkpoint& ckpt, absl::string_view base_view) {
  const std::string base(base_view);
  LinearWeight w;
  w.base = base;
  DSV4_ASSIGN_OR_RETURN(w.weight, ckpt.Get(base + ".weight"));
  if (w.weight.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(base, ".weight: a linear weight is 2-D, found ",
                                                   DescribeTensor(w.weight.dtype, w.weight.shape)));
  }
  const Companions c{.scale = ckpt.Has(base + ".scale"),
                     .weight_scale = ckpt.Has(base + ".weight_scale"),
                     .weight_scale_2 = ckpt.Has(base + ".weight_scale_2"),
                     .input_scale = ckpt.Has(base + ".input_scale")};
  DSV4_ASSIGN_OR_RETURN(w.format, DetectFormat(base, w.weight, c));
  const bool packed = w.format == WeightFormat::kNvfp4 || w.format == WeightFormat::kMxfp4;
  w.n = w.weight.shape[0];
  w.k = packed ? 2 * w.weight.shape[1] : w.weight.shape[1];
  if (w.format == WeightFormat::kNvfp4) {
    DSV4_ASSIGN_OR_RETURN(w.scale, ckpt.Get(base + ".weight_scale"));
    DSV4_ASSIGN_OR_RETURN(w.scale_2, PositiveScalar(ckpt, base + ".weight_scale_2"));
    if (c.input_scale) {
      DSV4_ASSIGN_OR_RETURN(w.input_scale, PositiveScalar(ckpt, base + ".input_scale"));
      w.has_input_scale = true;
    }
  } else if (w.format != WeightFormat::kBF16 && w.format != WeightFormat::kF32) {
    DSV4_ASSIGN_OR_RETURN(w.scale, ckpt.Get(base + ".scale"));
  }
  DSV4_RETURN_IF_ERROR(ValidateLinearWeight(w));
  return w;
}

absl::Status DequantizeBlock(const LinearWeight& w, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                             std::span<float> out) {
  DSV4_RETURN_IF_ERROR(ValidateLinearWeight(w));
  if (row0 < 0 || rows < 0 || row0 > w.n - rows || col0 < 0 || cols < 0 || col0 > w.k - cols) {
    return absl::OutOfRangeError(absl::StrCat(w.base, ": block rows [", row0, ",", row0 + rows, ") cols [", col0,
                                              ",", col0 + cols, ") outside [", w.n, ",", w.k, "]"));
  }
  if (out.size() < static_cast<size_t>(rows * cols)) {
    return absl::InvalidArgumentError(
        absl::StrCat(w.base, ": output holds ", out.size(), " floats, block needs ", rows * cols));
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out.data() + r * cols;
    DequantRow(w, row0 + r, col0, cols, o);
    for (int64_t c = 0; c < cols; ++c) {
      if (!std::isfinite(o[c])) {
        return absl::DataLossError(absl::StrCat(w.base, ": element [", row0 + r, ",", col0 + c, "] dequantizes to ",
                                                o[c], " (NaN/Inf code in the weight or its scale)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DequantizeRows(const LinearWeight& w, int64_t row0, int64_t rows, std::span<float> out) {
  return DequantizeBlock(w, row0, rows, 0, w.k, out);
}

absl::Status DequantizeRows(const LinearWeight& w, int64_t row0, int64_t rows, float* out) {
  if (out == nullptr) return absl::InvalidArgumentError(absl::StrCat(w.base, ": null output"));
  return DequantizeBlock(w, row0, rows, 0, w.k, std::span<float>(out, static_cast<size_t>(std::max<int64_t>(rows, 0) * w.k)));
}

absl::StatusOr<std::vector<float>> Dequantize(const LinearWeight& w) {
  DSV4_RETURN_IF_ERROR(ValidateLinearWeight(w));
  std::vector<float> out(static_cast<size_t>(w.n * w.k));
  DSV4_RETURN_IF_ERROR(DequantizeRows(w, 0, w.n, std::span<float>(out)));
  return out;
}

}  // namespace dsv4::ckpt
