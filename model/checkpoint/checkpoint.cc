// Checkpoint folder: index parsing, lazy shard opening, typed lookups (see checkpoint.h).
#include "model/checkpoint/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace dsv4::ckpt {
namespace {

using nlohmann::json;

bool IsRegularFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return std::move(text).str();
}

// A shard name must stay inside the folder: a plain file name, nothing else.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseCheckpointIndex(absl::string_view index_path,
                                                                       absl::string_view text) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint index ", index_path, ": not valid JSON: ", e.what()));
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object() || j["weight_map"].empty()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint index ", index_path,
                                                   ": needs a non-empty object \"weight_map\": {tensor: shard file}"));
  }
  std::map<std::string, std::string> weight_map;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string() || !IsPlainFileName(it.value().get<std::string>())) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint index ", index_path, ": tensor \"", it.key(),
                                                     "\": shard must be a file name in the folder, got ",
                                                     it.value().dump()));
    }
    weight_map.emplace(it.key(), it.value().get<std::string>());
  }
  return weight_map;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = dir;
  const std::string single = ckpt->PathOf(kSingleFileName);
  const std::string index = ckpt->PathOf(kIndexFileName);
  const bool has_single = IsRegularFile(single), has_index = IsRegularFile(index);
  if (has_single && has_index) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", dir, ": both ", kSingleFileName, " and ",
                                                   kIndexFileName, " exist; remove one"));
  }
  if (!has_single && !has_index) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", dir, ": neither ", kSingleFileName, " nor ", kIndexFileName, " found"));
  }
  if (has_single) {
    DSV4_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(single));
    for (const TensorEntry& e : file->entries()) ckpt->shard_of_.emplace(e.name, 0);
    ckpt->shard_files_.push_back(kSingleFileName);
    absl::MutexLock lock(&ckpt->mu_);
    ckpt->shards_.push_back(std::move(file));
    return ckpt;
  }

  DSV4_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(index));
  DSV4_ASSIGN_OR_RETURN(const auto weight_map, ParseCheckpointIndex(index, text));
  std::map<std::string, int> shard_ids;  // sorted shard names
  for (const auto& [tensor, shard] : weight_map) shard_ids.emplace(shard, 0);
  for (auto& [name, id] : shard_ids) {
    if (!IsRegularFile(ckpt->PathOf(name))) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint ", dir, ": shard ", name, " named in ", kIndexFileName, " is missing"));
    }
    id = static_cast<int>(ckpt->shard_files_.size());
    ckpt->shard_files_.push_back(name);
  }
  for (const auto& [tensor, shard] : weight_map) ckpt->shard_of_.emplace(tensor, shard_ids.at(shard));
  absl::MutexLock lock(&ckpt->mu_);
  ckpt->shards_.resize(ckpt->shard_files_.size());
  return ckpt;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::InMemory(std::string label, std::vector<TensorView> tensors,
                                                                 std::shared_ptr<const void> keep_alive) {
  if (tensors.empty()) return absl::InvalidArgumentError(absl::StrCat("in-memory checkpoint ", label, ": no tensors"));
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = std::move(label);
  ckpt->keep_alive_ = std::move(keep_alive);
  for (TensorView& v : tensors) {
    std::string name = v.name;
    if (!ckpt->memory_.emplace(name, std::move(v)).second) {
      return absl::InvalidArgumentError(absl::StrCat("in-memory checkpoint ", ckpt->dir_, ": tensor ", name,
                                                     " given twice"));
    }
  }
  return ckpt;
}

std::string Checkpoint::PathOf(absl::string_view file) const {
  if (dir_.empty()) return std::string(file);
  return dir_.back() == '/' ? absl::StrCat(dir_, file) : absl::StrCat(dir_, "/", file);
}

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(shard_of_.size() + memory_.size());
  for (const auto& [name, shard] : shard_of_) names.push_back(name);
  for (const auto& [name, view] : memory_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::string> Checkpoint::ShardOf(absl::string_view name) const {
  if (memory_.contains(name)) return std::string("(memory)");
  auto it = shard_of_.find(name);
  if (it == shard_of_.end()) {
    return absl::NotFoundError(absl::StrCat(name, ": no such tensor in checkpoint ", dir_));
  }
  return shard_files_[it->second];
}

absl::StatusOr<const SafetensorsFile*> Checkpoint::Shard(int index) const {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<SafetensorsFile>& slot = shards_[index];
  if (slot == nullptr) {
    DSV4_ASSIGN_OR_RETURN(slot, SafetensorsFile::Open(PathOf(shard_files_[index])));
  }
  return slot.get();  // never replaced once set, so the pointer outlives the lock
}

absl::StatusOr<std::pair<const SafetensorsFile*, const TensorEntry*>> Checkpoint::FindInShards(
    absl::string_view name) const {
  auto it = shard_of_.find(name);
  if (it == shard_of_.end()) {
    return absl::NotFoundError(absl::StrCat(name, ": no such tensor in checkpoint ", dir_));
  }
  DSV4_ASSIGN_OR_RETURN(const SafetensorsFile* shard, Shard(it->second));
  const TensorEntry* entry = shard->Find(name);
  if (entry == nullptr) {
    return absl::DataLossError(absl::StrCat(name, ": ", kIndexFileName, " maps it to ", shard->path(),
                                            " but that file has no such tensor"));
  }
  return std::make_pair(shard, entry);
}

absl::StatusOr<TensorView> Checkpoint::Get(absl::string_view name) const {
  if (auto m = memory_.find(name); m != memory_.end()) return m->second;
  DSV4_ASSIGN_OR_RETURN(auto found, FindInShards(name));
  return found.first->View(*found.second);
}

absl::StatusOr<TensorLocation> Checkpoint::Locate(absl::string_view name) const {
  if (memory_.contains(name)) {
    return absl::FailedPreconditionError(absl::StrCat(name, ": held in memory by checkpoint ", dir_, ", not in a file"));
  }
  DSV4_ASSIGN_OR_RETURN(auto found, FindInShards(name));
  const auto [shard, entry] = found;
  return TensorLocation{.path = shard->path(), .offset = shard->data_start() + entry->begin,
                        .view = shard->View(*entry)};
}

absl::StatusOr<TensorView> Checkpoint::Expect(absl::string_view name, DType dtype,
                                              const std::vector<int64_t>& shape) const {
  DSV4_ASSIGN_OR_RETURN(TensorView view, Get(name));
  if (view.dtype != dtype || view.shape != shape) {
    const auto shard = shard_of_.find(name);
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected ", DescribeTensor(dtype, shape), ", found ",
                                                   DescribeTensor(view.dtype, view.shape), " (in ",
                                                   shard == shard_of_.end() ? dir_ : PathOf(shard_files_[shard->second]),
                                                   ")"));
  }
  return view;
}

absl::Status Checkpoint::ValidateAll() const {
  for (int i = 0; i < static_cast<int>(shard_files_.size()); ++i) {
    DSV4_ASSIGN_OR_RETURN(const SafetensorsFile* shard, Shard(i));
    for (const TensorEntry& e : shard->entries()) {
      auto it = shard_of_.find(e.name);
      if (it == shard_of_.end() || it->second != i) {
        return absl::DataLossError(absl::StrCat(e.name, ": stored in ", shard->path(), " but ", kIndexFileName,
                                                it == shard_of_.end() ? " does not list it"
                                                                      : absl::StrCat(" maps it to ",
                                                                                     shard_files_[it->second])));
      }
    }
  }
  for (const auto& [name, shard] : shard_of_) {
    DSV4_RETURN_IF_ERROR(Get(name).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Checkpoint::ReadText(absl::string_view file) const {
  const std::string path = PathOf(file);
  if (!IsRegularFile(path)) return absl::NotFoundError(absl::StrCat("checkpoint ", dir_, ": no ", file));
  return ReadWholeFile(path);
}

absl::StatusOr<std::string> Checkpoint::ReadConfigJson() const { return ReadText(kConfigFileName); }
absl::StatusOr<std::string> Checkpoint::ReadQuantConfigJson() const { return ReadText(kQuantConfigFileName); }

}  // namespace dsv4::ckpt
