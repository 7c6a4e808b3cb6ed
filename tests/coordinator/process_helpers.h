// Helpers for the coordinator tests that run real processes on loopback: a child process with a log file,
// ready files, /metrics over a plain socket, the dsv4-coordinator command line, and a fixture that makes the
// tiny checkpoint and runs real dsv4-worker groups.
// Binaries come from $DSV4_BINARY_DIR (set by ctest), sources from $DSV4_SOURCE_DIR.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "dsv4/v1/coordinator.grpc.pb.h"
#include "dsv4/v1/worker.grpc.pb.h"
#include "grpcpp/support/status.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_client.h"
#include "tests/raw_grpc.h"

namespace dsv4::testing {

std::string Env(const char* name);  // DSV4_BINARY_DIR falls back to this binary's build tree
std::string ReadFile(const std::string& path);
std::string TempDir(const std::string& name);

// A child process with stdout/stderr in a log file; killed (SIGKILL) if still running at destruction.
class Process {
 public:
  Process(const std::vector<std::string>& argv, const std::string& log);
  ~Process();
  bool started() const { return pid_ > 0; }
  bool running() const { return pid_ > 0 && !status_.has_value(); }
  pid_t pid() const { return pid_; }
  void Signal(int sig);
  // The wait status once the process ended, nullopt if it is still running after `timeout`.
  std::optional<int> Wait(absl::Duration timeout);
  std::string LogTail() const;

 private:
  pid_t pid_ = -1;
  std::string log_;
  std::optional<int> status_;
};

// Waits for "grpc=HOST:PORT metrics=HOST:PORT" in a ready file; returns {grpc, metrics} ({"", ""} + a test
// failure when the process ended or `timeout` passed).
std::pair<std::string, std::string> WaitReady(Process& p, const std::string& path, absl::Duration timeout);

// GET http://host:port/path over a plain socket (loopback only): the whole response, headers included.
std::string HttpGet(const std::string& hostport, const std::string& path);
// The value of the first sample line starting with `series` (name plus labels prefix), or -1.
double MetricValue(const std::string& exposition, const std::string& series);
// Resident set size of a process in KiB (VmRSS), -1 when unreadable.
int64_t RssKib(pid_t pid);

// dsv4-coordinator on 127.0.0.1:0 with metrics, a ready file in `dir`, a 50 ms poll and `extra` flags.
std::unique_ptr<Process> StartCoordinator(const std::string& dir, const std::vector<std::string>& workers,
                                          int min_ready, const std::vector<std::string>& extra = {});

// Real worker groups on the tiny checkpoint (made once per test in a temporary folder).
class RealWorkersTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Starts (or restarts, on the same port) worker group g; returns its gRPC address (metrics in metrics_[g]).
  std::string StartWorker(int g, const std::string& listen = "127.0.0.1:0", const std::vector<std::string>& extra = {});

  static bool WaitReadyGroups(dsv4::v1::Coordinator::Stub& stub, int n, absl::Duration timeout);
  static dsv4::v1::GetLoadResponse LoadOf(const std::string& address);
  static int RunningOn(const std::string& address);  // running + waiting, -1 without an answer
  // Waits until the group reports nothing running or queued and no KV page in use; returns its last load.
  static dsv4::v1::GetLoadResponse WaitIdle(const std::string& address, absl::Duration timeout);
  // Streams `req` (60 s deadline); once `after` tokens have arrived, sends `sig` to the group serving it (after
  // SIGKILL also reaps it). *signalled gets that group (-1: none was serving); *stall (may be null) the longest
  // wait for a chunk from the signal on: how long the client saw the stream stand still.
  StreamResult RunAndSignal(dsv4::v1::Coordinator::Stub& stub, const dsv4::v1::GenerateRequest& req, int after,
                            int sig, int* signalled, absl::Duration* stall = nullptr);

  std::string bin_, dir_;
  std::unique_ptr<Process> workers_[2];
  std::string addresses_[2];
  std::string metrics_[2];
};

}  // namespace dsv4::testing
