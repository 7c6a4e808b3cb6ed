// Device-side bf16 <-> fp32 conversion for NcclCommunicator::AllReduceSumBf16 (built only with CUDA).
// The scalar conversions are common/float_formats.h's, so host (Gloo) and device (NCCL) round identically.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsv4::comm::detail {

// out[n] = fp32(in[n]); enqueued on `stream` (a cudaStream_t). Returns the launch's cudaError_t as an int.
int LaunchBf16ToF32(const uint16_t* in, float* out, size_t n, void* stream);
// out[n] = bf16(in[n]) with round-to-nearest-even; enqueued on `stream`.
int LaunchF32ToBf16(const float* in, uint16_t* out, size_t n, void* stream);

}  // namespace dsv4::comm::detail
