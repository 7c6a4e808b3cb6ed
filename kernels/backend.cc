// The backend-independent parts of the seam: Buffer ownership, uploads, names, KV page sizes.
#include "kernels/backend.h"

#include "common/status_macros.h"
#include "kernels/sparse_mla/kv_row_format.h"

namespace dsv4::kernels {

const char* MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kWeights: return "weights";
    case MemoryKind::kKvCache: return "kv_cache";
    case MemoryKind::kState: return "state";
    case MemoryKind::kWorkspace: return "workspace";
    case MemoryKind::kHostStaging: return "host_staging";
  }
  return "?";
}

const char* WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32: return "F32";
    case WeightFormat::kBF16: return "BF16";
    case WeightFormat::kFp8Block128: return "FP8_BLOCK128";
    case WeightFormat::kNvfp4: return "NVFP4";
    case WeightFormat::kMxfp4: return "MXFP4";
  }
  return "?";
}

// The 584-byte record is kernels/sparse_mla's definition (kv_row_format.h): the CPU production path and the
// GPU kernel share one encoding.
int64_t KvPageBytes(KvFormat format, int dim, int page_rows) {
  if (format == KvFormat::kF32) return int64_t{page_rows} * dim * 4;
  return sparse_mla::KvPageStrideBytes(page_rows);
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Reset();
    owner_ = std::exchange(o.owner_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    kind_ = o.kind_;
  }
  return *this;
}

void Buffer::Reset() {
  if (owner_ != nullptr && data_ != nullptr) owner_->Free(data_, bytes_, kind_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<Buffer> Backend::UploadF32(std::span<const float> host, MemoryKind kind) {
  const int64_t bytes = static_cast<int64_t>(host.size_bytes());
  DSV4_ASSIGN_OR_RETURN(Buffer b, Allocate(bytes, kind));
  if (bytes > 0) {
    DSV4_RETURN_IF_ERROR(CopyToDevice(b.data(), host.data(), bytes));
    DSV4_RETURN_IF_ERROR(Synchronize());  // the host span may go away when we return
  }
  return b;
}

absl::StatusOr<Buffer> Backend::UploadI32(std::span<const int32_t> host, MemoryKind kind) {
  const int64_t bytes = static_cast<int64_t>(host.size_bytes());
  DSV4_ASSIGN_OR_RETURN(Buffer b, Allocate(bytes, kind));
  if (bytes > 0) {
    DSV4_RETURN_IF_ERROR(CopyToDevice(b.data(), host.data(), bytes));
    DSV4_RETURN_IF_ERROR(Synchronize());
  }
  return b;
}

}  // namespace dsv4::kernels
