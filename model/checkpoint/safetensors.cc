// Safetensors reader: header validation and the read-only mapping (see safetensors.h).
#include "model/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace dsv4::ckpt {
namespace {

using nlohmann::json;

absl::Status Invalid(absl::string_view file, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors file ", file, ": ", what));
}
absl::Status TensorInvalid(absl::string_view file, absl::string_view tensor, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors file ", file, ": tensor \"", tensor, "\": ", what));
}

// Reads exactly `n` bytes at `offset`; DataLoss when the file ends first.
absl::Status PreadFull(int fd, const std::string& path, uint64_t offset, size_t n, char* out) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return absl::InternalError(absl::StrCat("read ", path, ": ", std::strerror(errno)));
    if (r == 0) {
      return absl::DataLossError(absl::StrCat("safetensors file ", path, ": truncated while reading bytes ",
                                              offset, "..", offset + n));
    }
    done += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

// Reads a JSON array of non-negative integers that fit in int64.
bool ReadUintArray(const json& j, std::vector<uint64_t>* out) {
  if (!j.is_array()) return false;
  for (const json& v : j) {
    if (!v.is_number_unsigned()) return false;
    const uint64_t x = v.get<uint64_t>();
    if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    out->push_back(x);
  }
  return true;
}

absl::StatusOr<TensorEntry> ParseEntry(absl::string_view file, const std::string& name, const json& j,
                                       uint64_t data_bytes) {
  if (name.empty()) return Invalid(file, "a tensor has an empty name");
  if (!j.is_object()) return TensorInvalid(file, name, "header entry is not a JSON object");
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!j.contains(key)) return TensorInvalid(file, name, absl::StrCat("header entry lacks \"", key, "\""));
  }
  TensorEntry e;
  e.name = name;
  if (!j["dtype"].is_string()) return TensorInvalid(file, name, "\"dtype\" is not a string");
  absl::StatusOr<DType> dtype = ParseDType(j["dtype"].get<std::string>());
  if (!dtype.ok()) return TensorInvalid(file, name, dtype.status().message());
  e.dtype = *dtype;
  std::vector<uint64_t> dims, offsets;
  if (!ReadUintArray(j["shape"], &dims)) {
    return TensorInvalid(file, name, absl::StrCat("\"shape\" is not an array of non-negative integers: ",
                                                  j["shape"].dump()));
  }
  for (uint64_t d : dims) e.shape.push_back(static_cast<int64_t>(d));
  if (!ReadUintArray(j["data_offsets"], &offsets) || offsets.size() != 2 || offsets[0] > offsets[1]) {
    return TensorInvalid(file, name, absl::StrCat("\"data_offsets\" must be [begin, end] with begin <= end, got ",
                                                  j["data_offsets"].dump()));
  }
  e.begin = offsets[0];
  e.end = offsets[1];
  absl::StatusOr<int64_t> numel = NumElements(e.shape);
  const uint64_t elem = DTypeSize(e.dtype);
  if (!numel.ok() || static_cast<uint64_t>(*numel) > std::numeric_limits<uint64_t>::max() / elem) {
    return TensorInvalid(file, name, absl::StrCat("shape ", ShapeString(e.shape), " is too large"));
  }
  const uint64_t want = static_cast<uint64_t>(*numel) * elem;
  if (want != e.end - e.begin) {
    return TensorInvalid(file, name,
                         absl::StrCat(DescribeTensor(e.dtype, e.shape), " needs ", want, " bytes but data_offsets [",
                                      e.begin, ",", e.end, "] hold ", e.end - e.begin));
  }
  if (e.end > data_bytes) {
    return absl::DataLossError(absl::StrCat("safetensors file ", file, ": tensor \"", name, "\": data_offsets [",
                                            e.begin, ",", e.end, "] end past the data section (", data_bytes,
                                            " bytes): file truncated or header corrupt"));
  }
  return e;
}

// Overlapping byte ranges mean two tensors alias each other: refuse, naming both.
absl::Status CheckNoOverlap(absl::string_view file, const std::vector<TensorEntry>& entries) {
  std::vector<const TensorEntry*> by_offset;
  for (const TensorEntry& e : entries) {
    if (e.end > e.begin) by_offset.push_back(&e);  // empty tensors occupy no bytes
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  const TensorEntry* furthest = nullptr;  // the entry reaching furthest so far
  for (const TensorEntry* e : by_offset) {
    if (furthest != nullptr && e->begin < furthest->end) {
      return TensorInvalid(file, e->name,
                           absl::StrCat("data_offsets [", e->begin, ",", e->end, "] overlap tensor \"",
                                        furthest->name, "\" [", furthest->begin, ",", furthest->end, "]"));
    }
    if (furthest == nullptr || e->end > furthest->end) furthest = e;
  }
  return absl::OkStatus();
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

absl::StatusOr<int64_t> NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension in shape ", ShapeString(shape)));
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " overflows int64"));
    }
    n *= d;
  }
  return n;
}

std::string DescribeTensor(DType dtype, const std::vector<int64_t>& shape) {
  return absl::StrCat(DTypeName(dtype), " ", ShapeString(shape));
}

absl::Status ParseSafetensorsHeader(absl::string_view file, absl::string_view text, uint64_t data_bytes,
                                    std::map<std::string, std::string>* metadata,
                                    std::vector<TensorEntry>* entries) {
  // nlohmann keeps the last of duplicate keys silently; the callback sees every top-level key.
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && !seen.insert(parsed.get<std::string>()).second &&
        duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), on_event);
  } catch (const json::exception& e) {
    return Invalid(file, absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!duplicate.empty()) return TensorInvalid(file, duplicate, "appears twice in the header");
  if (!header.is_object()) return Invalid(file, "header JSON is not an object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return Invalid(file, "\"__metadata__\" is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          return Invalid(file, absl::StrCat("\"__metadata__\" value for \"", m.key(), "\" is not a string"));
        }
        (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    DSV4_ASSIGN_OR_RETURN(TensorEntry entry, ParseEntry(file, it.key(), it.value(), data_bytes));
    entries->push_back(std::move(entry));
  }
  // json objects iterate in key order, so `entries` is already sorted by name.
  return CheckNoOverlap(file, *entries);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string why = std::strerror(errno);
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("safetensors file ", path, ": ", why));
    return absl::PermissionDeniedError(absl::StrCat("safetensors file ", path, ": ", why));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return absl::InternalError(absl::StrCat("stat ", path, ": ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) return Invalid(path, "not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    return absl::DataLossError(absl::StrCat("safetensors file ", path, ": truncated: ", size,
                                            " bytes, the 8-byte header length alone needs 8"));
  }
  unsigned char len_bytes[8];
  DSV4_RETURN_IF_ERROR(PreadFull(fd, path, 0, 8, reinterpret_cast<char*>(len_bytes)));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];  // little-endian
  if (header_len > kMaxHeaderBytes) {
    return Invalid(path, absl::StrCat("header length ", header_len, " exceeds the limit of ", kMaxHeaderBytes,
                                      " bytes (not a safetensors file, or corrupt)"));
  }
  if (8 + header_len > size) {
    return absl::DataLossError(absl::StrCat("safetensors file ", path, ": truncated header: the header needs ",
                                            header_len, " bytes after the length but the file has ", size - 8));
  }
  std::string text(header_len, '\0');
  DSV4_RETURN_IF_ERROR(PreadFull(fd, path, 8, header_len, text.data()));

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->file_size_ = size;
  file->data_start_ = 8 + header_len;
  DSV4_RETURN_IF_ERROR(
      ParseSafetensorsHeader(path, text, size - file->data_start_, &file->metadata_, &file->entries_));

  // The mapping reserves address space only; pages are read when a tensor is touched.
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap ", path, ": ", std::strerror(errno)));
  file->map_ = static_cast<const uint8_t*>(map);
  file->map_bytes_ = size;
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
}

const TensorEntry* SafetensorsFile::Find(absl::string_view name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const TensorEntry& e, absl::string_view n) { return e.name < n; });
  if (it == entries_.end() || it->name != name) return nullptr;
  return &*it;
}

absl::StatusOr<TensorView> SafetensorsFile::Get(absl::string_view name) const {
  const TensorEntry* e = Find(name);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat("safetensors file ", path_, ": no tensor \"", name, "\""));
  }
  return View(*e);
}

TensorView SafetensorsFile::View(const TensorEntry& e) const {
  return TensorView{.name = e.name,
                    .dtype = e.dtype,
                    .shape = e.shape,
                    .data = map_ + data_start_ + e.begin,
                    .nbytes = static_cast<size_t>(e.end - e.begin)};
}

}  // namespace dsv4::ckpt
