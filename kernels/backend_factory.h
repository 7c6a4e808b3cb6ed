// The one place a program turns a backend name into a Backend (kernels/backend.h): "cpu" (the fp32 reference,
// kernels/cpu) or "cuda" (kernels/cuda, where this build has it and a GPU is visible). The worker, dsv4-generate and
// the benchmarks call this; model/ never does.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace dsv4::kernels {

struct BackendOptions {
  std::string name = "cpu";  // cpu | cuda
  int threads = 0;           // cpu: worker threads (0 = all cores)
  int device = 0;            // cuda: device ordinal
  std::string attention_kernel = "mma";  // cuda: sparse-MLA decode kernel, mma | simt
};

// InvalidArgument for an unknown name, Unavailable for "cuda" in a build without it or with no usable GPU.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const BackendOptions& options);

// Whether this build has the CUDA backend.
bool HaveCudaBackend();

}  // namespace dsv4::kernels
