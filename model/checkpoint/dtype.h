// Element types a checkpoint tensor can have, with their safetensors header names and sizes.
// The names are the ones the safetensors format (and torch) writes, so a file produced by any
// other tool parses here and a file written here loads there.
#pragma once

#include <array>
#include <cstddef>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace dsv4::ckpt {

enum class DType { kBF16, kF32, kF8E4M3, kF8E8M0, kU8, kI8, kI64, kI32, kF16 };

// Every DType, for tests and loops over all types.
inline constexpr std::array<DType, 9> kAllDTypes = {DType::kBF16, DType::kF32,  DType::kF8E4M3,
                                                    DType::kF8E8M0, DType::kU8,   DType::kI8,
                                                    DType::kI64,    DType::kI32,  DType::kF16};

// "BF16", "F32", "F8_E4M3", "F8_E8M0", "U8", "I8", "I64", "I32", "F16".
absl::string_view DTypeName(DType dtype);

// Bytes per element (1, 2, 4 or 8).
size_t DTypeSize(DType dtype);

// Parses a safetensors dtype name; InvalidArgument naming the text and the accepted names otherwise.
absl::StatusOr<DType> ParseDType(absl::string_view name);

}  // namespace dsv4::ckpt
