// Writes a checkpoint folder in the safetensors format: one model.safetensors, or K shards
// model-0000i-of-0000K.safetensors plus model.safetensors.index.json.
//
// Streaming: Add() copies the tensor's bytes to an unlinked spool file in the target folder at
// once, so the caller can free them; memory use stays at the names and shapes. Finish() lays the
// shards out and copies the bytes into them (copy_file_range, in the kernel), then renames each
// finished file into place, so a reader never sees a half-written shard.
//
// Deterministic: the output depends only on the set of tensors added, not on the order of Add()
// calls. Tensors are split into shards as contiguous runs of the name-sorted list, cut at equal
// byte fractions (HF style: one layer's tensors sit together). In each file the header JSON has
// its keys sorted and no whitespace, padded with spaces to a multiple of 8 bytes (as the
// reference implementation pads); the data section is laid out as the reference implementation
// does, element size descending, then name, with contiguous offsets, so every tensor starts at an
// address aligned to its element size. "__metadata__" defaults to {"format": "pt"}, which
// transformers requires to load the file.
//
// Thread safety: one thread at a time (externally synchronized).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/checkpoint/dtype.h"
#include "model/checkpoint/safetensors.h"

namespace dsv4::ckpt {

struct CheckpointWriterOptions {
  int num_shards = 1;  // 1: model.safetensors; K > 1: K shards plus the index
  // false: Create() refuses a folder that already holds model*.safetensors or the index.
  // true: Finish() replaces them (and removes stale shards of another sharding).
  bool overwrite = false;
  std::map<std::string, std::string> metadata = {{"format", "pt"}};  // "__metadata__" of each file
};

class CheckpointWriter {
 public:
  // Creates `dir` (and parents) if needed.
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Create(std::string dir, int num_shards);
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Create(std::string dir, CheckpointWriterOptions options);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Adds one tensor. Refuses an empty or duplicate name, "__metadata__", a negative dim, and
  // bytes.size() != numel * DTypeSize(dtype); each message names the tensor.
  absl::Status Add(std::string name, DType dtype, std::vector<int64_t> shape, std::span<const uint8_t> bytes);

  // Writes the files. Refuses more shards than tensors. After Finish() the writer accepts nothing.
  absl::Status Finish();

  int num_tensors() const { return static_cast<int>(entries_.size()); }
  uint64_t total_bytes() const { return spool_bytes_; }

 private:
  struct Spooled {
    TensorEntry entry;      // begin/end unused until Finish()
    uint64_t spool_offset;  // where its bytes are in the spool
  };
  CheckpointWriter() = default;
  absl::Status WriteShard(const std::string& file, std::vector<const Spooled*> tensors) const;
  absl::Status WriteIndex(const std::map<std::string, std::string>& weight_map) const;
  absl::Status RemoveStale(const std::vector<std::string>& keep) const;
  std::string PathOf(const std::string& file) const { return dir_ + "/" + file; }

  std::string dir_;
  CheckpointWriterOptions options_;
  int spool_fd_ = -1;
  uint64_t spool_bytes_ = 0;
  std::vector<Spooled> entries_;
  std::map<std::string, size_t> by_name_;
  bool finished_ = false;
};

// The header bytes (without the 8-byte length) the writer emits for `entries` (offsets filled in):
// compact JSON, keys sorted, padded with spaces to a multiple of 8.
std::string BuildSafetensorsHeader(const std::vector<TensorEntry>& entries,
                                   const std::map<std::string, std::string>& metadata);

// "model-00002-of-00003.safetensors" for index 1 of 3.
std::string ShardFileName(int index, int num_shards);

}  // namespace dsv4::ckpt
