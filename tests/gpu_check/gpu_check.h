// The one check every gpu-labelled test makes before touching the device: how many CUDA devices are usable and,
// when none is, why (the message a skipped test prints). Tests skip with DSV4_SKIP_WITHOUT_GPU().
#pragma once

#include <string>

#include <gtest/gtest.h>

namespace dsv4::testing {

// Usable CUDA devices; 0 with `why` set (e.g. "no usable CUDA device (cudaGetDeviceCount: ...)") when there are none.
int GpuCount(std::string* why = nullptr);

// Whether at least one CUDA device is usable; `why` (may be null) says why not.
inline bool HaveGpu(std::string* why = nullptr) { return GpuCount(why) > 0; }

}  // namespace dsv4::testing

// Skips the calling test, with the reason, when no CUDA device is usable.
#define DSV4_SKIP_WITHOUT_GPU()                                     \
  do {                                                              \
    std::string dsv4_why_no_gpu;                                    \
    if (!::dsv4::testing::HaveGpu(&dsv4_why_no_gpu)) {              \
      GTEST_SKIP() << dsv4_why_no_gpu;                              \
    }                                                               \
  } while (0)
