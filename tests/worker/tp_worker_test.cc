// Tensor-parallel worker groups of real dsv4-worker processes on loopback (docs/tensor-parallel.md), on the tiny
// checkpoint made at test time: world 2 and 4 groups stream the same greedy tokens as a world-1 worker on a
// golden prompt (320 tokens); a follower SIGKILLed mid-stream ends the client's stream with UNAVAILABLE and the
// leader reports NOT_SERVING within 5 s; a follower that never arrives fails the leader's start-up with a
// timeout naming it; a follower with another checkpoint or another --world is refused at rendezvous.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dsv4/v1/worker.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/process_util.h"
#include "tests/worker/tiny_checkpoint_suite.h"
#include "tools/generate/npy.h"

namespace dsv4::worker::testing {
namespace {

using ::testing::HasSubstr;

struct Group {
  std::optional<ChildProcess> leader;
  std::vector<ChildProcess> followers;
  std::string address;
  std::unique_ptr<dsv4::v1::Worker::Stub> stub;
};

class TpWorkerTest : public TinyCheckpointSuite {
 protected:
  static void SetUpTestSuite() { MakeCheckpoints("tp_worker", {1, 2}); }


  static std::vector<std::string> Flags(int seed, int world, int rank) {
    return {"--checkpoint=" + Checkpoint(seed), "--max-batch=4", "--max-context=1024", "--kv-pages=64",
            "--prefill-chunk=128", "--threads=1", absl::StrCat("--world=", world), absl::StrCat("--rank=", rank)};
  }

  // Starts ranks 1..world-1 (they retry the rendezvous until the leader is up), then the leader on a known
  // port, and waits until the leader is SERVING.
  static absl::StatusOr<Group> StartGroup(int world) {
    Group g;
    const std::string leader_addr = absl::StrCat("127.0.0.1:", FreePort());
    for (int r = 1; r < world; ++r) {
      std::vector<std::string> argv = {BinaryPath("worker/dsv4-worker"), "--listen=127.0.0.1:0",
                                       "--leader=" + leader_addr, "--startup-timeout=60"};
      for (auto& f : Flags(1, world, r)) argv.push_back(f);
      auto child = ChildProcess::Start(argv, absl::StrCat(*dir_, "/group", world, "_rank", r, ".log"));
      if (!child.ok()) return child.status();
      g.followers.push_back(std::move(*child));
    }
    std::vector<std::string> flags = Flags(1, world, 0);
    flags.push_back("--listen=" + leader_addr);
    flags.push_back("--startup-timeout=60");
    auto leader = StartWorker(*dir_, flags, &g.address);
    if (!leader.ok()) return leader.status();
    g.leader.emplace(std::move(*leader));
    g.stub = dsv4::v1::Worker::NewStub(grpc::CreateChannel(g.address, grpc::InsecureChannelCredentials()));
    return g;
  }

  // The first golden prompt (tests/data/golden: 320 tokens, past the 128-token window).
  static std::vector<int32_t> GoldenPrompt() {
    std::ifstream meta_in(SourcePath("tests/data/golden/golden.json"));
    const auto meta = nlohmann::json::parse(meta_in);
    auto tokens = npy::Read(SourcePath("tests/data/golden/tokens.npy"));
    EXPECT_TRUE(tokens.ok()) << tokens.status();
    const int64_t len = meta["sequences"][0]["prompt_len"].get<int64_t>();
    const int32_t* t = tokens->as<int32_t>();
    return std::vector<int32_t>(t, t + len);
  }

  static dsv4::v1::GenerateRequest Request(const std::vector<int32_t>& prompt, int max_new) {
    dsv4::v1::GenerateRequest r;
    for (int32_t t : prompt) r.add_prompt_token_ids(t);
    r.mutable_sampling()->set_max_new_tokens(max_new);
    r.mutable_sampling()->set_ignore_eos(true);
    return r;
  }

  // Streams one greedy request; `on_token` (optional) runs after each message.
  static grpc::Status Generate(dsv4::v1::Worker::Stub* stub, const dsv4::v1::GenerateRequest& r,
                               std::vector<int32_t>* tokens, const std::function<void()>& on_message = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto reader = stub->Generate(&ctx, r);
    dsv4::v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      for (int32_t t : msg.token_ids()) tokens->push_back(t);
      if (on_message) on_message();
    }
    return reader->Finish();
  }

};

TEST_F(TpWorkerTest, World2And4StreamWorld1GreedyTokens) {
  const std::vector<int32_t> prompt = GoldenPrompt();
  ASSERT_GT(prompt.size(), 300u);
  constexpr int kNew = 8;
  std::vector<int32_t> reference;
  {
    std::string address;
    auto one = StartWorker(*dir_, Flags(1, 1, 0), &address);
    ASSERT_TRUE(one.ok()) << one.status();
    auto stub = dsv4::v1::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    const grpc::Status s = Generate(stub.get(), Request(prompt, kNew), &reference);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(reference.size(), static_cast<size_t>(kNew));
  }
  for (int world : {2, 4}) {
    auto group = StartGroup(world);
    ASSERT_TRUE(group.ok()) << "world " << world << ": " << group.status();
    std::vector<int32_t> tokens;
    const grpc::Status s = Generate(group->stub.get(), Request(prompt, kNew), &tokens);
    ASSERT_TRUE(s.ok()) << "world " << world << ": " << s.error_message();
    EXPECT_EQ(tokens, reference) << "world " << world;
    // SIGTERM on the leader: drain, then its shutdown plan releases the followers, which exit 0.
    group->leader->Signal(SIGTERM);
    auto code = group->leader->Wait(30);
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0);
    for (auto& f : group->followers) {
      auto fc = f.Wait(30);
      ASSERT_TRUE(fc.ok()) << fc.status();
      EXPECT_EQ(*fc, 0) << "a follower of world " << world << " did not leave cleanly on the shutdown plan";
    }
  }
}

// Log-probabilities from a world-2 group (the leader copies its gathered, full-vocabulary logit rows after the
// sampled step): the same tokens and, to float rounding of a differently summed forward, the same log-probs and
// alternatives as a world-1 worker.
TEST_F(TpWorkerTest, World2LogprobsMatchWorld1) {
  dsv4::v1::GenerateRequest r = Request(GoldenPrompt(), 6);
  r.mutable_sampling()->set_logprobs(true);
  r.mutable_sampling()->set_top_logprobs(3);
  auto stream = [&](dsv4::v1::Worker::Stub* stub, std::vector<int32_t>* tokens,
                    std::vector<dsv4::v1::TokenLogprob>* logprobs) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto reader = stub->Generate(&ctx, r);
    dsv4::v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      tokens->insert(tokens->end(), msg.token_ids().begin(), msg.token_ids().end());
      logprobs->insert(logprobs->end(), msg.logprobs().begin(), msg.logprobs().end());
    }
    return reader->Finish();
  };
  std::vector<int32_t> want_tokens, got_tokens;
  std::vector<dsv4::v1::TokenLogprob> want, got;
  {
    std::string address;
    auto one = StartWorker(*dir_, Flags(1, 1, 0), &address);
    ASSERT_TRUE(one.ok()) << one.status();
    auto stub = dsv4::v1::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    ASSERT_TRUE(stream(stub.get(), &want_tokens, &want).ok());
  }
  auto group = StartGroup(2);
  ASSERT_TRUE(group.ok()) << group.status();
  const grpc::Status s = stream(group->stub.get(), &got_tokens, &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(got_tokens, want_tokens);
  ASSERT_EQ(got.size(), got_tokens.size());
  ASSERT_EQ(want.size(), want_tokens.size());
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    EXPECT_NEAR(got[i].logprob(), want[i].logprob(), 1e-3) << i;
    ASSERT_EQ(got[i].top_size(), 3);
    EXPECT_EQ(got[i].top(0).token_id(), want[i].top(0).token_id()) << i;
  }
}

TEST_F(TpWorkerTest, FollowerKilledMidStreamEndsStreamUnavailableAndLeaderNotServing) {
  auto group = StartGroup(2);
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(HealthStatus(group->address), 1);
  std::vector<int32_t> tokens;
  absl::Time killed_at = absl::InfiniteFuture();
  // Long enough that the stream is still running when the follower dies after the first streamed token.
  const grpc::Status s = Generate(group->stub.get(), Request(GoldenPrompt(), 600), &tokens, [&] {
    if (killed_at == absl::InfiniteFuture()) {
      group->followers[0].Signal(SIGKILL);
      killed_at = absl::Now();
    }
  });
  const absl::Time stream_end = absl::Now();
  ASSERT_NE(killed_at, absl::InfiniteFuture()) << "the stream sent nothing: " << s.error_message();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_LT(tokens.size(), 600u);
  int health = 0;
  while (absl::Now() - killed_at < absl::Seconds(5) && (health = HealthStatus(group->address)) != 2) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(health, 2) << "leader still not NOT_SERVING 5 s after the follower died";
  // The group stays broken: a new request fails the same way instead of hanging.
  std::vector<int32_t> after;
  const grpc::Status again = Generate(group->stub.get(), Request({5, 6, 7}, 4), &after);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::UNAVAILABLE) << again.error_message();
  std::printf("stream ended %.3f s after the kill; NOT_SERVING by %.3f s\n",
              absl::ToDoubleSeconds(stream_end - killed_at), absl::ToDoubleSeconds(absl::Now() - killed_at));
}

// World 4, idle (no request): a killed follower is found by the leader's heartbeat; the surviving followers
// leave their loops (non-zero) instead of waiting forever, and the broken leader still exits 0 on SIGTERM.
TEST_F(TpWorkerTest, FollowerKilledWhileIdleBreaksTheGroupWithoutHanging) {
  auto group = StartGroup(4);
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(HealthStatus(group->address), 1);
  const absl::Time killed_at = absl::Now();
  group->followers[1].Signal(SIGKILL);  // rank 2
  int health = 0;
  while (absl::Now() - killed_at < absl::Seconds(5) && (health = HealthStatus(group->address)) != 2) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(health, 2) << "leader still not NOT_SERVING 5 s after an idle follower died";
  std::printf("idle group: NOT_SERVING %.3f s after the kill\n", absl::ToDoubleSeconds(absl::Now() - killed_at));
  for (int i : {0, 2}) {
    auto code = group->followers[i].Wait(10);
    ASSERT_TRUE(code.ok()) << "surviving follower " << i + 1 << ": " << code.status();
    EXPECT_NE(*code, 0);
  }
  group->leader->Signal(SIGTERM);
  auto code = group->leader->Wait(15);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

// SIGTERM reaches every pod of a group at once: a follower keeps following (the leader can drain) and leaves
// with exit 0 on the leader's shutdown plan.
TEST_F(TpWorkerTest, SigtermedFollowerWaitsForTheLeadersShutdown) {
  auto group = StartGroup(2);
  ASSERT_TRUE(group.ok()) << group.status();
  group->followers[0].Signal(SIGTERM);
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(HealthStatus(group->address), 1) << "the leader lost its follower on SIGTERM";
  std::vector<int32_t> tokens;
  const grpc::Status s = Generate(group->stub.get(), Request({5, 6, 7}, 4), &tokens);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tokens.size(), 4u);
  group->leader->Signal(SIGTERM);
  auto leader_code = group->leader->Wait(15);
  auto follower_code = group->followers[0].Wait(15);
  ASSERT_TRUE(leader_code.ok()) << leader_code.status();
  ASSERT_TRUE(follower_code.ok()) << follower_code.status();
  EXPECT_EQ(*leader_code, 0);
  EXPECT_EQ(*follower_code, 0);
}

TEST_F(TpWorkerTest, FollowerNeverArrivesFailsLeaderStartupWithTimeout) {
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  std::vector<std::string> argv = {BinaryPath("worker/dsv4-worker"), "--listen=" + address,
                                   "--startup-timeout=1.5", "--ready-file=" + *dir_ + "/lonely.ready"};
  for (auto& f : Flags(1, 2, 0)) argv.push_back(f);
  const std::string log = *dir_ + "/lonely.log";
  auto leader = ChildProcess::Start(argv, log);
  ASSERT_TRUE(leader.ok()) << leader.status();
  const absl::Time start = absl::Now();
  // While the group forms the leader answers, but NOT_SERVING, and Generate gets UNAVAILABLE.
  int health = -1;
  while (absl::Now() - start < absl::Seconds(1.2) && (health = HealthStatus(address)) == -1) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(health, 2);
  auto stub = dsv4::v1::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  std::vector<int32_t> none;
  const grpc::Status early = Generate(stub.get(), Request({5, 6, 7}, 4), &none);
  EXPECT_EQ(early.error_code(), grpc::StatusCode::UNAVAILABLE) << early.error_message();
  EXPECT_THAT(early.error_message(), HasSubstr("starting"));
  auto code = leader->Wait(20);
  ASSERT_TRUE(code.ok()) << code.status() << "\n" << ReadFile(log);
  EXPECT_NE(*code, 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_THAT(ReadFile(log), HasSubstr("follower rank(s) 1 never completed the rendezvous within 1500 ms"));
  EXPECT_FALSE(std::filesystem::exists(*dir_ + "/lonely.ready"));
}

TEST_F(TpWorkerTest, FollowerWithOtherCheckpointOrWorldIsRefused) {
  const std::string leader_addr = absl::StrCat("127.0.0.1:", FreePort());
  std::vector<std::string> argv = {BinaryPath("worker/dsv4-worker"), "--listen=" + leader_addr,
                                   "--startup-timeout=60"};
  for (auto& f : Flags(1, 2, 0)) argv.push_back(f);
  auto leader = ChildProcess::Start(argv, *dir_ + "/refusing_leader.log");
  ASSERT_TRUE(leader.ok()) << leader.status();
  struct Case {
    int seed, world;
    std::string want;
  };
  for (const Case& c : {Case{2, 2, "checkpoint mismatch"}, Case{1, 4, "world mismatch"}}) {
    std::vector<std::string> fargv = {BinaryPath("worker/dsv4-worker"), "--listen=127.0.0.1:0",
                                      "--leader=" + leader_addr, "--startup-timeout=30"};
    for (auto& f : Flags(c.seed, c.world, 1)) fargv.push_back(f);
    const std::string log = absl::StrCat(*dir_, "/refused_", c.seed, "_", c.world, ".log");
    auto follower = ChildProcess::Start(fargv, log);
    ASSERT_TRUE(follower.ok()) << follower.status();
    auto code = follower->Wait(30);
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_NE(*code, 0);
    EXPECT_THAT(ReadFile(log), HasSubstr(c.want));
  }
  EXPECT_THAT(ReadFile(*dir_ + "/refusing_leader.log"), ::testing::Not(HasSubstr("SERVING grpc=")));
}

}  // namespace
}  // namespace dsv4::worker::testing
