// Shared helpers of the CUDA op tests (cuda_ops_test): the GPU check that skips a test with a message, a CPU
// and a CUDA backend side by side, host <-> backend copies, random inputs and checkpoint-format weights, and
// the comparison every op test prints (max abs error, relative error by norm, worst index; NaN never passes).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/weights.h"

namespace dsv4::kernels::cuda::testing {

// Whether a CUDA device is usable; `why` says why not.
bool HaveGpu(std::string* why);

// Skips the calling test (with the reason) when no GPU is usable.
#define DSV4_REQUIRE_GPU()                                       \
  do {                                                           \
    std::string why_no_gpu;                                      \
    if (!::dsv4::kernels::cuda::testing::HaveGpu(&why_no_gpu)) { \
      GTEST_SKIP() << why_no_gpu;                                \
    }                                                            \
  } while (0)

// The CPU reference backend and the CUDA backend (device 0), made once per test binary.
struct Backends {
  Backend& cpu;
  Backend& cuda;
};
Backends GetBackends();

// Host <-> backend memory (the helpers fail the test on error and return empty results).
Buffer Upload(Backend& b, std::span<const float> host, MemoryKind kind = MemoryKind::kWorkspace);
Buffer UploadI32(Backend& b, std::span<const int32_t> host);
Buffer UploadBytes(Backend& b, const void* host, int64_t bytes);
std::vector<float> Download(Backend& b, const Buffer& buf, int64_t n);
// A buffer of n floats filled with NaN (an element an op forgets to write fails the comparison).
Buffer Poisoned(Backend& b, int64_t n);

// Fresh random inputs (a seeded generator per test keeps failures reproducible).
std::vector<float> RandomNormal(std::mt19937& rng, int64_t n, float stddev = 1.f);
// Rounds every value to the nearest bf16 (so a backend's bf16 rounding of it is exact).
void RoundToBf16(std::vector<float>& v);

// A linear weight in its checkpoint format over host bytes, as a loader hands it to PrepareLinear.
struct HostWeight {
  WeightView view;
  std::vector<uint8_t> data, scale;
};
// Random weights of `format` (F32, BF16, FP8_BLOCK128 with ue8m0 or, scale_f32, non-power-of-two f32 scales),
// magnitudes like a trained layer's (|W| ~ 1/sqrt(k)).
HostWeight RandomWeight(std::mt19937& rng, WeightFormat format, int64_t n, int64_t k, bool scale_f32 = false);

// got vs want: max |got - want|, ||got - want|| / ||want||, where the largest difference is, and whether any
// value is NaN or infinite (which fails every check).
struct Diff {
  double max_abs = 0, rel = 0;
  int64_t worst = -1;
  bool non_finite = false;
};
Diff Compare(std::span<const float> got, std::span<const float> want);
// Prints the comparison under `what` and checks rel <= max_rel and max_abs <= max_abs_err.
void ExpectClose(const std::string& what, std::span<const float> got, std::span<const float> want, double max_rel,
                 double max_abs_err = 1e30);
// Bit-for-bit equality (reports the first mismatching index).
void ExpectBitEqual(const std::string& what, std::span<const float> got, std::span<const float> want);

}  // namespace dsv4::kernels::cuda::testing
