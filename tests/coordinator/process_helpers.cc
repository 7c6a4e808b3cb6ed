// See process_helpers.h.
#include "tests/coordinator/process_helpers.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

extern char** environ;

namespace dsv4::testing {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  if (v != nullptr) return v;
  if (std::string(name) == "DSV4_BINARY_DIR") {
    // ctest sets it; when only DSV4_SOURCE_DIR arrives (a list-valued ENVIRONMENT property can lose its
    // second entry through gtest_discover_tests) the build tree is two levels above this test binary.
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) return self.parent_path().parent_path().parent_path().string();
  }
  return "";
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string TempDir(const std::string& name) {
  std::string templ = ::testing::TempDir() + "/" + name + "-XXXXXX";
  return mkdtemp(templ.data()) != nullptr ? templ : "";
}

Process::Process(const std::vector<std::string>& argv, const std::string& log) : log_(log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  if (posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ) != 0) pid_ = -1;
  posix_spawn_file_actions_destroy(&fa);
}

Process::~Process() {
  if (running()) {
    kill(pid_, SIGKILL);
    Wait(absl::Seconds(10));
  }
}

void Process::Signal(int sig) { kill(pid_, sig); }

std::optional<int> Process::Wait(absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (!status_.has_value()) {
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      status_ = st;
    } else if (absl::Now() > end) {
      return std::nullopt;
    } else {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  return status_;
}

std::string Process::LogTail() const {
  const std::string all = ReadFile(log_);
  return all.size() > 3000 ? all.substr(all.size() - 3000) : all;
}

std::pair<std::string, std::string> WaitReady(Process& p, const std::string& path, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    const std::string s = ReadFile(path);
    if (!s.empty() && s.back() == '\n') {
      std::string grpc, metrics;
      for (absl::string_view kv : absl::StrSplit(absl::StripTrailingAsciiWhitespace(s), ' ')) {
        if (absl::ConsumePrefix(&kv, "grpc=")) grpc = std::string(kv);
        if (absl::ConsumePrefix(&kv, "metrics=")) metrics = std::string(kv);
      }
      return {grpc, metrics};
    }
    if (p.Wait(absl::ZeroDuration()).has_value()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ADD_FAILURE() << "no ready file " << path << "; process log:\n" << p.LogTail();
  return {"", ""};
}

std::string HttpGet(const std::string& hostport, const std::string& path) {
  const size_t colon = hostport.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(hostport.substr(colon + 1), &port)) return "";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: localhost\r\n\r\n");
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
    }
  }
  close(fd);
  return out;
}

double MetricValue(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::StartsWith(line, series)) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) return v;
  }
  return -1;
}

int64_t RssKib(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view v = line;
    if (!absl::ConsumePrefix(&v, "VmRSS:")) continue;
    int64_t kib = -1;
    v = absl::StripAsciiWhitespace(v);
    absl::ConsumeSuffix(&v, " kB");
    return absl::SimpleAtoi(v, &kib) ? kib : -1;
  }
  return -1;
}

std::unique_ptr<Process> StartCoordinator(const std::string& dir, const std::vector<std::string>& workers,
                                          int min_ready, const std::vector<std::string>& extra) {
  const std::string bin = Env("DSV4_BINARY_DIR") + "/coordinator/dsv4-coordinator";
  std::vector<std::string> argv = {bin,
                                   "--listen=127.0.0.1:0",
                                   "--workers=" + absl::StrJoin(workers, ","),
                                   "--metrics-listen=127.0.0.1:0",
                                   "--ready-file=" + dir + "/coordinator.ready",
                                   "--min-ready-groups=" + std::to_string(min_ready),
                                   "--drain-timeout=10",
                                   "--poll-interval-ms=50"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return std::make_unique<Process>(argv, dir + "/coordinator.log");
}

// ---------------------------------------------------------------------------------------------------------
// RealWorkersTest

void RealWorkersTest::SetUp() {
  bin_ = Env("DSV4_BINARY_DIR");
  ASSERT_FALSE(bin_.empty()) << "run through ctest (DSV4_BINARY_DIR names the build tree)";
  if (!std::filesystem::exists(bin_ + "/worker/dsv4-worker") ||
      !std::filesystem::exists(bin_ + "/tools/make_checkpoint/dsv4-make-checkpoint")) {
    GTEST_SKIP() << "dsv4-worker or dsv4-make-checkpoint is not built in " << bin_;
  }
  dir_ = TempDir("coord-real");
  Process gen({bin_ + "/tools/make_checkpoint/dsv4-make-checkpoint", "--config",
               Env("DSV4_SOURCE_DIR") + "/configs/tiny.json", "--seed", "1", "--out", dir_ + "/ckpt"},
              dir_ + "/make_checkpoint.log");
  std::optional<int> st = gen.Wait(absl::Seconds(120));
  ASSERT_TRUE(st.has_value() && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << gen.LogTail();
}

void RealWorkersTest::TearDown() {
  for (auto& w : workers_) w.reset();
  // The checkpoint is 39 MB: keep the folder (logs) only when something failed.
  if (!dir_.empty() && !HasFailure()) std::filesystem::remove_all(dir_);
}

std::string RealWorkersTest::StartWorker(int g, const std::string& listen, const std::vector<std::string>& extra) {
  const std::string ready = absl::StrCat(dir_, "/worker", g, ".ready");
  std::remove(ready.c_str());
  std::vector<std::string> argv = {bin_ + "/worker/dsv4-worker", "--checkpoint", dir_ + "/ckpt", "--listen", listen,
                                   "--backend", "cpu", "--max-batch", "32", "--max-context", "4096", "--kv-pages",
                                   "256", "--prefill-chunk", "256", "--mode", "exact", "--threads", "1", "--group",
                                   std::to_string(g), "--rank", "0", "--world", "1", "--metrics-listen",
                                   "127.0.0.1:0", "--ready-file", ready, "--drain-timeout", "30"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  workers_[g] = std::make_unique<Process>(argv, absl::StrCat(dir_, "/worker", g, ".log"));
  auto [grpc, metrics] = WaitReady(*workers_[g], ready, absl::Seconds(120));
  metrics_[g] = metrics;
  return grpc;
}

bool RealWorkersTest::WaitReadyGroups(dsv4::v1::Coordinator::Stub& stub, int n, absl::Duration timeout) {
  for (const absl::Time end = absl::Now() + timeout; absl::Now() < end; absl::SleepFor(absl::Milliseconds(50))) {
    grpc::ClientContext ctx;
    dsv4::v1::GetModelInfoResponse info;
    if (stub.GetModelInfo(&ctx, {}, &info).ok() && info.ready_groups() >= n) return true;
  }
  return false;
}

dsv4::v1::GetLoadResponse RealWorkersTest::LoadOf(const std::string& address) {
  auto stub = dsv4::v1::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  dsv4::v1::GetLoadResponse load;
  if (!stub->GetLoad(&ctx, {}, &load).ok()) load.set_running(-1);
  return load;
}

int RealWorkersTest::RunningOn(const std::string& address) {
  const dsv4::v1::GetLoadResponse load = LoadOf(address);
  return load.running() < 0 ? -1 : load.running() + load.waiting();
}

dsv4::v1::GetLoadResponse RealWorkersTest::WaitIdle(const std::string& address, absl::Duration timeout) {
  dsv4::v1::GetLoadResponse load;
  for (const absl::Time end = absl::Now() + timeout; absl::Now() < end; absl::SleepFor(absl::Milliseconds(20))) {
    load = LoadOf(address);
    int64_t used = 0;
    for (const auto& pool : load.kv_pools()) used += pool.pages_used();
    if (load.running() == 0 && load.waiting() == 0 && used == 0 && !load.kv_pools().empty()) break;
  }
  return load;
}

StreamResult RealWorkersTest::RunAndSignal(dsv4::v1::Coordinator::Stub& stub, const dsv4::v1::GenerateRequest& req,
                                           int after, int sig, int* signalled, absl::Duration* stall) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  StreamResult r;
  auto reader = stub.Generate(&ctx, req);
  dsv4::v1::GenerateResponse chunk;
  *signalled = -1;
  std::optional<absl::Time> last;  // set from the signal on
  if (stall != nullptr) *stall = absl::ZeroDuration();
  while (reader->Read(&chunk)) {
    const absl::Time now = absl::Now();
    if (last.has_value()) {
      if (stall != nullptr) *stall = std::max(*stall, now - *last);
      last = now;
    }
    ++r.chunks;
    r.tokens.insert(r.tokens.end(), chunk.token_ids().begin(), chunk.token_ids().end());
    if (chunk.finish_reason() != dsv4::v1::FINISH_REASON_UNSPECIFIED) ++r.finish_chunks;
    r.last = chunk;
    if (*signalled < 0 && static_cast<int>(r.tokens.size()) >= after) {
      for (int g = 0; g < 2; ++g) {
        if (workers_[g] && workers_[g]->running() && RunningOn(addresses_[g]) > 0) {
          workers_[g]->Signal(sig);
          last = absl::Now();
          if (sig == SIGKILL) workers_[g]->Wait(absl::Seconds(10));
          *signalled = g;
          break;
        }
      }
    }
  }
  r.status = reader->Finish();
  return r;
}

}  // namespace dsv4::testing
