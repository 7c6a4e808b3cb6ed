// The CUDA backend's prepared linear weight: the checkpoint's bytes in device memory (FP8 block-128 with its
// scales turned into f32 once, BF16, F32), read by the linear kernels (linear.cu) and dequantised only in
// registers. Made by PrepareCudaLinear (launchers.h); LaunchLinear takes any LinearWeight and refuses the ones
// another backend prepared.
#pragma once

#include <cstdint>
#include <utility>

#include "kernels/backend.h"
#include "kernels/weights.h"

namespace dsv4::kernels::cuda {

class CudaLinearWeight final : public LinearWeight {
 public:
  CudaLinearWeight(int64_t n, int64_t k, WeightFormat format, Buffer data, Buffer scale)
      : LinearWeight(n, k, format, data.bytes() + scale.bytes()), data_(std::move(data)), scale_(std::move(scale)) {}

  // [N, Kin]: e4m3 bytes (kFp8Block128), bf16 bits (kBF16) or f32 (kF32).
  const void* data() const { return data_.data(); }
  // kFp8Block128: [ceil(N/128), ceil(Kin/128)] f32 block scales; null otherwise.
  const float* scale() const { return scale_.as<const float>(); }

 private:
  Buffer data_;
  Buffer scale_;
};

}  // namespace dsv4::kernels::cuda
