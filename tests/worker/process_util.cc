// See process_util.h.
#include "tests/worker/process_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "common/status_macros.h"

namespace dsv4::worker::testing {
namespace {

pid_t Spawn(const std::vector<std::string>& argv, int out_fd) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // a crashed test must not leave workers behind
  if (out_fd >= 0) {
    dup2(out_fd, 1);
    dup2(out_fd == 1 ? 2 : out_fd, 2);
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

absl::StatusOr<int> WaitPid(pid_t pid, double timeout_s) {
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout_s);
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r < 0) return absl::InternalError("waitpid failed");
    if (absl::Now() > deadline) return absl::DeadlineExceededError(absl::StrCat("pid ", pid, " still running"));
    absl::SleepFor(absl::Milliseconds(10));
  }
}

}  // namespace

// ctest sets both variables, but a list-valued ENVIRONMENT property can arrive empty through
// gtest_discover_tests; then fall back to the directories CMake compiled in.
std::string BinaryPath(const std::string& relative) {
  const char* dir = std::getenv("DSV4_BINARY_DIR");
  return absl::StrCat(dir != nullptr && *dir ? dir : DSV4_WORKER_TEST_BINARY_DIR, "/", relative);
}

std::string SourcePath(const std::string& relative) {
  const char* dir = std::getenv("DSV4_SOURCE_DIR");
  return absl::StrCat(dir != nullptr && *dir ? dir : DSV4_WORKER_TEST_SOURCE_DIR, "/", relative);
}

ChildProcess::~ChildProcess() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

absl::StatusOr<ChildProcess> ChildProcess::Start(const std::vector<std::string>& argv, const std::string& log) {
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", log));
  const pid_t pid = Spawn(argv, fd);
  close(fd);
  if (pid < 0) return absl::InternalError("fork failed");
  return ChildProcess(pid);
}

void ChildProcess::Signal(int sig) const {
  if (pid_ > 0) kill(pid_, sig);
}

absl::StatusOr<int> ChildProcess::Wait(double timeout_s) {
  DSV4_ASSIGN_OR_RETURN(int code, WaitPid(pid_, timeout_s));
  pid_ = -1;
  return code;
}

absl::StatusOr<std::string> RunAndCapture(const std::vector<std::string>& argv, double timeout_s) {
  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError("pipe failed");
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fds[0]);
  DSV4_ASSIGN_OR_RETURN(int code, WaitPid(pid, timeout_s));
  if (code != 0) return absl::InternalError(absl::StrCat(argv[0], " exited ", code, ": ", out));
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<ChildProcess> StartWorker(const std::string& dir, const std::vector<std::string>& flags,
                                         std::string* address, std::string* log_path,
                                         std::string* metrics_address) {
  static int counter = 0;
  const std::string tag = absl::StrCat(dir, "/worker", counter++);
  if (log_path != nullptr) *log_path = tag + ".log";
  std::vector<std::string> argv = {BinaryPath("worker/dsv4-worker"), absl::StrCat("--ready-file=", tag, ".ready")};
  argv.insert(argv.end(), flags.begin(), flags.end());
  DSV4_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Start(argv, tag + ".log"));
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (absl::Now() < deadline) {
    std::ifstream ready(tag + ".ready");
    std::string line;
    if (std::getline(ready, line)) {
      for (absl::string_view part : absl::StrSplit(line, ' ')) {
        if (absl::ConsumePrefix(&part, "grpc=")) *address = std::string(part);
        if (absl::ConsumePrefix(&part, "metrics=") && metrics_address != nullptr) {
          *metrics_address = std::string(part);
        }
      }
      return child;
    }
    int status = 0;
    if (waitpid(child.pid(), &status, WNOHANG) == child.pid()) {
      std::ifstream log(tag + ".log");
      std::stringstream text;
      text << log.rdbuf();
      return absl::InternalError(absl::StrCat("dsv4-worker exited during start-up: ", text.str()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError("dsv4-worker did not become ready in 120 s");
}

absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("bad address ", address));
  }
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to ", address));
  }
  const std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address, "\r\n\r\n");
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return absl::UnavailableError("short write");
  }
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? out : out.substr(body + 4);
}

int HealthStatus(const std::string& address) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::Slice empty(std::string{});
  grpc::ByteBuffer request(&empty, 1), response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = s;
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const auto& slice : slices) bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : 0;
}

absl::Status MakeTinyCheckpoint(const std::string& out, int seed) {
  return RunAndCapture({BinaryPath("tools/make_checkpoint/dsv4-make-checkpoint"), "--config",
                        SourcePath("configs/tiny.json"), "--seed", std::to_string(seed), "--out", out},
                       120)
      .status();
}

namespace {
// True when a loopback TCP socket can bind `port` (0: any; *bound gets the port taken).
bool BindsLoopback(int port, int* bound) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  socklen_t len = sizeof(addr);
  ok = ok && getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  if (ok) *bound = ntohs(addr.sin_port);
  return ok;
}
}  // namespace

// Below the kernel's ephemeral range: a port released by bind(0) goes back to the pool that every later bind(0)
// and every outgoing connection draws from (a TP leader's store, a follower's Gloo pairs), and CI saw one of them
// take it before the program listened. Ports below ip_local_port_range are never handed out that way.
int FreePort() {
  int low = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  if (!(range >> low) || low <= 12000) low = 32768;
  static thread_local unsigned seed = static_cast<unsigned>(getpid()) * 2654435761u ^
                                      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count());
  const int span = low - 10000;
  for (int attempt = 0; attempt < 64; ++attempt) {
    seed = seed * 1103515245u + 12345u;
    const int port = 10000 + static_cast<int>((seed >> 8) % static_cast<unsigned>(span));
    int bound = 0;
    if (BindsLoopback(port, &bound)) return bound;
  }
  int bound = 0;
  return BindsLoopback(0, &bound) ? bound : 0;
}

}  // namespace dsv4::worker::testing
