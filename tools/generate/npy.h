// Minimal .npy (NumPy format 1.0) reading and writing for float32 / int16 / int32 arrays, C order,
// little-endian: what dsv4-generate --dump-logits writes and the golden tests read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dsv4::npy {

struct Array {
  std::string descr;            // "<f4", "<i2", "<i4"
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;    // raw little-endian elements
  int64_t numel() const;
  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data.data()); }
};

absl::Status WriteF32(const std::string& path, const float* data, const std::vector<int64_t>& shape);
// Reads a file; refuses fortran order, big-endian and any descr other than <f4, <i2, <i4, <i8.
absl::StatusOr<Array> Read(const std::string& path);

}  // namespace dsv4::npy
