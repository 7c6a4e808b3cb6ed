// Real processes on loopback: the dsv4-coordinator binary (against in-process fake groups, and against real
// dsv4-worker processes on the tiny checkpoint), a Python grpcio client, /metrics, SIGTERM drain, a second
// coordinator on ports already in use, --help, and the kill -9 failover test: a worker group is killed
// mid-stream and the client's stream must equal an uninterrupted run, for a greedy and for a seeded sampled
// request. (The SIGSTOP failover and the soak are timing-bound: coordinator_serial_test runs them alone.)
//
// Binaries come from $DSV4_BINARY_DIR (set by ctest); tests that need dsv4-worker skip with a message when it
// was not built (e.g. a partial build), never pass silently.
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "dsv4/v1/worker.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_worker.h"
#include "tests/coordinator/process_helpers.h"
#include "tests/coordinator/test_client.h"

namespace dsv4::testing {
namespace {

using ::testing::HasSubstr;

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
  // The coordinator runs no engine: no engine series that would sit at 0 beside the workers' (issue 16 #6).
  for (const char* series : {"dsv4_decode_batch_size", "dsv4_decode_gpu_seconds_total", "dsv4_attention_time_share",
                             "dsv4_startup_"}) {
    EXPECT_THAT(scrape, ::testing::Not(HasSubstr(series))) << series;
  }

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

// Issue 16 #1: gRPC shares a port between processes (SO_REUSEPORT) unless told not to; a second coordinator
// must refuse to start on a port the first one serves, and on its metrics port, naming the port.
TEST(CoordinatorProcessTest, SecondCoordinatorOnPortsInUseExitsNamingThePort) {
  ASSERT_FALSE(Env("DSV4_BINARY_DIR").empty());
  const std::string dir = TempDir("coord-ports");
  FakeWorker w({});
  auto first = StartCoordinator(dir, {w.address()}, 1);
  auto [target, metrics] = WaitReady(*first, dir + "/coordinator.ready", absl::Seconds(20));
  ASSERT_FALSE(target.empty() || metrics.empty());
  const std::string port = target.substr(target.rfind(':') + 1);
  const std::string metrics_port = metrics.substr(metrics.rfind(':') + 1);
  const std::string bin = Env("DSV4_BINARY_DIR") + "/coordinator/dsv4-coordinator";
  struct Case {
    std::vector<std::string> flags;
    std::string expect;
  };
  for (const Case& c : {Case{{"--listen=" + target}, "--listen " + target + ": cannot listen on port " + port},
                        Case{{"--listen=127.0.0.1:0", "--metrics-listen=" + metrics},
                             "--metrics-listen " + metrics + ": cannot listen on port " + metrics_port}}) {
    std::vector<std::string> argv = {bin, "--workers=" + w.address()};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    Process second(argv, dir + "/second.log");
    std::optional<int> st = second.Wait(absl::Seconds(20));
    ASSERT_TRUE(st.has_value()) << "a second coordinator kept running on " << c.flags.back() << "\n"
                                << second.LogTail();
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) != 0) << "wait status " << *st;
    EXPECT_THAT(second.LogTail(), HasSubstr(c.expect));
  }
  // The first one still owns its ports and serves.
  EXPECT_EQ(HealthStatus(target), grpc::health::v1::HealthCheckResponse::SERVING);
  auto stub = CoordinatorStub(target);
  const StreamResult r = RunGenerate(*stub, MakeRequest({3, 4}, 3));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(HttpGet(metrics, "/metrics"), HasSubstr("dsv4_generation_tokens_total"));
}

// Issue 16 #3: --help lists the program's own flags with their defaults and exits 0.
TEST(CoordinatorProcessTest, HelpListsItsFlagsWithDefaults) {
  ASSERT_FALSE(Env("DSV4_BINARY_DIR").empty());
  const std::string dir = TempDir("coord-help");
  for (const char* flag : {"--help", "-h"}) {
    Process p({Env("DSV4_BINARY_DIR") + "/coordinator/dsv4-coordinator", flag}, dir + "/" + flag + ".log");
    std::optional<int> st = p.Wait(absl::Seconds(10));
    ASSERT_TRUE(st.has_value());
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << flag << ": wait status " << *st;
    const std::string out = p.LogTail();
    EXPECT_THAT(out, ::testing::Not(HasSubstr("No flags matched")));
    for (const char* want : {"--workers (default \"\")", "--listen (default \"0.0.0.0:50051\")",
                             "--poll-interval-ms (default 100)", "--health-timeout-ms (default 1000)",
                             "--stream-idle-timeout-ms (default 30000)", "--max-attempts (default 4)"}) {
      EXPECT_THAT(out, HasSubstr(want)) << flag;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Real worker groups on the tiny checkpoint.

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
  const auto [greedy, sampled] = MakeFailoverRequests(kTokens);
  const StreamResult greedy_ref = RunGenerate(*stub, greedy);
  const StreamResult sampled_ref = RunGenerate(*stub, sampled);
  ASSERT_TRUE(greedy_ref.status.ok()) << greedy_ref.status.error_message() << "\n" << coord->LogTail();
  ASSERT_TRUE(sampled_ref.status.ok()) << sampled_ref.status.error_message();
  ASSERT_EQ(greedy_ref.tokens.size(), static_cast<size_t>(kTokens));

  for (const auto* c : {&greedy, &sampled}) {
    const StreamResult& ref = c == &greedy ? greedy_ref : sampled_ref;
    int killed = -1;
    const StreamResult r = RunAndSignal(*stub, *c, /*after=*/4, SIGKILL, &killed);
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
