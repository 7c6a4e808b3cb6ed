// PdlEnabled (pdl.h): DSV4_PDL=0 turns programmatic dependent launch off for the whole process; tests may override.
#include "kernels/cuda/pdl.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace dsv4::kernels::cuda {
namespace {
std::atomic<int> g_override{-1};  // -1: the environment decides
}  // namespace

bool PdlEnabled() {
  const int o = g_override.load(std::memory_order_relaxed);
  if (o >= 0) return o != 0;
  static const bool from_env = [] {
    const char* v = std::getenv("DSV4_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return from_env;
}

void SetPdlForTesting(int enabled) { g_override.store(enabled < 0 ? -1 : enabled != 0, std::memory_order_relaxed); }

}  // namespace dsv4::kernels::cuda
