// Process-wide switches of the CUDA backend read once from the environment (A/B measurements from one binary,
// fallbacks): DSV4_NORM_ROPE, DSV4_HC_NORM.
#pragma once

#include <cstdlib>
#include <cstring>

namespace dsv4::kernels::cuda {

// True unless the environment variable `name` is "0".
inline bool EnvFlagOn(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

}  // namespace dsv4::kernels::cuda
