// Timing-bound tests of the coordinator with real dsv4-worker groups on the tiny checkpoint; ctest runs each
// case alone (RUN_SERIAL), so CPU contention from other tests cannot stretch the deadlines they measure.
//
// - SIGSTOP mid-stream (a hung worker, as a GPU hang looks from outside): the coordinator's health deadline
//   finds it, the request moves to the other group with no gap and no duplicate token, the stopped group is not
//   ready; after SIGCONT it rejoins, ends the abandoned request as aborted (never serves it twice) and serves
//   again. Prints how long the client's stream stood still and how long the rejoin took.
// - Soak: about a minute (DSV4_SOAK_SECONDS) of mixed greedy / seeded / stop-token / cancelled requests at
//   concurrency 8: no error, every token equal to its reference, server counters equal to what the client
//   received, no KV page left in use, bounded RSS growth. Prints the figures.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
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

// RSS growth allowed over the soak, after a 5 s warm-up (KiB). Measured on the 2-core VM over 60 s (913
// requests): coordinator +0.3 MiB, workers -0.9 and +4.4 MiB; the bounds leave 3-25x room for allocator noise
// and still catch a leak of ~9 KiB (coordinator) or ~18 KiB (worker) per request.
constexpr int64_t kCoordinatorRssGrowthKib = 8 << 10;
constexpr int64_t kWorkerRssGrowthKib = 16 << 10;

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
  const auto [greedy, sampled] = MakeFailoverRequests(kTokens);
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

// ---------------------------------------------------------------------------------------------------------
// Soak

enum class Kind { kGreedy, kSeeded, kStop, kCancel };

struct Tally {
  int64_t requests = 0, length = 0, stop = 0, cancelled = 0;
  int64_t prompt_tokens = 0;    // of requests that received a token
  int64_t received = 0;         // tokens the client received
  int64_t cancel_slack = 0;     // max_new_tokens - received, over cancelled requests
  std::vector<std::string> errors;
};

TEST_F(CoordinatorSerialTest, SoakMixedTrafficHoldsCountersPagesAndMemory) {
  int seconds = 60;
  if (const char* s = std::getenv("DSV4_SOAK_SECONDS"); s != nullptr) {
    ASSERT_TRUE(absl::SimpleAtoi(s, &seconds)) << "DSV4_SOAK_SECONDS=" << s;
  }
  const std::string target = StartAll({});
  ASSERT_FALSE(target.empty());
  auto stub = CoordinatorStub(target);

  // References: the greedy and the seeded continuation of each prompt, uninterrupted and alone.
  constexpr int kPrompts = 12, kRefTokens = 64, kConcurrency = 8;
  std::vector<std::vector<int32_t>> prompts(kPrompts);
  std::vector<std::vector<int32_t>> greedy_ref(kPrompts), seeded_ref(kPrompts);
  auto greedy_req = [&](int p, int max_new) {
    dsv4::v1::GenerateRequest r = MakeRequest(prompts[p], max_new);
    r.mutable_sampling()->set_ignore_eos(true);
    return r;
  };
  auto seeded_req = [&](int p, int max_new) {
    dsv4::v1::GenerateRequest r = MakeRequest(prompts[p], max_new, 0.8f);
    r.mutable_sampling()->set_top_k(50);
    r.mutable_sampling()->set_seed(1000 + p);
    r.mutable_sampling()->set_ignore_eos(true);
    return r;
  };
  for (int p = 0; p < kPrompts; ++p) {
    for (int i = 0; i < 4 + 3 * p; ++i) prompts[p].push_back(2 + (i * 131 + p * 977 + (i * i) % 13) % 4000);
    const StreamResult g = RunGenerate(*stub, greedy_req(p, kRefTokens));
    const StreamResult s = RunGenerate(*stub, seeded_req(p, kRefTokens));
    ASSERT_TRUE(g.status.ok() && s.status.ok()) << g.status.error_message() << s.status.error_message();
    greedy_ref[p] = g.tokens;
    seeded_ref[p] = s.tokens;
  }

  // One request of the mix; checks its stream against the reference and adds it to `t`.
  auto one = [&](int n, Tally& t) {
    const int p = n % kPrompts;
    const Kind kind = static_cast<Kind>(n % 4);
    const int max_new = kind == Kind::kCancel ? 16 : 8 + n % 17;  // a cancel leaves at most 14 tokens unsent
    dsv4::v1::GenerateRequest req = kind == Kind::kSeeded ? seeded_req(p, max_new) : greedy_req(p, max_new);
    const std::vector<int32_t>& ref = kind == Kind::kSeeded ? seeded_ref[p] : greedy_ref[p];
    std::vector<int32_t> want(ref.begin(), ref.begin() + max_new);
    dsv4::v1::FinishReason finish = dsv4::v1::FINISH_REASON_LENGTH;
    if (kind == Kind::kStop) {
      const int32_t stop = ref[n % 20];  // may lie beyond max_new: then the request ends with LENGTH
      req.mutable_sampling()->add_stop_token_ids(stop);
      if (auto at = std::find(want.begin(), want.end(), stop); at != want.end()) {
        want.erase(at + 1, want.end());
        finish = dsv4::v1::FINISH_REASON_STOP;
      }
    }
    const StreamResult r = RunGenerate(*stub, req, kind == Kind::kCancel ? 2 + n % 4 : -1);
    ++t.requests;
    t.received += static_cast<int64_t>(r.tokens.size());
    if (!r.tokens.empty()) t.prompt_tokens += req.prompt_token_ids_size();
    auto fail = [&](const std::string& what) {
      t.errors.push_back(absl::StrCat("request ", n, " (kind ", n % 4, "): ", what));
    };
    if (r.status.error_code() == grpc::StatusCode::CANCELLED && kind == Kind::kCancel) {
      ++t.cancelled;
      t.cancel_slack += max_new - static_cast<int64_t>(r.tokens.size());
      if (!std::equal(r.tokens.begin(), r.tokens.end(), ref.begin())) fail("cancelled stream is not a prefix");
      return;
    }
    if (!r.status.ok()) return fail(absl::StrCat("status ", r.status.error_code(), ": ", r.status.error_message()));
    if (r.tokens != want) return fail("tokens differ from the reference");
    if (r.finish_chunks != 1) return fail(absl::StrCat(r.finish_chunks, " finish chunks"));
    if (r.last.usage().completion_tokens() != static_cast<int>(want.size())) return fail("usage.completion_tokens");
    if (r.last.finish_reason() != finish) return fail(absl::StrCat("finish reason ", r.last.finish_reason()));
    (finish == dsv4::v1::FINISH_REASON_STOP ? t.stop : t.length) += 1;
  };
  // Runs the mix at kConcurrency for `d`; returns the merged tally.
  auto run = [&](absl::Duration d, int first) {
    const absl::Time end = absl::Now() + d;
    std::vector<Tally> tallies(kConcurrency);
    std::vector<std::thread> threads;
    for (int c = 0; c < kConcurrency; ++c) {
      threads.emplace_back([&, c] {
        for (int n = first + c; absl::Now() < end; n += kConcurrency) one(n, tallies[c]);
      });
    }
    for (auto& th : threads) th.join();
    Tally all;
    for (const Tally& t : tallies) {
      all.requests += t.requests, all.length += t.length, all.stop += t.stop, all.cancelled += t.cancelled;
      all.prompt_tokens += t.prompt_tokens, all.received += t.received, all.cancel_slack += t.cancel_slack;
      all.errors.insert(all.errors.end(), t.errors.begin(), t.errors.end());
    }
    return all;
  };

  const Tally warm = run(absl::Seconds(5), 0);  // allocator arenas and gRPC buffers reach their working size
  ASSERT_TRUE(warm.errors.empty()) << warm.errors[0];
  for (int g = 0; g < 2; ++g) WaitIdle(addresses_[g], absl::Seconds(20));
  const pid_t pids[3] = {coordinator_->pid(), workers_[0]->pid(), workers_[1]->pid()};
  const char* names[3] = {"coordinator", "worker 0", "worker 1"};
  int64_t rss_start[3], rss_end[3];
  for (int i = 0; i < 3; ++i) rss_start[i] = RssKib(pids[i]);
  const std::string c0 = ScrapeCoordinator(), w0[2] = {Scrape(0), Scrape(1)};

  const absl::Time started = absl::Now();
  const Tally t = run(absl::Seconds(seconds), 1 << 20);
  const double wall = absl::ToDoubleSeconds(absl::Now() - started);
  dsv4::v1::GetLoadResponse loads[2];
  for (int g = 0; g < 2; ++g) loads[g] = WaitIdle(addresses_[g], absl::Seconds(20));
  for (int i = 0; i < 3; ++i) rss_end[i] = RssKib(pids[i]);
  const std::string c1 = ScrapeCoordinator(), w1[2] = {Scrape(0), Scrape(1)};

  std::printf("[ measure ] soak %.1f s, concurrency %d: %lld requests (%lld length, %lld stop, %lld cancelled), "
              "%lld tokens received, %.1f req/s, %.0f tok/s\n",
              wall, kConcurrency, static_cast<long long>(t.requests), static_cast<long long>(t.length),
              static_cast<long long>(t.stop), static_cast<long long>(t.cancelled),
              static_cast<long long>(t.received), t.requests / wall, t.received / wall);
  for (int i = 0; i < 3; ++i) {
    std::printf("[ measure ] soak RSS %s: %lld KiB -> %lld KiB (%+lld KiB)\n", names[i],
                static_cast<long long>(rss_start[i]), static_cast<long long>(rss_end[i]),
                static_cast<long long>(rss_end[i] - rss_start[i]));
  }

  EXPECT_TRUE(t.errors.empty()) << t.errors.size() << " errors; first: " << t.errors[0];
  EXPECT_GT(t.requests, 8 * seconds / 10) << "the soak barely ran";
  EXPECT_GT(t.cancelled, 0);
  EXPECT_GT(t.stop, 0);
  // Requests by outcome: what the client saw, except that a cancel races the stream's end: a request the client
  // cancelled may already have finished with LENGTH on the coordinator (its last tokens in flight), never the
  // other way round. So aborts <= cancels, and length + abort together are exact.
  const double server_length = Finished(c1, "length") - Finished(c0, "length");
  const double server_abort = Finished(c1, "abort") - Finished(c0, "abort");
  EXPECT_EQ(server_length + server_abort, t.length + t.cancelled);
  EXPECT_LE(server_abort, t.cancelled);
  EXPECT_GE(server_length, t.length);
  EXPECT_EQ(Finished(c1, "stop") - Finished(c0, "stop"), t.stop);
  EXPECT_EQ(Finished(c1, "error") - Finished(c0, "error"), 0);
  EXPECT_EQ(Sample(c1, "dsv4_coordinator_failovers_total") - Sample(c0, "dsv4_coordinator_failovers_total"), 0);
  // Prompt tokens: exactly the client's prompts, on the coordinator and summed over the groups.
  const double coord_prompt = Sample(c1, "dsv4_prompt_tokens_total") - Sample(c0, "dsv4_prompt_tokens_total");
  const double workers_prompt =
      Sample(w1[0], "dsv4_prompt_tokens_total") - Sample(w0[0], "dsv4_prompt_tokens_total") +
      Sample(w1[1], "dsv4_prompt_tokens_total") - Sample(w0[1], "dsv4_prompt_tokens_total");
  EXPECT_EQ(coord_prompt, t.prompt_tokens);
  EXPECT_EQ(workers_prompt, t.prompt_tokens);
  // Generated tokens: what the client received, plus at most what a cancelled stream's worker produced between
  // the client's cancel and its arrival (a cancel races the stream by nature).
  const double coord_gen = Sample(c1, "dsv4_generation_tokens_total") - Sample(c0, "dsv4_generation_tokens_total");
  const double workers_gen =
      Sample(w1[0], "dsv4_generation_tokens_total") - Sample(w0[0], "dsv4_generation_tokens_total") +
      Sample(w1[1], "dsv4_generation_tokens_total") - Sample(w0[1], "dsv4_generation_tokens_total");
  EXPECT_GE(coord_gen, t.received);
  EXPECT_LE(coord_gen, t.received + t.cancel_slack);
  EXPECT_GE(workers_gen, coord_gen);
  EXPECT_LE(workers_gen, t.received + t.cancel_slack);
  std::printf("[ measure ] soak tokens: client %lld, coordinator %.0f, workers %.0f (cancel slack %lld)\n",
              static_cast<long long>(t.received), coord_gen, workers_gen, static_cast<long long>(t.cancel_slack));
  // Nothing left behind.
  for (int g = 0; g < 2; ++g) {
    EXPECT_EQ(loads[g].running() + loads[g].waiting(), 0) << "group " << g;
    EXPECT_FALSE(loads[g].kv_pools().empty());
    EXPECT_EQ(PagesUsed(loads[g]), 0) << "group " << g;
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_GT(rss_start[i], 0);
    EXPECT_LT(rss_end[i] - rss_start[i], i == 0 ? kCoordinatorRssGrowthKib : kWorkerRssGrowthKib) << names[i];
  }
}

}  // namespace
}  // namespace dsv4::testing
