// CudaBackend (cuda_backend.h): memory, copies, the stream, weight preparation and scratch reservation.
#include "kernels/cuda/cuda_backend.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/dense_params.h"
#include "kernels/cuda/launchers.h"

namespace dsv4::kernels::cuda {

CudaBackend::CudaBackend(int device, cudaStream_t stream, std::string name, sparse_mla::SparseMlaKernel attention)
    : device_(device),
      stream_(stream),
      name_(std::move(name)),
      ops_(stream, &scratch_),
      control_(device, stream, [this] { return ops_.TakeError(); }),
      attention_kernel_(attention) {}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  // The scratch buffers point back at this backend: free them while it is whole.
  moe_scratch_.Reset();
  attention_scratch_.Reset();
  indexer_scratch_.Reset();
  cudaStreamDestroy(stream_);
}

absl::Status CudaBackend::Bind() const { return CudaStatus(cudaSetDevice(device_), "cudaSetDevice"); }

absl::StatusOr<Buffer> CudaBackend::Allocate(int64_t bytes, MemoryKind kind) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("allocate: negative size ", bytes));
  if (bytes == 0) return Buffer();
  DSV4_RETURN_IF_ERROR(Bind());
  void* p = nullptr;
  const std::string what = absl::StrCat("allocating ", bytes, " bytes of ", MemoryKindName(kind), " on ", name_);
  if (kind == MemoryKind::kHostStaging) {
    DSV4_RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), what));
    std::memset(p, 0, bytes);
  } else {
    DSV4_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, bytes), what));
    // Zeroed on the stream, so it is ordered before every op and copy that follows.
    const cudaError_t err = cudaMemsetAsync(p, 0, bytes, stream_);
    if (err != cudaSuccess) {
      cudaFree(p);
      return CudaStatus(err, what);
    }
  }
  Count(kind, bytes);
  return Buffer(this, p, bytes, kind);
}

void CudaBackend::Free(void* data, int64_t bytes, MemoryKind kind) {
  cudaSetDevice(device_);
  // cudaFree / cudaFreeHost wait for the device, so work still reading the memory finishes first.
  if (kind == MemoryKind::kHostStaging) {
    cudaFreeHost(data);
  } else {
    cudaFree(data);
  }
  Count(kind, -bytes);
}

absl::Status CudaBackend::CopyToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("copy to device: negative size ", bytes));
  if (bytes == 0) return absl::OkStatus();
  DSV4_RETURN_IF_ERROR(Bind());
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "copy to device");
}

absl::Status CudaBackend::CopyToHost(void* dst, const void* src, int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("copy to host: negative size ", bytes));
  DSV4_RETURN_IF_ERROR(Bind());
  if (bytes > 0) {
    const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_);
    if (err != cudaSuccess) {
      absl::Status first = ops_.TakeError();
      return first.ok() ? CudaStatus(err, "copy to host") : first;
    }
  }
  return Synchronize();
}

absl::Status CudaBackend::Synchronize() {
  DSV4_RETURN_IF_ERROR(Bind());
  const cudaError_t err = cudaStreamSynchronize(stream_);
  absl::Status first = ops_.TakeError();  // earlier than anything the stream reports now
  if (!first.ok()) return first;
  return CudaStatus(err, absl::StrCat("stream of ", name_));
}

absl::StatusOr<LinearHandle> CudaBackend::PrepareLinear(const WeightView& w) {
  DSV4_RETURN_IF_ERROR(Bind());
  return PrepareCudaLinear(w, *this);
}

absl::StatusOr<ExpertsHandle> CudaBackend::PrepareExperts(std::span<const WeightView> w1,
                                                          std::span<const WeightView> w3,
                                                          std::span<const WeightView> w2) {
  DSV4_RETURN_IF_ERROR(Bind());
  return PrepareCudaExperts(w1, w3, w2, *this);
}

absl::Status CudaBackend::GrowScratch(Buffer& buffer, CudaScratch& scratch, int64_t bytes) {
  if (bytes < 0) return absl::InternalError(absl::StrCat("scratch size ", bytes, " is negative"));
  if (bytes <= buffer.bytes()) return absl::OkStatus();
  DSV4_RETURN_IF_ERROR(Synchronize());  // nothing may still use the old scratch
  scratch = CudaScratch{};
  buffer.Reset();
  DSV4_ASSIGN_OR_RETURN(buffer, Allocate(bytes, MemoryKind::kWorkspace));
  scratch = CudaScratch{.data = buffer.data(), .bytes = buffer.bytes()};
  return absl::OkStatus();
}

absl::Status CudaBackend::Reserve(const StepLimits& limits) {
  if (limits.max_tokens < 0 || limits.max_seqs < 0 || limits.max_context < 0) {
    return absl::InvalidArgumentError("reserve: negative step limits");
  }
  DSV4_RETURN_IF_ERROR(GrowScratch(moe_scratch_, scratch_.moe, MoeScratchBytes(limits)));
  DSV4_RETURN_IF_ERROR(GrowScratch(attention_scratch_, scratch_.attention, AttentionScratchBytes(limits)));
  DSV4_RETURN_IF_ERROR(GrowScratch(indexer_scratch_, scratch_.indexer, IndexerScratchBytes(limits)));
  // The sparse-MLA launch plans for steps up to `limits` (GrowScratch reset the scratch struct's plan pointer);
  // nothing enqueued may still use the old plan. Limits without attention heads (a caller that runs no attention,
  // e.g. an op benchmark) get none.
  DSV4_RETURN_IF_ERROR(Synchronize());
  attention_plan_.reset();
  if (limits.heads > 0) {
    DSV4_ASSIGN_OR_RETURN(attention_plan_, MakeAttentionPlan(limits, attention_kernel_));
  }
  scratch_.attention.attention_plan = attention_plan_.get();
  return Synchronize();
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device, sparse_mla::SparseMlaKernel attention) {
  int count = 0;
  DSV4_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " does not exist (", count, " present)"));
  }
  DSV4_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  cudaDeviceProp prop{};
  DSV4_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
  const std::string name = absl::StrCat("cuda:", device, " (", prop.name, ", sm_", prop.major, prop.minor, ")");
  // A device this build has no kernel image for fails here, not at the first op.
  if (const cudaError_t err = internal::ProbeKernelImage(); err != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(name, " cannot run this build's kernels (built for sm_90 and ",
                                                      "sm_120): ", cudaGetErrorString(err)));
  }
  cudaStream_t stream = nullptr;
  DSV4_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  const std::string named = absl::StrCat(name, ", attention ", attention == sparse_mla::SparseMlaKernel::kMma ? "mma" : "simt");
  return std::unique_ptr<Backend>(new CudaBackend(device, stream, named, attention));
}

}  // namespace dsv4::kernels::cuda
