// Read-only access to one .safetensors file, memory-mapped.
//
// Format (https://github.com/huggingface/safetensors): 8-byte little-endian header length N, N bytes
// of JSON {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"k": "v"}}, then the data section; offsets are relative to its start (8 + N).
//
// Open() reads only the header (pread) and maps the file PROT_READ/MAP_PRIVATE; tensor bytes are
// paged in by the kernel when first touched, so a tensor-parallel rank that reads its slice of a
// 5 GB shard reads only that slice from disk. Every structural problem is refused at Open() with a
// message naming the file and, where there is one, the tensor.
//
// Thread safety: a SafetensorsFile is immutable after Open(); all methods may be called concurrently.
// TensorView::data points into the mapping and stays valid while the SafetensorsFile lives. It is
// aligned to the element size for files written by CheckpointWriter (and by the reference writer),
// but a foreign file may place a tensor at any byte offset: read multi-byte elements with memcpy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "model/checkpoint/dtype.h"

namespace dsv4::ckpt {

// Largest header accepted (same limit as the reference implementation's MAX_HEADER_SIZE).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// A tensor inside a mapped file (or a test buffer). Shape [] is a scalar (one element).
struct TensorView {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const;
};

// "[512,4096]"; "[]" for a scalar.
std::string ShapeString(const std::vector<int64_t>& shape);

// Element count of `shape`, or InvalidArgument on a negative dim or int64 overflow.
absl::StatusOr<int64_t> NumElements(const std::vector<int64_t>& shape);

// "F8_E4M3 [512,4096]".
std::string DescribeTensor(DType dtype, const std::vector<int64_t>& shape);

// One header entry; offsets are relative to the data section.
struct TensorEntry {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps `path` and validates its header; see the file comment for what is refused.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  // Byte offset of the data section in the file (8 + header length).
  uint64_t data_start() const { return data_start_; }
  // The "__metadata__" map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Entries sorted by name.
  const std::vector<TensorEntry>& entries() const { return entries_; }

  // nullptr when absent.
  const TensorEntry* Find(absl::string_view name) const;
  // NotFound naming the file and the tensor when absent.
  absl::StatusOr<TensorView> Get(absl::string_view name) const;
  TensorView View(const TensorEntry& entry) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  uint64_t file_size_ = 0;
  uint64_t data_start_ = 0;
  const uint8_t* map_ = nullptr;  // whole file, PROT_READ; nullptr for an empty data section
  size_t map_bytes_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorEntry> entries_;
};

// Parses and validates a header (the JSON text, without the 8-byte length) for a data section of
// `data_bytes` bytes. `file` is used in messages only. Exposed so the writer's tests can check it.
absl::Status ParseSafetensorsHeader(absl::string_view file, absl::string_view json, uint64_t data_bytes,
                                    std::map<std::string, std::string>* metadata,
                                    std::vector<TensorEntry>* entries);

}  // namespace dsv4::ckpt
