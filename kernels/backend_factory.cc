// MakeBackend: see backend_factory.h.
#include "kernels/backend_factory.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"
#if defined(DSV4_HAVE_CUDA_BACKEND)
#include "kernels/cuda/cuda_backend.h"
#endif

namespace dsv4::kernels {

bool HaveCudaBackend() {
#if defined(DSV4_HAVE_CUDA_BACKEND)
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const BackendOptions& o) {
  if (o.name == "cpu") {
    const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return cpu::MakeCpuBackend(threads);
  }
  if (o.name == "cuda") {
#if defined(DSV4_HAVE_CUDA_BACKEND)
    absl::StatusOr<sparse_mla::SparseMlaKernel> kernel = sparse_mla::ParseSparseMlaKernel(o.attention_kernel);
    if (!kernel.ok()) return kernel.status();
    return cuda::MakeCudaBackend(o.device, *kernel);
#else
    return absl::UnavailableError("backend cuda: this build has no CUDA backend (built without nvcc)");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("backend must be cpu or cuda, got \"", o.name, "\""));
}

}  // namespace dsv4::kernels
