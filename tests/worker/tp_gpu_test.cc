// Tensor-parallel groups on GPUs (issue 15 §5): world T = 2, 4 and 8 groups of dsv4-worker --backend cuda processes,
// rank r on GPU r, with the forward's collectives on NCCL inside the ranks' CUDA graphs (step plans on Gloo),
// stream the same greedy tokens as a world-1 CUDA worker - one long prompt alone, then 6 requests in flight (decode
// buckets 8, 4, ...) - parting, if at all, only at a near tie of the reference logits (greedy_check.h); a follower SIGKILLed mid-stream ends the stream with UNAVAILABLE and turns the leader
// NOT_SERVING within the collective deadline instead of hanging. Each case skips, saying so, below T GPUs. Label gpu.
// Processes talk over loopback only (NCCL_SOCKET_IFNAME=lo); NCCL_NVLS_ENABLE=0 as in production.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "dsv4/v1/worker.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/gpu_check/gpu_check.h"
#include "tests/worker/greedy_check.h"
#include "tests/worker/process_util.h"
#include "tests/worker/worker_client.h"

namespace dsv4::worker::testing {
namespace {

struct Group {
  std::optional<ChildProcess> leader;
  std::vector<ChildProcess> followers;
  std::string address, leader_log;
  std::vector<std::string> follower_logs;
  std::unique_ptr<dsv4::v1::Worker::Stub> stub;
  std::string Logs() const { return absl::StrCat("leader log ", leader_log, ", follower logs ",
                                                 absl::StrJoin(follower_logs, " ")); }
};

class TpGpuTest : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);  // loopback only, inherited by the workers
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    dir_ = new std::string(::testing::TempDir() + "/tp_gpu_" + std::to_string(getpid()));
    std::filesystem::create_directories(*dir_);
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr && ::testing::UnitTest::GetInstance()->failed_test_count() == 0) {
      std::filesystem::remove_all(*dir_);  // kept when something failed: every rank's log is there
    }
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    const int world = GetParam(), gpus = ::dsv4::testing::GpuCount();
    if (gpus < world) GTEST_SKIP() << "world " << world << " needs " << world << " GPUs; " << gpus << " visible";
    if (checkpoint_.empty()) {
      checkpoint_ = *dir_ + "/tiny";
      auto made = RunAndCapture({BinaryPath("tools/make_checkpoint/dsv4-make-checkpoint"), "--config",
                                 SourcePath("configs/tiny.json"), "--seed", "1", "--out", checkpoint_},
                                120);
      ASSERT_TRUE(made.ok()) << made.status();
    }
  }

  static std::vector<std::string> Flags(int world, int rank) {
    return {"--checkpoint=" + checkpoint_, "--backend=cuda", absl::StrCat("--device=", rank),
            "--gpu-memory-fraction=0.3", "--max-batch=8", "--max-context=1024", "--prefill-chunk=128",
            "--comm-timeout=10", "--startup-timeout=120", absl::StrCat("--world=", world),
            absl::StrCat("--rank=", rank)};
  }

  // Followers first (they retry the rendezvous), then the leader on a known port; returns once it is SERVING.
  static absl::StatusOr<Group> StartGroup(int world) {
    Group g;
    const std::string leader_addr = absl::StrCat("127.0.0.1:", FreePort());
    for (int r = 1; r < world; ++r) {
      std::vector<std::string> argv = {BinaryPath("worker/dsv4-worker"), "--listen=127.0.0.1:0",
                                       "--leader=" + leader_addr};
      for (auto& f : Flags(world, r)) argv.push_back(f);
      g.follower_logs.push_back(absl::StrCat(*dir_, "/world", world, "_rank", r, "_", ++starts_, ".log"));
      auto child = ChildProcess::Start(argv, g.follower_logs.back());
      if (!child.ok()) return child.status();
      g.followers.push_back(std::move(*child));
    }
    std::vector<std::string> flags = Flags(world, 0);
    flags.push_back("--listen=" + leader_addr);
    auto leader = StartWorker(*dir_, flags, &g.address, &g.leader_log);
    if (!leader.ok()) {
      return absl::Status(leader.status().code(), absl::StrCat(leader.status().message(), " (follower logs ",
                                                               absl::StrJoin(g.follower_logs, " "), ")"));
    }
    g.leader.emplace(std::move(*leader));
    g.stub = dsv4::v1::Worker::NewStub(grpc::CreateChannel(g.address, grpc::InsecureChannelCredentials()));
    return g;
  }

  static std::vector<dsv4::v1::GenerateRequest> Batch() {
    std::vector<dsv4::v1::GenerateRequest> reqs;
    for (int i = 0; i < 6; ++i) reqs.push_back(Request(Prompt(20 + 37 * i, 300 + i), 10 + 3 * i));
    return reqs;
  }

  static std::string* dir_;
  static std::string checkpoint_;
  static int starts_;
};

std::string* TpGpuTest::dir_ = nullptr;
std::string TpGpuTest::checkpoint_;
int TpGpuTest::starts_ = 0;

TEST_P(TpGpuTest, GroupStreamsTheTokensOfWorldOne) {
  const int world = GetParam();
  // World 1 on GPU 0: the reference.
  auto one = StartGroup(1);
  ASSERT_TRUE(one.ok()) << one.status();
  const std::vector<int32_t> prompt = Prompt(320, 1);  // past the 128-token window and two ratio-128 rows
  const Stream want_long = Generate(one->stub.get(), Request(prompt, 24));
  ASSERT_TRUE(want_long.status.ok()) << want_long.status.error_message() << " (" << one->Logs() << ")";
  const std::vector<Stream> want_batch = GenerateAll(one->stub.get(), Batch());
  one->leader.reset();  // frees GPU 0 for the group's rank 0

  auto group = StartGroup(world);
  ASSERT_TRUE(group.ok()) << group.status();
  const Stream got_long = Generate(group->stub.get(), Request(prompt, 24));
  ASSERT_TRUE(got_long.status.ok()) << got_long.status.error_message() << " (" << group->Logs() << ")";
  // The group sums partial results across ranks: the streams may part at a near tie only (greedy_check.h).
  const absl::Status same_long = SameGreedyTokens(checkpoint_, prompt, got_long.tokens, want_long.tokens,
                                                  {"--backend", "cuda"}, *dir_);
  EXPECT_TRUE(same_long.ok()) << "world " << world << " vs world 1: " << same_long << " (" << group->Logs() << ")";
  const std::vector<Stream> got_batch = GenerateAll(group->stub.get(), Batch());
  for (size_t i = 0; i < got_batch.size(); ++i) {
    ASSERT_TRUE(got_batch[i].status.ok()) << got_batch[i].status.error_message() << " (" << group->Logs() << ")";
    ASSERT_TRUE(want_batch[i].status.ok()) << want_batch[i].status.error_message();
    const absl::Status same = SameGreedyTokens(checkpoint_, Prompt(20 + 37 * i, 300 + i), got_batch[i].tokens,
                                               want_batch[i].tokens, {"--backend", "cuda"}, *dir_);
    EXPECT_TRUE(same.ok()) << "world " << world << ", request " << i << " of 6 in flight vs world 1: " << same
                           << " (" << group->Logs() << ")";
  }
}

TEST_P(TpGpuTest, KilledFollowerEndsTheStreamAndTheGroupStopsServing) {
  const int world = GetParam();
  auto group = StartGroup(world);
  ASSERT_TRUE(group.ok()) << group.status();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = group->stub->Generate(&ctx, Request(Prompt(40, 9), 900));
  dsv4::v1::GenerateResponse msg;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(reader->Read(&msg)) << group->Logs();
  group->followers.back().Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  while (reader->Read(&msg)) {
  }
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message() << " (" << group->Logs()
                                                                << ")";
  // The NCCL wait gives up at --comm-timeout 10 s; the health flip follows at once.
  int health = 1;
  while (absl::Now() - killed < absl::Seconds(30) && (health = HealthStatus(group->address)) == 1) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(health, 2) << "leader still SERVING " << absl::ToDoubleSeconds(absl::Now() - killed)
                       << " s after its follower died (" << group->Logs() << ")";
}

INSTANTIATE_TEST_SUITE_P(Worlds, TpGpuTest, ::testing::Values(2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& p) { return absl::StrCat("world", p.param); });

}  // namespace
}  // namespace dsv4::worker::testing
