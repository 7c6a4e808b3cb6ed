// The real dsv4-worker process on a loopback port with the tiny checkpoint made at test time: greedy tokens
// equal dsv4-generate's (alone and with 16 requests in flight), seeded sampling repeats, cancel frees pages,
// a burst needing more pages than exist completes, every bad input gets its status, SIGTERM drains.
#include <signal.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "comm/rendezvous.h"
#include "dsv4/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/worker/process_util.h"
#include "tests/worker/worker_client.h"

namespace dsv4::worker::testing {
namespace {

using dsv4::v1::GenerateRequest;
using dsv4::v1::GenerateResponse;

class WorkerProcessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
#if !defined(DSV4_WORKER_HAVE_MODEL)
    return;  // no dsv4_model in this build: nothing to start (SetUp skips with a message)
#endif
    dir_ = new std::string(::testing::TempDir() + "/worker_it_" + std::to_string(getpid()));
    std::filesystem::create_directories(*dir_);
    checkpoint_ = new std::string(*dir_ + "/tiny");
    const absl::Status made = MakeTinyCheckpoint(*checkpoint_, 1);
    ASSERT_TRUE(made.ok()) << made;
    std::string address;
    auto worker = StartWorker(*dir_, {"--checkpoint=" + *checkpoint_, "--listen=127.0.0.1:0", "--max-batch=32",
                                      "--max-context=4096", "--prefill-chunk=256", "--threads=2"},
                              &address);
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = new ChildProcess(std::move(*worker));
    stub_ = dsv4::v1::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())).release();
  }
  static void TearDownTestSuite() {
    delete stub_;
    delete worker_;
  }
  void SetUp() override {
#if defined(DSV4_WORKER_HAVE_MODEL)
    ASSERT_NE(stub_, nullptr) << "the tiny checkpoint or dsv4-worker did not start (see the suite set-up error)";
#else
    GTEST_SKIP() << "dsv4_model is not part of this build: no dsv4-worker to test";
#endif
  }

  // dsv4-generate's greedy tokens (CPU backend): the reference.
  static std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_new) {
    return ReferenceTokens(*checkpoint_, prompt, max_new);
  }

  static std::string* dir_;
  static std::string* checkpoint_;
  static ChildProcess* worker_;
  static dsv4::v1::Worker::Stub* stub_;
};

std::string* WorkerProcessTest::dir_ = nullptr;
std::string* WorkerProcessTest::checkpoint_ = nullptr;
ChildProcess* WorkerProcessTest::worker_ = nullptr;
dsv4::v1::Worker::Stub* WorkerProcessTest::stub_ = nullptr;

TEST_F(WorkerProcessTest, ModelInfo) {
  grpc::ClientContext ctx;
  dsv4::v1::GetModelInfoResponse info;
  ASSERT_TRUE(stub_->GetModelInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.vocab_size(), 4096);
  EXPECT_EQ(info.max_context(), 4096);
  EXPECT_EQ(info.eos_token_id(), 1);
  // The checkpoint's identity, the same hash a tensor-parallel rendezvous compares.
  auto fingerprint = comm::CheckpointFingerprint(*checkpoint_);
  ASSERT_TRUE(fingerprint.ok()) << fingerprint.status();
  EXPECT_EQ(info.checkpoint_fingerprint(), *fingerprint);
  EXPECT_EQ(info.checkpoint_fingerprint().rfind("fnv1a64:", 0), 0u) << info.checkpoint_fingerprint();
}

// Log-probabilities from the real model: the same greedy tokens as without them, one entry per token, the greedy
// token the most likely one, alternatives in descending order and together at most probability 1.
TEST_F(WorkerProcessTest, GreedyLogprobsOnTheRealModel) {
  const auto prompt = Prompt(40, 9);
  GenerateRequest r = Request(prompt, 8);
  r.mutable_sampling()->set_logprobs(true);
  r.mutable_sampling()->set_top_logprobs(4);
  const Stream s = Generate(stub_, r);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.tokens, Reference(prompt, 8));
  ASSERT_EQ(s.logprobs.size(), s.tokens.size());
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    const dsv4::v1::TokenLogprob& lp = s.logprobs[i];
    ASSERT_EQ(lp.top_size(), 4) << i;
    EXPECT_EQ(lp.top(0).token_id(), s.tokens[i]) << i;
    EXPECT_EQ(lp.top(0).logprob(), lp.logprob()) << i;
    double mass = 0;
    for (int k = 0; k < 4; ++k) {
      if (k > 0) {
        EXPECT_GE(lp.top(k - 1).logprob(), lp.top(k).logprob()) << i;
      }
      EXPECT_LE(lp.top(k).logprob(), 0.0f);
      mass += std::exp(static_cast<double>(lp.top(k).logprob()));
    }
    EXPECT_LE(mass, 1.0 + 1e-5) << i;
  }
}

TEST_F(WorkerProcessTest, GreedyEqualsGenerate) {
  for (int n : {1, 33, 140}) {  // 140 crosses the 128-token window and a ratio-128 row
    const auto prompt = Prompt(n, n);
    const Stream s = Generate(stub_, Request(prompt, 10));
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.tokens, Reference(prompt, 10)) << "prompt length " << n;
    EXPECT_EQ(s.last.finish_reason(), dsv4::v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(s.last.usage().completion_tokens(), 10);
    EXPECT_EQ(s.last.usage().prompt_tokens(), n);
  }
  EXPECT_TRUE(WaitPagesFree(stub_));
}

TEST_F(WorkerProcessTest, SixteenInFlightEqualGenerate) {
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 16; ++i) reqs.push_back(Request(Prompt(2 + 5 * i, 100 + i), 4 + i % 5));
  const std::vector<Stream> got = GenerateAll(stub_, reqs);
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, Reference(Prompt(2 + 5 * i, 100 + i), 4 + i % 5)) << "request " << i;
  }
  EXPECT_TRUE(WaitPagesFree(stub_));
}

TEST_F(WorkerProcessTest, SeededSamplingRepeats) {
  const GenerateRequest r = Request(Prompt(12, 7), 16, 0.9f, 424242);
  const Stream alone = Generate(stub_, r);
  ASSERT_TRUE(alone.status.ok()) << alone.status.error_message();
  EXPECT_EQ(alone.last.usage().seed(), 424242u);
  // Same request again among others: batching must not change it.
  const auto batch = GenerateAll(stub_, {Request(Prompt(20, 1), 8, 0.7f, 1), r, Request(Prompt(5, 2), 12)});
  EXPECT_EQ(batch[1].tokens, alone.tokens);
  EXPECT_EQ(alone.tokens.size(), 16u);
}

TEST_F(WorkerProcessTest, CancelMidStreamFreesPages) {
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Request(Prompt(20, 3), 3000));
  GenerateResponse msg;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(reader->Read(&msg));
  EXPECT_GT(PagesUsed(stub_), 0);
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitPagesFree(stub_));
}

TEST_F(WorkerProcessTest, BadInputsGetNamedStatuses) {
  struct Case {
    std::string what;
    std::function<void(GenerateRequest*)> mutate;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"empty prompt", [](GenerateRequest* r) { r->clear_prompt_token_ids(); }, "prompt_token_ids is empty"},
      {"token >= vocab", [](GenerateRequest* r) { r->add_prompt_token_ids(4096); }, "[0, 4096)"},
      {"context", [](GenerateRequest* r) { r->mutable_sampling()->set_max_new_tokens(4095); }, "max context 4096"},
      {"temperature", [](GenerateRequest* r) { r->mutable_sampling()->set_temperature(-1); }, "sampling.temperature"},
      {"top_p", [](GenerateRequest* r) { r->mutable_sampling()->set_top_p(1.5f); }, "sampling.top_p"},
      {"top_k", [](GenerateRequest* r) { r->mutable_sampling()->set_top_k(-2); }, "sampling.top_k"},
  };
  for (const Case& c : cases) {
    GenerateRequest r = Request({5, 6, 7}, 4);
    c.mutate(&r);
    const Stream s = Generate(stub_, r);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.what;
    EXPECT_NE(s.status.error_message().find(c.expect), std::string::npos) << c.what << ": " << s.status.error_message();
  }
  const Stream ok = Generate(stub_, Request({5, 6, 7}, 2));  // still serving
  EXPECT_TRUE(ok.status.ok());
  EXPECT_EQ(ok.tokens.size(), 2u);
}

// A second worker with few pages: a burst needing more than exist completes (waiting + preemption), with the
// same greedy tokens; then a flood beyond --max-waiting gets RESOURCE_EXHAUSTED.
TEST_F(WorkerProcessTest, BurstBeyondPagesAndQueueFull) {
  // One request of 256 tokens needs 16 compressed-4 pages of 4 rows; 4 running requests of ~110 tokens need 28.
  std::string address, log;
  auto small = StartWorker(*dir_, {"--checkpoint=" + *checkpoint_, "--max-batch=4", "--max-waiting=8",
                                   "--max-context=256", "--page-rows=4", "--kv-pages=20", "--prefill-chunk=64",
                                   "--threads=2"},
                           &address, &log);
  ASSERT_TRUE(small.ok()) << small.status();
  auto stub = dsv4::v1::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(Request(Prompt(30 + 4 * i, 50 + i), 60));
  const auto got = GenerateAll(stub.get(), reqs);
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, Reference(Prompt(30 + 4 * i, 50 + i), 60)) << "request " << i;
  }
  EXPECT_TRUE(WaitPagesFree(stub.get()));
  EXPECT_NE(ReadFile(log).find("preempted"), std::string::npos) << "the burst never ran short of pages";

  std::vector<GenerateRequest> flood(32, Request(Prompt(8, 9), 3));
  const auto flooded = GenerateAll(stub.get(), flood);
  int exhausted = 0;
  for (const Stream& s : flooded) {
    if (s.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++exhausted;
      EXPECT_NE(s.status.error_message().find("--max-waiting 8"), std::string::npos) << s.status.error_message();
    } else {
      EXPECT_TRUE(s.status.ok()) << s.status.error_message();
    }
  }
  EXPECT_GT(exhausted, 0);
  EXPECT_TRUE(WaitPagesFree(stub.get()));
}

TEST_F(WorkerProcessTest, SigtermDrainsInFlightThenExitsZero) {
  std::string address;
  auto w = StartWorker(*dir_, {"--checkpoint=" + *checkpoint_, "--max-context=512", "--drain-timeout=60",
                               "--threads=2"},
                       &address);
  ASSERT_TRUE(w.ok()) << w.status();
  auto stub = dsv4::v1::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, Request(Prompt(10, 4), 40));
  GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  w->Signal(SIGTERM);
  int tokens = msg.token_ids_size();
  GenerateResponse last;
  while (reader->Read(&msg)) {
    tokens += msg.token_ids_size();
    last = msg;
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, 40);
  EXPECT_EQ(last.finish_reason(), dsv4::v1::FINISH_REASON_LENGTH);
  auto code = w->Wait(30);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}


TEST_F(WorkerProcessTest, HealthMetricsAndDrainRpc) {
  std::string address, log, metrics;
  auto w = StartWorker(*dir_, {"--checkpoint=" + *checkpoint_, "--max-context=512", "--group=3", "--threads=2",
                               "--metrics-listen=127.0.0.1:0"},
                       &address, &log, &metrics);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_FALSE(metrics.empty()) << "ready file has no metrics address";
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = dsv4::v1::Worker::NewStub(channel);
  EXPECT_EQ(HealthStatus(address), 1);  // SERVING once weights and pools are ready
  const Stream s = Generate(stub.get(), Request(Prompt(6, 5), 5));
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  auto text = HttpGet(metrics, "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_NE(text->find("dsv4_generation_tokens_total{group=\"3\",rank=\"0\",role=\"worker\"} 5"),
            std::string::npos) << *text;
  EXPECT_NE(text->find("dsv4_request_finished_total"), std::string::npos);
  EXPECT_NE(text->find("dsv4_time_to_first_token_seconds_count"), std::string::npos);

  grpc::ClientContext ctx;
  dsv4::v1::DrainRequest drain;
  drain.set_timeout_s(10);
  dsv4::v1::DrainResponse drained;
  ASSERT_TRUE(stub->Drain(&ctx, drain, &drained).ok());
  EXPECT_EQ(drained.aborted(), 0);
  EXPECT_EQ(HealthStatus(address), 2);  // NOT_SERVING after a drain
  const Stream refused = Generate(stub.get(), Request(Prompt(6, 5), 5));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.status.error_message();
  w->Signal(SIGTERM);
  auto code = w->Wait(30);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

}  // namespace
}  // namespace dsv4::worker::testing
