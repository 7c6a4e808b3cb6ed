// Checkpoint writer: spool, shard split, header serialization, index (see safetensors_writer.h).
#include "model/checkpoint/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "model/checkpoint/checkpoint.h"

namespace dsv4::ckpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const std::string& path, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Errno("write", path);
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// Copies n bytes from `in` at `offset` to the current position of `out`: in the kernel when the
// filesystem allows, else through a buffer.
absl::Status CopyRange(int in, uint64_t offset, int out, const std::string& out_path, uint64_t n) {
  loff_t off = static_cast<loff_t>(offset);
  while (n > 0) {
    const ssize_t c = ::copy_file_range(in, &off, out, nullptr, n, 0);
    if (c < 0 && errno == EINTR) continue;
    if (c <= 0) break;  // unsupported here (or EOF, impossible for the spool): fall back
    n -= static_cast<uint64_t>(c);
  }
  std::vector<char> buf(n > 0 ? std::min<uint64_t>(n, 4u << 20) : 0);
  while (n > 0) {
    const ssize_t r = ::pread(in, buf.data(), std::min<uint64_t>(n, buf.size()), off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return absl::InternalError(absl::StrCat("spool read failed while writing ", out_path));
    DSV4_RETURN_IF_ERROR(WriteAll(out, out_path, buf.data(), static_cast<size_t>(r)));
    off += r;
    n -= static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

// Contiguous runs of the name-sorted list, cut where the running byte count crosses s/K of the
// total (midpoint rule), each shard holding at least one tensor.
template <typename T>
std::vector<std::vector<const T*>> SplitIntoShards(const std::vector<const T*>& sorted, int k) {
  uint64_t total = 0;
  for (const T* t : sorted) total += t->entry.end;  // `end` holds the byte count before layout
  std::vector<std::vector<const T*>> shards(k);
  size_t i = 0;
  unsigned __int128 cum = 0;
  for (int s = 0; s < k; ++s) {
    const unsigned __int128 boundary = static_cast<unsigned __int128>(total) * (s + 1) / k;
    const size_t reserve = static_cast<size_t>(k - 1 - s);  // one tensor for each later shard
    while (i < sorted.size() - reserve) {
      const uint64_t b = sorted[i]->entry.end;
      if (s != k - 1 && !shards[s].empty() && 2 * cum + b > 2 * boundary) break;
      shards[s].push_back(sorted[i]);
      cum += b;
      ++i;
    }
  }
  return shards;
}

bool IsOurOutput(const std::string& name) {
  static const std::regex kShard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == kSingleFileName || name == kIndexFileName || std::regex_match(name, kShard);
}

}  // namespace

std::string ShardFileName(int index, int num_shards) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, num_shards);
}

std::string BuildSafetensorsHeader(const std::vector<TensorEntry>& entries,
                                   const std::map<std::string, std::string>& metadata) {
  json header = json::object();  // std::map-backed: keys come out sorted
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const TensorEntry& e : entries) {
    header[e.name] = {{"dtype", DTypeName(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Create(std::string dir, int num_shards) {
  CheckpointWriterOptions options;
  options.num_shards = num_shards;
  return Create(std::move(dir), std::move(options));
}

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Create(std::string dir,
                                                                           CheckpointWriterOptions options) {
  if (options.num_shards < 1 || options.num_shards > 99999) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint writer: num_shards must be in [1, 99999], got ", options.num_shards));
  }
  if (dir.empty()) return absl::InvalidArgumentError("checkpoint writer: empty directory name");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("checkpoint writer: cannot create ", dir, ": ", ec.message()));
  if (!options.overwrite) {
    for (const fs::directory_entry& f : fs::directory_iterator(dir, ec)) {
      if (IsOurOutput(f.path().filename().string())) {
        return absl::FailedPreconditionError(absl::StrCat("checkpoint writer: ", f.path().string(),
                                                          " already exists (set overwrite to replace it)"));
      }
    }
  }
  std::unique_ptr<CheckpointWriter> w(new CheckpointWriter());
  w->dir_ = std::move(dir);
  w->options_ = std::move(options);
  // Unlinked at once: the spool vanishes with the process, whatever happens to it.
  const std::string spool = w->PathOf(absl::StrCat(".dsv4-spool-", ::getpid(), ".tmp"));
  w->spool_fd_ = ::open(spool.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (w->spool_fd_ < 0) return Errno("create", spool);
  ::unlink(spool.c_str());
  return w;
}

CheckpointWriter::~CheckpointWriter() {
  if (spool_fd_ >= 0) ::close(spool_fd_);
}

absl::Status CheckpointWriter::Add(std::string name, DType dtype, std::vector<int64_t> shape,
                                   std::span<const uint8_t> bytes) {
  if (finished_) return absl::FailedPreconditionError(absl::StrCat(name, ": Add() after Finish()"));
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint writer: invalid tensor name \"", name, "\""));
  }
  if (by_name_.contains(name)) return absl::InvalidArgumentError(absl::StrCat(name, ": added twice"));
  absl::StatusOr<int64_t> numel = NumElements(shape);
  if (!numel.ok()) return absl::InvalidArgumentError(absl::StrCat(name, ": ", numel.status().message()));
  const uint64_t want = static_cast<uint64_t>(*numel) * DTypeSize(dtype);
  if (bytes.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", DescribeTensor(dtype, shape), " needs ", want,
                                                   " bytes, got ", bytes.size()));
  }
  DSV4_RETURN_IF_ERROR(WriteAll(spool_fd_, dir_ + "/<spool>", bytes.data(), bytes.size()));
  Spooled s{.entry = {.name = name, .dtype = dtype, .shape = std::move(shape), .begin = 0, .end = want},
            .spool_offset = spool_bytes_};
  spool_bytes_ += want;
  by_name_.emplace(std::move(name), entries_.size());
  entries_.push_back(std::move(s));
  return absl::OkStatus();
}

absl::Status CheckpointWriter::WriteShard(const std::string& file, std::vector<const Spooled*> tensors) const {
  // Reference layout: larger elements first so every tensor is aligned to its element size.
  std::sort(tensors.begin(), tensors.end(), [](const Spooled* a, const Spooled* b) {
    const size_t sa = DTypeSize(a->entry.dtype), sb = DTypeSize(b->entry.dtype);
    return sa != sb ? sa > sb : a->entry.name < b->entry.name;
  });
  std::vector<TensorEntry> laid_out;
  uint64_t offset = 0;
  for (const Spooled* t : tensors) {
    TensorEntry e = t->entry;
    e.begin = offset;
    e.end = offset + t->entry.end;
    offset = e.end;
    laid_out.push_back(std::move(e));
  }
  const std::string header = BuildSafetensorsHeader(laid_out, options_.metadata);
  const std::string final_path = PathOf(file), partial = final_path + ".partial";
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create", partial);
  absl::Status st;
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  st.Update(WriteAll(fd, partial, len, 8));
  if (st.ok()) st.Update(WriteAll(fd, partial, header.data(), header.size()));
  for (const Spooled* t : tensors) {
    if (!st.ok()) break;
    st.Update(CopyRange(spool_fd_, t->spool_offset, fd, partial, t->entry.end));
  }
  if (::close(fd) != 0 && st.ok()) st = Errno("close", partial);
  if (st.ok() && ::rename(partial.c_str(), final_path.c_str()) != 0) st = Errno("rename", partial);
  if (!st.ok()) ::unlink(partial.c_str());
  return st;
}

absl::Status CheckpointWriter::WriteIndex(const std::map<std::string, std::string>& weight_map) const {
  const json index = {{"metadata", {{"total_size", spool_bytes_}}}, {"weight_map", weight_map}};
  const std::string text = index.dump(2) + "\n";  // as transformers writes it (indent 2, sorted keys)
  const std::string path = PathOf(kIndexFileName), partial = path + ".partial";
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create", partial);
  absl::Status st = WriteAll(fd, partial, text.data(), text.size());
  if (::close(fd) != 0 && st.ok()) st = Errno("close", partial);
  if (st.ok() && ::rename(partial.c_str(), path.c_str()) != 0) st = Errno("rename", partial);
  return st;
}

absl::Status CheckpointWriter::RemoveStale(const std::vector<std::string>& keep) const {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const fs::directory_entry& f : fs::directory_iterator(dir_, ec)) {
    const std::string name = f.path().filename().string();
    if (IsOurOutput(name) && std::find(keep.begin(), keep.end(), name) == keep.end()) stale.push_back(f.path());
  }
  for (const fs::path& p : stale) {
    if (!fs::remove(p, ec) || ec) return absl::InternalError(absl::StrCat("cannot remove stale ", p.string()));
  }
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Finish() {
  if (finished_) return absl::FailedPreconditionError("checkpoint writer: Finish() called twice");
  finished_ = true;
  const int k = options_.num_shards;
  if (static_cast<int>(entries_.size()) < k) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint writer ", dir_, ": ", k, " shard(s) requested but ",
                                                      entries_.size(), " tensor(s) added"));
  }
  std::vector<const Spooled*> sorted;
  for (const auto& [name, i] : by_name_) sorted.push_back(&entries_[i]);  // by_name_ is name-ordered
  const std::vector<std::vector<const Spooled*>> shards = SplitIntoShards(sorted, k);
  std::vector<std::string> written;
  std::map<std::string, std::string> weight_map;
  for (int s = 0; s < k; ++s) {
    const std::string file = k == 1 ? std::string(kSingleFileName) : ShardFileName(s, k);
    DSV4_RETURN_IF_ERROR(WriteShard(file, shards[s]));
    written.push_back(file);
    for (const Spooled* t : shards[s]) weight_map[t->entry.name] = file;
  }
  if (k > 1) {
    DSV4_RETURN_IF_ERROR(WriteIndex(weight_map));
    written.push_back(kIndexFileName);
  }
  ::close(spool_fd_);
  spool_fd_ = -1;
  return RemoveStale(written);
}

}  // namespace dsv4::ckpt
