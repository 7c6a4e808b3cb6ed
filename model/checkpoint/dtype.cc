// Safetensors dtype names and element sizes (see dtype.h).
#include "model/checkpoint/dtype.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dsv4::ckpt {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 9> kInfo = {{
    {DType::kBF16, "BF16", 2},
    {DType::kF32, "F32", 4},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E8M0, "F8_E8M0", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kI64, "I64", 8},
    {DType::kI32, "I32", 4},
    {DType::kF16, "F16", 2},
}};

const DTypeInfo& Info(DType dtype) {
  for (const DTypeInfo& info : kInfo) {
    if (info.dtype == dtype) return info;
  }
  return kInfo[0];  // unreachable: every enumerator is in the table (checked by the tests)
}

}  // namespace

absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }

size_t DTypeSize(DType dtype) { return Info(dtype).size; }

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (const DTypeInfo& info : kInfo) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name,
                   "\" (supported: BF16, F32, F8_E4M3, F8_E8M0, U8, I8, I64, I32, F16)"));
}

}  // namespace dsv4::ckpt
