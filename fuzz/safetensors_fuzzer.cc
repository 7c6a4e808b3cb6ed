// Fuzz target: a whole .safetensors file (8-byte header length, JSON header, data section) through
// SafetensorsFile::Open, the path every checkpoint shard takes. Accepted files must keep the reader's promises:
// every tensor's bytes lie inside the file, sizes match dtype x shape, names are sorted and unique, and every
// TensorView is readable end to end (a view past the mapping would fault here).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include "fuzz/fuzz_check.h"
#include "fuzz/json_mutator.h"
#include "model/checkpoint/safetensors.h"

namespace {

// One in-memory file reused by every run: Open() takes a path, /proc/self/fd/N names the memfd.
int MemFd() {
  static const int fd = memfd_create("safetensors_fuzz", MFD_CLOEXEC);
  FUZZ_CHECK(fd >= 0, "memfd_create failed");
  return fd;
}

}  // namespace

// Half the time: edit the JSON header as a tree (fuzz/json_mutator.h) and re-frame it with a correct length,
// keeping the data section; otherwise libFuzzer's byte mutations (which also reach the length field).
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  std::minstd_rand rng(seed);
  if (size >= 8 && rng() % 2 == 0) {
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | data[i];
    if (len <= size - 8) {
      nlohmann::json header =
          nlohmann::json::parse(data + 8, data + 8 + len, nullptr, /*allow_exceptions=*/false);
      if (!header.is_discarded() && header.is_object() && dsv4::fuzz::MutateJsonTree(header, rng)) {
        const std::string text = header.dump();
        const std::string rest(reinterpret_cast<const char*>(data) + 8 + len, size - 8 - len);
        if (8 + text.size() + rest.size() <= max_size) {
          for (int i = 0; i < 8; ++i) data[i] = static_cast<uint8_t>(text.size() >> (8 * i));
          std::memcpy(data + 8, text.data(), text.size());
          std::memcpy(data + 8 + text.size(), rest.data(), rest.size());
          return 8 + text.size() + rest.size();
        }
      }
    }
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dsv4::ckpt::SafetensorsFile;
  const int fd = MemFd();
  FUZZ_CHECK(ftruncate(fd, 0) == 0, "ftruncate");
  FUZZ_CHECK(size == 0 || pwrite(fd, data, size, 0) == static_cast<ssize_t>(size), "pwrite");
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) return 0;
  const SafetensorsFile& f = **file;
  FUZZ_CHECK(f.file_size() == size, "file_size %llu != %zu", static_cast<unsigned long long>(f.file_size()), size);
  FUZZ_CHECK(f.data_start() >= 8 && f.data_start() <= size, "data_start out of the file");
  const std::string* previous = nullptr;
  uint64_t checksum = 0;
  for (const auto& e : f.entries()) {
    FUZZ_CHECK(previous == nullptr || *previous < e.name, "entries not sorted and unique");
    previous = &e.name;
    FUZZ_CHECK(e.begin <= e.end && f.data_start() + e.end <= size, "tensor %s [%llu,%llu) outside the file",
               e.name.c_str(), static_cast<unsigned long long>(e.begin), static_cast<unsigned long long>(e.end));
    auto numel = dsv4::ckpt::NumElements(e.shape);
    FUZZ_CHECK(numel.ok(), "accepted shape does not have an element count");
    FUZZ_CHECK(static_cast<uint64_t>(*numel) * dsv4::ckpt::DTypeSize(e.dtype) == e.end - e.begin,
               "byte size of %s does not match dtype x shape", e.name.c_str());
    FUZZ_CHECK(f.Find(e.name) == &e, "Find(%s) does not return its entry", e.name.c_str());
    const auto view = f.View(e);
    FUZZ_CHECK(view.nbytes == e.end - e.begin && view.numel() == *numel, "view of %s", e.name.c_str());
    for (size_t i = 0; i < view.nbytes; ++i) checksum += view.data[i];  // faults if the view leaves the mapping
  }
  FUZZ_CHECK(!f.Get("\x01 no such tensor").ok(), "Get of a missing name succeeded");
  // Keep the reads from being optimised away.
  volatile uint64_t sink = checksum;
  (void)sink;
  return 0;
}
