// dsv4-group (worker/group_main.cc) running real dsv4-worker ranks on the tiny checkpoint, on the CPU: a world-2
// group streams a world-1 worker's greedy tokens and stops together on SIGTERM (exit 0, no rank left); a rank
// killed with SIGKILL, or failing its start-up, stops the whole group with that rank's exit code; a killed
// dsv4-group takes its ranks along;
// --validate-only runs every rank's flags through the worker's own validation.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dsv4/v1/worker.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/worker/process_util.h"
#include "tests/worker/tiny_checkpoint_suite.h"

namespace dsv4::worker::testing {
namespace {

using ::testing::HasSubstr;

// Alive and not a zombie waiting to be reaped.
bool Alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
}

bool GoneWithin(pid_t pid, absl::Duration d) {
  const absl::Time end = absl::Now() + d;
  while (Alive(pid)) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

class GroupProcessTest : public TinyCheckpointSuite {
 protected:
  static void SetUpTestSuite() { MakeCheckpoints("group", {1}); }

  static std::vector<std::string> WorkerFlags() {
    return {"--checkpoint=" + Checkpoint(1), "--max-batch=4", "--max-context=1024", "--kv-pages=64",
            "--prefill-chunk=128", "--threads=1", "--comm-timeout=3", "--drain-timeout=5"};
  }

  struct RunningGroup {
    std::unique_ptr<ChildProcess> supervisor;
    std::string address, log;
    std::vector<pid_t> ranks;  // from the supervisor's "rank r pid P" lines
  };

  // dsv4-group --world=`world` on a free port; waits for the leader's ready file and every rank's pid line.
  static absl::StatusOr<RunningGroup> Start(int world) {
    static int counter = 0;
    const std::string tag = absl::StrCat(*dir_, "/group", counter++);
    RunningGroup g;
    g.address = absl::StrCat("127.0.0.1:", FreePort());
    g.log = tag + ".log";
    std::vector<std::string> argv = {BinaryPath("worker/dsv4-group"), absl::StrCat("--world=", world), "--"};
    for (const std::string& f : WorkerFlags()) argv.push_back(f);
    argv.push_back("--listen=" + g.address);
    argv.push_back("--ready-file=" + tag + ".ready");
    auto child = ChildProcess::Start(argv, g.log);
    if (!child.ok()) return child.status();
    g.supervisor = std::make_unique<ChildProcess>(std::move(*child));
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (!std::filesystem::exists(tag + ".ready")) {
      if (absl::Now() > deadline || !Alive(g.supervisor->pid())) {
        return absl::InternalError(absl::StrCat("group did not become ready: ", ReadFile(g.log)));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    const std::string text = ReadFile(g.log);
    g.ranks.assign(world, -1);
    const std::regex line("dsv4-group: rank (\\d+) pid (\\d+):");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator(); ++it) {
      const int r = std::stoi((*it)[1]);
      if (r >= 0 && r < world) g.ranks[r] = std::stoi((*it)[2]);
    }
    for (int r = 0; r < world; ++r) {
      if (g.ranks[r] <= 0) return absl::InternalError(absl::StrCat("no pid line for rank ", r, ": ", text));
    }
    return g;
  }

  static grpc::Status Generate(const std::string& address, int max_new, std::vector<int32_t>* tokens) {
    auto stub = dsv4::v1::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    dsv4::v1::GenerateRequest r;
    for (int32_t t : {11, 23, 5, 99, 42, 7, 300, 12}) r.add_prompt_token_ids(t);
    r.mutable_sampling()->set_max_new_tokens(max_new);
    r.mutable_sampling()->set_ignore_eos(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub->Generate(&ctx, r);
    dsv4::v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      for (int32_t t : msg.token_ids()) tokens->push_back(t);
    }
    return reader->Finish();
  }

};

TEST_F(GroupProcessTest, ServesWorldOneTokensAndStopsTogetherOnSigterm) {
  std::vector<int32_t> reference;
  {
    std::string address;
    std::vector<std::string> flags = WorkerFlags();
    flags.push_back("--listen=127.0.0.1:0");
    auto one = StartWorker(*dir_, flags, &address);
    ASSERT_TRUE(one.ok()) << one.status();
    ASSERT_TRUE(Generate(address, 6, &reference).ok());
    ASSERT_EQ(reference.size(), 6u);
  }
  auto g = Start(2);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(HealthStatus(g->address), 1);
  std::vector<int32_t> tokens;
  const grpc::Status s = Generate(g->address, 6, &tokens);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tokens, reference) << "a world-2 group launched by dsv4-group streams world 1's greedy tokens";
  g->supervisor->Signal(SIGTERM);
  auto code = g->supervisor->Wait(30);
  ASSERT_TRUE(code.ok()) << code.status() << "\n" << ReadFile(g->log);
  EXPECT_EQ(*code, 0) << ReadFile(g->log);
  for (pid_t pid : g->ranks) EXPECT_FALSE(Alive(pid)) << "rank pid " << pid << " outlived dsv4-group";
}

TEST_F(GroupProcessTest, AKilledRankStopsTheGroupWithItsExitCode) {
  auto g = Start(4);
  ASSERT_TRUE(g.ok()) << g.status();
  const absl::Time killed_at = absl::Now();
  ASSERT_EQ(kill(g->ranks[2], SIGKILL), 0);
  auto code = g->supervisor->Wait(30);
  ASSERT_TRUE(code.ok()) << code.status() << "\n" << ReadFile(g->log);
  EXPECT_EQ(*code, 128 + SIGKILL) << ReadFile(g->log);
  EXPECT_LT(absl::Now() - killed_at, absl::Seconds(15)) << "the group took too long to stop";
  for (pid_t pid : g->ranks) EXPECT_FALSE(Alive(pid)) << "rank pid " << pid << " outlived dsv4-group";
  EXPECT_THAT(ReadFile(g->log), HasSubstr("rank 2 was killed by signal 9 on its own: stopping the group"));
}

TEST_F(GroupProcessTest, ARankFailingStartUpFailsTheGroupWithItsMessage) {
  // The tiny model's 8 heads do not split over 3 ranks: every rank refuses at load, and dsv4-group exits with
  // that code instead of leaving the others waiting.
  std::vector<std::string> argv = {BinaryPath("worker/dsv4-group"), "--world=3", "--"};
  for (const std::string& f : WorkerFlags()) argv.push_back(f);
  argv.push_back(absl::StrCat("--listen=127.0.0.1:", FreePort()));
  const std::string log = *dir_ + "/three.log";
  auto child = ChildProcess::Start(argv, log);
  ASSERT_TRUE(child.ok()) << child.status();
  auto code = child->Wait(60);
  ASSERT_TRUE(code.ok()) << code.status() << "\n" << ReadFile(log);
  EXPECT_NE(*code, 0);
  EXPECT_THAT(ReadFile(log), HasSubstr("not divisible by world 3"));
  EXPECT_THAT(ReadFile(log), HasSubstr("on its own: stopping the group"));
}

TEST_F(GroupProcessTest, AKilledSupervisorTakesItsRanksAlong) {
  auto g = Start(2);
  ASSERT_TRUE(g.ok()) << g.status();
  g->supervisor->Signal(SIGKILL);
  auto code = g->supervisor->Wait(10);
  ASSERT_TRUE(code.ok()) << code.status();
  for (pid_t pid : g->ranks) EXPECT_TRUE(GoneWithin(pid, absl::Seconds(5))) << "rank pid " << pid << " orphaned";
}

TEST_F(GroupProcessTest, ValidateOnlyChecksEveryRanksFlags) {
  std::vector<std::string> argv = {BinaryPath("worker/dsv4-group"), "--world=2", "--validate-only", "--",
                                   "--checkpoint=/models/dsv4", "--backend=cuda", "--listen=0.0.0.0:50061"};
  auto ok = RunAndCapture(argv, 60);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_THAT(*ok, HasSubstr("group 0 rank 0 of 2"));
  EXPECT_THAT(*ok, HasSubstr("group 0 rank 1 of 2"));
  argv.push_back("--attention-kernel=fast");
  EXPECT_FALSE(RunAndCapture(argv, 60).ok()) << "a flag the worker refuses must fail the group's validation";
  argv.back() = "--rank=1";
  EXPECT_FALSE(RunAndCapture(argv, 60).ok()) << "a flag dsv4-group writes itself must be refused";
}

}  // namespace
}  // namespace dsv4::worker::testing
