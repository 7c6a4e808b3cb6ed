// Real processes on loopback: the dsv4-coordinator binary (against in-process fake groups, and against real
// dsv4-worker processes on the tiny checkpoint), a Python grpcio client, /metrics, SIGTERM drain, and the
// kill -9 failover test: a worker group is killed mid-stream and the client's stream must equal an
// uninterrupted run, for a greedy and for a seeded sampled request.
//
// Binaries come from $DSV4_BINARY_DIR (set by ctest); tests that need dsv4-worker skip with a message when it
// was not built (e.g. a partial build), never pass silently.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "dsv4/v1/worker.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_worker.h"
#include "tests/coordinator/test_client.h"

extern char** environ;

namespace dsv4::testing {
namespace {

using ::testing::HasSubstr;

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

// A child process with stdout/stderr in a log file; killed (SIGKILL) if still running at destruction.
class Process {
 public:
  Process(const std::vector<std::string>& argv, const std::string& log) : log_(log) {
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
  ~Process() {
    if (running()) {
      kill(pid_, SIGKILL);
      Wait(absl::Seconds(10));
    }
  }
  bool started() const { return pid_ > 0; }
  bool running() const { return pid_ > 0 && !status_.has_value(); }
  void Signal(int sig) { kill(pid_, sig); }
  // The wait status once the process ended, nullopt if it is still running after `timeout`.
  std::optional<int> Wait(absl::Duration timeout) {
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
  std::string LogTail() const {
    const std::string all = ReadFile(log_);
    return all.size() > 3000 ? all.substr(all.size() - 3000) : all;
  }

 private:
  pid_t pid_ = -1;
  std::string log_;
  std::optional<int> status_;
};

// Waits for "grpc=HOST:PORT metrics=HOST:PORT" in a ready file; returns {grpc, metrics}.
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

// GET http://host:port/path over a plain socket (loopback only).
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

// The value of the first sample line starting with `series` (name plus labels prefix), or -1.
double MetricValue(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::StartsWith(line, series)) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) return v;
  }
  return -1;
}

std::string TempDir(const std::string& name) {
  std::string templ = ::testing::TempDir() + "/" + name + "-XXXXXX";
  return mkdtemp(templ.data()) != nullptr ? templ : "";
}

std::unique_ptr<Process> StartCoordinator(const std::string& dir, const std::vector<std::string>& workers,
                                          int min_ready) {
  const std::string bin = Env("DSV4_BINARY_DIR") + "/coordinator/dsv4-coordinator";
  return std::make_unique<Process>(
      std::vector<std::string>{bin, "--listen=127.0.0.1:0", "--workers=" + absl::StrJoin(workers, ","),
                               "--metrics-listen=127.0.0.1:0", "--ready-file=" + dir + "/coordinator.ready",
                               "--min-ready-groups=" + std::to_string(min_ready), "--drain-timeout=10",
                               "--poll-interval-ms=50"},
      dir + "/coordinator.log");
}

int RunPythonClient(const std::string& target, const std::string& log, const std::string& extra = "") {
  const std::string cmd = absl::StrCat("/usr/bin/python3 ", Env("DSV4_SOURCE_DIR"),
                                       "/tests/coordinator/python_client.py --target ", target, " --source-dir ",
                                       Env("DSV4_SOURCE_DIR"), " ", extra, " > ", log, " 2>&1");
  return std::system(cmd.c_str());
}

TEST(CoordinatorProcessTest, PythonClientMetricsAndSigtermDrain) {
  ASSERT_FALSE(Env("DSV4_BINARY_DIR").empty()) << "run through ctest (DSV4_BINARY_DIR names the build tree)";
  const std::string dir = TempDir("coord-fake");
  FakeWorker a({.step = absl::Milliseconds(3)}), b({.step = absl::Milliseconds(3)});
  auto coord = StartCoordinator(dir, {a.address(), b.address()}, 2);
  ASSERT_TRUE(coord->started());
  auto [target, metrics] = WaitReady(*coord, dir + "/coordinator.ready", absl::Seconds(20));
  ASSERT_FALSE(target.empty());

  // The same greedy ids the C++ side expects from the fake model.
  const std::string want = absl::StrJoin(FakeGeneration({1, 2, 3, 4, 5}, 12, false, 0, 1000), " ");
  const int rc = RunPythonClient(target, dir + "/python.log", "--expect-tokens '" + want + "'");
  EXPECT_EQ(rc, 0) << ReadFile(dir + "/python.log");
  EXPECT_THAT(ReadFile(dir + "/python.log"), HasSubstr("all checks passed"));

  const std::string scrape = HttpGet(metrics, "/metrics");
  EXPECT_GE(MetricValue(scrape, "dsv4_generation_tokens_total{"), 12 * 4) << scrape.substr(0, 2000);
  EXPECT_THAT(scrape, HasSubstr("role=\"coordinator\""));
  EXPECT_GE(MetricValue(scrape, "dsv4_request_finished_total{"), 0);

  // SIGTERM mid-stream: the in-flight request still completes, then the process exits 0.
  auto stub = CoordinatorStub(target);
  StreamResult in_flight;
  std::thread client([&] { in_flight = RunGenerate(*stub, MakeRequest({7, 8}, 150)); });
  while (a.active() + b.active() == 0) absl::SleepFor(absl::Milliseconds(2));
  coord->Signal(SIGTERM);
  client.join();
  EXPECT_TRUE(in_flight.status.ok()) << in_flight.status.error_message();
  EXPECT_EQ(in_flight.tokens, FakeGeneration({7, 8}, 150, false, 0, 1000));
  std::optional<int> st = coord->Wait(absl::Seconds(15));
  ASSERT_TRUE(st.has_value()) << "coordinator did not exit after SIGTERM\n" << coord->LogTail();
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << "wait status " << *st << "\n" << coord->LogTail();
}

TEST(CoordinatorProcessTest, BadFlagsEndWithOneClearLine) {
  ASSERT_FALSE(Env("DSV4_BINARY_DIR").empty());
  const std::string dir = TempDir("coord-flags");
  Process p({Env("DSV4_BINARY_DIR") + "/coordinator/dsv4-coordinator", "--workers=localhost"}, dir + "/log");
  std::optional<int> st = p.Wait(absl::Seconds(10));
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) != 0);
  EXPECT_THAT(p.LogTail(), HasSubstr("--workers entry 'localhost' is not host:port"));
}

// ---------------------------------------------------------------------------------------------------------
// Real worker groups on the tiny checkpoint.

class RealWorkersTest : public ::testing::Test {
 protected:
  void SetUp() override {
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

  void TearDown() override {
    for (auto& w : workers_) w.reset();
    // The checkpoint is 39 MB: keep the folder (logs) only when something failed.
    if (!dir_.empty() && !HasFailure()) std::filesystem::remove_all(dir_);
  }

  // Starts (or restarts, on the same port) worker group g; returns its gRPC address.
  std::string StartWorker(int g, const std::string& listen = "127.0.0.1:0") {
    const std::string ready = absl::StrCat(dir_, "/worker", g, ".ready");
    std::remove(ready.c_str());
    workers_[g] = std::make_unique<Process>(
        std::vector<std::string>{bin_ + "/worker/dsv4-worker", "--checkpoint", dir_ + "/ckpt", "--listen", listen,
                                 "--backend", "cpu", "--max-batch", "32", "--max-context", "4096", "--kv-pages",
                                 "256", "--prefill-chunk", "256", "--mode", "exact", "--threads", "1", "--group",
                                 std::to_string(g), "--rank", "0", "--world", "1", "--metrics-listen",
                                 "127.0.0.1:0", "--ready-file", ready, "--drain-timeout", "30"},
        absl::StrCat(dir_, "/worker", g, ".log"));
    return WaitReady(*workers_[g], ready, absl::Seconds(120)).first;
  }

  static bool WaitReadyGroups(dsv4::v1::Coordinator::Stub& stub, int n, absl::Duration timeout) {
    for (const absl::Time end = absl::Now() + timeout; absl::Now() < end; absl::SleepFor(absl::Milliseconds(50))) {
      grpc::ClientContext ctx;
      dsv4::v1::GetModelInfoResponse info;
      if (stub.GetModelInfo(&ctx, {}, &info).ok() && info.ready_groups() >= n) return true;
    }
    return false;
  }

  static dsv4::v1::GetLoadResponse LoadOf(const std::string& address) {
    auto stub = dsv4::v1::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    dsv4::v1::GetLoadResponse load;
    if (!stub->GetLoad(&ctx, {}, &load).ok()) load.set_running(-1);
    return load;
  }
  static int RunningOn(const std::string& address) {
    const dsv4::v1::GetLoadResponse load = LoadOf(address);
    return load.running() < 0 ? -1 : load.running() + load.waiting();
  }

  // Streams `req`; after `kill_after` tokens, kill -9s the group serving it. Returns the stream.
  StreamResult RunAndKill(dsv4::v1::Coordinator::Stub& stub, const dsv4::v1::GenerateRequest& req, int kill_after,
                          int* killed_group) {
    grpc::ClientContext ctx;
    StreamResult r;
    auto reader = stub.Generate(&ctx, req);
    dsv4::v1::GenerateResponse chunk;
    *killed_group = -1;
    while (reader->Read(&chunk)) {
      r.tokens.insert(r.tokens.end(), chunk.token_ids().begin(), chunk.token_ids().end());
      if (chunk.finish_reason() != dsv4::v1::FINISH_REASON_UNSPECIFIED) ++r.finish_chunks;
      r.last = chunk;
      if (*killed_group < 0 && static_cast<int>(r.tokens.size()) >= kill_after) {
        for (int g = 0; g < 2; ++g) {
          if (workers_[g] && workers_[g]->running() && RunningOn(addresses_[g]) > 0) {
            workers_[g]->Signal(SIGKILL);
            workers_[g]->Wait(absl::Seconds(10));
            *killed_group = g;
            break;
          }
        }
      }
    }
    r.status = reader->Finish();
    return r;
  }

  std::string bin_, dir_;
  std::unique_ptr<Process> workers_[2];
  std::string addresses_[2];
};

TEST_F(RealWorkersTest, KillNineMidStreamContinuesSeamlessly) {
  addresses_[0] = StartWorker(0);
  addresses_[1] = StartWorker(1);
  ASSERT_FALSE(addresses_[0].empty() || addresses_[1].empty());
  auto coord = StartCoordinator(dir_, {addresses_[0], addresses_[1]}, 2);
  auto [target, metrics] = WaitReady(*coord, dir_ + "/coordinator.ready", absl::Seconds(20));
  ASSERT_FALSE(target.empty());
  auto stub = CoordinatorStub(target);

  // The proto from another language, against the real model.
  EXPECT_EQ(RunPythonClient(target, dir_ + "/python.log", "--max-new-tokens 6"), 0) << ReadFile(dir_ + "/python.log");

  const int kTokens = 40;
  dsv4::v1::GenerateRequest greedy = MakeRequest({0, 17, 99, 1234, 7, 4000, 3, 250}, kTokens);
  greedy.mutable_sampling()->set_ignore_eos(true);
  dsv4::v1::GenerateRequest sampled = MakeRequest({0, 5, 6, 7}, kTokens, 0.9f);
  sampled.mutable_sampling()->set_top_k(50);
  sampled.mutable_sampling()->set_seed(20260429);
  sampled.mutable_sampling()->set_ignore_eos(true);
  const StreamResult greedy_ref = RunGenerate(*stub, greedy);
  const StreamResult sampled_ref = RunGenerate(*stub, sampled);
  ASSERT_TRUE(greedy_ref.status.ok()) << greedy_ref.status.error_message() << "\n" << coord->LogTail();
  ASSERT_TRUE(sampled_ref.status.ok()) << sampled_ref.status.error_message();
  ASSERT_EQ(greedy_ref.tokens.size(), static_cast<size_t>(kTokens));

  for (const auto* c : {&greedy, &sampled}) {
    const StreamResult& ref = c == &greedy ? greedy_ref : sampled_ref;
    int killed = -1;
    const StreamResult r = RunAndKill(*stub, *c, /*kill_after=*/4, &killed);
    SCOPED_TRACE(c == &greedy ? "greedy" : "sampled");
    ASSERT_GE(killed, 0) << "no group was serving the request when 4 tokens had arrived";
    ASSERT_TRUE(r.status.ok()) << r.status.error_message() << "\n" << coord->LogTail();
    EXPECT_EQ(r.tokens, ref.tokens);  // no gap, no duplicate, same sampling stream
    EXPECT_EQ(r.finish_chunks, 1);
    EXPECT_EQ(r.last.finish_reason(), ref.last.finish_reason());
    EXPECT_EQ(r.last.usage().completion_tokens(), kTokens);
    // Bring the killed group back on the same port; the coordinator must route to it again.
    addresses_[killed] = StartWorker(killed, addresses_[killed]);
    ASSERT_FALSE(addresses_[killed].empty());
    ASSERT_TRUE(WaitReadyGroups(*stub, 2, absl::Seconds(20))) << coord->LogTail();
  }
  const std::string scrape = HttpGet(metrics, "/metrics");
  EXPECT_EQ(MetricValue(scrape, "dsv4_coordinator_failovers_total{"), 2) << scrape.substr(0, 3000);

  // A client cancel reaches the worker: the request leaves it and every KV page comes back.
  dsv4::v1::GenerateRequest long_req = MakeRequest({0, 9, 8, 7}, 3000);
  long_req.mutable_sampling()->set_ignore_eos(true);
  const StreamResult cancelled = RunGenerate(*stub, long_req, /*cancel_after=*/3);
  EXPECT_EQ(cancelled.status.error_code(), grpc::StatusCode::CANCELLED);
  for (int g = 0; g < 2; ++g) {
    dsv4::v1::GetLoadResponse load;
    for (const absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;
         absl::SleepFor(absl::Milliseconds(20))) {
      load = LoadOf(addresses_[g]);
      if (load.running() + load.waiting() == 0 && load.kv_usage_ratio() == 0) break;
    }
    EXPECT_EQ(load.running() + load.waiting(), 0) << "group " << g;
    EXPECT_EQ(load.kv_usage_ratio(), 0) << "group " << g;
    EXPECT_FALSE(load.kv_pools().empty()) << "group " << g << " reports no KV pools";
    for (const auto& pool : load.kv_pools()) EXPECT_EQ(pool.pages_used(), 0) << "group " << g << " " << pool.pool();
  }

  coord->Signal(SIGTERM);
  std::optional<int> st = coord->Wait(absl::Seconds(15));
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0);
  for (auto& w : workers_) {
    w->Signal(SIGTERM);
    std::optional<int> ws = w->Wait(absl::Seconds(30));
    ASSERT_TRUE(ws.has_value()) << w->LogTail();
    EXPECT_TRUE(WIFEXITED(*ws) && WEXITSTATUS(*ws) == 0) << w->LogTail();
  }
}

}  // namespace
}  // namespace dsv4::testing
