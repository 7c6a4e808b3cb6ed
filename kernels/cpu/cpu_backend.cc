// The CPU backend: see cpu_backend.h.
#include "kernels/cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_weights.h"

namespace dsv4::kernels::cpu {
namespace {

constexpr int64_t kAlign = 64;  // a cache line: every buffer starts on its own line

}  // namespace

CpuBackend::CpuBackend(int num_threads) : ops_(num_threads) {}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::name() const { return absl::StrCat("cpu (", ops_.num_threads(), " threads)"); }

absl::Status CpuBackend::Reserve(const StepLimits& limits) {
  if (limits.max_tokens < 0 || limits.max_seqs < 0 || limits.max_context < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Reserve: negative limits (tokens ", limits.max_tokens, ", seqs ",
                                                   limits.max_seqs, ", context ", limits.max_context, ")"));
  }
  ops_.Reserve(limits);
  CountScratch();
  return absl::OkStatus();
}

void CpuBackend::CountScratch() {
  const int64_t now = ops_.scratch_bytes();
  Count(MemoryKind::kWorkspace, now - counted_scratch_);
  counted_scratch_ = now;
}

absl::StatusOr<Buffer> CpuBackend::Allocate(int64_t bytes, MemoryKind kind) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("Allocate: negative size ", bytes));
  if (bytes == 0) return Buffer();
  const int64_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, static_cast<size_t>(rounded));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("Allocate: ", bytes, " bytes of ", MemoryKindName(kind),
                                                     " host memory failed"));
  }
  std::memset(p, 0, static_cast<size_t>(rounded));
  Count(kind, bytes);
  return Buffer(this, p, bytes, kind);
}

void CpuBackend::Free(void* data, int64_t bytes, MemoryKind kind) {
  std::free(data);
  Count(kind, -bytes);
}

absl::Status CpuBackend::CopyToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes < 0 || (bytes > 0 && (dst == nullptr || src == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat("CopyToDevice: ", bytes, " bytes with a null pointer"));
  }
  if (bytes > 0) std::memmove(dst, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToHost(void* dst, const void* src, int64_t bytes) {
  if (bytes < 0 || (bytes > 0 && (dst == nullptr || src == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat("CopyToHost: ", bytes, " bytes with a null pointer"));
  }
  if (bytes > 0) std::memmove(dst, src, static_cast<size_t>(bytes));
  return Synchronize();  // the ops ran before the copy: their first error is this copy's result
}

absl::Status CpuBackend::Synchronize() {
  CountScratch();
  return ops_.TakeError();
}

absl::StatusOr<LinearHandle> CpuBackend::PrepareLinear(const WeightView& w) {
  auto prepared = PrepareCpuLinear(w, *this, ops_.pool());
  if (!prepared.ok()) return prepared.status();
  return LinearHandle(std::move(prepared).value());
}

absl::StatusOr<ExpertsHandle> CpuBackend::PrepareExperts(std::span<const WeightView> w1,
                                                         std::span<const WeightView> w3,
                                                         std::span<const WeightView> w2) {
  return PrepareCpuExperts(w1, w3, w2, *this, ops_.pool());
}

std::unique_ptr<Backend> MakeCpuBackend(int num_threads) { return std::make_unique<CpuBackend>(num_threads); }

}  // namespace dsv4::kernels::cpu
