// A Hugging Face-style checkpoint folder: model.safetensors, or model.safetensors.index.json
// ("weight_map": tensor -> shard file) with its shards, plus config.json / hf_quant_config.json.
//
// Open() reads the index (or the single file's header) only. A shard is opened (header read,
// file mapped) the first time one of its tensors is requested, and its tensor bytes are paged
// in only when touched, so a rank that loads a slice of the model reads only that slice.
// Lookups by name return TensorViews into the mappings; they stay valid while the Checkpoint
// lives. Every error names the tensor and the file it concerns.
//
// Thread safety: all methods are const and may be called from several threads; shard opening
// is serialized by an internal mutex.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "model/checkpoint/safetensors.h"

namespace dsv4::ckpt {

inline constexpr char kSingleFileName[] = "model.safetensors";
inline constexpr char kIndexFileName[] = "model.safetensors.index.json";
inline constexpr char kConfigFileName[] = "config.json";
inline constexpr char kQuantConfigFileName[] = "hf_quant_config.json";

// Parses model.safetensors.index.json text into tensor name -> shard file name. Refuses text that is not
// {"weight_map": {name: "file.safetensors", ...}} with at least one entry, and a shard name that is not a plain
// file name inside the folder ("", ".", "..", anything with '/' or NUL). `index_path` is used in messages only.
// Checkpoint::Open uses it; exposed for the tests and the fuzz target (fuzz/checkpoint_index_fuzzer.cc).
absl::StatusOr<std::map<std::string, std::string>> ParseCheckpointIndex(absl::string_view index_path,
                                                                       absl::string_view text);

// Where a tensor's bytes lie on disk, for readers that do not go through the mapping (stream_reader.h).
struct TensorLocation {
  std::string path;     // the shard file
  uint64_t offset = 0;  // of the tensor's first byte in the file
  TensorView view;      // name, dtype, shape, nbytes; data points into the mapping (not touched by Locate)
};

class Checkpoint {
 public:
  // Opens `dir`. Refuses a folder with neither (or both) of model.safetensors and the index, an
  // index that is not {"weight_map": {name: "file.safetensors"}}, a shard name that leaves the
  // folder, and a missing shard file.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);
  // A checkpoint held in memory instead of a folder (bench/decode builds its synthetic weights this way): the
  // views point into memory that `keep_alive` owns (or that outlives the Checkpoint); several views may share
  // bytes. `label` stands for the folder in messages. Refuses an empty list and a name given twice. Has no
  // config.json (ReadConfigJson is NotFound).
  static absl::StatusOr<std::unique_ptr<Checkpoint>> InMemory(std::string label, std::vector<TensorView> tensors,
                                                             std::shared_ptr<const void> keep_alive);

  const std::string& dir() const { return dir_; }
  // Shard file names (relative to dir), sorted.
  const std::vector<std::string>& shard_files() const { return shard_files_; }
  // Every tensor name, sorted.
  std::vector<std::string> Names() const;
  bool Has(absl::string_view name) const { return shard_of_.contains(name) || memory_.contains(name); }
  // Made by InMemory: no tensor has a file, so readers that bypass the mapping (Locate) cannot be used.
  bool in_memory() const { return !memory_.empty(); }
  // Shard file name holding `name`; NotFound when absent.
  absl::StatusOr<std::string> ShardOf(absl::string_view name) const;

  // The tensor; NotFound naming the tensor when absent, or the shard's open error.
  absl::StatusOr<TensorView> Get(absl::string_view name) const;
  // Get() plus a dtype/shape check: "layers.2.attn.wkv.weight: expected F8_E4M3 [512,4096],
  // found BF16 [512,4096] (in <dir>/<shard>)".
  absl::StatusOr<TensorView> Expect(absl::string_view name, DType dtype, const std::vector<int64_t>& shape) const;

  // Get() plus the tensor's file and byte offset (the shard's header is read; no tensor byte is touched).
  // FailedPrecondition for a tensor of an InMemory checkpoint (it has no file).
  absl::StatusOr<TensorLocation> Locate(absl::string_view name) const;

  // Opens every shard and checks the index against the shards both ways (every indexed tensor is
  // in its shard; every tensor of a shard is indexed to that shard). Reads headers only.
  absl::Status ValidateAll() const;

  // config.json / hf_quant_config.json text, read whole (they are small). NotFound when absent.
  absl::StatusOr<std::string> ReadConfigJson() const;
  absl::StatusOr<std::string> ReadQuantConfigJson() const;
  // Path of a file inside the folder (no existence check).
  std::string PathOf(absl::string_view file) const;

 private:
  Checkpoint() = default;
  absl::StatusOr<const SafetensorsFile*> Shard(int index) const;
  // The shard file holding `name` and its entry there (NotFound / DataLoss naming the tensor otherwise).
  absl::StatusOr<std::pair<const SafetensorsFile*, const TensorEntry*>> FindInShards(absl::string_view name) const;
  absl::StatusOr<std::string> ReadText(absl::string_view file) const;

  std::string dir_;
  std::vector<std::string> shard_files_;
  absl::flat_hash_map<std::string, int> shard_of_;  // tensor -> index into shard_files_
  mutable absl::Mutex mu_;
  mutable std::vector<std::unique_ptr<SafetensorsFile>> shards_ ABSL_GUARDED_BY(mu_);
  // InMemory only: the tensors (no shard files) and what owns their bytes.
  absl::flat_hash_map<std::string, TensorView> memory_;
  std::shared_ptr<const void> keep_alive_;
};

}  // namespace dsv4::ckpt
