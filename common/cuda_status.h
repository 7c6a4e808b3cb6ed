// CUDA runtime errors as absl::Status: the one helper every CUDA host file uses (kernels/cuda, kernels/sparse_mla,
// metrics). Header-only so that only targets that already link CUDA::cudart include it.
//
//   DSV4_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(...));              // returns "cudaMemcpyAsync(...): ..." on error
//   return CudaStatus(cudaGetLastError(), "linear launch");
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dsv4 {

// OK for cudaSuccess; otherwise an error naming `what`, the CUDA error name and its description. Out of memory
// maps to kResourceExhausted (a caller may retry with less); everything else is kInternal.
inline absl::Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  // (std::string: this Abseil's string_view is not std::string_view.)
  std::string msg =
      absl::StrCat(std::string(what), ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(std::move(msg));
  return absl::InternalError(std::move(msg));
}

}  // namespace dsv4

// Returns a Status from the enclosing function when the CUDA call `expr` fails; the message names the call.
#define DSV4_CUDA_RETURN_IF_ERROR(expr) DSV4_RETURN_IF_ERROR(::dsv4::CudaStatus((expr), #expr))
