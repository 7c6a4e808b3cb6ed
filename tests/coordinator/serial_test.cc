// Timing-bound tests of the coordinator with real dsv4-worker groups on the tiny checkpoint; ctest runs each
// case alone (RUN_SERIAL), so CPU contention from other tests cannot stretch the deadlines they measure.
//
// - SIGSTOP mid-stream (a hung worker, as a GPU hang looks from outside): the coordinator's health deadline
//   finds it, the request moves to the other group with no gap and no duplicate token, the stopped group is not
//   ready; after SIGCONT it rejoins, ends the abandoned request as aborted (never serves it twice) and serves
//   again. Prints how long the client's stream stood still and how long the rejoin took.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/process_helpers.h"
#include "tests/coordinator/test_client.h"

namespace dsv4::testing {
namespace {

// The value of the sample of `name` whose labels contain `label` ("" = the first sample of `name`), or -1.
double Sample(const std::string& exposition, const std::string& name, const std::string& label = "") {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::StartsWith(line, name + "{")) continue;
    const absl::string_view labels = line.substr(0, line.find('}'));
    if (!label.empty() && !absl::StrContains(labels, label)) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) return v;
  }
  return -1;
}

double Finished(const std::string& exposition, const std::string& reason) {
  return Sample(exposition, "dsv4_request_finished_total", "reason=\"" + reason + "\"");
}

int64_t PagesUsed(const dsv4::v1::GetLoadResponse& load) {
  int64_t used = 0;
  for (const auto& p : load.kv_pools()) used += p.pages_used();
  return used;
}

class CoordinatorSerialTest : public RealWorkersTest {
 protected:
  // Two worker groups and a coordinator with `extra` flags; returns the coordinator's address (metrics in
  // coordinator_metrics_).
  std::string StartAll(const std::vector<std::string>& extra) {
    addresses_[0] = StartWorker(0);
    addresses_[1] = StartWorker(1);
    if (addresses_[0].empty() || addresses_[1].empty()) return "";
    coordinator_ = StartCoordinator(dir_, {addresses_[0], addresses_[1]}, 2, extra);
    auto [target, metrics] = WaitReady(*coordinator_, dir_ + "/coordinator.ready", absl::Seconds(20));
    coordinator_metrics_ = metrics;
    return target;
  }
  std::string Scrape(int g) { return HttpGet(metrics_[g], "/metrics"); }
  std::string ScrapeCoordinator() { return HttpGet(coordinator_metrics_, "/metrics"); }

  std::unique_ptr<Process> coordinator_;
  std::string coordinator_metrics_;
};

TEST_F(CoordinatorSerialTest, SigstopMidStreamFailsOverAndTheWorkerRejoins) {
  const std::string target = StartAll({"--health-timeout-ms=500"});
  ASSERT_FALSE(target.empty());
  auto stub = CoordinatorStub(target);

  const int kTokens = 40;
  dsv4::v1::GenerateRequest greedy = MakeRequest({0, 17, 99, 1234, 7, 4000, 3, 250}, kTokens);
  greedy.mutable_sampling()->set_ignore_eos(true);
  dsv4::v1::GenerateRequest sampled = MakeRequest({0, 5, 6, 7}, kTokens, 0.9f);
  sampled.mutable_sampling()->set_top_k(50);
  sampled.mutable_sampling()->set_seed(20260429);
  sampled.mutable_sampling()->set_ignore_eos(true);
  const StreamResult greedy_ref = RunGenerate(*stub, greedy);
  const StreamResult sampled_ref = RunGenerate(*stub, sampled);
  ASSERT_TRUE(greedy_ref.status.ok()) << greedy_ref.status.error_message() << "\n" << coordinator_->LogTail();
  ASSERT_TRUE(sampled_ref.status.ok()) << sampled_ref.status.error_message();

  for (const auto* c : {&greedy, &sampled}) {
    SCOPED_TRACE(c == &greedy ? "greedy" : "sampled");
    const StreamResult& ref = c == &greedy ? greedy_ref : sampled_ref;
    const std::string before[2] = {Scrape(0), Scrape(1)};
    int stopped = -1;
    absl::Duration stall;
    const StreamResult r = RunAndSignal(*stub, *c, /*after=*/4, SIGSTOP, &stopped, &stall);
    ASSERT_GE(stopped, 0) << "no group was serving the request when 4 tokens had arrived";
    const int other = 1 - stopped;
    ASSERT_TRUE(r.status.ok()) << r.status.error_message() << "\n" << coordinator_->LogTail();
    EXPECT_EQ(r.tokens, ref.tokens);  // no gap, no duplicate, same sampling stream
    EXPECT_EQ(r.finish_chunks, 1);
    EXPECT_EQ(r.last.usage().completion_tokens(), kTokens);
    // Health deadline 500 ms + poll period 50 ms, at most twice (a poll in flight at the stop may answer).
    EXPECT_LT(stall, absl::Seconds(5)) << "the stream stood still for " << absl::FormatDuration(stall);
    std::printf("[ measure ] SIGSTOP (health deadline 500 ms, poll 50 ms): stream stood still %.0f ms\n",
                absl::ToDoubleMilliseconds(stall));
    {
      grpc::ClientContext ctx;
      dsv4::v1::GetModelInfoResponse info;
      ASSERT_TRUE(stub->GetModelInfo(&ctx, {}, &info).ok());
      EXPECT_EQ(info.ready_groups(), 1) << "the stopped group must not be ready";
    }

    const absl::Time resumed = absl::Now();
    workers_[stopped]->Signal(SIGCONT);
    ASSERT_TRUE(WaitReadyGroups(*stub, 2, absl::Seconds(20))) << coordinator_->LogTail();
    std::printf("[ measure ] SIGCONT: group ready again after %.0f ms\n",
                absl::ToDoubleMilliseconds(absl::Now() - resumed));
    // The resumed worker sees the cancel it missed, aborts the request and frees its pages: served once.
    const dsv4::v1::GetLoadResponse load = WaitIdle(addresses_[stopped], absl::Seconds(20));
    EXPECT_EQ(load.running() + load.waiting(), 0);
    EXPECT_EQ(PagesUsed(load), 0);
    const std::string after[2] = {Scrape(0), Scrape(1)};
    EXPECT_EQ(Finished(after[stopped], "abort") - Finished(before[stopped], "abort"), 1) << after[stopped];
    EXPECT_EQ(Finished(after[stopped], "length"), Finished(before[stopped], "length"));
    EXPECT_EQ(Finished(after[other], "length") - Finished(before[other], "length"), 1);
  }

  // Issue 16 #5: every prompt a worker prefilled is counted once on each side.
  const std::string coord = ScrapeCoordinator();
  const double workers_prompt =
      Sample(Scrape(0), "dsv4_prompt_tokens_total") + Sample(Scrape(1), "dsv4_prompt_tokens_total");
  const double resubmitted = Sample(coord, "dsv4_coordinator_failover_prompt_tokens_total");
  EXPECT_GT(resubmitted, 0);
  EXPECT_EQ(workers_prompt, Sample(coord, "dsv4_prompt_tokens_total") + resubmitted) << coord;
  EXPECT_EQ(Sample(coord, "dsv4_coordinator_failovers_total"), 2);

  // Rejoined groups serve again.
  const double gen_before[2] = {Sample(Scrape(0), "dsv4_generation_tokens_total"),
                                Sample(Scrape(1), "dsv4_generation_tokens_total")};
  std::vector<std::thread> clients;
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&, i] {
      dsv4::v1::GenerateRequest req = MakeRequest({3, 4, 5, i}, 8);
      req.mutable_sampling()->set_ignore_eos(true);
      EXPECT_TRUE(RunGenerate(*stub, req).status.ok());
    });
  }
  for (auto& t : clients) t.join();
  for (int g = 0; g < 2; ++g) EXPECT_GT(Sample(Scrape(g), "dsv4_generation_tokens_total"), gen_before[g]) << g;
}

}  // namespace
}  // namespace dsv4::testing
