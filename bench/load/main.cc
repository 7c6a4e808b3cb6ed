// dsv4-load-bench: how fast the weights of a checkpoint reach the backend (CMakeLists.txt says what it prints).
//   dsv4-load-bench --checkpoint DIR [--backend cuda] [--modes streamed,mapped,auto] [--cold] [--repeat 2]
// --cold evicts the checkpoint's files from the page cache before every load (posix_fadvise DONTNEED after
// sync; run as root with `echo 3 > /proc/sys/vm/drop_caches` for the same) and prints how much stayed resident.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "kernels/backend_factory.h"
#include "model/checkpoint/checkpoint.h"
#include "model/config/config.h"
#include "model/dsv4/weights.h"

ABSL_FLAG(std::string, checkpoint, "", "checkpoint folder");
ABSL_FLAG(std::string, backend, "cuda", "cpu | cuda");
ABSL_FLAG(int, device, 0, "CUDA device");
ABSL_FLAG(std::string, modes, "streamed,mapped", "load modes to time, in order: streamed, mapped, auto");
ABSL_FLAG(bool, cold, false, "evict the checkpoint's pages before each load");
ABSL_FLAG(int, repeat, 1, "loads per mode");
ABSL_FLAG(int, threads, 4, "reader threads (streamed)");
ABSL_FLAG(int64_t, copy_mib, 1024, "bytes per copy-bandwidth probe");

namespace dsv4 {
namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<std::string> CheckpointFiles(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Fraction of the files' pages in the page cache (mincore over a fresh mapping).
double Resident(const std::vector<std::string>& files) {
  const long page = sysconf(_SC_PAGESIZE);
  uint64_t in = 0, total = 0;
  for (const std::string& f : files) {
    const int fd = open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    fstat(fd, &st);
    if (st.st_size > 0) {
      void* m = mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) {
        std::vector<unsigned char> v((st.st_size + page - 1) / page);
        if (mincore(m, st.st_size, v.data()) == 0) {
          for (unsigned char c : v) in += c & 1;
          total += v.size();
        }
        munmap(m, st.st_size);
      }
    }
    close(fd);
  }
  return total ? static_cast<double>(in) / total : 0;
}

void Evict(const std::vector<std::string>& files) {
  sync();
  for (const std::string& f : files) {
    const int fd = open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

// Copy bandwidth to the backend from `src` (GB/s, best of 5).
absl::StatusOr<double> CopyRate(kernels::Backend& b, const void* src, void* dst, int64_t bytes) {
  double best = 0;
  for (int i = 0; i < 6; ++i) {
    const double t0 = Now();
    DSV4_RETURN_IF_ERROR(b.CopyToDevice(dst, src, bytes));
    DSV4_RETURN_IF_ERROR(b.Synchronize());
    const double s = Now() - t0;
    if (i > 0) best = std::max(best, bytes / s / 1e9);  // the first warms up
  }
  return best;
}

absl::Status Run() {
  const std::string dir = absl::GetFlag(FLAGS_checkpoint);
  if (dir.empty()) return absl::InvalidArgumentError("--checkpoint is required");
  DSV4_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend,
                        kernels::MakeBackend({.name = absl::GetFlag(FLAGS_backend), .device = absl::GetFlag(FLAGS_device)}));
  std::printf("backend %s\n", backend->name().c_str());
  {
    const int64_t bytes = absl::GetFlag(FLAGS_copy_mib) << 20;
    DSV4_ASSIGN_OR_RETURN(kernels::Buffer pinned, backend->Allocate(bytes, kernels::MemoryKind::kHostStaging));
    DSV4_ASSIGN_OR_RETURN(kernels::Buffer dev, backend->Allocate(bytes, kernels::MemoryKind::kWorkspace));
    std::vector<uint8_t> pageable(bytes, 1);
    DSV4_ASSIGN_OR_RETURN(double p, CopyRate(*backend, pinned.data(), dev.data(), bytes));
    DSV4_ASSIGN_OR_RETURN(double q, CopyRate(*backend, pageable.data(), dev.data(), bytes));
    std::printf("copy to backend, %lld MiB: pinned %.2f GB/s, pageable %.2f GB/s\n",
                static_cast<long long>(bytes >> 20), p, q);
  }
  const std::vector<std::string> files = CheckpointFiles(dir);
  uint64_t file_bytes = 0;
  for (const auto& f : files) file_bytes += std::filesystem::file_size(f);
  std::printf("checkpoint %s: %zu files, %.3f GB\n", dir.c_str(), files.size(), file_bytes / 1e9);
  DSV4_ASSIGN_OR_RETURN(Config config, LoadConfig(dir));
  for (const absl::string_view m : absl::StrSplit(absl::GetFlag(FLAGS_modes), ',', absl::SkipEmpty())) {
    const std::string mode(m);
    model::WeightLoadOptions o{.reader_threads = absl::GetFlag(FLAGS_threads)};
    DSV4_ASSIGN_OR_RETURN(o.mode, model::ParseWeightLoadMode(mode));
    for (int r = 0; r < absl::GetFlag(FLAGS_repeat); ++r) {
      if (absl::GetFlag(FLAGS_cold)) Evict(files);
      const double resident = Resident(files);
      // A fresh Checkpoint each time: its mapping must not keep pages of an earlier load.
      DSV4_ASSIGN_OR_RETURN(std::unique_ptr<ckpt::Checkpoint> ck, ckpt::Checkpoint::Open(dir));
      model::WeightLoadStats st;
      DSV4_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelWeights> w,
                            model::LoadWeights(*ck, config, *backend, nullptr, {}, o, &st));
      std::printf("load %s %s (%.0f%% resident before): %s\n", mode.c_str(),
                  absl::GetFlag(FLAGS_cold) ? "cold" : "warm", 100 * resident, st.ToString().c_str());
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace dsv4

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status s = dsv4::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "dsv4-load-bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
