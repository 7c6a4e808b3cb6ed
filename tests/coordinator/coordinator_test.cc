// Coordinator behaviour against in-process fake worker groups (fake_worker.h): streaming, validation,
// load-aware routing, saturation, failover stitching, hung groups (health and inactivity deadlines),
// undecodable requests, prompt-token accounting, cancellation, drain. Each test runs in about a second or less;
// the real-process tests (real workers, kill -9) are in process_test.cc.
#include <cstdio>
#include <functional>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/serving/runner.h"
#include "coordinator/server.h"
#include "coordinator/stream_watchdog.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_worker.h"
#include "tests/coordinator/process_helpers.h"
#include "tests/coordinator/test_client.h"

namespace dsv4::testing {
namespace {

using ::testing::HasSubstr;

class CoordinatorTest : public ::testing::Test {
 protected:
  void StartWorkers(const std::vector<FakeWorkerOptions>& options) {
    for (const FakeWorkerOptions& o : options) workers_.push_back(std::make_unique<FakeWorker>(o));
  }
  void StartCoordinator(int max_attempts = 4, int expect_ready = -1) {
    coordinator::CoordinatorOptions o = options_;  // tests may set deadlines or metrics there first
    o.listen = "127.0.0.1:0";
    for (const auto& w : workers_) o.workers.push_back(w->address());
    o.poll_interval = absl::Milliseconds(20);
    o.max_attempts = max_attempts;
    o.route_seed = 7;
    absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> s = coordinator::CoordinatorServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    const int want = expect_ready >= 0 ? expect_ready : static_cast<int>(workers_.size());
    ASSERT_TRUE(server_->pool().WaitForReady(want, absl::Seconds(5)));
    address_ = absl::StrCat("127.0.0.1:", server_->port());
    stub_ = CoordinatorStub(address_);
  }
  // Waits until every group's polled load reflects what the fakes now report.
  void WaitPolls() { absl::SleepFor(absl::Milliseconds(80)); }

  std::string Scrape() {
    return HttpGet(absl::StrCat("127.0.0.1:", server_->metrics_port()), "/metrics");
  }
  const coordinator::GroupStatus* Group(const std::vector<coordinator::GroupStatus>& groups, int w) {
    for (const auto& g : groups) {
      if (g.address == workers_[w]->address()) return &g;
    }
    return nullptr;
  }

  coordinator::CoordinatorOptions options_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
  std::unique_ptr<coordinator::CoordinatorServer> server_;
  std::string address_;
  std::unique_ptr<dsv4::v1::Coordinator::Stub> stub_;
};

TEST_F(CoordinatorTest, StreamsTheWorkersTokensWithUsage) {
  StartWorkers({{}, {}});
  StartCoordinator();
  const std::vector<int32_t> prompt = {5, 17, 300, 42};
  StreamResult r = RunGenerate(*stub_, MakeRequest(prompt, 12));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, FakeGeneration(prompt, 12, false, 0, 1000));
  EXPECT_EQ(r.finish_chunks, 1);
  EXPECT_EQ(r.last.finish_reason(), dsv4::v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(r.last.usage().prompt_tokens(), 4);
  EXPECT_EQ(r.last.usage().completion_tokens(), 12);
  EXPECT_GT(r.last.usage().time_to_first_token_s(), 0.0);
  EXPECT_FALSE(r.last.request_id().empty());
}

TEST_F(CoordinatorTest, StopTokenEndsTheStream) {
  StartWorkers({{}});
  StartCoordinator();
  const std::vector<int32_t> prompt = {9, 8, 7};
  const std::vector<int32_t> full = FakeGeneration(prompt, 20, false, 0, 1000);
  dsv4::v1::GenerateRequest req = MakeRequest(prompt, 20);
  req.mutable_sampling()->add_stop_token_ids(full[4]);
  const size_t first = std::find(full.begin(), full.end(), full[4]) - full.begin();
  StreamResult r = RunGenerate(*stub_, req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.last.finish_reason(), dsv4::v1::FINISH_REASON_STOP);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(full.begin(), full.begin() + first + 1));
}

TEST_F(CoordinatorTest, InvalidRequestsAreRejectedBeforeRouting) {
  StartWorkers({{}});
  StartCoordinator();
  StreamResult r = RunGenerate(*stub_, MakeRequest({1, 1000}, 4));  // vocab 1000
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.status.error_message(), HasSubstr("prompt_token_ids[1] = 1000"));
  r = RunGenerate(*stub_, MakeRequest({}, 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.status.error_message(), HasSubstr("prompt_token_ids"));
  r = RunGenerate(*stub_, MakeRequest({3}, 4096));  // 1 + 4096 > max_context 4096
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.status.error_message(), HasSubstr("max context 4096"));
  r = RunGenerate(*stub_, MakeRequest({3}, 4, -1.0f));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.status.error_message(), HasSubstr("sampling.temperature"));
  dsv4::v1::GenerateRequest resumed = MakeRequest({3, 4, 5}, 4);
  resumed.set_resume_generated(1);
  r = RunGenerate(*stub_, resumed);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.status.error_message(), HasSubstr("resume_generated"));
  EXPECT_EQ(workers_[0]->generate_calls(), 0);
}

TEST_F(CoordinatorTest, ModelInfoComesFromTheGroups) {
  StartWorkers({{}, {}});
  StartCoordinator();
  grpc::ClientContext ctx;
  dsv4::v1::GetModelInfoResponse info;
  ASSERT_TRUE(stub_->GetModelInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.vocab_size(), 1000);
  EXPECT_EQ(info.max_context(), 4096);
  EXPECT_EQ(info.eos_token_id(), 1);
  EXPECT_EQ(info.ready_groups(), 2);
  EXPECT_EQ(info.total_groups(), 2);
  EXPECT_EQ(HealthStatus(address_), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(CoordinatorTest, NoReadyGroupIsUnavailable) {
  StartWorkers({{}});
  const std::string dead = workers_[0]->address();
  workers_[0]->Kill();
  StartCoordinator(4, /*expect_ready=*/0);
  StreamResult r = RunGenerate(*stub_, MakeRequest({3, 4}, 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(), HasSubstr("no worker group is ready"));
  EXPECT_THAT(r.status.error_message(), HasSubstr("1 not answering its health poll")) << "says why, by kind";
  EXPECT_THAT(r.status.error_message(), ::testing::Not(HasSubstr(dead))) << "no worker address to clients";
  grpc::ClientContext ctx;
  dsv4::v1::GetModelInfoResponse info;
  EXPECT_EQ(stub_->GetModelInfo(&ctx, {}, &info).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(CoordinatorHealthTest, ServingOnceMinReadyGroupsWereReady) {
  FakeWorker alive({});
  auto dead = std::make_unique<FakeWorker>(FakeWorkerOptions{});
  const std::string dead_address = dead->address();
  dead.reset();
  coordinator::CoordinatorOptions o;
  o.listen = "127.0.0.1:0";
  o.workers = {alive.address(), dead_address};
  o.poll_interval = absl::Milliseconds(20);
  o.min_ready_groups = 2;
  auto s = coordinator::CoordinatorServer::Start(o);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*s)->port());
  (*s)->RefreshHealth();
  // One of two groups ready: the API can serve, but the start-up gate (2 groups) is not passed yet.
  EXPECT_EQ(HealthStatus(address), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(HealthStatus(address, "dsv4.v1.Coordinator"), grpc::health::v1::HealthCheckResponse::SERVING);
  o.min_ready_groups = 1;
  o.workers = {alive.address()};
  auto s1 = coordinator::CoordinatorServer::Start(o);
  ASSERT_TRUE(s1.ok()) << s1.status();
  (*s1)->RefreshHealth();
  EXPECT_EQ(HealthStatus(absl::StrCat("127.0.0.1:", (*s1)->port())), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(CoordinatorTest, RoutesToTheLessLoadedGroup) {
  StartWorkers({{}, {}});
  dsv4::v1::GetLoadResponse busy;
  busy.set_running_tokens(1'000'000);
  busy.set_kv_usage_ratio(0.9);
  workers_[0]->SetLoad(busy);
  StartCoordinator();
  WaitPolls();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(RunGenerate(*stub_, MakeRequest({3, 4, i}, 2)).status.ok());
  EXPECT_EQ(workers_[0]->generate_calls(), 0);
  EXPECT_EQ(workers_[1]->generate_calls(), 10);
}

TEST_F(CoordinatorTest, SpreadsABurstOverEqualGroups) {
  StartWorkers({{.step = absl::Milliseconds(5)}, {.step = absl::Milliseconds(5)}});
  StartCoordinator();
  std::vector<std::thread> clients;
  for (int i = 0; i < 24; ++i) {
    clients.emplace_back([&, i] { EXPECT_TRUE(RunGenerate(*stub_, MakeRequest({3, i}, 10)).status.ok()); });
  }
  for (auto& t : clients) t.join();
  // Tokens routed since the last poll count against a group, so a burst does not herd onto one of them.
  EXPECT_GE(workers_[0]->generate_calls(), 8);
  EXPECT_GE(workers_[1]->generate_calls(), 8);
  EXPECT_EQ(workers_[0]->generate_calls() + workers_[1]->generate_calls(), 24);
}

TEST_F(CoordinatorTest, AllGroupsSaturatedIsResourceExhaustedWithRetryHint) {
  StartWorkers({{}, {}});
  dsv4::v1::GetLoadResponse full;
  full.set_max_batch(4);
  full.set_running(4);
  full.set_waiting(8);
  full.set_max_waiting(8);
  full.set_recent_step_seconds(0.2);
  workers_[0]->SetLoad(full);
  workers_[1]->SetLoad(full);
  StartCoordinator();
  WaitPolls();
  grpc::ClientContext ctx;
  StreamResult r = RunGenerate(*stub_, MakeRequest({3, 4}, 4), -1, &ctx);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(r.status.error_message(), HasSubstr("retry after 200 ms"));
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto hint = trailers.find("retry-after-ms");
  ASSERT_NE(hint, trailers.end());
  EXPECT_EQ(std::string(hint->second.data(), hint->second.size()), "200");
  EXPECT_EQ(workers_[0]->generate_calls() + workers_[1]->generate_calls(), 0);
}

TEST_F(CoordinatorTest, AWorkerWithAFullQueueIsSkipped) {
  StartWorkers({{.queue_full = true}, {.queue_full = true}, {}});
  StartCoordinator();
  for (int i = 0; i < 6; ++i) {
    StreamResult r = RunGenerate(*stub_, MakeRequest({3, 4, i}, 3));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, FakeGeneration({3, 4, i}, 3, false, 0, 1000));
  }
  EXPECT_EQ(workers_[2]->completed(), 6);
}

// A group died after writing `die_after` tokens; the survivor's request resumes after k of them, 1 <= k <=
// die_after: the last chunks the dead group wrote may never reach the coordinator (the process is gone before
// they leave its socket), and the coordinator resumes from what it received, never from what was written.
// The resumed prompt is the original prompt plus exactly the k tokens the client already has.
void ExpectResumedAfterWhatTheClientGot(const dsv4::v1::GenerateRequest& resumed,
                                        const std::vector<int32_t>& prompt, const std::vector<int32_t>& tokens,
                                        int die_after) {
  const int k = resumed.resume_generated();
  EXPECT_GE(k, 1);
  EXPECT_LE(k, die_after);
  ASSERT_LE(k, static_cast<int>(tokens.size()));
  ASSERT_EQ(resumed.prompt_token_ids_size(), static_cast<int>(prompt.size()) + k);
  for (size_t i = 0; i < prompt.size(); ++i) EXPECT_EQ(resumed.prompt_token_ids(i), prompt[i]) << i;
  for (int i = 0; i < k; ++i) EXPECT_EQ(resumed.prompt_token_ids(prompt.size() + i), tokens[i]) << i;
}

// The group that gets the request dies after `die_after` tokens; the stream must equal an uninterrupted run.
void ExpectSeamlessFailover(CoordinatorTest* t, std::vector<std::unique_ptr<FakeWorker>>& workers,
                            dsv4::v1::Coordinator::Stub& stub, dsv4::v1::GenerateRequest req, int die_after) {
  StreamResult r = RunGenerate(stub, req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const auto& s = req.sampling();
  const uint64_t seed = s.has_seed() ? s.seed() : r.last.usage().seed();
  std::vector<int32_t> prompt(req.prompt_token_ids().begin(), req.prompt_token_ids().end());
  EXPECT_EQ(r.tokens, FakeGeneration(prompt, s.max_new_tokens(), s.temperature() > 0, seed, 1000));
  EXPECT_EQ(r.finish_chunks, 1);
  EXPECT_EQ(r.last.finish_reason(), dsv4::v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(r.last.usage().completion_tokens(), s.max_new_tokens());
  EXPECT_EQ(r.last.usage().prompt_tokens(), static_cast<int>(prompt.size()));
  // The survivor got the original prompt plus what the dead group had streamed, marked as resumed.
  const std::vector<dsv4::v1::GenerateRequest> resumed = workers[1]->requests();
  ASSERT_EQ(resumed.size(), 1u);
  ExpectResumedAfterWhatTheClientGot(resumed[0], prompt, r.tokens, die_after);
  EXPECT_EQ(resumed[0].sampling().seed(), seed);
  EXPECT_EQ(resumed[0].sampling().max_new_tokens(), s.max_new_tokens());
}

TEST_F(CoordinatorTest, FailoverOfAGreedyRequestIsSeamless) {
  StartWorkers({{.die_after_tokens = 5}, {}});
  dsv4::v1::GetLoadResponse busy;
  busy.set_running_tokens(1'000'000);  // the first attempt goes to the group that will die
  workers_[1]->SetLoad(busy);
  StartCoordinator();
  WaitPolls();
  ExpectSeamlessFailover(this, workers_, *stub_, MakeRequest({11, 12, 13}, 16), 5);
}

// Log-probabilities reach the client one per token, across a failover too (the resumed group sends those of the
// tokens it streams; none is lost or repeated).
TEST_F(CoordinatorTest, LogprobsStayAlignedWithTheTokensThroughAFailover) {
  StartWorkers({{.die_after_tokens = 4}, {}});
  dsv4::v1::GetLoadResponse busy;
  busy.set_running_tokens(1'000'000);
  workers_[1]->SetLoad(busy);
  StartCoordinator();
  WaitPolls();
  dsv4::v1::GenerateRequest req = MakeRequest({21, 22, 23}, 10);
  req.mutable_sampling()->set_logprobs(true);
  req.mutable_sampling()->set_top_logprobs(2);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto reader = stub_->Generate(&ctx, req);
  std::vector<int32_t> tokens;
  std::vector<dsv4::v1::TokenLogprob> logprobs;
  dsv4::v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    EXPECT_EQ(msg.logprobs_size(), msg.token_ids_size());
    tokens.insert(tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
    logprobs.insert(logprobs.end(), msg.logprobs().begin(), msg.logprobs().end());
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, FakeGeneration({21, 22, 23}, 10, false, 0, 1000));
  ASSERT_EQ(logprobs.size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_EQ(logprobs[i].logprob(), FakeLogprob(tokens[i])) << i;
    ASSERT_EQ(logprobs[i].top_size(), 2);
    EXPECT_EQ(logprobs[i].top(1).token_id(), 1);
  }
  ASSERT_EQ(workers_[1]->requests().size(), 1u);
  ExpectResumedAfterWhatTheClientGot(workers_[1]->requests()[0], {21, 22, 23}, tokens, 4);
  EXPECT_TRUE(workers_[1]->requests()[0].sampling().logprobs()) << "the resumed request still asks";
}

TEST_F(CoordinatorTest, FailoverOfASampledRequestKeepsThePinnedSeed) {
  StartWorkers({{.die_after_tokens = 7}, {}});
  dsv4::v1::GetLoadResponse busy;
  busy.set_running_tokens(1'000'000);
  workers_[1]->SetLoad(busy);
  StartCoordinator();
  WaitPolls();
  // No seed from the client: the coordinator pins one before the first submission and reports it.
  ExpectSeamlessFailover(this, workers_, *stub_, MakeRequest({21, 22}, 20, 0.8f), 7);
}

TEST_F(CoordinatorTest, FailoverOfAClientSeededRequest) {
  StartWorkers({{.die_after_tokens = 3}, {}});
  dsv4::v1::GetLoadResponse busy;
  busy.set_running_tokens(1'000'000);
  workers_[1]->SetLoad(busy);
  StartCoordinator();
  WaitPolls();
  dsv4::v1::GenerateRequest req = MakeRequest({21, 22}, 12, 1.0f);
  req.mutable_sampling()->set_seed(12345);
  ExpectSeamlessFailover(this, workers_, *stub_, req, 3);
}

TEST_F(CoordinatorTest, GivesUpAfterMaxAttempts) {
  StartWorkers({{.die_after_tokens = 2}, {.die_after_tokens = 2}});
  StartCoordinator(/*max_attempts=*/2);
  StreamResult r = RunGenerate(*stub_, MakeRequest({1, 2}, 50));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(), HasSubstr("request failed on 2 worker groups"));
}

TEST_F(CoordinatorTest, ClientCancelCancelsTheWorkerStream) {
  StartWorkers({{.step = absl::Milliseconds(5)}});
  StartCoordinator();
  StreamResult r = RunGenerate(*stub_, MakeRequest({3, 4}, 2000), /*cancel_after=*/3);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED);
  for (int i = 0; i < 200 && workers_[0]->cancelled() == 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(workers_[0]->cancelled(), 1);
  EXPECT_EQ(workers_[0]->active(), 0);
  EXPECT_EQ(workers_[0]->completed(), 0);
}

TEST_F(CoordinatorTest, DrainFinishesInFlightAndAdmitsNothingNew) {
  StartWorkers({{.step = absl::Milliseconds(5)}});
  StartCoordinator();
  StreamResult in_flight;
  std::thread client([&] { in_flight = RunGenerate(*stub_, MakeRequest({3, 4}, 60)); });
  while (server_->tracker().inflight() == 0) absl::SleepFor(absl::Milliseconds(1));
  int left = -1;
  std::thread drainer([&] { left = server_->Drain(absl::Seconds(10)); });
  while (server_->tracker().admitting()) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(HealthStatus(address_), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  StreamResult late = RunGenerate(*stub_, MakeRequest({3, 4}, 2));
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(late.status.error_message(), HasSubstr("draining"));
  client.join();
  drainer.join();
  ASSERT_TRUE(in_flight.status.ok()) << in_flight.status.error_message();
  EXPECT_EQ(in_flight.tokens.size(), 60u);
  EXPECT_EQ(left, 0);
}

TEST_F(CoordinatorTest, DrainTimeoutCancelsWhatIsLeft) {
  StartWorkers({{.step = absl::Milliseconds(5)}});
  StartCoordinator();
  StreamResult in_flight;
  std::thread client([&] { in_flight = RunGenerate(*stub_, MakeRequest({3, 4}, 3000)); });
  while (server_->tracker().inflight() == 0) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(server_->Drain(absl::Milliseconds(100)), 1);
  client.join();
  EXPECT_FALSE(in_flight.status.ok());
  for (int i = 0; i < 200 && workers_[0]->active() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(workers_[0]->active(), 0);  // the worker stream was cancelled too: its pages are freed
}

TEST_F(CoordinatorTest, BenchRunnerRecordsEveryRequest) {
  StartWorkers({{}, {}});
  StartCoordinator();
  auto work = bench::MakeRandomWorkload(
      {.num_prompts = 10, .input_len = 12, .output_len = 6, .range_ratio = 0.5, .vocab_size = 1000, .seed = 3});
  ASSERT_TRUE(work.ok());
  for (double rate : {0.0, 200.0}) {  // back to back, then Poisson arrivals
    double duration = 0;
    const std::vector<bench::RequestRecord> records =
        bench::RunBenchmark(*stub_, *work, {.concurrency = 3, .request_rate = rate, .seed = 5}, &duration);
    ASSERT_EQ(records.size(), work->size());
    for (size_t i = 0; i < records.size(); ++i) {
      const bench::RequestRecord& r = records[i];
      ASSERT_TRUE(r.ok) << r.error;
      EXPECT_EQ(r.output_len, (*work)[i].output_len);
      EXPECT_EQ(r.prompt_len, static_cast<int>((*work)[i].prompt.size()));
      EXPECT_EQ(r.itl_s.size(), static_cast<size_t>(r.output_len - 1));
      EXPECT_GT(r.ttft_s, 0);
      EXPECT_GE(r.e2e_s, r.ttft_s);
      EXPECT_LE(r.e2e_s, duration);
    }
    const bench::Summary sum = bench::Summarize(records, duration);
    EXPECT_EQ(sum.completed, 10);
    EXPECT_GT(sum.output_tok_s, 0);
  }
}

// Issue 16 #4: the count in the saturation message includes the groups this request already tried (here a
// group that refused it with a full queue), not only the ones left to try.
TEST_F(CoordinatorTest, SaturationMessageCountsEveryReadyGroup) {
  StartWorkers({{.queue_full = true}, {}});
  dsv4::v1::GetLoadResponse full;
  full.set_max_batch(4);
  full.set_running(4);
  full.set_waiting(8);
  full.set_max_waiting(8);
  workers_[1]->SetLoad(full);
  StartCoordinator();
  WaitPolls();
  StreamResult r = RunGenerate(*stub_, MakeRequest({3, 4}, 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(r.status.error_message(),
              HasSubstr("all 2 ready worker groups are saturated (1 of them already tried for this request)"));
  EXPECT_EQ(workers_[0]->generate_calls(), 1);
  EXPECT_EQ(workers_[1]->generate_calls(), 0);
}

// Issue 16 #2: bytes that are not a request get INVALID_ARGUMENT saying so (gRPC's typed handlers answered
// UNIMPLEMENTED with no message), and nothing reaches a worker.
TEST_F(CoordinatorTest, UndecodableRequestsAreInvalidArgument) {
  StartWorkers({{}});
  StartCoordinator();
  // The hand-made body is a valid request but for its request_id: the same bytes with "ab" are the encoding.
  dsv4::v1::GenerateRequest valid = MakeRequest({5, 6, 7}, 4);
  valid.set_request_id("ab");
  std::string bad_utf8 = GenerateRequestWithBadUtf8();
  std::string ab = bad_utf8;
  ab.replace(2, 2, "ab");
  ASSERT_EQ(valid.SerializeAsString(), ab);

  grpc::Status st = RawUnaryCall(address_, "/dsv4.v1.Coordinator/Generate", bad_utf8);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("could not be parsed as dsv4.v1.GenerateRequest"));
  EXPECT_THAT(st.error_message(), HasSubstr("request_id"));
  st = RawUnaryCall(address_, "/dsv4.v1.Coordinator/Generate", std::string("\xff\xff\xff\xff\x0f", 5));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("could not be parsed"));
  st = RawUnaryCall(address_, "/dsv4.v1.Coordinator/GetModelInfo", std::string("\x0b\x0b", 2));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("could not be parsed as dsv4.v1.GetModelInfoRequest"));
  EXPECT_EQ(workers_[0]->generate_calls(), 0);
  const StreamResult r = RunGenerate(*stub_, MakeRequest({5, 6, 7}, 4));  // still serving
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, FakeGeneration({5, 6, 7}, 4, false, 0, 1000));
}

// Streams `req`; calls `hook` once `after` tokens have arrived. *stall: the longest gap between two chunks
// after the hook (tokens already in flight at the hook arrive first, so the stall shows as one long gap).
StreamResult RunWithHook(dsv4::v1::Coordinator::Stub& stub, const dsv4::v1::GenerateRequest& req, int after,
                         const std::function<void()>& hook, absl::Duration* stall) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));  // a hang fails, not blocks
  StreamResult r;
  auto reader = stub.Generate(&ctx, req);
  dsv4::v1::GenerateResponse chunk;
  std::optional<absl::Time> last;
  bool fired = false;
  *stall = absl::ZeroDuration();
  while (reader->Read(&chunk)) {
    const absl::Time now = absl::Now();
    if (last.has_value()) *stall = std::max(*stall, now - *last);
    if (fired) last = now;
    r.tokens.insert(r.tokens.end(), chunk.token_ids().begin(), chunk.token_ids().end());
    if (chunk.finish_reason() != dsv4::v1::FINISH_REASON_UNSPECIFIED) ++r.finish_chunks;
    r.last = chunk;
    if (!fired && static_cast<int>(r.tokens.size()) >= after) {
      fired = true;
      hook();
      last = absl::Now();
    }
  }
  r.status = reader->Finish();
  return r;
}

// A group that freezes mid-stream (streams and GetLoad stall, as under SIGSTOP) misses its health deadline: the
// request moves to the other group with no gap and no duplicate, the frozen group is not ready, and once it
// thaws it is ready again and ends the abandoned request as cancelled instead of finishing it a second time.
TEST_F(CoordinatorTest, HungGroupFailsOverAtTheHealthDeadlineAndRejoins) {
  StartWorkers({{.step = absl::Milliseconds(3)}, {.step = absl::Milliseconds(3)}});
  dsv4::v1::GetLoadResponse busy;
  busy.set_running_tokens(1'000'000);  // the first attempt goes to group 0
  workers_[1]->SetLoad(busy);
  options_.poll_timeout = absl::Milliseconds(300);
  options_.stream_idle_timeout = absl::ZeroDuration();  // only the health deadline here
  StartCoordinator();
  WaitPolls();
  absl::Duration stall;
  const StreamResult r =
      RunWithHook(*stub_, MakeRequest({31, 32, 33}, 60), 5, [&] { workers_[0]->Freeze(); }, &stall);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, FakeGeneration({31, 32, 33}, 60, false, 0, 1000));
  EXPECT_EQ(r.finish_chunks, 1);
  // Poll period 20 ms + at most two 300 ms deadlines (a poll already in flight at the freeze may not count).
  EXPECT_LT(stall, absl::Seconds(3)) << "hung stream stalled for " << absl::FormatDuration(stall);
  std::printf("[ measure ] hung group (health deadline 300 ms, poll 20 ms): longest gap between chunks %.0f ms\n",
              absl::ToDoubleMilliseconds(stall));
  const auto frozen = server_->pool().Snapshot();
  ASSERT_NE(Group(frozen, 0), nullptr);
  EXPECT_FALSE(Group(frozen, 0)->ready);
  EXPECT_THAT(Group(frozen, 0)->why_not_ready, HasSubstr("GetLoad"));
  ASSERT_EQ(workers_[1]->requests().size(), 1u);
  EXPECT_GE(workers_[1]->requests()[0].resume_generated(), 5);

  workers_[0]->Thaw();
  EXPECT_TRUE(server_->pool().WaitForReady(2, absl::Seconds(5)));
  for (int i = 0; i < 200 && workers_[0]->cancelled() == 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(workers_[0]->cancelled(), 1);  // the abandoned stream ends cancelled on the thawed group
  EXPECT_EQ(workers_[0]->completed(), 0);  // and is not served a second time
  EXPECT_EQ(workers_[1]->completed(), 1);
}

// An engine that hangs behind RPC threads that still answer GetLoad: the stream inactivity deadline moves the
// request; the group is marked down until a later poll answers.
TEST_F(CoordinatorTest, FrozenStreamFailsOverAtTheInactivityDeadline) {
  StartWorkers({{.step = absl::Milliseconds(3)}, {.step = absl::Milliseconds(3)}});
  dsv4::v1::GetLoadResponse busy;
  busy.set_running_tokens(1'000'000);
  workers_[1]->SetLoad(busy);
  options_.stream_idle_timeout = absl::Milliseconds(300);
  StartCoordinator();
  WaitPolls();
  absl::Duration stall;
  const StreamResult r = RunWithHook(
      *stub_, MakeRequest({41, 42}, 40, 0.7f), 4, [&] { workers_[0]->Freeze(/*streams_only=*/true); }, &stall);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, FakeGeneration({41, 42}, 40, true, r.last.usage().seed(), 1000));
  EXPECT_GE(stall, absl::Milliseconds(250));  // not before the deadline
  EXPECT_LT(stall, absl::Seconds(3)) << absl::FormatDuration(stall);
  std::printf("[ measure ] frozen stream (inactivity deadline 300 ms): longest gap between chunks %.0f ms\n",
              absl::ToDoubleMilliseconds(stall));
  workers_[0]->Thaw();
  for (int i = 0; i < 200 && workers_[0]->cancelled() == 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(workers_[0]->cancelled(), 1);
  EXPECT_EQ(workers_[0]->completed(), 0);
}

// Each group's poll ends on its own: while one group leaves its GetLoad unanswered up to a long health deadline,
// the other's load is still refreshed every poll interval (routing never works from loads a deadline old).
TEST_F(CoordinatorTest, AHungGroupDoesNotSlowTheOthersPolls) {
  StartWorkers({{}, {}});
  options_.poll_timeout = absl::Seconds(3);
  StartCoordinator();
  workers_[0]->Freeze();  // streams and GetLoad hang
  absl::SleepFor(absl::Milliseconds(100));  // a poll of group 0 is now in flight for up to 3 s
  for (int round = 1; round <= 3; ++round) {
    dsv4::v1::GetLoadResponse load;
    load.set_waiting_tokens(1000 * round);
    workers_[1]->SetLoad(load);
    const absl::Time set_at = absl::Now();
    int64_t seen = -1;
    while (absl::Now() - set_at < absl::Seconds(2)) {
      const auto groups = server_->pool().Snapshot();
      if (Group(groups, 1) != nullptr && (seen = Group(groups, 1)->load.waiting_tokens()) == 1000 * round) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(seen, 1000 * round);
    EXPECT_LT(absl::Now() - set_at, absl::Milliseconds(500))
        << "group 1's new load took " << absl::FormatDuration(absl::Now() - set_at) << " to arrive";
  }
  workers_[0]->Thaw();
}

// An engine that hangs before a stream's first token, behind RPC threads that still answer GetLoad: the
// inactivity deadline never starts (no first message), but the group's heartbeat shows no progress, so at the
// engine stall deadline the group is not ready and the request moves to the other group; it rejoins on thaw.
TEST_F(CoordinatorTest, StalledEngineMovesEvenAStreamWaitingForItsFirstToken) {
  StartWorkers({{.step = absl::Milliseconds(3)}, {.step = absl::Milliseconds(3)}});
  dsv4::v1::GetLoadResponse busy;
  busy.set_running_tokens(1'000'000);  // the first attempt goes to group 0
  workers_[1]->SetLoad(busy);
  options_.poll_timeout = absl::Milliseconds(300);
  options_.stream_idle_timeout = absl::ZeroDuration();  // off: only the heartbeat can catch this
  options_.engine_stall = absl::Milliseconds(400);
  StartCoordinator();
  WaitPolls();
  workers_[0]->Freeze(/*streams_only=*/true);
  const absl::Time sent = absl::Now();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto reader = stub_->Generate(&ctx, MakeRequest({51, 52, 53}, 12));
  std::vector<int32_t> tokens;
  absl::Time first = absl::InfiniteFuture();
  dsv4::v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    if (first == absl::InfiniteFuture() && msg.token_ids_size() > 0) first = absl::Now();
    for (int32_t t : msg.token_ids()) tokens.push_back(t);
  }
  const grpc::Status s = reader->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tokens, FakeGeneration({51, 52, 53}, 12, false, 0, 1000));
  EXPECT_GE(first - sent, absl::Milliseconds(350)) << "moved before the stall deadline";
  EXPECT_LT(first - sent, absl::Seconds(4)) << "first token after " << absl::FormatDuration(first - sent);
  std::printf("[ measure ] stalled engine (stall deadline 400 ms, poll 20 ms): first token after %.0f ms\n",
              absl::ToDoubleMilliseconds(first - sent));
  ASSERT_EQ(workers_[1]->requests().size(), 1u);
  const auto stalled = server_->pool().Snapshot();
  ASSERT_NE(Group(stalled, 0), nullptr);
  EXPECT_FALSE(Group(stalled, 0)->ready);
  EXPECT_THAT(Group(stalled, 0)->why_not_ready, HasSubstr("engine made no progress"));
  workers_[0]->Thaw();
  EXPECT_TRUE(server_->pool().WaitForReady(2, absl::Seconds(5)));
  for (int i = 0; i < 200 && workers_[0]->cancelled() == 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(workers_[0]->cancelled(), 1);  // the abandoned stream ends cancelled, not served twice
  EXPECT_EQ(workers_[0]->completed(), 0);
}

// Groups on two checkpoints (a rolling upgrade): a stream that began on checkpoint A fails over only to a group on
// A, even when a group on B is emptier; GetModelInfo names the checkpoint most ready groups serve; the pool counts
// 2 ready checkpoints (the gauge dsv4_coordinator_ready_checkpoints; its scrape is in prometheus_e2e - a metrics
// port here would keep this test out of the TSan stage, which cannot see into prometheus-cpp's locks).
TEST_F(CoordinatorTest, FailoverStaysOnTheCheckpointThatBeganTheStream) {
  StartWorkers({{.step = absl::Milliseconds(30), .die_after_tokens = 5, .checkpoint = "fnv1a64:aaaa"},
                {.checkpoint = "fnv1a64:bbbb"},
                {.checkpoint = "fnv1a64:aaaa"}});
  workers_[1]->SetDraining(true);  // out of the first pick: the stream begins on group 0 (A), not on an idle B
  dsv4::v1::GetLoadResponse busy;
  busy.set_running_tokens(1'000'000);
  workers_[2]->SetLoad(busy);  // the A survivor looks much busier than B
  StartCoordinator(4, /*expect_ready=*/2);
  WaitPolls();
  absl::Duration stall;
  const StreamResult r = RunWithHook(*stub_, MakeRequest({61, 62, 63}, 12), 1, [&] {
    workers_[1]->SetDraining(false);  // B becomes ready before group 0 dies
    ASSERT_TRUE(server_->pool().WaitForReady(3, absl::Seconds(2)));
  }, &stall);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, FakeGeneration({61, 62, 63}, 12, false, 0, 1000));
  EXPECT_EQ(workers_[1]->generate_calls(), 0) << "resumed on a group serving another checkpoint";
  ASSERT_EQ(workers_[2]->requests().size(), 1u);
  ExpectResumedAfterWhatTheClientGot(workers_[2]->requests()[0], {61, 62, 63}, r.tokens, 5);
  // Group 0 died: one A and one B ready; the tie goes to the smaller fingerprint.
  auto info = server_->pool().ModelInfo();
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->checkpoint_fingerprint(), "fnv1a64:aaaa");
  EXPECT_EQ(server_->pool().ReadyCheckpoints(), 2);
  // A fresh request (no tokens yet) may start on any checkpoint.
  EXPECT_TRUE(RunGenerate(*stub_, MakeRequest({7, 8}, 3)).status.ok());
  // Model info is asked at every poll: what an address serves now counts, not what it served once (a leader
  // restarted there on another checkpoint).
  workers_[1]->SetCheckpoint("fnv1a64:aaaa");
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (server_->pool().ReadyCheckpoints() != 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(server_->pool().ReadyCheckpoints(), 1);
  const auto groups = server_->pool().Snapshot();
  ASSERT_NE(Group(groups, 1), nullptr);
  EXPECT_TRUE(Group(groups, 1)->ready) << "group 1 must count as ready on checkpoint A, not drop out";
}

// Issue 16 #5: dsv4_prompt_tokens_total counts a request's prompt once a group has prefilled it (first token);
// a failover's second prefill (prompt + resumed tokens) goes to dsv4_coordinator_failover_prompt_tokens_total,
// so the coordinator's two counters add up to what the worker groups count. Rejected requests count nothing.
TEST_F(CoordinatorTest, PromptTokensCountEachPrefillOnce) {
  StartWorkers({{.die_after_tokens = 5}, {}});
  dsv4::v1::GetLoadResponse busy;
  busy.set_running_tokens(1'000'000);
  workers_[1]->SetLoad(busy);
  options_.metrics_listen = "127.0.0.1:0";
  StartCoordinator();
  WaitPolls();
  EXPECT_EQ(RunGenerate(*stub_, MakeRequest({1, 5000}, 4)).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const StreamResult r = RunGenerate(*stub_, MakeRequest({11, 12, 13}, 16));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(workers_[1]->requests().size(), 1u);
  const int resumed = workers_[1]->requests()[0].resume_generated();
  ASSERT_GE(resumed, 1);
  const std::string scrape = Scrape();
  EXPECT_EQ(MetricValue(scrape, "dsv4_prompt_tokens_total{"), 3) << scrape;
  EXPECT_EQ(MetricValue(scrape, "dsv4_coordinator_failover_prompt_tokens_total{"), 3 + resumed);
  EXPECT_EQ(MetricValue(scrape, "dsv4_generation_tokens_total{"), 16);
  EXPECT_EQ(MetricValue(scrape, "dsv4_coordinator_failovers_total{"), 1);
}

// A stream the watchdog tests script: group, last activity, first message, end.
class ScriptedStream final : public coordinator::WatchedStream {
 public:
  ScriptedStream(std::string group, absl::Duration silent, bool received, bool ended = false)
      : group_(std::move(group)), last_(absl::Now() - silent), received_(received), ended_(ended) {}
  const std::string& group_address() const override { return group_; }
  absl::Time last_activity() const override { return last_; }
  bool received_any() const override { return received_; }
  bool ended() const override { return ended_; }
  void Abandon(const std::string& why) override {
    absl::MutexLock lock(&mu_);
    why_ = why;
  }
  std::string why() {
    absl::MutexLock lock(&mu_);
    return why_;
  }

 private:
  const std::string group_;
  const absl::Time last_;
  const bool received_, ended_;
  absl::Mutex mu_;
  std::string why_;
};

TEST(StreamWatchdogTest, HealthDeadlineAbandonsOnlyTheGroupsSilentStreams) {
  coordinator::StreamWatchdog w(absl::ZeroDuration());
  auto quiet = std::make_shared<ScriptedStream>("a", absl::Seconds(2), true);
  auto queued = std::make_shared<ScriptedStream>("a", absl::Seconds(2), false);  // no token yet: silent too
  auto busy = std::make_shared<ScriptedStream>("a", absl::ZeroDuration(), true);
  auto other = std::make_shared<ScriptedStream>("b", absl::Seconds(2), true);
  auto done = std::make_shared<ScriptedStream>("a", absl::Seconds(2), true, /*ended=*/true);
  for (const auto& s : {quiet, queued, busy, other, done}) w.Watch(s);
  EXPECT_EQ(w.AbandonSilent("a", absl::Seconds(1), "no GetLoad answer"), 2);
  EXPECT_EQ(quiet->why(), "no GetLoad answer");
  EXPECT_EQ(queued->why(), "no GetLoad answer");
  EXPECT_EQ(busy->why(), "");
  EXPECT_EQ(other->why(), "");
  EXPECT_EQ(done->why(), "");
  EXPECT_EQ(w.watched(), 4);  // the ended stream was dropped
}

TEST(StreamWatchdogTest, InactivityDeadlineWaitsForTheFirstMessage) {
  coordinator::StreamWatchdog w(absl::Milliseconds(50));
  auto waiting = std::make_shared<ScriptedStream>("a", absl::Seconds(1), /*received=*/false);
  auto stalled = std::make_shared<ScriptedStream>("a", absl::Seconds(1), /*received=*/true);
  w.Watch(waiting);
  w.Watch(stalled);
  for (int i = 0; i < 200 && stalled->why().empty(); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_THAT(stalled->why(), HasSubstr("stream inactivity deadline --stream-idle-timeout-ms 50"));
  EXPECT_EQ(waiting->why(), "");  // queued or prefilling: only the health deadline applies
}

TEST(StreamWatchdogTest, EndedStreamsArePrunedWithoutTheScanThread) {
  coordinator::StreamWatchdog w(absl::ZeroDuration());  // no scan thread: Watch itself must prune
  auto live = std::make_shared<ScriptedStream>("a", absl::ZeroDuration(), true);
  w.Watch(live);
  for (int i = 0; i < 10000; ++i) w.Watch(std::make_shared<ScriptedStream>("a", absl::ZeroDuration(), true));
  EXPECT_LT(w.watched(), 200);
}

TEST(WorkerListTest, ParsesAndRejects) {
  auto ok = coordinator::ParseWorkerList("127.0.0.1:7001, localhost:7002,[::1]:7003");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->size(), 3u);
  EXPECT_THAT(std::string(coordinator::ParseWorkerList("").status().message()), HasSubstr("--workers is empty"));
  EXPECT_THAT(std::string(coordinator::ParseWorkerList("host").status().message()), HasSubstr("not host:port"));
  EXPECT_THAT(std::string(coordinator::ParseWorkerList("h:99999").status().message()), HasSubstr("1..65535"));
}

TEST(GroupPoolTest, DnsNameResolvesToEveryLeader) {
  // "localhost" resolves to 127.0.0.1 (and ::1 where configured); each address is its own group.
  FakeWorker w({});
  const std::string port = w.address().substr(w.address().rfind(':') + 1);
  coordinator::GroupPool pool({.targets = {"localhost:" + port}, .poll_interval = absl::Milliseconds(20)});
  ASSERT_TRUE(pool.Start().ok());
  ASSERT_TRUE(pool.WaitForReady(1, absl::Seconds(5)));
  bool found = false;
  for (const auto& g : pool.Snapshot()) found |= g.address == "127.0.0.1:" + port && g.ready;
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace dsv4::testing
