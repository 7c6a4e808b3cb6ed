// Helpers for tests that run real programs: start a process, run one to completion, start dsv4-worker and wait
// for its ready file. POSIX only (fork/exec); every child is killed when its handle is destroyed.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dsv4::worker::testing {

// <build dir>/<relative> and <source dir>/<relative> ($DSV4_BINARY_DIR / $DSV4_SOURCE_DIR, else this build's).
std::string BinaryPath(const std::string& relative);
std::string SourcePath(const std::string& relative);

class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept : pid_(other.pid_) { other.pid_ = -1; }
  ChildProcess& operator=(ChildProcess&&) = delete;
  ~ChildProcess();  // SIGKILL and reap if still running
  static absl::StatusOr<ChildProcess> Start(const std::vector<std::string>& argv, const std::string& log_path);
  // Sends a signal; then Wait returns the exit code (or 128 + signal).
  void Signal(int sig) const;
  absl::StatusOr<int> Wait(double timeout_s);
  pid_t pid() const { return pid_; }

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
};

// grpc.health.v1.Health/Check for the whole server ("" service), without the health proto: 1 SERVING,
// 2 NOT_SERVING, 0 UNKNOWN, -1 no answer within 2 s.
int HealthStatus(const std::string& address);

// A loopback port that was free a moment ago (below the ephemeral range, bound and released), for programs that
// must be given their address before they start (a TP leader's followers dial it before its ready file exists).
int FreePort();

// Writes the tiny checkpoint (configs/tiny.json, seed `seed`) to `out` with dsv4-make-checkpoint.
absl::Status MakeTinyCheckpoint(const std::string& out, int seed);

// Runs argv to completion and returns its stdout (stderr goes to the test log). Errors on non-zero exit.
absl::StatusOr<std::string> RunAndCapture(const std::vector<std::string>& argv, double timeout_s);

// Starts dsv4-worker with `flags` plus --ready-file and waits until it is SERVING; *address gets host:port,
// *log_path (when not null) the file its stdout and stderr go to.
absl::StatusOr<ChildProcess> StartWorker(const std::string& dir, const std::vector<std::string>& flags,
                                         std::string* address, std::string* log_path = nullptr,
                                         std::string* metrics_address = nullptr);

// Body of GET http://<address><path> (HTTP/1.0, for /metrics); errors when the connection fails.
absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path);

// The whole text of a file ("" when unreadable).
std::string ReadFile(const std::string& path);

}  // namespace dsv4::worker::testing
