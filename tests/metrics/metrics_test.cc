// Tests of dsv4_metrics: the /metrics endpoint over real HTTP, the serving series and their labels, buckets,
// the CPU phase timer and load-progress lines. Run: ctest -R metrics_test (or build-*/tests/metrics/metrics_test).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "metrics/load_progress.h"
#include "metrics/phase_timer.h"
#include "metrics/serving_metrics.h"

namespace dsv4::metrics {
namespace {

// GET http://127.0.0.1:port/metrics with a plain socket; returns the body.
std::string HttpGetMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  EXPECT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string resp;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) resp.append(buf, n);
  close(fd);
  const size_t body = resp.find("\r\n\r\n");
  EXPECT_NE(body, std::string::npos) << resp;
  EXPECT_NE(resp.find(" 200 "), std::string::npos) << resp.substr(0, 200);
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

// Joins labels sorted by key: the canonical form used for both parsed and expected series names.
std::string Canonical(const std::string& name, const std::map<std::string, std::string>& labels) {
  std::string out = name + "{";
  for (const auto& [k, v] : labels) absl::StrAppend(&out, out.back() == '{' ? "" : ",", k, "=\"", v, "\"");
  return out + "}";
}

// Parses exposition text into canonical "name{k="v",...}" -> value (label values here never hold ',' or '"').
std::map<std::string, double> ParseExposition(const std::string& text) {
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    const size_t open = line.find('{');
    const size_t close = line.rfind('}');
    double v = 0;
    if (sp == absl::string_view::npos || !absl::SimpleAtod(line.substr(sp + 1), &v)) {
      ADD_FAILURE() << "bad exposition line: " << line;
      continue;
    }
    if (open == absl::string_view::npos || close == absl::string_view::npos) {  // no labels
      out[std::string(line.substr(0, sp))] = v;
      continue;
    }
    std::map<std::string, std::string> labels;
    for (absl::string_view kv : absl::StrSplit(line.substr(open + 1, close - open - 1), ',', absl::SkipEmpty())) {
      const size_t eq = kv.find('=');
      labels[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 2, kv.size() - eq - 3));
    }
    out[Canonical(std::string(line.substr(0, open)), labels)] = v;
  }
  return out;
}

double Get(const std::map<std::string, double>& m, const std::string& key) {
  auto it = m.find(key);
  EXPECT_NE(it, m.end()) << "missing series " << key;
  return it == m.end() ? std::nan("") : it->second;
}

TEST(MetricsServerTest, ServesEverySeriesWithRoleGroupRankOverHttp) {
  auto server = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  ServingMetrics m(*(*server)->registry(), {.role = "worker", .group = 3, .rank = 1});

  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> tokens(1, 1000);
  int64_t gen = 0, prompt = 0;
  for (int i = 0; i < 20; ++i) {
    const int g = tokens(rng), p = tokens(rng);
    m.AddGenerationTokens(g);
    m.AddPromptTokens(p);
    gen += g;
    prompt += p;
  }
  m.AddGenerationTokens(-5);  // a caller bug must not move a counter backwards
  const int running = tokens(rng), waiting = tokens(rng);
  m.SetRunning(running);
  m.SetWaiting(waiting);
  m.SetKvUsage(0.625);
  m.ObserveTtft(0.3);
  m.ObserveItl(0.02);
  m.ObserveE2e(4.0);
  m.ObserveBatchSize(17);
  m.RequestFinished("stop");
  m.RequestFinished("stop");
  m.RequestFinished("length");
  m.RequestFinished("bogus");  // unknown reasons count as error: bounded label set
  m.SetStartup(10.0, 4e10, 2.5, 14.0);

  const auto s = ParseExposition(HttpGetMetrics((*server)->port()));
  auto K = [](const std::string& name, std::map<std::string, std::string> extra = {}) {
    extra.insert({{"role", "worker"}, {"group", "3"}, {"rank", "1"}});
    return Canonical(name, extra);
  };
  EXPECT_EQ(Get(s, K("dsv4_generation_tokens_total")), static_cast<double>(gen));
  EXPECT_EQ(Get(s, K("dsv4_prompt_tokens_total")), static_cast<double>(prompt));
  EXPECT_EQ(Get(s, K("dsv4_num_requests_running")), running);
  EXPECT_EQ(Get(s, K("dsv4_num_requests_waiting")), waiting);
  EXPECT_EQ(Get(s, K("dsv4_kv_cache_usage_ratio")), 0.625);
  EXPECT_EQ(Get(s, K("dsv4_time_to_first_token_seconds_count")), 1);
  EXPECT_EQ(Get(s, K("dsv4_time_to_first_token_seconds_bucket", {{"le", "0.25"}})), 0);
  EXPECT_EQ(Get(s, K("dsv4_time_to_first_token_seconds_bucket", {{"le", "0.5"}})), 1);
  EXPECT_EQ(Get(s, K("dsv4_time_to_first_token_seconds_bucket", {{"le", "+Inf"}})), 1);
  EXPECT_EQ(Get(s, K("dsv4_inter_token_latency_seconds_sum")), 0.02);
  EXPECT_EQ(Get(s, K("dsv4_e2e_request_latency_seconds_count")), 1);
  EXPECT_EQ(Get(s, K("dsv4_decode_batch_size_bucket", {{"le", "16"}})), 0);
  EXPECT_EQ(Get(s, K("dsv4_decode_batch_size_bucket", {{"le", "24"}})), 1);
  EXPECT_EQ(Get(s, K("dsv4_request_finished_total", {{"reason", "stop"}})), 2);
  EXPECT_EQ(Get(s, K("dsv4_request_finished_total", {{"reason", "length"}})), 1);
  EXPECT_EQ(Get(s, K("dsv4_request_finished_total", {{"reason", "abort"}})), 0);
  EXPECT_EQ(Get(s, K("dsv4_request_finished_total", {{"reason", "error"}})), 1);
  EXPECT_EQ(Get(s, K("dsv4_startup_weight_load_bytes_per_second")), 4e9);
  EXPECT_EQ(Get(s, K("dsv4_startup_graph_capture_seconds")), 2.5);
  EXPECT_EQ(Get(s, K("dsv4_startup_total_seconds")), 14.0);
  for (const char* phase : {"attention", "moe", "dense", "comm", "other"}) {
    EXPECT_EQ(Get(s, K("dsv4_decode_gpu_seconds_total", {{"phase", phase}})), 0);
  }
  int build_info = 0;
  for (const auto& [k, v] : s) {
    if (k.rfind("dsv4_", 0) != 0) continue;  // prometheus-cpp's own exposer_* series describe the HTTP server
    // Every series of this process carries role, group and rank: no rank is ever folded into another.
    for (const char* label : {"group=\"3\"", "rank=\"1\"", "role=\"worker\""}) {
      EXPECT_NE(k.find(label), std::string::npos) << k;
    }
    if (k.rfind("dsv4_build_info{", 0) == 0) {
      ++build_info;
      EXPECT_EQ(v, 1);
      EXPECT_NE(k.find("git_commit=\""), std::string::npos) << k;
    }
  }
  EXPECT_EQ(build_info, 1);
}

TEST(MetricsServerTest, RejectsBadAddressesWithClearErrors) {
  for (const char* bad : {"", "localhost", ":9100", "127.0.0.1:70000", "127.0.0.1:-1", "127.0.0.1:abc"}) {
    auto s = MetricsServer::Start(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.status().message().find("--metrics-listen"), std::string::npos) << s.status();
  }
  auto first = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  auto taken = MetricsServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()));
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable) << taken.status();
  EXPECT_NE(taken.status().message().find(absl::StrCat("cannot listen on port ", (*first)->port())),
            std::string::npos)
      << taken.status();
}

// Issue 16 #6: the coordinator runs no engine, so its exposition has no engine series left at 0; feeding them
// there is a no-op.
TEST(ServingMetricsTest, CoordinatorSetLeavesOutTheEngineSeries) {
  const std::vector<std::string> engine = {
      "dsv4_decode_batch_size",         "dsv4_decode_gpu_seconds_total",
      "dsv4_attention_time_share",      "dsv4_startup_weight_load_seconds",
      "dsv4_startup_weight_load_bytes", "dsv4_startup_weight_load_bytes_per_second",
      "dsv4_startup_graph_capture_seconds", "dsv4_startup_total_seconds"};
  for (SeriesSet set : {SeriesSet::kWorker, SeriesSet::kCoordinator}) {
    prometheus::Registry registry;
    ServingMetrics m(registry, {.role = set == SeriesSet::kWorker ? "worker" : "coordinator"}, set);
    m.ObserveBatchSize(4);
    m.AddPhaseSeconds(Phase::kAttention, 0.5);
    m.SetStartup(1, 2, 3, 4);
    m.AddPromptTokens(3);
    std::vector<std::string> names;
    for (const prometheus::MetricFamily& f : registry.Collect()) names.push_back(f.name);
    for (const std::string& name : engine) {
      const bool present = std::find(names.begin(), names.end(), name) != names.end();
      EXPECT_EQ(present, set == SeriesSet::kWorker) << name;
    }
    for (const char* shared : {"dsv4_prompt_tokens_total", "dsv4_generation_tokens_total",
                               "dsv4_request_finished_total", "dsv4_time_to_first_token_seconds", "dsv4_build_info"}) {
      EXPECT_NE(std::find(names.begin(), names.end(), shared), names.end()) << shared;
    }
    EXPECT_EQ(m.attention_time_share(), set == SeriesSet::kWorker ? 1.0 : 0.0);
  }
}

TEST(BucketsTest, CoverServingRangesInIncreasingOrder) {
  auto increasing = [](const std::vector<double>& b) {
    for (size_t i = 1; i < b.size(); ++i) {
      if (!(b[i] > b[i - 1])) return false;
    }
    return true;
  };
  EXPECT_TRUE(increasing(TtftBuckets()));
  EXPECT_TRUE(increasing(ItlBuckets()));
  EXPECT_TRUE(increasing(E2eBuckets()));
  EXPECT_TRUE(increasing(BatchSizeBuckets()));
  EXPECT_EQ(TtftBuckets().front(), 0.005);
  EXPECT_EQ(TtftBuckets().back(), 60.0);
  EXPECT_EQ(ItlBuckets().front(), 0.001);
  EXPECT_EQ(ItlBuckets().back(), 2.0);
}

TEST(ServingMetricsTest, AttentionShareIsAttentionOverAllPhasesOnRandomInputs) {
  prometheus::Registry registry;
  ServingMetrics m(registry, {.role = "worker", .group = 0, .rank = 0});
  EXPECT_EQ(m.attention_time_share(), 0.0);
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> sec(1e-4, 1e-2);
  std::uniform_int_distribution<int> phase(0, kNumPhases - 1);
  double attention = 0, all = 0;
  for (int i = 0; i < 500; ++i) {
    const Phase p = static_cast<Phase>(phase(rng));
    const double s = sec(rng);
    m.AddPhaseSeconds(p, s);
    all += s;
    if (p == Phase::kAttention) attention += s;
  }
  // Bad values are dropped, never counted: NaN, inf, negatives, zero.
  m.AddPhaseSeconds(Phase::kAttention, std::nan(""));
  m.AddPhaseSeconds(Phase::kMoe, INFINITY);
  m.AddPhaseSeconds(Phase::kMoe, -1.0);
  // The decay over the test's few milliseconds (tau 60 s) moves the ratio by far less than 1e-4.
  EXPECT_NEAR(m.attention_time_share(), attention / all, 1e-4);
  EXPECT_FALSE(std::isnan(m.attention_time_share()));
}

// Spins (no sleep, so the clock must advance by at least `s`) for `s` seconds.
void Spin(double s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(s);
  while (std::chrono::steady_clock::now() < end) {
  }
}

TEST(CpuPhaseTimerTest, PhasesAddUpToTheStepAndGapsGoToOther) {
  std::array<double, kNumPhases> got = {};
  auto timer = MakeCpuPhaseTimer([&](Phase p, double s) { got[static_cast<int>(p)] += s; }, {.sample_every = 1});
  ASSERT_TRUE(timer.ok()) << timer.status();
  const auto t0 = std::chrono::steady_clock::now();
  (*timer)->BeginStep();
  EXPECT_TRUE((*timer)->sampling());
  Spin(0.001);  // outside any phase: other
  (*timer)->Begin(Phase::kAttention);
  Spin(0.002);
  (*timer)->Begin(Phase::kMoe);  // switches phase: closes attention
  Spin(0.003);
  (*timer)->End(Phase::kMoe);
  (*timer)->End(Phase::kDense);  // not open: ignored
  (*timer)->Begin(Phase::kComm);
  Spin(0.001);
  (*timer)->EndStep();  // closes comm
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ((*timer)->steps_reported(), 1);
  EXPECT_GE(got[static_cast<int>(Phase::kAttention)], 0.002);
  EXPECT_GE(got[static_cast<int>(Phase::kMoe)], 0.003);
  EXPECT_GE(got[static_cast<int>(Phase::kComm)], 0.001);
  EXPECT_GE(got[static_cast<int>(Phase::kOther)], 0.001);
  EXPECT_EQ(got[static_cast<int>(Phase::kDense)], 0.0);
  double sum = 0;
  for (double s : got) sum += s;
  EXPECT_LE(sum, wall);
  EXPECT_GE(sum, 0.007);
}

TEST(CpuPhaseTimerTest, SamplesOneStepInN) {
  int calls = 0;
  auto timer = MakeCpuPhaseTimer([&](Phase, double) { ++calls; }, {.sample_every = 4});
  ASSERT_TRUE(timer.ok()) << timer.status();
  int sampled = 0;
  for (int step = 0; step < 10; ++step) {
    (*timer)->BeginStep();
    sampled += (*timer)->sampling() ? 1 : 0;
    (*timer)->Begin(Phase::kAttention);
    Spin(1e-5);
    (*timer)->EndStep();
  }
  EXPECT_EQ(sampled, 3);  // steps 0, 4, 8
  EXPECT_EQ((*timer)->steps_reported(), 3);
  EXPECT_GE(calls, 3);
}

TEST(CpuPhaseTimerTest, RejectsBadOptions) {
  auto t = MakeCpuPhaseTimer([](Phase, double) {}, {.sample_every = 0});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(MakeCpuPhaseTimer(nullptr, {}).ok());
}

TEST(CpuPhaseTimerTest, FeedsServingMetrics) {
  prometheus::Registry registry;
  ServingMetrics m(registry, {.role = "worker"});
  auto timer = MakeCpuPhaseTimer(SinkTo(&m), {.sample_every = 1});
  ASSERT_TRUE(timer.ok());
  (*timer)->BeginStep();
  (*timer)->Begin(Phase::kAttention);
  Spin(0.002);
  (*timer)->End(Phase::kAttention);
  (*timer)->EndStep();
  EXPECT_GT(m.attention_time_share(), 0.5);
  EXPECT_LE(m.attention_time_share(), 1.0);
}

TEST(LoadProgressTest, FormatsPercentAndThroughput) {
  EXPECT_EQ(LoadProgress::FormatLine("weights", 12'300'000'000, 29'300'000'000, 3.0),
            "weights: 42.0% 12.3 GB of 29.3 GB, 4.10 GB/s, 3.0 s");
  EXPECT_EQ(LoadProgress::FormatLine("weights", 2'000'000'000, 0, 0.5), "weights: 2.0 GB, 4.00 GB/s, 0.5 s");
  EXPECT_EQ(LoadProgress::FormatLine("weights", 0, 10, 0.0), "weights: 0.0% 0.0 GB of 0.0 GB, 0.00 GB/s, 0.0 s");
}

TEST(LoadProgressTest, LogsAtTheIntervalAndFinishesOnce) {
  LoadProgress quiet("w", 100, /*log_interval_s=*/3600);
  for (int i = 0; i < 10; ++i) quiet.Add(10);
  EXPECT_EQ(quiet.lines_logged(), 0);
  EXPECT_EQ(quiet.bytes(), 100);
  const double s = quiet.Finish();
  EXPECT_EQ(quiet.lines_logged(), 1);
  EXPECT_EQ(quiet.Finish(), s);
  EXPECT_EQ(quiet.lines_logged(), 1);

  LoadProgress chatty("w", 100, /*log_interval_s=*/0);
  chatty.Add(50);
  chatty.Add(50);
  EXPECT_EQ(chatty.lines_logged(), 2);
}

}  // namespace
}  // namespace dsv4::metrics
